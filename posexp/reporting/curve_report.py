"""The extrapolation curves of a report's runs (``eval.during_training``): ``report_curve.png`` with one panel
per run (with ``--by``: per group, its runs pooled) and a section of ``report.md`` that says, for each
panel, how far each longer length ends from the training length and from which step on it stayed apart.

Reads each run's ``curve.csv`` through :mod:`posexp.runs.layout`; runs without one are left out, and a report
of runs that have none gets no section.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from posexp.reporting.formatting import NOT_APPLICABLE
from posexp.reporting.runs import Run
from posexp.reporting.tables import Column, Section, Table, TableCell, to_markdown
from posexp.runs.curve import read_curve
from posexp.runs.layout import PERPLEXITY, REPORT_CURVE_PLOT

MAX_PANELS = 24  # a figure of more panels is unreadable; the section says how many were left out
# a longer length "has diverged" from the step on which its perplexity stays above (1 + this) x the 1x one
DIVERGED = 0.10


@dataclass
class CurvePanel:
    """One panel: a run's curve, or a group's runs pooled (perplexity from the mean loss, accuracy averaged)
    at the (step, multiple) points every run of the group has."""

    label: str
    metric: str
    rows: list[dict]
    runs: int


def panels_of(report: Any = None, task_report: Any = None) -> list[CurvePanel]:
    """The panels of a perplexity report (:class:`~posexp.reporting.lm_report.Report`) and a task report: one per
    run, or per group when the report is grouped (``--by``), in the reports' order; runs without a curve
    left out."""
    named: list[tuple[str, list[Run]]] = []
    if report is not None:
        if report.by:
            named += [(g.label, [row.run for row in g.rows]) for g in report.groups]
        else:
            named += [(row.label, [row.run]) for g in report.groups for row in g.rows]
    if task_report is not None:
        named += [(f"{g.task}: {g.label}", list(g.runs)) for g in task_report.groups]
    panels = []
    for label, runs in named:
        panel = _pooled(label, runs)
        if panel is not None:
            panels.append(panel)
    return panels


def _pooled(label: str, runs: Sequence[Run]) -> Optional[CurvePanel]:
    curves = [read_curve(run.path) for run in runs]
    curves = [(metric, rows) for metric, rows in curves if metric is not None and rows]
    if not curves or len({metric for metric, _ in curves}) > 1:
        return None
    metric = curves[0][0]
    if len(curves) == 1:
        return CurvePanel(label, metric, curves[0][1], 1)
    points = [{(r["step"], r["multiple"]): r for r in rows} for _, rows in curves]
    shared = sorted(set.intersection(*(set(p) for p in points)))
    pooled = []
    for key in shared:
        group = [p[key] for p in points]
        if metric == PERPLEXITY:
            loss = math.fsum(r["loss"] for r in group) / len(group)
            pooled.append({"step": key[0], "multiple": key[1], "loss": loss, "ppl": math.exp(loss)})
        else:
            pooled.append({"step": key[0], "multiple": key[1],
                           "exact_match": math.fsum(r["exact_match"] for r in group) / len(group)})
    return CurvePanel(label, metric, pooled, len(curves))


def diverged_from(rows: Sequence[dict], multiple: float, tolerance: float = DIVERGED) -> tuple[Optional[float],
                                                                                             Optional[int]]:
    """For a perplexity curve: ppl at ``multiple`` over ppl at 1x at the last step both were measured, and the
    first step from which that ratio stayed above ``1 + tolerance`` at every later point (None: it did not,
    or ended within it)."""
    base = {r["step"]: r["ppl"] for r in rows if r["multiple"] == 1}
    ratios = sorted((r["step"], r["ppl"] / base[r["step"]]) for r in rows
                    if r["multiple"] == multiple and r["step"] in base and base[r["step"]])
    if not ratios:
        return None, None
    since = None
    for step, ratio in ratios:
        if not ratio > 1 + tolerance:
            since = None
        elif since is None:
            since = step
    return ratios[-1][1], since


def curve_table(panels: Sequence[CurvePanel]) -> Optional[Table]:
    """The perplexity panels' ratios at the last step (and from which step they stayed apart) as a
    :class:`~posexp.reporting.tables.Table`; None without perplexity panels past 1x."""
    lm = [p for p in panels if p.metric == PERPLEXITY]
    multiples = sorted({r["multiple"] for p in lm for r in p.rows if r["multiple"] > 1})
    if not lm or not multiples:
        return None
    rows = []
    for panel in lm:
        cells = []
        for m in multiples:
            ratio, since = diverged_from(panel.rows, m)
            since_text = f" (from {since})" if since is not None else ""
            cells.append(NOT_APPLICABLE if ratio is None else f"{ratio:.2f}{since_text}")
        last = max(r["step"] for r in panel.rows)
        rows.append([TableCell(panel.label), TableCell(str(panel.runs)), TableCell(str(last)), *map(TableCell, cells)])
    columns = [Column("curve", label=True), Column("runs"), Column("last step"),
               *(Column(f"{m:g}x / 1x") for m in multiples)]
    return Table("extrapolation during training", columns, [Section(rows)])


def curve_section(panels: Sequence[CurvePanel], out_dir: str | os.PathLike) -> Optional[str]:
    """Draw ``report_curve.png`` into ``out_dir``; returns the markdown of its section of ``report.md``, or None
    (nothing drawn) without panels."""
    if not panels:
        return None
    from posexp.plots.curve import plot_curve_panels

    shown = list(panels[:MAX_PANELS])
    plot_curve_panels([(p.label, p.metric, p.rows) for p in shown], Path(out_dir) / REPORT_CURVE_PLOT,
                      title="extrapolation during training (eval.during_training)")
    lines = ["## Extrapolation during training", "", f"![extrapolation during training]({REPORT_CURVE_PLOT})", "",
             "Each panel: a run's curve.csv (with --by, a group's runs pooled: perplexity from the mean loss), one "
             "line per multiple of the training length against the training step, measured on the same held-out "
             "tokens (task runs: exact match on the same instances) at every point."]
    if len(panels) > len(shown):
        lines.append(f"The first {len(shown)} of {len(panels)} curves are drawn; narrow the report with --where.")
    table = curve_table(panels)
    if table is not None:
        lines += ["", *to_markdown(table).splitlines(), "",
                  f"Each cell: perplexity at that multiple of the training length over perplexity at 1x, at the last "
                  f"step; (from S): above {1 + DIVERGED:g}x at every point from step S on."]
    return "\n".join(lines) + "\n"
