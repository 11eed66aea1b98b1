"""The summary metrics of one run's row (``--metric``: ratio, ppl@, ratio@, maxlen, auc, gain), and the
lengths the ratio and the plain auc are taken at, common to every run of the report."""

from __future__ import annotations

import math
from typing import Optional

from posexp.reporting.runs import context_gain
from posexp.reporting.selection import Metric
from posexp.reporting.table import Cell, Report, ReportRow


def common_ratio_length(rows: list[ReportRow], lengths: list[int], train_len: Optional[int]) -> Optional[int]:
    """The longest length beyond training where every run that extrapolates at all has a perplexity.

    Using one common length keeps the ratio comparable across runs: a run that
    cannot go past 512 tokens would otherwise be compared at 512 against others at 8k.
    A run with no perplexity past the training length (learned positions at their
    table size) has no ratio, and does not take the others' away.
    """
    if train_len is None:
        return None
    usable = [row for row in rows if any(c.applicable for n, c in row.cells.items() if n > train_len)]
    for length in reversed(lengths):
        if length <= train_len:
            return None
        if usable and all(row.cells.get(length, Cell()).applicable for row in usable):
            return length
    return None


def ratio_of(row: ReportRow, length: int) -> Optional[float]:
    at_len = row.cells.get(length, Cell())
    at_train = row.cells.get(row.run.train_len, Cell()) if row.run.train_len is not None else Cell()
    if not (at_len.applicable and at_train.applicable) or not at_train.ppl:
        return None
    return at_len.ppl / at_train.ppl


def metric_value(metric: Metric, row: ReportRow, report: "Report") -> tuple[Optional[bool], Optional[float]]:
    """One run's value of ``metric``: (True, value), (False, None) = n/a, (None, None) = not evaluated."""
    if metric.kind == "ratio":
        if report.ratio_length is None or row.ratio is None:
            return False, None
        return True, row.ratio
    cells, train_len = row.cells, row.run.train_len
    if train_len is None:
        return None, None
    if metric.kind == "gain":
        return context_gain(row.run, train_len, metric.at(train_len), report.window)
    at_train = cells.get(train_len)
    if metric.kind == "ppl_at":
        cell = cells.get(metric.at(train_len))
        return (None, None) if cell is None else (bool(cell.applicable), cell.ppl if cell.applicable else None)
    if at_train is None:
        return None, None
    if not at_train.applicable or not at_train.ppl:
        return False, None
    if metric.kind == "ratio_at":
        cell = cells.get(metric.at(train_len))
        if cell is None:
            return None, None
        return (True, cell.ppl / at_train.ppl) if cell.applicable else (False, None)
    if metric.kind == "maxlen":
        limit = (1 + metric.tolerance) * at_train.ppl
        best = train_len
        for length in sorted(n for n in cells if n > train_len):
            cell = cells[length]
            if not cell.applicable or cell.ppl is None or cell.ppl > limit:
                break
            best = length
        return True, float(best)
    # auc
    multiple = metric.multiple if metric.multiple is not None else report.auc_multiple
    if not multiple or multiple <= 1:
        return False, None
    upper = int(round(multiple * train_len))
    if upper not in cells:
        return None, None
    span = [n for n in sorted(cells) if train_len <= n <= upper]
    if any(not cells[n].applicable or not cells[n].ppl or cells[n].ppl <= 0 for n in span):
        return False, None
    xs = [math.log2(n) for n in span]
    ys = [math.log(cells[n].ppl) for n in span]
    return True, sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(span) - 1))


def auc_span_multiple(rows: list[ReportRow]) -> Optional[float]:
    """The span of plain ``auc``: the largest multiple of its training length that every run was evaluated at."""
    reach = []
    for row in rows:
        train_len = row.run.train_len
        if train_len and row.cells:
            reach.append(max(row.cells) / train_len)
    return min(reach) if reach else None

