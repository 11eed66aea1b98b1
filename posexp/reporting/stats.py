"""Means of replicate runs with a Student-t interval, the exact t quantile and distribution function behind it,
and the tests, intervals and sample sizes of a comparison between two groups of runs: a t test's p-value, two
one-sided tests of equivalence, and Holm's correction for a family of comparisons."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional, Sequence

from posexp.reporting.formatting import MISSING, NOT_APPLICABLE, fmt_fixed


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Student (1908), "The probable error of a mean", Biometrika 6(1): the density
    f(t) = Γ((ν+1)/2) / (√(νπ) Γ(ν/2)) · (1 + t²/ν)^(-(ν+1)/2). Substituting
    t = √ν·tan θ turns P(0 < T < t) into C·∫₀^θ cos^(ν-1)φ dφ with
    C = Γ((ν+1)/2) / (√π Γ(ν/2)), a smooth integrand on [0, π/2) that Simpson's
    rule integrates accurately; θ is then found by bisection. No scipy needed.

    Args:
        p: probability in (0.5, 1), e.g. 0.975 for a two-sided 95% interval.
        df: degrees of freedom, at least 1; need not be a whole number (Welch's interval).

    Returns:
        t such that P(T ≤ t) = p.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (got p={p}, df={df})")
    return _t_quantile(float(p), float(df))


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t distribution with ``df`` degrees of freedom.

    Through the regularized incomplete beta function (Abramowitz & Stegun 1964, "Handbook of
    Mathematical Functions", eq. 26.7.1): P(|T| ≥ |t|) = I_x(ν/2, 1/2) with x = ν / (ν + t²). Unlike
    ``1 − 2·P(0 < T < |t|)`` this keeps its precision in the far tail, where small p-values live.

    Args:
        t: the statistic.
        df: degrees of freedom, > 0; need not be a whole number (Welch's test).

    Returns:
        The probability, in [0, 1].
    """
    if not df > 0:
        raise ValueError(f"t_cdf needs df > 0 (got {df})")
    tail = t_two_sided_p(t, df) / 2  # one tail beyond |t|
    return 1 - tail if t > 0 else tail


def t_two_sided_p(t: float, df: float) -> float:
    """The two-sided p-value of a t statistic, P(|T| ≥ |t|); e.g. t = 2.776 with 4 degrees of freedom gives 0.05."""
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / (df + t * t), df / 2, 0.5)


def regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) = B(x; a, b) / B(a, b).

    The continued fraction of Abramowitz & Stegun (1964), eq. 26.5.8, evaluated by Lentz's method
    (Lentz 1976, Applied Optics 15(3), as modified by Thompson & Barnett 1986, J. Comput. Phys. 64); it
    converges fast for x < (a + 1)/(a + b + 2), and the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) covers the rest.

    Args:
        x: in [0, 1].
        a, b: shape parameters, > 0.
    """
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - regularized_beta(1 - x, b, a)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float) -> float:
    """1 / (1 + d₁ / (1 + d₂ / (1 + ...))) of A&S 26.5.8, by modified Lentz."""
    tiny = 1e-300
    value, c, d = tiny, tiny, 0.0
    for k in range(0, 1000):  # k = 0: the leading 1 / (...); then d_k
        m, odd = divmod(k, 2)
        if k == 0:
            term = 1.0
        elif odd:  # d_{2m+1}
            term = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:  # d_{2m}
            term = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1 + term * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + term / c
        c = c if abs(c) > tiny else tiny
        value *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return value


@functools.lru_cache(maxsize=256)
def _t_quantile(p: float, df: float) -> float:
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    target = p - 0.5
    steps = 256  # even, for Simpson's rule

    def mass(theta: float) -> float:
        h = theta / steps
        total = 1.0 + math.cos(theta) ** (df - 1)  # the ends; cos(0) = 1
        for i in range(1, steps):
            total += (4 if i % 2 else 2) * math.cos(i * h) ** (df - 1)
        return scale * total * h / 3

    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if mass(mid) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan((lo + hi) / 2)


@dataclass
class Stat:
    """A value over the runs of a group: their mean and 95% interval.

    With two or more runs the interval is mean ± t(0.975, n-1)·s/√n over the runs
    (seeds), cut at the bounds of a bounded value (:func:`aggregate_stat`); for one run it is the run's own
    evaluation interval where there is one.

    Attributes:
        applicable: None when no run has this value (not evaluated), False when not applicable.
        mean, low, high: the value and its interval (None when unknown).
        n: how many runs the mean is over; 0 for one run's own value (a cell of a run's line, with its
            evaluation interval).
        cut: the interval over runs was cut at a bound of the value, so it is no longer mean ± a half-width.
    """

    applicable: Optional[bool] = None
    mean: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    n: int = 0
    cut: bool = False

    @property
    def spread(self) -> Optional[float]:
        """Half-width of the interval over runs (None for a single run)."""
        if self.n < 2 or self.low is None or self.high is None or self.mean is None:
            return None
        return (self.high - self.low) / 2

    def text(self, decimals: int = 2, plus_minus: str = " ± ", of: int = 0) -> str:
        """``3.10 ± 0.12``, or ``95.0 [31.5, 100.0]`` for an interval :attr:`cut` at a bound; ``of``: the group's
        size, to say when fewer of its runs have this value."""
        if self.applicable is None:
            return MISSING
        if not self.applicable or self.mean is None:
            return NOT_APPLICABLE
        out = fmt_fixed(self.mean, decimals)
        if self.cut and self.low is not None and self.high is not None:
            out += f" [{fmt_fixed(self.low, decimals)}, {fmt_fixed(self.high, decimals)}]"
        elif self.spread is not None:
            out += plus_minus + fmt_fixed(self.spread, decimals)
        if 0 < self.n < of:
            out += f" (n={self.n})"
        return out

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n,
                "applicable": self.applicable}


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, Optional[float], Optional[float]]:
    """Mean and two-sided t-interval (Student 1908) of independent replicates such as seeds.

    Args:
        values: one value per run.
        confidence: interval coverage.

    Returns:
        ``(mean, low, high)``; low/high are None for a single value.
    """
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None, None
    half = t_quantile(0.5 + confidence / 2, n - 1) * sample_sd(values) / math.sqrt(n)
    return mean, mean - half, mean + half


# the note of a table with an interval cut at a bound (Stat.cut), ``bounds`` the values it would pass there
CUT_NOTE = ("[low, high]: the 95% t-interval over the runs where it would pass {bounds}, cut there; mean ± its "
            "half-width elsewhere.")


def aggregate_stat(values: list[tuple[Optional[bool], Optional[float]]], single_interval: tuple = (None, None),
                   bounds: Optional[tuple[float, float]] = None) -> Stat:
    """Aggregate per-run (applicable, value) pairs; the n/a and missing ones are not averaged.

    Args:
        values: each run's (applicable, value).
        single_interval: the interval of a lone run's value (its own evaluation interval).
        bounds: the (lowest, highest) value a run can have (an accuracy in %: 0 and 100), else None.

    Returns:
        The mean with its t-interval over the runs (:func:`mean_interval`), cut at ``bounds``: symmetric about
        the mean, the t-interval passes them at few seeds (t(0.975, 1) = 12.7: accuracies of 90% and 100% give
        95 ± 63.5). It stays the t-interval of the runs' mean, for the spread between seeds is what it measures
        (not the binomial error of one run's examples, its Wilson interval); only its part past a bound goes, where
        no mean of runs can lie. Cut so, it covers the true mean as often as the whole one does: the true mean lies
        within the bounds, so it is in the cut interval whenever it is in the whole one (Mandelkern 2002, "Setting
        confidence intervals for bounded parameters", Statist. Sci. 17(2), on intervals of bounded parameters);
        holding the runs' mean, it is never empty. A logit transform would keep inside too, but has no interval when
        every seed scores 0 or 100%, as tasks often do.
    """
    numbers = [v for ok, v in values if ok and v is not None and math.isfinite(v)]
    if not numbers:
        states = [ok for ok, _ in values]
        return Stat(applicable=False if any(s is not None for s in states) else None)
    mean, low, high = mean_interval(numbers)
    if len(numbers) == 1:
        return Stat(True, mean, single_interval[0], single_interval[1], 1)
    assert low is not None and high is not None  # two or more values have an interval
    if bounds is not None and (low < bounds[0] or high > bounds[1]):
        return Stat(True, mean, max(low, bounds[0]), min(high, bounds[1]), len(numbers), cut=True)
    return Stat(True, mean, low, high, len(numbers))


def sample_sd(values: Sequence[float]) -> float:
    """The sample standard deviation (n − 1 in the denominator) of two or more values."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's difference, standard error and Welch–Satterthwaite degrees of freedom.

    Welch (1947), "The generalization of 'Student's' problem when several different population
    variances are involved", Biometrika 34: standard error √(s_a²/n_a + s_b²/n_b), with the
    Welch–Satterthwaite degrees of freedom ν = (s_a²/n_a + s_b²/n_b)² / Σ (s²/n)² / (n − 1).
    """
    va, vb = sample_sd(a) ** 2 / len(a), sample_sd(b) ** 2 / len(b)
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    if va + vb == 0:
        return diff, 0.0, float(len(a) + len(b) - 2)
    return diff, math.sqrt(va + vb), (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))


def runs_needed(difference: float, sd: float, groups: int = 1, alpha: float = 0.05, power: float = 0.8) -> float:
    """Runs (pairs of seeds, or runs per group) a t-test needs to detect ``difference`` at ``power``.

    The normal-approximation sample size of a two-sided test (Lehr 1992, "Sixteen s-squared over
    d-squared: a relation for crude sample size estimates", Stat. Med. 11; Chow, Shao & Wang 2008,
    "Sample Size Calculations in Clinical Research", §3.1-3.2):
    n = groups · ((z_{1-α/2} + z_{power}) · sd / difference)², with groups = 1 for paired differences
    (sd: of the differences) and 2 for two independent groups (sd: the pooled one). At α = 0.05 and
    80% power, (1.960 + 0.842)² = 7.85. It is a little optimistic for small n, where t replaces z.

    Args:
        difference: the difference to detect (the observed one, for "how many seeds would tell").
        sd: the standard deviation of one paired difference, or of one run within a group.
        groups: 1 for a paired design, 2 for two independent groups.
        alpha: two-sided significance level.
        power: the chance of detecting a true difference of this size.

    Returns:
        The number of runs, not rounded; ``inf`` when ``difference`` is 0.
    """
    if difference == 0:
        return math.inf
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return groups * (z * sd / difference) ** 2


def runs_needed_equivalent(difference: float, sd: float, margin: float, groups: int = 1, alpha: float = 0.05,
                           power: float = 0.8) -> float:
    """Runs two one-sided tests need to show equivalence within ``±margin`` when the true difference is ``difference``.

    The normal-approximation sample size of a test for equivalence (Chow, Shao & Wang 2008, "Sample Size
    Calculations in Clinical Research", §3.1.4 and §3.2.4): n = groups · (z_{1-α} + z_{1-β/2})² · sd² /
    (margin − |difference|)², with β = 1 − power; the conservative z_{1-β/2} holds for any difference.

    Args:
        difference: the true (here: the observed) difference.
        sd: as for :func:`runs_needed`.
        margin: the equivalence margin, > 0, in the difference's unit.
        groups: 1 for a paired design, 2 for two independent groups.
        alpha: the level of each one-sided test.
        power: the chance of showing equivalence.

    Returns:
        The number of runs, not rounded; ``inf`` when ``|difference| ≥ margin`` (no n shows it equivalent).
    """
    if abs(difference) >= margin:
        return math.inf
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(1 - (1 - power) / 2)
    return groups * (z * sd / (margin - abs(difference))) ** 2


@dataclass(frozen=True)
class TTest:
    """A t test of a difference: the paired one over shared seeds or Welch's over two independent groups.

    Attributes:
        difference: the mean difference.
        se: its standard error.
        df: degrees of freedom (n − 1 paired; Welch–Satterthwaite unpaired).
        sd: the standard deviation of one paired difference, or the pooled one of a run (for sample sizes).
        groups: 1 paired, 2 unpaired (for sample sizes).
    """

    difference: float
    se: float
    df: float
    sd: float
    groups: int

    @classmethod
    def paired(cls, deltas: Sequence[float]) -> "TTest":
        """Student's (1908) one-sample t test of per-seed differences (two or more)."""
        sd = sample_sd(deltas)
        return cls(math.fsum(deltas) / len(deltas), sd / math.sqrt(len(deltas)), len(deltas) - 1, sd, 1)

    @classmethod
    def welch(cls, a: Sequence[float], b: Sequence[float]) -> "TTest":
        """Welch's (1947) test of mean(a) − mean(b), two or more runs each (see :func:`_welch`)."""
        diff, se, df = _welch(a, b)
        return cls(diff, se, max(df, 1.0), math.sqrt((sample_sd(a) ** 2 + sample_sd(b) ** 2) / 2), 2)

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """The two-sided t-interval of the difference."""
        half = t_quantile(0.5 + confidence / 2, self.df) * self.se if self.se else 0.0
        return self.difference - half, self.difference + half

    def p_value(self) -> float:
        """The two-sided p-value of "no difference"; 0 for a constant non-zero difference, 1 for none at all."""
        if self.se == 0:
            return 1.0 if self.difference == 0 else 0.0
        return t_two_sided_p(self.difference / self.se, self.df)

    def equivalence_p(self, margin: float) -> float:
        """The p-value of two one-sided tests (TOST) that the true difference lies within ``±margin``.

        Schuirmann (1987), "A comparison of the two one-sided tests procedure and the power approach for
        assessing the equivalence of average bioavailability", J. Pharmacokinet. Biopharm. 15(6): reject both
        "difference ≤ −margin" and "difference ≥ +margin" at level α; the larger of the two one-sided p-values
        is below α exactly when the (1 − 2α) interval lies inside (−margin, +margin).
        """
        if self.se == 0:
            return 0.0 if abs(self.difference) < margin else 1.0
        above_low = 1 - t_cdf((self.difference + margin) / self.se, self.df)  # H0: difference ≤ −margin
        below_high = t_cdf((self.difference - margin) / self.se, self.df)  # H0: difference ≥ +margin
        return max(above_low, below_high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests, in the order given.

    Holm (1979), "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6(2): with the
    m p-values sorted, p₍₁₎ ≤ ... ≤ p₍ₘ₎, reject H₍ᵢ₎ while p₍ⱼ₎ ≤ α / (m − j + 1) for every j ≤ i; this keeps
    the chance of any false rejection at most α whatever the dependence between the tests. The adjusted
    p₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1) · p₍ⱼ₎) is below α exactly for the rejected ones.

    Args:
        p_values: one per test of the family.

    Returns:
        The adjusted p-values, each at least its raw one and at most m times it.
    """
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
