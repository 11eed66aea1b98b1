"""Any key as a column: ``posexp report DIRS --by KEY --cols KEY`` pivots the result rows of the runs.

``--cols`` names a row key (``window``, ``scaling``, ``protocol``) or a run key (``seed``, ``encoder``,
``base``, any dotted config key); its values become the table's columns, the first of them the baseline, and
every other column shows its difference to the baseline beside it. ``--by`` names the lines (one per value, seeds
averaged; without it, a line per model: the runs' labels less their ``eval.*`` and ``task`` settings); the
lengths are the table's rows within a line, so the table grows down, not across.

A difference is taken only between measurements made alike. Over a row key, the same model
(:func:`~posexp.reporting.runs.model_identity`: a pretrained model's weights, a trained run's config hash) at the
same length on the same tokens (:func:`~posexp.reporting.runs.measured_on`), whichever folder holds each: a
sweep of ``eval.scaling=none,yarn`` writes a folder per scaling. Over a run key, the runs alike in every other
override (the same seed: same data order and initialisation, trained two ways). A note says which values found no
such partner, and why.

The table shows every measure the rows hold, each in its own columns: perplexity, any other perplexity-row
metric the registry declares a row field for (``ppl_key``), and each task's exact match (%; the mean over depths),
so that ``--cols scaling`` over a model's perplexity rows and a zero-shot passkey run gives one table. What the
table does not pivot on stays fixed at its plain value: the ``nonoverlap`` protocol (teacher-forced for a task),
no scaling, no window. With ``--cols window``, each window also gets a paired verdict against its own plain rows
("beats its own window at 8×", :func:`posexp.reporting.difference.window_verdicts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.difference import window_verdicts
from posexp.reporting.formatting import MISSING, fmt_value, joined
from posexp.reporting.frame import LM_TASK, NO_SCALING, run_records
from posexp.reporting.runs import Run, measured_on, model_identity
from posexp.reporting import selection
from posexp.reporting.stats import mean_interval
from posexp.reporting.tables import Column, Section, Table, TableCell
from posexp.reporting.views import MAIN_PROTOCOL, view_text
from posexp.runs.row import VIEW_KEY, factor_text, fixed_factor

# a row key only an evaluation setting gives a row, and how to make such rows
MADE_BY = {"window": "the runs were never evaluated with an attention window; make such rows with "
                     "`posexp eval RUN eval.window=128` (eval.sinks=4 to keep sink tokens), then report again",
           "sinks": "the runs were never evaluated with sink tokens; make such rows with "
                    "`posexp eval RUN eval.window=128 eval.sinks=4`, then report again"}

# what stays fixed unless pivoted on, and the value it is fixed at (a task's rows: their own protocol)
FIXED = {"protocol": MAIN_PROTOCOL, "scaling": NO_SCALING, "window": None, "sinks": None}


@dataclass(frozen=True)
class Measure:
    """What a group of the table's columns shows: a row field of the rows of one task (``lm``: perplexity rows)."""

    name: str
    task: str
    field: str
    scale: float = 1.0
    decimals: int = 2
    span: float = math.inf  # the most two values can differ by (an accuracy in %: 100 points); inf: no bound


PPL = Measure("ppl", LM_TASK, "ppl")


@dataclass
class PivotCell:
    """The values in one cell, and their differences to the baseline column's (paired as the module says)."""

    values: dict[Any, float] = field(default_factory=dict)  # pair key -> value
    diffs: list[float] = field(default_factory=list)

    @property
    def mean(self) -> Optional[float]:
        return mean_interval(list(self.values.values()))[0] if self.values else None

    def diff(self, span: float = math.inf) -> tuple[Optional[float], Optional[float], Optional[float]]:
        """Mean difference to the baseline column with its 95% paired t-interval (None: n < 2), cut at ``±span``,
        beyond which no difference of two values lies (:attr:`Measure.span`), as the comparisons cut theirs."""
        if not self.diffs:
            return None, None, None
        mean, low, high = mean_interval(self.diffs)
        return mean, None if low is None else max(low, -span), None if high is None else min(high, span)


