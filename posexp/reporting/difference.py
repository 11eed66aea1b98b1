"""One difference between two sets of runs, and the verdict a reviewer accepts.

A difference is tested by a t test: paired over the seeds both sides share (Student 1908), else
Welch's (Welch 1947). Its two-sided p-value is corrected with the others of its family by Holm's
step-down procedure (Holm 1979) before it is called better or worse; an unresolved difference is
*inconclusive* at its n, with about how many seeds would resolve it, and never reads as "the
same". Equivalence is claimed only within a margin (``--margin``), by two one-sided tests
(Schuirmann 1987). :mod:`.compare` compares a report's groups with these parts;
:func:`window_verdicts` compares runs with their own attention window.

A bootstrap is not used: with the 2-5 seeds a sweep usually has, a resample of the differences takes only a
handful of distinct values and its percentile interval is too narrow; the t-interval is exact for normal
differences and the usual choice at this n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.formatting import fmt_signed
from posexp.reporting.stats import TTest, holm, runs_needed, runs_needed_equivalent

CONFIDENCE = 0.95
ALPHA = 0.05  # of the Holm-corrected family, and of each one-sided test of an equivalence
PAIRED, WELCH, NONE = "paired t", "Welch t", "none"
BETTER, WORSE, INCONCLUSIVE, EQUIVALENT, EQUAL = "better", "worse", "inconclusive", "equivalent", "equal"
NO_INTERVAL, NOT_COMPARED = "no interval", "not compared"

MARGIN_FORMS = ("a percentage of the reference group's mean (e.g. 2%) or an absolute difference in the metric's "
                "unit (e.g. 0.05), greater than 0")


@dataclass(frozen=True)
class Margin:
    """The largest difference that does not matter in practice (``--margin``).

    Attributes:
        value: a fraction of the reference group's mean (``relative``), else in the metric's unit.
        relative: whether ``value`` is relative.
    """

    value: float
    relative: bool

    def of(self, reference_mean: Optional[float]) -> Optional[float]:
        """The margin in the metric's unit; None for a relative margin of a zero (or unknown) reference mean."""
        if not self.relative:
            return self.value
        return self.value * abs(reference_mean) if reference_mean else None

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


