"""Means of replicate runs with a Student-t interval, the exact t quantile behind it, and the
intervals and sample sizes of a comparison between two groups of runs."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from posexp.reporting.formatting import MISSING, NOT_APPLICABLE, _fmt_fixed


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
    (seeds); for one run it is the run's own evaluation interval where there is one.

    Attributes:
        applicable: None when no run has this value (not evaluated), False when not applicable.
        mean, low, high: the value and its interval (None when unknown).
        n: how many runs the mean is over.
    """

    applicable: Optional[bool] = None
    mean: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    n: int = 0

    @property
    def spread(self) -> Optional[float]:
        """Half-width of the interval over runs (None for a single run)."""
        if self.n < 2 or self.low is None or self.high is None or self.mean is None:
            return None
        return (self.high - self.low) / 2

    def text(self, decimals: int = 2, plus_minus: str = " ± ", of: int = 0) -> str:
        """``3.10 ± 0.12``; ``of``: the group's size, to say when fewer of its runs have this value."""
        if self.applicable is None:
            return MISSING
        if not self.applicable or self.mean is None:
            return NOT_APPLICABLE
        out = _fmt_fixed(self.mean, decimals)
        if self.spread is not None:
            out += plus_minus + _fmt_fixed(self.spread, decimals)
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
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def _stat(values: list[tuple[Optional[bool], Optional[float]]], single_interval: tuple = (None, None)) -> Stat:
    """Aggregate per-run (applicable, value) pairs; the n/a and missing ones are not averaged."""
    numbers = [v for ok, v in values if ok and v is not None and math.isfinite(v)]
    if not numbers:
        states = [ok for ok, _ in values]
        return Stat(applicable=False if any(s is not None for s in states) else None)
    mean, low, high = mean_interval(numbers)
    if len(numbers) == 1:
        low, high = single_interval
    return Stat(True, mean, low, high, len(numbers))


def normal_quantile(p: float) -> float:
    """The ``p`` quantile of the standard normal distribution, by bisection on Φ(z) = (1 + erf(z/√2)) / 2.

    Args:
        p: probability in (0, 1), e.g. 0.975 (z = 1.95996) or 0.8 (z = 0.84162).

    Returns:
        z such that Φ(z) = p, to about 1e-12.
    """
    if not 0 < p < 1:
        raise ValueError(f"normal_quantile needs 0 < p < 1 (got {p})")
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if (1 + math.erf(mid / math.sqrt(2))) / 2 < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sample_sd(values: Sequence[float]) -> float:
    """The sample standard deviation (n − 1 in the denominator) of two or more values."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def welch_interval(a: Sequence[float], b: Sequence[float],
                   confidence: float = 0.95) -> tuple[float, float, float, float]:
    """Mean of ``a`` minus mean of ``b`` with Welch's t-interval, for two unpaired groups of two or more runs.

    Welch (1947), "The generalization of 'Student's' problem when several different population
    variances are involved", Biometrika 34: standard error √(s_a²/n_a + s_b²/n_b), with the
    Welch–Satterthwaite degrees of freedom ν = (s_a²/n_a + s_b²/n_b)² / Σ (s²/n)² / (n − 1).

    Args:
        a, b: one value per run of each group.
        confidence: interval coverage.

    Returns:
        ``(difference, low, high, df)``.
    """
    va, vb = sample_sd(a) ** 2 / len(a), sample_sd(b) ** 2 / len(b)
    diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
    if va + vb == 0:
        return diff, diff, diff, float(len(a) + len(b) - 2)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + confidence / 2, max(df, 1.0)) * math.sqrt(va + vb)
    return diff, diff - half, diff + half, df


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
    z = normal_quantile(1 - alpha / 2) + normal_quantile(power)
    return groups * (z * sd / difference) ** 2