@dataclass
class Pivot:
    """Lines (``--by`` values) × lengths × columns (``--cols`` values, the first the baseline) × measures."""

    by: list[str]
    cols: list[str]
    columns: list[tuple]
    lines: list[tuple]
    lengths: dict[tuple, list[int]]
    cells: dict[tuple, PivotCell]
    notes: list[str] = field(default_factory=list)
    measures: list[Measure] = field(default_factory=lambda: [PPL])
    by_model: bool = True  # pairs are the same model on the same tokens (a row key pivoted), else the same seed
    fixed: dict[str, Any] = field(default_factory=dict)  # what the table does not pivot on: the value it is fixed at

    def cell(self, line: tuple, length: int, column: tuple, measure: Measure = PPL) -> PivotCell:
        return self.cells.get((line, length, column, measure), PivotCell())


def show_value(value: Any) -> str:
    """A key's value as a line or column of the pivot: as the report's groups spell it
    (:func:`~posexp.reporting.selection.show_value`), but null is "none" (no window, no scaling), not missing."""
    return "none" if value is None else selection.show_value(value)


def label(keys: Sequence[str], values: tuple) -> str:
    if list(keys) == ["label"]:  # no --by: a line per model, named by its overrides
        return show_value(values[0])
    return " ".join(f"{k}={show_value(v)}" for k, v in zip(keys, values)) or "all runs"


def _kept_overrides(run: Run, cols: list[str]) -> Optional[list[str]]:
    """The run's overrides less those of the pivoted keys and those that only say how it was measured (``eval.*``,
    ``task``); None when it recorded none."""
    overrides = run.info.get("overrides")
    if not isinstance(overrides, list):
        return None
    return [o for o in map(str, overrides) if not o.lstrip("+").startswith(("eval.", "task=", "task."))
            and o.split("=", 1)[0].lstrip("+") not in cols]


def _model_label(run: Run, cols: list[str]) -> str:
    """A line of a pivot without ``--by``: the run's label less the pivoted keys and how it was measured."""
    kept = _kept_overrides(run, cols)
    return str(run.info.get("label") or "default") if kept is None else " ".join(kept) or "default"


def _other_settings(run: Run, cols: list[str]) -> tuple:
    """What pairs runs across run-key columns: their other overrides (e.g. the same seed trained with two
    encodings); the folder when the run recorded no overrides."""
    kept = _kept_overrides(run, cols)
    return (str(run.path),) if kept is None else tuple(sorted(kept))


def _measures(records: list[dict]) -> list[Measure]:
    """Perplexity (and ``ppl_key`` where rows carry it), then each task's exact match, as the rows hold them."""
    measures = []
    lm = [r for r in records if r.get("metric", "perplexity") == "perplexity" and r.get("task") == LM_TASK]
    if any(r.get("ppl") is not None for r in lm):
        measures.append(PPL)
    if any(r.get("ppl_key") is not None for r in lm):
        measures.append(Measure("ppl_key", LM_TASK, "ppl_key"))
    for task in dict.fromkeys(str(r.get("task")) for r in records if r.get("metric") == "accuracy"):
        measures.append(Measure(f"{task} acc", task, "exact_match", 100.0, 1, span=100.0))
    return measures


