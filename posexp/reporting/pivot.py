"""Any key as a column: ``posexp report DIRS --by KEY --cols KEY`` pivots the result rows of the runs.

``--cols`` names a row key (``window``, ``scaling``, ``protocol``) or a run key (``seed``, ``encoder``,
``base``, any dotted config key); its values become the table's columns, the first of them the baseline, and
every other column shows its difference to the baseline beside it, paired run by run (the same model measured
two ways, or the same seed trained two ways). ``--by`` names the lines (one per value, seeds averaged); the
lengths are the table's rows within a line, so the table grows down, not across.

What the table does not pivot on stays fixed at its plain value: the ``nonoverlap`` protocol, no scaling, no
window, the perplexity metric. With ``--cols window``, each window also gets a paired verdict against its own
plain rows ("beats its own window at 8×", :func:`posexp.reporting.difference.window_verdicts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.difference import window_verdicts
from posexp.reporting.frame import NO_SCALING, run_records
from posexp.reporting.runs import Run
from posexp.reporting.stats import mean_interval
from posexp.reporting.tables import Column, Section, Table, TableCell
from posexp.runs.row import VIEW_KEY

# a row key only an evaluation setting gives a row, and how to make such rows
MADE_BY = {"window": "the runs were never evaluated with an attention window; make such rows with "
                     "`posexp eval RUN eval.window=128` (eval.sinks=4 to keep sink tokens), then report again",
           "sinks": "the runs were never evaluated with sink tokens; make such rows with "
                    "`posexp eval RUN eval.window=128 eval.sinks=4`, then report again"}

# what stays fixed unless pivoted on, and the value it is fixed at
FIXED = {"protocol": "nonoverlap", "scaling": NO_SCALING, "window": None, "sinks": None, "metric": "perplexity"}


@dataclass
class PivotCell:
    """The runs' perplexities in one cell, and their differences to the baseline column (paired by run)."""

    values: dict[Any, float] = field(default_factory=dict)  # run (or seed) -> perplexity
    diffs: list[float] = field(default_factory=list)

    @property
    def mean(self) -> Optional[float]:
        return mean_interval(list(self.values.values()))[0] if self.values else None

    def diff(self) -> tuple[Optional[float], Optional[float], Optional[float]]:
        """Mean difference to the baseline column with its 95% paired t-interval (None: n < 2)."""
        return mean_interval(self.diffs) if self.diffs else (None, None, None)


@dataclass
class Pivot:
    """Lines (``--by`` values) × lengths × columns (``--cols`` values, the first the baseline)."""

    by: list[str]
    cols: list[str]
    columns: list[tuple]
    lines: list[tuple]
    lengths: dict[tuple, list[int]]
    cells: dict[tuple, PivotCell]
    notes: list[str] = field(default_factory=list)

    def cell(self, line: tuple, length: int, column: tuple) -> PivotCell:
        return self.cells.get((line, length, column), PivotCell())


