"""The summary metrics of a task run's accuracy-vs-length curve: acc@, tok@, maxlen@acc, maxlen@rel, efflen.

Each reads the run's accuracies in [0, 1] by length, of the field :attr:`reads` of the rows the table shows
(:func:`posexp.reporting.metrics.shown_values`), and the run's training length.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from posexp.reporting.metrics import ACCURACY, HIGHER, Metric, MetricSpec, Value, ValueAt, longest, shown_values


class Accuracy(ValueAt):
    kind, pattern, forms = "acc", "acc@{at}", "acc@Kx (e.g. acc@4x), acc@N (N tokens)"
    applies, better, decimals, scale = ACCURACY, HIGHER, 1, 100.0
    relative = False  # a difference in percentage points: a % of the reference's % would read as points
    bounds = (0.0, 100.0)
    examples: ClassVar[tuple[str, ...]] = ("acc@2x", "acc@4x")

    def describe(self, metric: Metric, report: Any) -> str:
        return f"{metric.name} = exact-match accuracy (%) at {metric.where('x')}."


class TokenAccuracy(Accuracy):
    """The share of answer tokens predicted right, the measure Ruoss et al. 2023 report (their "accuracy"), which
    moves where exact match is 0 everywhere."""

    kind, pattern, forms, examples = "tok", "tok@{at}", "tok@Kx / tok@N (per-token)", ("tok@4x",)
    reads = "token_accuracy"

    def describe(self, metric: Metric, report: Any) -> str:
        return f"{metric.name} = per-token accuracy of the answer (%) at {metric.where('x')}."


class AbsoluteMaxLen(MetricSpec):
    kind, pattern, applies, better, decimals = "maxlen_acc", "maxlen@acc{pct}%?", ACCURACY, HIGHER, 0
    bounds = (0.0, math.inf)  # a length: 64 and 128 tokens over two seeds are 96 ± 407, not down to −311
    forms = ("maxlen@accP (e.g. maxlen@acc90: the longest length up to which every evaluated length has exact "
             "match >= 90%)")
    examples, max_pct = ("maxlen@acc90",), 100.0

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        """The longest evaluated length up to which every evaluated length has exact match >= the share; 0 when
        the shortest has not (a length not applicable ends the run of lengths as a miss does)."""
        acc = shown_values(row, report, self.reads)
        return (True, float(longest(acc, 0, lambda v: v >= metric.share, best=0))) if acc else (None, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = the longest evaluated length up to which every evaluated length has exact-match "
                f"accuracy >= {metric.share:.0%} (0: not even the shortest).")


class RelativeMaxLen(MetricSpec):
    """Every evaluated length from the training length on counts (relative: a model at 0.2% at 1× that stays there
    gets the longest length); n/a when the accuracy at the training length is 0."""

    kind, pattern, applies, better, decimals = "maxlen_rel", "maxlen@rel{pct}%?", ACCURACY, HIGHER, 0
    bounds = (0.0, math.inf)
    forms, examples, max_pct = "maxlen@relP (>= P% of the 1x exact match)", ("maxlen@rel90",), 100.0

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        acc, train_len = shown_values(row, report, self.reads), row.run.train_len
        if train_len is None or not acc.get(train_len, (None,))[0]:
            return None, None
        if not acc[train_len][1]:
            return False, None  # nothing in distribution to keep
        best = longest(acc, train_len, lambda v: v >= metric.share * acc[train_len][1])
        return (True, float(best)) if best is not None else (False, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = the longest length up to which exact-match accuracy stays >= {metric.share:.0%} "
                "of the accuracy at the training length (relative to it, however low it is).")


class EffectiveLength(MetricSpec):
    """Hsieh et al. 2024 (RULER), §4: the effective length is the longest length whose score passes a threshold."""

    kind, pattern, applies, better, decimals = "efflen", "efflen@{pct}%?", ACCURACY, HIGHER, 0
    bounds = (0.0, math.inf)
    forms = ("efflen@P (e.g. efflen@85: the effective length, the longest evaluated length whose exact match is "
             ">= 85%, shorter ones as they may be)")
    examples, max_pct = ("efflen@85",), 100.0

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        acc = shown_values(row, report, self.reads)
        passing = [n for n, (ok, value) in acc.items() if ok and value is not None and value >= metric.share]
        return (True, float(max(passing, default=0))) if acc else (None, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = effective length (Hsieh et al. 2024, RULER): the longest evaluated length whose "
                f"exact-match accuracy is >= {metric.share:.0%}, whatever the shorter ones score (0: none); it is "
                f"maxlen@acc{metric.share * 100:g} when accuracy falls with length, and longer when a dip recovers.")