def build_pivot(runs: list[Run], by: Sequence[str], cols: Sequence[str]) -> Pivot:
    """The pivot of ``runs``' rows (see the module docstring).

    Raises:
        ConfigError: for ``--cols``: no key, a ``by`` key, or a key no run or row has.
    """
    cols, by = list(cols), list(by) or ["label"]
    if not cols:
        raise ConfigError("--cols", "give a row or run key, e.g. --cols window, --cols scaling, --cols seed")
    if both := [k for k in cols if k in by]:  # its lines would each hold one column: nothing is set side by side
        raise ConfigError("--cols", f"{', '.join(both)} {'is a --by key' if len(both) == 1 else 'are --by keys'} too; "
                                    "a key is either the lines (--by) or the columns (--cols), e.g. --by encoder "
                                    "--cols seed")
    keys = [k for k in (*by, *cols) if "." in k or k in ("base",)]
    identity = {str(run.path): model_identity(run) for run in runs}
    lines_of = {str(run.path): _model_label(run, cols) for run in runs}
    settings_of = {str(run.path): _other_settings(run, cols) for run in runs}
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
    measures = _measures(records)
    by_model = set(cols) <= {*VIEW_KEY, "metric"}
    kept = [r for r in records if all(r.get(k) == v for k, v in fixed.items()
                                      if not (r.get("metric") == "accuracy" and k == "protocol"))]
    value_of = _column_values(kept, cols)
    # value per (line, length, column, measure) and pair key; a task's depths averaged per run first
    per_run: dict[tuple, dict[Any, list[float]]] = {}
    for r in kept:
        for m in (m for m in measures if m.task == r.get("task") and r.get(m.field) is not None):
            line = tuple(lines_of[r["run"]] if k == "label" else _hashable(r.get(k)) for k in by)
            pair = (identity[r["run"]], measured_on(r)) if by_model else settings_of[r["run"]]
            per_run.setdefault((line, int(r["length"]), tuple(value_of(r, k) for k in cols), m), {}) \
                .setdefault(pair, []).append(float(r[m.field]) * m.scale)
    columns = list(dict.fromkeys(key[2] for key in per_run))
    columns.sort(key=lambda c: [(v not in (None, NO_SCALING), str(v)) for v in c])  # plain first: the baseline
    lines = list(dict.fromkeys(key[0] for key in per_run))
    pivot = Pivot(by, cols, columns, lines, {}, {}, measures=[m for m in measures if any(k[3] == m for k in per_run)],
                  by_model=by_model, fixed=fixed)
    for (line, length, column, measure), lists in per_run.items():
        values = {k: sum(v) / len(v) for k, v in lists.items()}
        base = {k: sum(v) / len(v) for k, v in per_run.get((line, length, columns[0], measure), {}).items()}
        cell = PivotCell(values, [v - base[k] for k, v in values.items() if k in base and column != columns[0]])
        pivot.cells[(line, length, column, measure)] = cell
        if length not in pivot.lengths.setdefault(line, []):
            pivot.lengths[line].append(length)
    for line in lines:
        pivot.lengths[line] = sorted(pivot.lengths.get(line, []))
    pivot.notes += _unpaired_notes(pivot, records, identity)
    if "window" in cols:
        pivot.notes += _window_notes(pivot, runs)
    return pivot


def _setting(row: dict, key: str, cols: Sequence[str]) -> str:
    """What else a row was measured with under its value of the pivoted ``key``: a window's sink tokens
    (``sinks=4``), a scaling's fixed factor and a position remapping's options (``×8``, ``offset=64 local=4``)."""
    if key == "window" and "sinks" not in cols and row.get("sinks"):
        return f"sinks={row['sinks']}"
    if key == "scaling" and isinstance(row.get("train_len"), int):
        fixed = fixed_factor(row, row["train_len"])
        factor = "" if fixed is None else factor_text(row["scaling"], fixed)
        return f"{factor} {row.get('scaling_options') or ''}".strip()
    return ""


def _column_values(records: list[dict], cols: Sequence[str]):
    """``value(row, key)``: the row's value of the pivoted ``key``, followed by what else it was measured with
    (:func:`_setting`) where rows of that value were measured with several settings, so that each setting is a
    column of its own rather than averaged with the others as if it were another measurement of one."""
    settings: dict[tuple, set[str]] = {}
    for r in records:
        for k in cols:
            settings.setdefault((k, _hashable(r.get(k))), set()).add(_setting(r, k, cols))

    def value(row: dict, key: str) -> Any:
        plain, setting = _hashable(row.get(key)), _setting(row, key, cols)
        return f"{show_value(plain)} {setting}" if setting and len(settings[(key, plain)]) > 1 else plain

    return value


def _hashable(value: Any) -> Any:
    """A key's value as a line or column of the pivot: a list or mapping (``model.lst=[1,2]``) as the text
    :func:`show_value` shows it, which can key a cell."""
    return show_value(value) if isinstance(value, (list, dict)) else value


def _unpaired_notes(pivot: Pivot, records: list[dict], identity: dict[str, tuple]) -> list[str]:
    """Per column other than the baseline: how many of its values found no partner in the baseline column, and why
    (another model, or the same model measured on other tokens)."""
    if not pivot.by_model or len(pivot.columns) < 2:
        return []
    notes = []
    for column in pivot.columns[1:]:
        lonely, other_tokens = 0, 0
        total = 0
        for (line, length, col, measure), cell in pivot.cells.items():
            if col != column:
                continue
            base = pivot.cell(line, length, pivot.columns[0], measure).values
            total += len(cell.values)
            for model, tokens in (k for k in cell.values if k not in base):
                lonely += 1
                other_tokens += any(m == model for m, _ in base)
        if not lonely:
            continue
        why = []
        if other_tokens:
            why.append(f"{other_tokens} measured on other tokens than the baseline's (eval.tokens, examples or seed "
                       "differ: evaluate both with the same ones)")
        if lonely - other_tokens:
            why.append(f"{lonely - other_tokens} without a baseline measurement of the same model")
        notes.append(f"{label(pivot.cols, column)}: {lonely} of {total} values have no difference to the baseline "
                     f"column, which pairs only the same model at the same length on the same tokens: "
                     + "; ".join(why))
    return notes


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

