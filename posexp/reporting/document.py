"""Files a report writes: ``report.md``, ``summary.md``/``summary.csv``, a lead table's csv and LaTeX, and the
figures.

Each part of the document draws its figures and gives its markdown (the perplexity report: :func:`render_markdown`;
the task runs: :func:`~posexp.reporting.task_report.task_section`; the training curves:
:func:`~posexp.reporting.curve_report.curve_section`; a :class:`LeadTable`); the files are put together here in
one fixed order and each written once, whole (:func:`~posexp.runs.atomic.atomic_write_text`), after every figure
is drawn. Figures are drawn by :mod:`posexp.plots` (matplotlib is imported only when drawing).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_write_text
from posexp.reporting.curve_report import curve_section, panels_of
from posexp.reporting.lm_report import Report
from posexp.reporting.formatting import MAX_BANDS, fmt_view
from posexp.reporting.render import legend_label, plot_series, ppl_label, plot_groups, render_csv, render_markdown
from posexp.reporting.tables import Table, render
from posexp.reporting.task_report import task_section
from posexp.runs.layout import (PPL_PLOT, REPORT_MD, REPORT_PLOT, REPORT_POSITION_PLOT, REPORT_TRAINING_PLOT, SUMMARY_CSV, SUMMARY_MD, read_position_curve, read_training_curve)


@dataclass
class LeadTable:
    """A table that stands in for the perplexity report's: the context-extension table of a parent and its
    fine-tunes, or a pivot (``--cols``). Printed in any format, and written at the top of report.md with its csv
    and LaTeX beside it."""

    name: str
    title: str
    table: Table


def write_summary(report: Optional[Report], out_dir: str | os.PathLike,
                  task_report: Optional[Report] = None) -> Path:
    """Write ``summary.md`` (with ``summary.csv`` and the ``ppl_vs_length.png`` overlay of a perplexity report; the
    task section and its figures after it) to ``out_dir``.

    The summary has one line per run whatever the grouping: it is the sweep's record.

    Args:
        report: from :func:`build_report`; None: task runs only.
        out_dir: destination folder; created if missing.
        task_report: the task runs' report, from :func:`~posexp.reporting.task_report.build_task_report`.

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    out_dir = Path(out_dir)
    with _writing(out_dir, "summary"):
        if report is not None:
            _plot_runs(report, out_dir)
        tasks = None if task_report is None else task_section(task_report, out_dir, level=1 if report is None else 2)
        _write_files(out_dir, _summary_files(report, tasks, out_dir))
    return out_dir / SUMMARY_MD


