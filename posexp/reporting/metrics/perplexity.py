"""The summary metrics of a language-model run's perplexity-vs-length curve: ratio, ratio@, ppl@, gain, maxlen, auc;
and the lengths the plain ratio and auc are taken at, common to every run of the report.

Each value function reads the run's :class:`~posexp.reporting.table.ReportRow` (``row.cells``: length -> Stat of
the rows the table shows) and the :class:`~posexp.reporting.table.Report`.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from posexp.reporting.metrics import HIGHER, LOWER, Metric, MetricSpec, Value, ValueAt, longest
from posexp.reporting.runs import window_key


def common_ratio_length(rows: list[Any], lengths: list[int], train_len: Optional[int]) -> Optional[int]:
    """The longest length beyond training where every run that extrapolates at all has a perplexity.

    Using one common length keeps the ratio comparable across runs: a run that
    cannot go past 512 tokens would otherwise be compared at 512 against others at 8k.
    A run with no perplexity past the training length (learned positions at their
    table size) has no ratio, and does not take the others' away. Beyond training is
    beyond each run's own training length (``train_len`` is the majority's): at its own
    length a run's ratio is 1 by construction, which reads as no loss at all.
    """
    if train_len is None:
        return None

    def beyond(row: Any, length: int) -> bool:
        return length > (row.run.train_len or train_len)

    usable = [row for row in rows if any(c.applicable for n, c in row.cells.items() if beyond(row, n))]
    for length in reversed(lengths):
        if length <= train_len:
            return None
        if usable and all(beyond(row, length) and length in row.cells and row.cells[length].applicable
                          for row in usable):
            return length
    return None


def ratio_of(row: Any, length: int) -> Optional[float]:
    if row.run.train_len is not None and length <= row.run.train_len:
        return None  # at or below its own training length: 1 by construction, no ratio
    at_len = row.cells.get(length)
    at_train = row.cells.get(row.run.train_len) if row.run.train_len is not None else None
    if at_len is None or at_train is None or not (at_len.applicable and at_train.applicable) or not at_train.mean:
        return None
    return at_len.mean / at_train.mean


def auc_span_multiple(rows: list[Any]) -> Optional[float]:
    """The span of plain ``auc``: the largest multiple of its training length that every run was evaluated at."""
    reach = []
    for row in rows:
        train_len = row.run.train_len
        if train_len and row.cells:
            reach.append(max(row.cells) / train_len)
    return min(reach) if reach else None


def _at_train(row: Any) -> tuple[Optional[Value], Any]:
    """(None, the cell at the training length) when it has a perplexity; else (the value to return, None)."""
    train_len = row.run.train_len
    if train_len is None or train_len not in row.cells:
        return (None, None), None
    cell = row.cells[train_len]
    if not cell.applicable or not cell.mean:
        return (False, None), None
    return None, cell


def _cells(row: Any) -> dict[int, Value]:
    return {n: (cell.applicable, cell.mean) for n, cell in row.cells.items()}


class Ratio(MetricSpec):
    kind, pattern, forms, examples = "ratio", "ratio", "ratio", ("ratio",)
    better, decimals = LOWER, 2

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        if report.ratio_length is None:
            return False, None
        if row.ratio is None:  # not evaluated at 1x or at the ratio's length (in the rows shown): missing, not n/a
            evaluated = all(n in row.cells for n in (row.run.train_len, report.ratio_length))
            return (False if evaluated else None), None
        return True, row.ratio

    def describe(self, metric: Metric, report: Any) -> str:
        if report.ratio_length is None:
            return ("ratio = ppl at the longest length / ppl at the training length; n/a here because no length "
                    "beyond the training length has a perplexity for every run.")
        others = report.other_train_lens(compared=True)
        base = (f"the training length ({report.train_len})" if not others else
                f"each run's own training length ({report.train_len}; {others})")
        return (f"ratio = ppl at {report.ratio_length} / ppl at {base}; "
                f"{report.ratio_length} is the longest length every run that goes past its training length reaches.")


class RatioAt(MetricSpec):
    kind, pattern, forms = "ratio_at", "ratio@{at}", "ratio@Kx (e.g. ratio@8x), ratio@N (N tokens)"
    examples, better, decimals = ("ratio@4x", "ratio@8x"), LOWER, 2

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        early, at_train = _at_train(row)
        if early is not None:
            return early
        cell = row.cells.get(metric.at(row.run.train_len))
        if cell is None:
            return None, None
        return (True, cell.mean / at_train.mean) if cell.applicable else (False, None)

    def describe(self, metric: Metric, report: Any) -> str:
        return f"{metric.name} = ppl at {metric.where()} / ppl at the training length (lower is better; 1 = no loss)."


class PplAt(ValueAt):
    kind, pattern, forms = "ppl_at", "ppl@{at}", "ppl@Kx, ppl@N"
    examples, better, decimals = ("ppl@4x", "ppl@8x"), LOWER, 2

    def values(self, row: Any, report: Any) -> dict[int, Value]:
        return _cells(row)  # the cells: per byte where the report compares per byte

    def describe(self, metric: Metric, report: Any) -> str:
        return f"{metric.name} = perplexity at {metric.where()}."


class Gain(MetricSpec):
    kind, pattern, forms, examples = "gain", "gain", "gain", ("gain",)
    better, decimals, relative = HIGHER, 3, False  # a difference of losses: 0 is "no gain"

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        """Loss of the run's ``last_k`` rows, in the window the table shows, at the training length minus at the
        metric's length (the longest one when it names none), unscaled: the same last K tokens scored with more
        context (Kazemnejad et al. 2023). (None, None) without them."""
        train_len, length = row.run.train_len, metric.at(row.run.train_len)
        losses = {int(r["length"]): r.get("loss") for r in row.run.rows
                  if r.get("protocol") == "last_k" and r.get("scaling") is None and window_key(r) == report.window}
        if train_len is None or train_len not in losses:
            return None, None
        target = length if length is not None else max(losses)
        if target not in losses or target == train_len and length is None:
            return None, None
        if losses[train_len] is None or losses[target] is None:
            return False, None
        return True, losses[train_len] - losses[target]

    def describe(self, metric: Metric, report: Any) -> str:
        at = metric.where() if metric.length is not None or metric.multiple is not None else \
            "the longest last_k length"
        return (f"{metric.name} = context gain: loss (nats/token) of the same last K tokens at the training length "
                f"minus at {at}, from eval.protocol=last_k rows (Kazemnejad et al. 2023's setting, which scores "
                "the same tokens at every length); > 0: the model profits from context longer than it trained "
                "with; n/a without last_k rows.")


class GainAt(Gain):
    kind, pattern, forms, examples = "gain_at", "gain@{at}", "gain@Kx", ("gain@4x",)


class MaxLen(MetricSpec):
    kind, pattern, forms, examples = "maxlen", "maxlen@{pct}%", "maxlen, maxlen@P% (e.g. maxlen@10%)", \
        ("maxlen", "maxlen@10%")
    better, decimals = HIGHER, 0
    bounds = (0.0, math.inf)  # a length: 256 and 384 tokens over two seeds are 320 [0, 1133], not down to −493

    def bare(self, tolerance: float) -> Optional[str]:
        from posexp.reporting.selection import check_tolerance

        check_tolerance(tolerance)
        return f"maxlen@{tolerance * 100:g}%"

    def error(self, raw: str, text: str) -> str:
        return (f"{raw!r}: the tolerance is a percentage, e.g. maxlen@10% (ppl within +10% of the training-length "
                "value)")

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        early, at_train = _at_train(row)
        if early is not None:
            return early
        limit = (1 + (metric.fraction or 0.0)) * at_train.mean
        return True, float(longest(_cells(row), row.run.train_len + 1, lambda ppl: ppl <= limit, row.run.train_len))

    def describe(self, metric: Metric, report: Any) -> str:
        return (f"{metric.name} = the longest evaluated length (tokens) up to which every evaluated length keeps "
                f"ppl within +{metric.fraction:.0%} of the training-length ppl (higher is better; capped at the "
                "longest length evaluated).")


class Auc(MetricSpec):
    kind, pattern, forms, examples = "auc", "auc", "auc", ("auc",)
    better, decimals = LOWER, 2

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        early, _ = _at_train(row)
        if early is not None:
            return early
        train_len, cells = row.run.train_len, row.cells
        multiple = metric.multiple if metric.multiple is not None else report.auc_multiple
        if not multiple or multiple <= 1:
            return False, None
        upper = int(round(multiple * train_len))
        if upper not in cells:
            return None, None
        span = [n for n in sorted(cells) if train_len <= n <= upper]
        if any(not cells[n].applicable or not cells[n].mean or cells[n].mean <= 0 for n in span):
            return False, None
        xs = [math.log2(n) for n in span]
        ys = [math.log(cells[n].mean) for n in span]
        return True, sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(span) - 1))

    def describe(self, metric: Metric, report: Any) -> str:
        upper = metric.multiple if metric.multiple is not None else report.auc_multiple
        span = f"1× to {upper:g}× the training length" if upper else "1× to the longest common multiple (none here)"
        return (f"{metric.name} = area under ln(ppl) over log2(context length), trapezoid rule over the evaluated "
                f"lengths from {span} (nats × octaves; lower is better; n/a when a length in the span is n/a).")


class AucAt(Auc):
    kind, pattern, forms, examples = "auc_at", "auc@{x}", "auc@Kx", ("auc@16x",)
    min_multiple = 1.0

    def error(self, raw: str, text: str) -> str:
        return f"{raw!r}: auc takes the upper end of its span as a multiple above 1, e.g. auc@16x"