def _text(pivot: Pivot, line: tuple, length: int, column: tuple, measure: Measure = PPL) -> str:
    cell, d = pivot.cell(line, length, column, measure), measure.decimals
    if cell.mean is None:
        return MISSING
    text = fmt_value(cell.mean, d)
    diff, low, high = cell.diff(measure.span)
    if diff is not None:
        text += f" ({fmt_value(diff, d, True)}"
        text += f" [{fmt_value(low, d, True)}, {fmt_value(high, d, True)}])" if low is not None else ")"
    return text


def as_table(pivot: Pivot) -> Table:
    """The pivot as a :class:`~posexp.reporting.tables.Table`: a line per ``--by`` value and length, a column per
    measure and ``--cols`` value (the measure named only when there are several)."""
    several = pivot.measures != [PPL]
    shown = [(m, c) for m in pivot.measures for c in pivot.columns]
    names = [(f"{m.name} " if several else "") + label(pivot.cols, c) + (" (baseline)" if c == pivot.columns[0]
                                                                         else " (Δ)") for m, c in shown]
    columns = [Column(", ".join(pivot.by) if pivot.by != ["label"] else "run", label=True), Column("length"),
               *(Column(name, wrap=True) for name in names)]
    rows = [[TableCell(label(pivot.by, line) if i == 0 else ""), TableCell(str(n)),
             *(TableCell(_text(pivot, line, n, c, m)) for m, c in shown)]
            for line in pivot.lines for i, n in enumerate(pivot.lengths[line])]
    cells: list[dict] = []
    for line in pivot.lines:
        for n in pivot.lengths[line]:
            for m, column in shown:
                cell = pivot.cell(line, n, column, m)
                if cell.mean is not None:
                    diff, low, high = cell.diff(m.span)
                    what = {"measure": m.name, "value": cell.mean} if several else {"ppl": cell.mean}
                    cells.append({**dict(zip(pivot.by, line)), "length": n, **dict(zip(pivot.cols, column)),
                                  **what, "n": len(cell.values), "diff_vs_baseline": diff,
                                  "diff_low": low, "diff_high": high})
    # the csv: the json's cells, a key both --by and --cols name in each of its columns
    header = [*pivot.by, "length", *pivot.cols, *(["measure", "value"] if several else ["ppl"]), "n",
              "diff_vs_baseline", "diff_low", "diff_high"]
    records: list[list[Any]] = [header, *([cell[k] for k in header] for cell in cells)]
    document = {"by": pivot.by, "cols": pivot.cols, "baseline": dict(zip(pivot.cols, pivot.columns[0]))
                if pivot.columns else None, "cells": cells, "notes": pivot.notes}
    return Table(f"{_what(pivot)} by {', '.join(pivot.cols)}", columns, [Section(rows)], caption(pivot),
                 pivot.notes, csv=records, json=document, keys=2)


def _what(pivot: Pivot) -> str:
    """What the table shows: ``perplexity``, or its measures (``perplexity and passkey exact match (%)``)."""
    names = [{"ppl": "perplexity", "ppl_key": "key-token perplexity"}.get(m.name, f"{m.task} exact match (%)")
             for m in pivot.measures] or ["perplexity"]
    return joined(names)


def caption(pivot: Pivot) -> str:
    paired = ("paired by model: the same model at the same length on the same tokens" if pivot.by_model else
              "paired run with run alike in every other override")
    return (f"{_what(pivot)[0].upper()}{_what(pivot)[1:]} by length, columns by {', '.join(pivot.cols)} ({view_text(pivot.fixed)}); "
            f"beside each column its difference to the baseline column, {paired} (mean over the pairs, 95% "
            "t-interval when n ≥ 2).")
