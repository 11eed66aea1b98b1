"""Means of replicate runs with a Student-t interval, and the exact t quantile behind it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from posexp.reporting.formatting import MISSING, NOT_APPLICABLE, _fmt_fixed


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Student (1908), "The probable error of a mean", Biometrika 6(1): the density
    f(t) = Γ((ν+1)/2) / (√(νπ) Γ(ν/2)) · (1 + t²/ν)^(-(ν+1)/2). Substituting
    t = √ν·tan θ turns P(0 < T < t) into C·∫₀^θ cos^(ν-1)φ dφ with
    C = Γ((ν+1)/2) / (√π Γ(ν/2)), a smooth integrand on [0, π/2) that Simpson's
    rule integrates accurately; θ is then found by bisection. No scipy needed.

    Args:
        p: probability in (0.5, 1), e.g. 0.975 for a two-sided 95% interval.
        df: degrees of freedom, at least 1.

    Returns:
        t such that P(T ≤ t) = p.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (got p={p}, df={df})")
    return _t_quantile(float(p), int(df))


@functools.lru_cache(maxsize=256)
def _t_quantile(p: float, df: int) -> float:
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