def show_value(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def label(keys: Sequence[str], values: tuple) -> str:
    if list(keys) == ["label"]:  # no --by: a line per run, named by its overrides
        return show_value(values[0])
    return " ".join(f"{k}={show_value(v)}" for k, v in zip(keys, values)) or "all runs"


def build_pivot(runs: list[Run], by: Sequence[str], cols: Sequence[str]) -> Pivot:
    """The pivot of ``runs``' perplexity rows (see the module docstring).

    Raises:
        ConfigError: for ``--cols``: no key, or a key no run or row has.
    """
    cols, by = list(cols), list(by) or ["label"]
    if not cols:
        raise ConfigError("--cols", "give a row or run key, e.g. --cols window, --cols scaling, --cols seed")
    keys = [k for k in (*by, *cols) if "." in k or k in ("base",)]
    records = [r for run in runs for r in run_records(run, keys)]
    for key in cols:
        if key in MADE_BY and not any(r.get(key) is not None for r in records):
            raise ConfigError("--cols", f"no row has a {key}: {MADE_BY[key]}")
        if not any(key in r for r in records):
            raise ConfigError("--cols", f"unknown key {key!r}: no run or row has it; e.g. window, scaling, protocol, "
                                        "seed, encoder, base")
    # a window's sink tokens belong to it: pivoting on the window shows each window with its sinks
    free = {*cols, *by, *(("sinks",) if "window" in cols or "window" in by else ())}
    fixed = {k: v for k, v in FIXED.items() if k not in free}
    chosen = [r for r in records if all(r.get(k) == v for k, v in fixed.items()) and r.get("ppl") is not None]
    columns = list(dict.fromkeys(tuple(r.get(k) for k in cols) for r in chosen))
    columns.sort(key=lambda c: [(v not in (None, NO_SCALING), str(v)) for v in c])  # plain first: the baseline
    lines = list(dict.fromkeys(tuple(r.get(k) for k in by) for r in chosen))
    per_run: dict[tuple, dict] = {}
    for r in chosen:
        line, column = tuple(r.get(k) for k in by), tuple(r.get(k) for k in cols)
        per_run.setdefault((line, int(r["length"]), column), {}).setdefault(_pair_key(r, cols), float(r["ppl"]))
    pivot = Pivot(by, cols, columns, lines, {}, {})
    for (line, length, column), values in per_run.items():
        base = per_run.get((line, length, columns[0]), {})
        cell = PivotCell(values, [v - base[k] for k, v in values.items() if k in base and column != columns[0]])
        pivot.cells[(line, length, column)] = cell
        pivot.lengths.setdefault(line, [])
        if length not in pivot.lengths[line]:
            pivot.lengths[line].append(length)
    for line in lines:
        pivot.lengths[line] = sorted(pivot.lengths.get(line, []))
    if "window" in cols:
        pivot.notes += _window_notes(pivot, runs)
    return pivot


def _pair_key(record: dict, cols: list[str]) -> Any:
    """What pairs a cell's value with the baseline's: the run (same model, measured two ways), or, when the
    columns are run keys, the seed (same data order and initialisation, trained two ways)."""
    return record["run"] if set(cols) <= {*VIEW_KEY, "metric"} else record.get("seed")


def _window_notes(pivot: Pivot, runs: list[Run]) -> list[str]:
    """Per line and window, whether the runs beat their own window, paired run by run."""
    train_len = next((r.train_len for r in runs if r.train_len), None)
    notes = []
    plain = next((c for c in pivot.columns if c[pivot.cols.index("window")] is None), None)
    for line in pivot.lines:
        for column in pivot.columns:
            if column == plain or plain is None:
                continue
            per_run: dict[Any, dict[int, tuple[float, float]]] = {}
            for length in pivot.lengths[line]:
                mine, theirs = pivot.cell(line, length, plain).values, pivot.cell(line, length, column).values
                for run in mine.keys() & theirs.keys():
                    per_run.setdefault(run, {})[length] = (mine[run], theirs[run])
            if not per_run:
                continue
            verdicts = window_verdicts(list(per_run.values()), train_len)
            said = "; ".join(v.text for v in verdicts.values())
            notes.append(f"{label(pivot.by, line)} against {label(pivot.cols, column)}: {said}")
    return notes


# -- rendering -------------------------------------------------------------------------------------------

def as_number(value: Optional[float], signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return (f"{value:+.2f}".replace("-", "−")) if signed else f"{value:.2f}"


def _text(pivot: Pivot, line: tuple, length: int, column: tuple) -> str:
    cell = pivot.cell(line, length, column)
    if cell.mean is None:
        return "—"
    text = as_number(cell.mean)
    diff, low, high = cell.diff()
    if diff is not None:
        text += f" ({as_number(diff, True)}"
        text += f" [{as_number(low, True)}, {as_number(high, True)}])" if low is not None else ")"
    return text


def as_table(pivot: Pivot) -> Table:
    """The pivot as a :class:`~posexp.reporting.tables.Table`: a line per ``--by`` value and length."""
    names = [label(pivot.cols, c) + (" (baseline)" if i == 0 else " (Δ)") for i, c in enumerate(pivot.columns)]
    columns = [Column(", ".join(pivot.by) if pivot.by != ["label"] else "run", label=True), Column("length"),
               *(Column(name, wrap=True) for name in names)]
    rows = [[TableCell(label(pivot.by, line) if i == 0 else ""), TableCell(str(n)),
             *(TableCell(_text(pivot, line, n, c)) for c in pivot.columns)]
            for line in pivot.lines for i, n in enumerate(pivot.lengths[line])]
    records: list[list[Any]] = [[*pivot.by, "length", *pivot.cols, "ppl", "n", "diff_vs_baseline", "diff_low",
                                  "diff_high"]]
    cells: list[dict] = []
    for line in pivot.lines:
        for n in pivot.lengths[line]:
            for column in pivot.columns:
                cell = pivot.cell(line, n, column)
                if cell.mean is not None:
                    diff, low, high = cell.diff()
                    records.append([*line, n, *column, cell.mean, len(cell.values), diff, low, high])
                    cells.append({**dict(zip(pivot.by, line)), "length": n, **dict(zip(pivot.cols, column)),
                                  "ppl": cell.mean, "n": len(cell.values), "diff_vs_baseline": diff,
                                  "diff_low": low, "diff_high": high})
    document = {"by": pivot.by, "cols": pivot.cols, "baseline": dict(zip(pivot.cols, pivot.columns[0]))
                if pivot.columns else None, "cells": cells, "notes": pivot.notes}
    return Table(f"perplexity by {', '.join(pivot.cols)}", columns, [Section(rows)], caption(pivot), pivot.notes,
                 csv=records, json=document)


def caption(pivot: Pivot) -> str:
    free = {*pivot.cols, *pivot.by, "metric", *(("sinks",) if "window" in (*pivot.cols, *pivot.by) else ())}
    fixed = ", ".join(f"{k}={show_value(v)}" for k, v in FIXED.items() if k not in free)
    return (f"Perplexity by length, columns by {', '.join(pivot.cols)} ({fixed}); beside each column its "
            "difference to the baseline column, paired run by run (mean over runs, 95% t-interval when n ≥ 2).")