def write_report(report: Optional[Report], out_dir: str | os.PathLike, task_report: Optional[Report] = None,
                 lead: Optional[LeadTable] = None) -> Path:
    """Write ``report.md`` with its figures, plus ``summary.md``/``summary.csv`` (and a lead table's csv and LaTeX),
    into ``out_dir``.

    report.md holds, in this order: the lead table, the perplexity report, the task section, the curves of runs
    trained with ``eval.during_training``; summary.md the perplexity runs' summary and the task section. Figures:
    perplexity vs length per group with interval bands (``ppl_vs_length.png`` without ``--by``,
    ``report_ppl_vs_length.png`` with it), loss by position (``report_loss_by_position.png``), training curves
    (``report_training_curves.png``), the task and curve sections' own.

    Args:
        report: from :func:`build_report`; None: task runs only.
        out_dir: destination folder; created if missing.
        task_report: the task runs' report, from :func:`~posexp.reporting.task_report.build_task_report`.
        lead: a table that stands in for the perplexity report's, first in report.md.

    Returns:
        The path of ``report.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    out_dir = Path(out_dir)
    with _writing(out_dir, "report"):
        parts = [f"# {lead.title}\n\n" + render(lead.table, "markdown")] if lead is not None else []
        if report is not None:
            parts.append(render_markdown(report, out_dir, _plot_report(report, out_dir)))
        tasks = None if task_report is None else task_section(task_report, out_dir, level=1 if report is None else 2)
        parts += [tasks, curve_section(panels_of(report, task_report), out_dir)]  # runs with eval.during_training
        files = _summary_files(report, tasks, out_dir)
        if lead is not None:
            files.update({f"{lead.name}.csv": render(lead.table, "csv"),
                          f"{lead.name}.tex": render(lead.table, "latex")})
        _write_files(out_dir, {**files, REPORT_MD: _joined(parts)})
    return out_dir / REPORT_MD


@contextmanager
def _writing(out_dir: Path, what: str) -> Iterator[None]:
    """Create ``out_dir`` (and parents) for the ``what``; a file in its place, or a figure or file that cannot be
    written, is a :class:`PosexpError` naming it."""
    try:
        if out_dir.exists() and not out_dir.is_dir():
            raise PosexpError(f"{out_dir}: is a file; the {what} needs a folder to write into")
        out_dir.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as e:
        raise PosexpError(f"cannot write the {what} into {out_dir}: {e.strerror or e}") from None


def _summary_files(report: Optional[Report], tasks: Optional[str], out_dir: Path) -> dict[str, str]:
    """summary.md (the perplexity runs' summary, then the task section) and the perplexity runs' summary.csv."""
    files = {SUMMARY_CSV: render_csv(report, out_dir)} if report is not None else {}
    return {**files, SUMMARY_MD: _joined([render_markdown(report, out_dir) if report is not None else None, tasks])}


def _joined(parts: Sequence[Optional[str]]) -> str:
    """A document of the ``parts`` there are, a blank line between each."""
    return "\n\n".join(part.rstrip("\n") for part in parts if part) + "\n"


def _write_files(out_dir: Path, files: dict[str, str]) -> None:
    """Write each file once, whole: a reader never sees one half-written."""
    for name, text in files.items():
        atomic_write_text(out_dir / name, text)


def _plot_runs(report: Report, out_dir: Path) -> None:
    """``ppl_vs_length.png``: a line per run, coloured by what the sweep varies."""
    from posexp.plots.perplexity import plot_ppl_vs_length

    plot_ppl_vs_length(plot_series(report), out_dir / PPL_PLOT, train_len=report.train_len,
                       colour_by=plot_groups(report), ylabel=ppl_label(report),
                       title=f"protocol: {fmt_view(report.protocol, report.scaling, report.window)}")


def _position_series(report: Report) -> list[tuple]:
    """Each group at the longest window where it is applicable; its runs pooled per position, weighted by windows."""
    series = []
    for group in report.groups:
        usable = [n for n, s in group.cells.items() if s.applicable]
        if not usable:
            continue
        length = max(usable)
        sums: dict[int, float] = {}
        weights: dict[int, int] = {}
        for row in group.rows:
            curve = read_position_curve(row.run.path, report.protocol, report.scaling, length, report.window)
            for position, (loss, count) in curve.items():
                sums[position] = sums.get(position, 0.0) + loss * count
                weights[position] = weights.get(position, 0) + count
        positions = sorted(p for p in sums if weights[p] > 0)
        if positions:
            series.append((f"{legend_label(report, group)}, L={length}", length, positions,
                           [sums[p] / weights[p] for p in positions], [weights[p] for p in positions]))
    return series


def _training_series(report: Report) -> list[tuple]:
    """Mean training loss per logged step over each group's runs."""
    series = []
    for group in report.groups:
        by_step: dict[float, list[float]] = {}
        for row in group.rows:
            for step, loss in zip(*read_training_curve(row.run.path)):
                by_step.setdefault(step, []).append(loss)
        if by_step:
            steps = sorted(by_step)
            series.append((legend_label(report, group), steps, [math.fsum(by_step[s]) / len(by_step[s]) for s in steps]))
    return series


def _plot_report(report: Report, out_dir: Path) -> list[tuple[str, str, str]]:
    """Draw report.md's figures (and, with ``--by``, summary.md's); each as (file, title, caption)."""
    from posexp.plots.perplexity import plot_position_overlay, plot_ppl_vs_length, plot_training_curves

    view = fmt_view(report.protocol, report.scaling, report.window)
    # Without --by the groups are the runs, and the summary's figure is this one.
    ppl_file = REPORT_PLOT if report.by else PPL_PLOT
    drawn = [g for g in report.groups if any(c.applicable for c in g.cells.values())]  # as plot_series draws them
    plot_ppl_vs_length(plot_series(report, groups=True), out_dir / ppl_file, train_len=report.train_len,
                       title=f"protocol: {view}", ylabel=ppl_label(report),
                       colour_by=None if report.by else plot_groups(report, [g.rows[0].run for g in drawn]))
    if report.by:
        _plot_runs(report, out_dir)
    figures = [(ppl_file, "Perplexity vs context length",
                "Lines: " + ("mean over each group's runs; bands: 95% t-interval over runs (the run's own "
                             "evaluation interval where n = 1)" if report.by else
                             "one per run; bands: 95% evaluation interval")
                + f", drawn when there are at most {MAX_BANDS} lines."
                + " Dashed: the training length. x: not applicable at that length.")]
    positions = _position_series(report)
    if positions:
        plot_position_overlay(positions, out_dir / REPORT_POSITION_PLOT, train_len=report.train_len,
                              title=f"loss by position in the window ({view})")
        figures.append((REPORT_POSITION_PLOT, "Loss by position",
                        "Each line: one group's mean loss per position, in its longest applicable window "
                        "(L in the legend), binned 2 per doubling of the context. A line that rises right of "
                        "the dashed training length is the encoding failing to extrapolate."))
    curves = _training_series(report)
    if curves:
        plot_training_curves(curves, out_dir / REPORT_TRAINING_PLOT, title="training loss (mean over runs)")
        figures.append((REPORT_TRAINING_PLOT, "Training curves",
                        "Training loss per logged step (metrics.csv), mean over each group's runs."))
    return figures