def parse_margin(margin: str | float | None, by: Sequence[str]) -> Optional[Margin]:
    """``--margin 2%`` (of the reference group's mean) or ``--margin 0.05`` (in the metric's unit) -> a :class:`Margin`.

    Raises:
        ConfigError: for ``--margin``: not one of the two forms, not above 0 (or 100% and more), or without ``--by``.
    """
    if margin is None:
        return None
    text = str(margin).strip()
    relative = text.endswith("%")
    try:
        value = float(text[:-1] if relative else text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError("--margin", f"{text!r} is not a margin; use {MARGIN_FORMS}")
    if value <= 0:
        raise ConfigError("--margin", f"{text!r} is not a margin: it must be above 0; use {MARGIN_FORMS}")
    if relative and value >= 100:
        raise ConfigError("--margin", f"{text!r} is not a margin: a percentage must be under 100% of the "
                                      f"reference group's mean; use {MARGIN_FORMS}")
    if not by:
        raise ConfigError("--margin", "needs --by: the margin is of a difference between groups, e.g. "
                                      "--by encoder --margin 2%")
    return Margin(value / 100 if relative else value, relative)


@dataclass
class Difference:
    """One group's metric against the reference's.

    Attributes:
        group: the group's label.
        metric: the metric's name.
        reference: the reference group's label.
        difference: mean of group − reference (paired: over shared seeds); None without values.
        low, high: its 95% interval; None when no interval exists.
        n: paired: the number of shared seeds; unpaired: the smaller group's number of runs.
        method: ``paired t``, ``Welch t`` or ``none``.
        verdict: ``better``, ``worse`` (Holm-adjusted p < 0.05), ``equivalent`` (within the margin),
            ``inconclusive``, ``equal`` (the same value for every seed), ``no interval`` or ``not compared``.
        needed: about how many seeds (per group) would resolve this difference; None unless inconclusive.
        reason: why there is no interval or no comparison.
        relative: the difference in % of the reference's mean (of the runs compared); None for a zero mean, or a
            metric whose zero is an ordinary value (``scaled`` False).
        p, p_adjusted: the two-sided p-value of the t test, and Holm's adjusted one over the report's family.
        margin: the equivalence margin in the metric's unit, when one was tested.
        within: the margin as the user gave it (``2%``), when one was tested.
        p_equivalence: the p-value of the two one-sided tests, when a margin was tested.
        higher: whether a larger value is better.
        scaled: a % of the reference's mean means something for the metric (:attr:`MetricSpec.relative`).
        reference_mean: the reference's mean over the runs compared.
        test: the t test behind the numbers.
    """

    group: str
    metric: str
    reference: str
    difference: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    n: int = 0
    method: str = NONE
    verdict: str = NOT_COMPARED
    needed: Optional[int] = None
    reason: str = ""
    relative: Optional[float] = None
    p: Optional[float] = None
    p_adjusted: Optional[float] = None
    margin: Optional[float] = None
    within: str = ""
    p_equivalence: Optional[float] = None
    higher: bool = False
    scaled: bool = True
    reference_mean: Optional[float] = None
    test: Optional[TTest] = field(default=None, repr=False)

    def text(self) -> str:
        """The verdict as the table says it: ``inconclusive at n = 3 (about 7 seeds needed)``, ``equivalent within 2%``."""
        if self.verdict == INCONCLUSIVE:
            if self.needed and self.needed > 10_000:  # a difference at the noise floor of the numbers
                return f"inconclusive at n = {self.n} (more than 10,000 seeds needed)"
            return f"inconclusive at n = {self.n}" + (f" (about {self.needed} seeds needed)" if self.needed else "")
        if self.verdict == EQUIVALENT:
            also = ""
            if self.p_adjusted is not None and self.p_adjusted < ALPHA:
                also = f" ({BETTER if ((self.difference or 0) > 0) == self.higher else WORSE}, by less than that)"
            return f"equivalent within {self.within}{also}"
        return "equal on every seed" if self.verdict == EQUAL else self.verdict

    def as_dict(self) -> dict:
        return {"group": self.group, "metric": self.metric, "reference": self.reference,
                "difference": self.difference, "relative": self.relative, "low": self.low, "high": self.high,
                "n": self.n, "method": self.method, "p": self.p, "p_adjusted": self.p_adjusted,
                "margin": self.margin, "p_equivalence": self.p_equivalence, "verdict": self.verdict,
                "verdict_text": self.text(), "n_needed": self.needed, "reason": self.reason}


def fill_difference(diff: Difference, mine: list[tuple[Any, float]], ref: list[tuple[Any, float]],
                    bounds: Optional[tuple[float, float]] = None) -> None:
    """Set ``diff``'s test and numbers from the two groups' (seed, value) lists; :func:`judge` gives the verdict.

    Paired over the seeds both share (two or more), else Welch's test (two or more runs each), else no interval.
    ``bounds``: those of the metric's values (:attr:`MetricSpec.bounds`), between which a difference lies within
    ±(high − low): its interval is cut there, as :func:`~posexp.reporting.stats.aggregate_stat` cuts one of values
    (two accuracies differ by at most 100 points).
    """
    if not mine or not ref:
        diff.reason = "no value in " + ("this group" if not mine else "the reference group")
        return
    mine_by, ref_by = dict(mine), dict(ref)
    unique = len(mine_by) == len(mine) and len(ref_by) == len(ref) and None not in mine_by and None not in ref_by
    shared = [s for s in mine_by if s in ref_by] if unique else []
    reference = [v for _, v in ref]
    if len(shared) >= 2:  # pairs: group − reference for each seed both have
        diff.test = TTest.paired([mine_by[s] - ref_by[s] for s in shared])
        diff.n, diff.method, reference = len(shared), PAIRED, [ref_by[s] for s in shared]
    elif len(mine) >= 2 and len(ref) >= 2:
        diff.test = TTest.welch([v for _, v in mine], reference)
        diff.n, diff.method = min(len(mine), len(ref)), WELCH
        diff.reason = ("unpaired: the groups share fewer than two seeds" if unique
                       else "unpaired: a seed repeats within a group")
    else:
        diff.difference = math.fsum(v for _, v in mine) / len(mine) - math.fsum(reference) / len(reference)
        diff.n, diff.verdict = min(len(mine), len(ref)), NO_INTERVAL
        diff.reason = "n = 1: no interval exists"
    if diff.test is not None:
        diff.difference, diff.p = diff.test.difference, diff.test.p_value()
        diff.low, diff.high = diff.test.interval(CONFIDENCE)
        if bounds is not None and math.isfinite(span := bounds[1] - bounds[0]):
            diff.low, diff.high = max(diff.low, -span), min(diff.high, span)
    diff.reference_mean = math.fsum(reference) / len(reference)
    if diff.reference_mean and diff.difference is not None and diff.scaled:
        diff.relative = 100 * diff.difference / abs(diff.reference_mean)


def judge(diffs: list[Difference], margin: Optional[Margin]) -> int:
    """Holm-adjust the tested differences' p-values as one family and give each its verdict; returns the family's
    size."""
    tested = [d for d in diffs if d.test is not None and d.p is not None]
    for diff, adjusted in zip(tested, holm([d.p for d in tested if d.p is not None])):
        diff.p_adjusted = adjusted
        _verdict(diff, margin, len(tested))
    return len(tested)


def _verdict(diff: Difference, margin: Optional[Margin], family: int) -> None:
    """Equal, equivalent within ``margin``, better or worse (Holm-adjusted p < α), else inconclusive."""
    test = diff.test
    assert test is not None and diff.p_adjusted is not None
    if margin is not None:
        bound = margin.of(diff.reference_mean) if diff.scaled or not margin.relative else None
        if bound is None:
            diff.reason = (f"no equivalence test: a {margin} margin of a zero reference mean" if diff.scaled else
                           f"no equivalence test: {diff.metric} has no {margin} (its 0 is an ordinary value); give "
                           "an absolute margin in its unit")
        else:
            diff.margin, diff.within, diff.p_equivalence = bound, str(margin), test.equivalence_p(bound)
    if test.se == 0 and test.difference == 0:
        diff.verdict = EQUAL
    elif diff.p_equivalence is not None and diff.p_equivalence < ALPHA:
        diff.verdict = EQUIVALENT
    elif diff.p_adjusted < ALPHA:
        diff.verdict = BETTER if (test.difference > 0) == diff.higher else WORSE
    else:
        diff.verdict = INCONCLUSIVE
        # Bonferroni's level is what Holm's demands of the smallest p: a safe bound for the sample size
        needed = runs_needed(test.difference, test.sd, test.groups, alpha=ALPHA / family)
        if diff.margin is not None:  # or as many as would show it equivalent, if that is fewer
            needed = min(needed, runs_needed_equivalent(test.difference, test.sd, diff.margin, test.groups, ALPHA))
        # at least one more than now: this n did not resolve it
        diff.needed = max(diff.n + 1, math.ceil(needed)) if math.isfinite(needed) else None


def interval_text(diff: Difference, decimals: int) -> str:
    """``+3.04 (+12.1%) [−0.28, +6.37]``: the difference, in % of the reference's mean, and its 95% interval."""
    if diff.difference is None:
        return "—"
    relative = None if diff.relative is None else \
        fmt_signed(diff.relative, 1 if abs(diff.relative) >= 1 or not diff.relative else 2)
    # a difference that rounds to zero beside a percentage that does not keeps the sign the percentage shows
    text = fmt_signed(diff.difference, decimals, keep_sign=relative is not None and float(relative[1:]) != 0)
    if relative is not None:
        text += f" ({relative}%)"
    if diff.low is None or diff.high is None:
        return text
    return f"{text} [{fmt_signed(diff.low, decimals)}, {fmt_signed(diff.high, decimals)}]"


def p_text(p: Optional[float]) -> str:
    """A p-value for a table: ``0.012``, ``< 0.001``, or ``—`` when there is none. One that rounds to
    :data:`ALPHA` gets the digits that show its side of it (``0.0498`` beside "worse", not ``0.050``)."""
    if p is None:
        return "—"
    if p < 0.001:
        return "< 0.001"
    digits = 3
    while float(text := f"{p:.{digits}f}") == ALPHA and p != ALPHA and digits < 9:
        digits += 1
    return text


@dataclass
class WindowVerdict:
    """Whether runs beat their own attention window at one length.

    Attributes:
        length: the evaluated length, in tokens.
        difference: plain − window perplexity, paired over the runs (lower is better), as a :class:`Difference`.
        text: ``beats its own window at 8×``, ``loses to its own window at 8×``, or why neither can be said.
    """

    length: int
    difference: Difference
    text: str


def window_verdicts(runs: Sequence[Mapping[int, tuple[float, float]]], train_len: Optional[int] = None,
                    margin: Optional[Margin] = None) -> dict[int, WindowVerdict]:
    """Per length, whether the runs' plain perplexity beats their windowed one (``posexp eval RUN eval.window=W``).

    Each run is its own pair (same model, same text): the paired t test of plain − window over the runs, its
    p-value Holm-corrected over the lengths given, as :func:`judge` does for a report's groups.

    Args:
        runs: one mapping per run (e.g. the seeds of one group): length -> (plain ppl, window ppl).
        train_len: the runs' training length, to say a length as a multiple (``8×``); else in tokens.
        margin: an equivalence margin (:func:`parse_margin`); None: no equivalence is claimed.

    Returns:
        length -> :class:`WindowVerdict`, for every length of any run, in increasing order.
    """
    diffs = {}
    for length in sorted({n for run in runs for n in run}):
        pairs = [run[length] for run in runs
                 if length in run and all(v is not None and math.isfinite(v) for v in run[length])]
        diff = Difference("plain", f"ppl@{length}", "window")  # lower perplexity is better
        fill_difference(diff, [(i, plain) for i, (plain, _) in enumerate(pairs)],
                        [(i, window) for i, (_, window) in enumerate(pairs)])
        diffs[length] = diff
    judge(list(diffs.values()), margin)
    return {n: WindowVerdict(n, d, _window_text(d, _at(n, train_len))) for n, d in diffs.items()}


def _at(length: int, train_len: Optional[int]) -> str:
    return f"{length / train_len:g}×" if train_len else f"{length} tokens"


def _window_text(diff: Difference, at: str) -> str:
    if diff.verdict == BETTER:
        return f"beats its own window at {at}"
    if diff.verdict == WORSE:
        return f"loses to its own window at {at}"
    if diff.verdict in (EQUIVALENT, EQUAL):
        return f"{diff.text()} of its own window at {at}"
    if diff.verdict == INCONCLUSIVE:
        return f"not shown to beat its own window at {at}: {diff.text()}"
    if diff.verdict == NO_INTERVAL:
        return f"one run: no verdict against its own window at {at}"
    return f"not measured both with and without the window at {at}"
