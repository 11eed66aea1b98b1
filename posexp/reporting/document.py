"""Files a report writes: ``summary.md``/``summary.csv``, ``report.md`` and its figures.

Figures are drawn by :mod:`posexp.plots.perplexity` (matplotlib is imported only when drawing).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_write_text
from posexp.reporting.compare import comparison_markdown
from posexp.reporting.lm_report import Report
from posexp.reporting.formatting import MAX_BANDS, fmt_view
from posexp.reporting.render import (head_lines, legend_label, lm_table, plot_series, ppl_label, plot_groups,
                                     render_csv, render_markdown, runs_table)
from posexp.reporting.tables import to_markdown
from posexp.runs.layout import (PPL_PLOT, REPORT_MD, REPORT_PLOT, REPORT_POSITION_PLOT, REPORT_TRAINING_PLOT, SUMMARY_CSV, SUMMARY_MD, read_position_curve, read_training_curve)


def write_summary(report: Report, out_dir: str | os.PathLike, plot: bool = True) -> Path:
    """Write ``summary.md``, ``summary.csv`` and the ``ppl_vs_length.png`` overlay to ``out_dir``.

    The summary has one line per run whatever the grouping: it is the sweep's record.

    Args:
        report: from :func:`build_report`.
        out_dir: destination folder; created if missing.
        plot: draw ``ppl_vs_length.png`` (False when the caller has just drawn it).

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    out_dir = Path(out_dir)
    from posexp.plots.perplexity import plot_ppl_vs_length

    try:
        _writable_folder(out_dir, "summary")
        if plot:
            plot_ppl_vs_length(
                plot_series(report), out_dir / PPL_PLOT, train_len=report.train_len, colour_by=plot_groups(report),
                title=f"protocol: {fmt_view(report.protocol, report.scaling, report.window)}", ylabel=ppl_label(report),
            )
        atomic_write_text(out_dir / SUMMARY_CSV, render_csv(report, out_dir))
        return atomic_write_text(out_dir / SUMMARY_MD, render_markdown(report, out_dir))
    except OSError as e:
        raise PosexpError(f"cannot write the summary into {out_dir}: {e.strerror or e}") from None


def _writable_folder(out_dir: Path, what: str) -> None:
    """Create ``out_dir`` (and parents); a file in its place is a :class:`PosexpError` naming ``what``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PosexpError(f"{out_dir}: is a file; the {what} needs a folder to write into")
    out_dir.mkdir(parents=True, exist_ok=True)


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


def write_report(report: Report, out_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` with its figures, plus ``summary.md``/``summary.csv``, into ``out_dir``.

    Figures: perplexity vs length per group with interval bands (``ppl_vs_length.png``
    without ``--by``, ``report_ppl_vs_length.png`` with it), loss by position
    (``report_loss_by_position.png``) and training curves (``report_training_curves.png``).

    Args:
        report: from :func:`build_report`.
        out_dir: destination folder; created if missing.

    Returns:
        The path of ``report.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    from posexp.plots.perplexity import plot_position_overlay, plot_ppl_vs_length, plot_training_curves

    out_dir = Path(out_dir)
    try:
        _writable_folder(out_dir, "report")
        view = fmt_view(report.protocol, report.scaling, report.window)
        # Without --by the groups are the runs, and the summary's figure is this one.
        ppl_file = REPORT_PLOT if report.by else PPL_PLOT
        drawn = [g for g in report.groups if any(c.applicable for c in g.cells.values())]  # as plot_series draws them
        plot_ppl_vs_length(plot_series(report, groups=True), out_dir / ppl_file, train_len=report.train_len,
                           title=f"protocol: {view}", ylabel=ppl_label(report),
                           colour_by=None if report.by else plot_groups(report, [g.rows[0].run for g in drawn]))
        write_summary(report, out_dir, plot=bool(report.by))
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
        return atomic_write_text(out_dir / REPORT_MD, render_report_markdown(report, out_dir, figures))
    except OSError as e:
        raise PosexpError(f"cannot write the report into {out_dir}: {e.strerror or e}") from None


def render_report_markdown(report: Report, out_dir: str | os.PathLike | None = None,
                           figures: Sequence[tuple[str, str, str]] = ()) -> str:
    """The text of ``report.md``: settings, the grouped table, metric notes, figures, the runs."""
    n_runs = len(report.rows)
    what = (f"{n_runs} run{'s' if n_runs != 1 else ''}" +
            (f" in {len(report.groups)} groups by {', '.join(report.by)}" if report.by else ""))
    lines = ["# Positional encodings: perplexity vs context length", "", *head_lines(report, what)]
    lines.append(to_markdown(lm_table(report)).rstrip("\n"))  # the table and its notes
    if report.comparison is not None:
        lines += ["", *comparison_markdown(report.comparison)]
    for file, title, caption in figures:
        lines += ["", f"## {title}", "", f"![{title.lower()}]({file})", "", caption]
    lines += ["", "## Runs", "", *to_markdown(runs_table(report, out_dir, groups=True)).splitlines()]
    return "\n".join(lines) + "\n"
