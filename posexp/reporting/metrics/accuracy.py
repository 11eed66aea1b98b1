"""The summary metrics of a task run's accuracy-vs-length curve: acc@, tok@, maxlen@acc, maxlen@rel, efflen.

Each value function reads the run's accuracies by length, of the row field the metric :attr:`reads`:
length -> (applicable, accuracy in [0, 1], low, high) (:func:`posexp.reporting.task_report.run_accuracy`),
and the run's training length.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from posexp.reporting.metrics import ACCURACY, HIGHER, Metric, MetricSpec, Value


def _where(metric: Metric) -> str:
    return f"{metric.multiple:g}x the training length" if metric.multiple is not None else f"{metric.length} tokens"


class Accuracy(MetricSpec):
    kind, pattern, forms = "acc", "acc@{at}", "acc@Kx (e.g. acc@4x), acc@N (N tokens)"
    applies, better, decimals = ACCURACY, HIGHER, 1
    examples: ClassVar[tuple[str, ...]] = ("acc@2x", "acc@4x")

    def value(self, metric: Metric, acc: dict, train_len: Optional[int]) -> Value:
        length = metric.length if metric.length is not None else (
            int(round(metric.multiple * train_len)) if train_len and metric.multiple is not None else None)
        cell = acc.get(length) if length is not None else None
        if cell is None:
            return None, None
        return (True, 100 * cell[1]) if cell[0] else (False, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return f"{metric.name} = exact-match accuracy (%) at {_where(metric)}."


class TokenAccuracy(Accuracy):
    kind, pattern, forms, examples = "tok", "tok@{at}", "tok@Kx / tok@N (per-token)", ("tok@4x",)
    reads = "token_accuracy"

    def describe(self, metric: Metric, report: Any) -> str:
        return f"{metric.name} = per-token accuracy of the answer (%) at {_where(metric)}."


class AbsoluteMaxLen(MetricSpec):
    kind, pattern, applies, better, decimals = "maxlen_acc", "maxlen@acc{pct}%?", ACCURACY, HIGHER, 0
    forms = ("maxlen@accP (e.g. maxlen@acc90: the longest length up to which every evaluated length has exact "
             "match >= 90%)")
    examples, max_pct = ("maxlen@acc90",), 100.0

    def value(self, metric: Metric, acc: dict, train_len: Optional[int]) -> Value:
        """The longest evaluated length up to which every evaluated length has exact match >= the share; 0 when
        the shortest has not (a length not applicable ends the run of lengths as a miss does)."""
        if not acc:
            return None, None
        best = 0
        for length in sorted(acc):
            ok, value = acc[length][0], acc[length][1]
            if not ok or value is None or value < metric.share:
                break
            best = length
        return True, float(best)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = the longest evaluated length up to which every evaluated length has exact-match "
                f"accuracy >= {metric.share:.0%} (0: not even the shortest).")


class RelativeMaxLen(MetricSpec):
    kind, pattern, applies, better, decimals = "maxlen_rel", "maxlen@rel{pct}%?", ACCURACY, HIGHER, 0
    forms, examples, max_pct = "maxlen@relP (>= P% of the 1x exact match)", ("maxlen@rel90",), 100.0

    def value(self, metric: Metric, acc: dict, train_len: Optional[int]) -> Value:
        if train_len is None or train_len not in acc or not acc[train_len][0]:
            return None, None
        if not acc[train_len][1]:
            return False, None  # nothing in distribution to keep
        floor = metric.share * acc[train_len][1]
        best = None
        for length in sorted(n for n in acc if n >= train_len):
            ok, value = acc[length][0], acc[length][1]
            if not ok or value is None or value < floor:
                break
            best = length
        return (True, float(best)) if best is not None else (False, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = the longest length up to which exact-match accuracy stays >= {metric.share:.0%} "
                "of the accuracy at the training length (relative to it, however low it is).")


class EffectiveLength(MetricSpec):
    """Hsieh et al. 2024 (RULER), §4: the effective length is the longest length whose score passes a threshold."""

    kind, pattern, applies, better, decimals = "efflen", "efflen@{pct}%?", ACCURACY, HIGHER, 0
    forms = ("efflen@P (e.g. efflen@85: the effective length, the longest evaluated length whose exact match is "
             ">= 85%, shorter ones as they may be)")
    examples, max_pct = ("efflen@85",), 100.0

    def value(self, metric: Metric, acc: dict, train_len: Optional[int]) -> Value:
        passing = [n for n, (ok, value, *_) in acc.items() if ok and value is not None and value >= metric.share]
        return (True, float(max(passing, default=0))) if acc else (None, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = effective length (Hsieh et al. 2024, RULER): the longest evaluated length whose "
                f"exact-match accuracy is >= {metric.share:.0%}, whatever the shorter ones score (0: none); it is "
                f"maxlen@acc{metric.share * 100:g} when accuracy falls with length, and longer when a dip recovers.")
