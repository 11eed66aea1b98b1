"""Entry points: ``posexp report``, the end-of-sweep summary and the sweep-summary refresh.

``posexp report DIR...`` and the end of a sweep (:func:`sweep_summary`, called by Hydra's callback
:class:`posexp.cli.jobs.SweepSummaryCallback`: reporting does not import Hydra) both end up in
:func:`report_main`; ``posexp eval`` and ``posexp resume`` call
:func:`refresh_sweep_summary` after they change a run of a sweep.

Each run folder holds a ``results.json`` written by the trainer (plus
``loss_by_position.csv`` and ``metrics.csv`` for the figures); reporting only
reads those files, so a report can be rebuilt at any time without touching a
model, and without importing torch.

``--by`` groups runs by config keys and averages the runs of a group (seeds)
with a Student-t interval, and compares each group with a reference group
(``--baseline``; :mod:`.compare`); ``--metric`` adds one-number summaries of each
curve (ratio at k× the training length, the longest length within a tolerance,
the area under log perplexity over log length); ``--where``/``--sort`` choose
and order; ``--format`` prints the table as rich, markdown, csv, json or latex.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from posexp.errors import ConfigError, PosexpError
from posexp.reporting.task_report import (build_task_report, is_task_run, long_csv, split_task_metrics, task_table,
                                          render_task)
from posexp.reporting.formatting import joined
from posexp.reporting.extension import as_table as extension_table, build_extension_table, extension_runs
from posexp.reporting.pivot import as_table as pivot_table, build_pivot
from posexp.reporting.tables import Table, render, rich_tables
from posexp.reporting.lm_report import Report, build_report
from posexp.reporting.options import ReportOptions
from posexp.reporting.document import LeadTable, write_report, write_summary
from posexp.reporting.render import FORMATS, RENDERERS, lm_table, print_comparison, print_report
from posexp.reporting.frame import unfinished_jobs
from posexp.reporting.runs import Run, read_run
from posexp.reporting.metrics import ACCURACY, PERPLEXITY, applies_to, metric_help
from posexp.reporting.selection import check_tolerance, parse_by, parse_where, select_runs
from posexp.reporting.views import parse_view, view_slug
from posexp.runs.layout import (REPORT_FILES, REPORTS_DIR, RESULTS_JSON, SUMMARY_CSV, SUMMARY_MD, find_runs,
                                is_run_dir, is_sweep_dir, runs_under)
from posexp.runs.lock import find_finished_runs, still_running
from posexp.runtime import terminal

# the logger name users' logging filters and test captures have always seen
log = logging.getLogger("posexp.report")


def report_main(paths: Sequence[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike | None = None, *,
                options: ReportOptions = ReportOptions(), console: Console | None = None,
                err_console: Console | None = None, _sweep_end: bool = False, sweep_notes: Sequence[str] = ()) -> Path:
    """``posexp report DIR...``: find runs, print the table, write report.md, summary.md and figures.

    Args:
        paths: run folders, sweep folders, or folders above them.
        out: where to write the files. Default: ``reports/NAME/`` in the folder given (the current folder when
            several were given), a folder of the report's own (:func:`_out_dir`).
        options: what the report shows and how it prints it (:class:`~posexp.reporting.options.ReportOptions`:
            ``--by``, ``--metric``, ``--format``, ...); a report of another ``view`` of one folder goes to
            ``reports/view-.../`` inside it.
        console: where the table goes (stdout by default).
        err_console: where notes go for machine-readable formats (stderr by default). With ``strict`` off, a run
            whose ``results.json`` cannot be loaded is named there in a one-line warning (the exit status stays 0).
        sweep_notes: warnings about the sweeps given that their folders do not show (their jobs that never
            started: :func:`posexp.commands.sweep_resume.unstarted_jobs`, which reads the sweep's plan with Hydra).

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: bad paths, no runs, an unreadable run, or an unwritable output folder.
        ConfigError: a bad option, naming it and the allowed values.
    """
    if options.fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {options.fmt!r}; choose one of {', '.join(FORMATS)}")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    check_tolerance(options.tolerance)
    lm_metrics, task_metrics = split_task_metrics(options.metrics)
    wanted = parse_view(options.view)
    lm_dirs, task_report = _split_tasks(find_finished_runs(paths), options, task_metrics, wanted)
    _check_metrics_apply(lm_metrics, task_metrics, bool(lm_dirs), task_report is not None)
    if task_report is not None and _sorts_by(options.sort) == ACCURACY:
        options = replace(options, sort=None)  # a task metric sorts the task table alone
    console = console or terminal.console()
    notes = console if options.fmt == "rich" else (err_console or terminal.console(stderr=True))
    try:
        report = build_report(lm_dirs, replace(options, metrics=lm_metrics)) if lm_dirs else None
    except ConfigError as e:
        if e.key != "--view" or task_report is None:
            raise
        report = None  # the view is the task runs' alone (a window posexp eval gave them only)
        notes.print(Text(f"note: perplexity runs left out: {e}"), style="yellow")
    _warn_unfinished_jobs(paths, report or task_report, sweep_notes)
    lead = _lead_table(report, task_report, options, wanted)
    out_dir = _out_dir(paths, out, options, wanted)
    _clear_report_folder(out_dir, sweep_end=_sweep_end)  # a wrong --out stops before any table is printed
    _print_tables(report, task_report, options.fmt, console, notes, lead)
    full = write_report(report, out_dir, task_report, lead)
    files = [SUMMARY_MD, *([SUMMARY_CSV] if report is not None else []),
             *([f"{lead.name}.csv", f"{lead.name}.tex"] if lead is not None else [])]
    notes.print(Text(f"wrote {full} (with figures), {joined(files)}"))
    return out_dir / SUMMARY_MD


def _clear_report_folder(out_dir: Path, sweep_end: bool = False) -> None:
    """Make ``out_dir`` the report's own: refuse a run or sweep folder (their files are theirs; the end of a sweep
    writes its summary into its own folder), and remove what a report wrote there before, so that no stale figure
    stays beside the new ones."""
    if not sweep_end and (is_run_dir(out_dir) or is_sweep_dir(out_dir)):
        kind = "run" if is_run_dir(out_dir) else "sweep"
        raise ConfigError("--out", f"{out_dir} is a {kind} folder, whose files are its own; give a folder of the "
                                   f"report's own (the default is {REPORTS_DIR}/NAME/ inside it)")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("--out", f"{out_dir} is a file; give a folder of the report's own (made if missing)")
    for name in REPORT_FILES:
        try:
            (out_dir / name).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise PosexpError(f"cannot replace the earlier report's {out_dir / name}: {e.strerror or e}") from None


def _lead_table(report: Optional[Report], task_report: Optional[Report], options: ReportOptions,
                wanted: Optional[dict]) -> Optional[LeadTable]:
    """``--cols``: the pivot, of the perplexity and the task runs in one table; a parent and its fine-tunes given
    alone: the context-extension table; else None."""
    runs = [row.run for row in report.rows] if report is not None else []
    if options.cols:
        runs += [run for group in task_report.groups for run in group.runs] if task_report is not None else []
        table = pivot_table(build_pivot(runs, parse_by(options.by), parse_by(options.cols)))
        return LeadTable("pivot", table.title[0].upper() + table.title[1:], table)
    if report is None:
        return None
    found = extension_runs(runs) if not (options.by or options.where or wanted) else None
    if found is None:
        return None
    return LeadTable("extension", "Context extension", extension_table(build_extension_table(*found)))


def _print_tables(report: Optional[Report], task_report: Optional[Report], fmt: str, console: Console,
                  notes: Console, lead: Optional[LeadTable] = None) -> None:
    """The table(s) to ``console`` in ``fmt``; with a machine-readable format, the warnings to ``notes``. A
    context-extension table or a pivot (``--cols``) stands in for the perplexity report's."""
    if lead is not None:
        _show(fmt, console, notes, lead.table.warnings, lead.table)
    elif report is not None and fmt == "rich":
        print_report(report, console)
    elif report is not None:
        _show(fmt, console, notes, report.warnings, text=_machine_text(report, task_report, fmt))
    if task_report is not None:  # its own tables: accuracy never shares a table with perplexity
        text = render_task(task_report, fmt) if report is None and fmt != "rich" else ""
        _show(fmt, console, notes, [], task_table(task_report) if fmt == "rich" else None, text)
        for task, comparison in task_report.comparisons.items() if fmt == "rich" else ():
            print_comparison(comparison, console, f"task {task}: ", grouped=not task_report.by)
        _show(fmt, console, notes, task_report.warnings)


def _show(fmt: str, console: Console, notes: Console, warnings: Sequence[str], table: Optional[Table] = None,
          text: str = "") -> None:
    """``table`` on a terminal (``fmt`` rich), else ``text`` (by default the table in ``fmt``), then ``warnings``,
    one line each however narrow the terminal: a warning is read (and grepped) whole."""
    if fmt == "rich" and table is not None:
        for part in rich_tables(table, console.width):
            console.print(part)
    elif text or table is not None:
        console.file.write(text or render(table, fmt))
        console.file.flush()
    for warning in warnings:
        notes.print(Text.assemble(("warning: ", "bold yellow"), warning), soft_wrap=True)


def _machine_text(report: Report, task_report: Optional[Report], fmt: str) -> str:
    """The perplexity report in ``fmt``, followed by the task report's tables when there are task runs too
    (for JSON, one document: the task records under ``"tasks"``; for csv, one table: the task table's lines, the
    perplexity groups' first)."""
    if task_report is not None and fmt == "csv":
        return render(Table("", [], [], csv=long_csv(report, task_report)), fmt)
    if task_report is not None and fmt == "json":
        lm, tasks = lm_table(report), task_table(task_report).json
        return render(replace(lm, json={**lm.json, "tasks": tasks["tasks"],
                                        "task_comparisons": tasks["task_comparisons"],
                                        "warnings": lm.json["warnings"] + tasks["warnings"]}), fmt)
    text = RENDERERS[fmt](report)
    return text if task_report is None else text + "\n" + render_task(task_report, fmt)


def _out_dir(paths: Sequence[str | os.PathLike], out: str | os.PathLike | None, options: ReportOptions,
             wanted: Optional[dict] = None) -> Path:
    """Where the report's files go: ``--out``; else a folder of the report's own, ``reports/NAME/`` inside the one
    folder given (here when several were given), NAME saying what it shows (``default``, ``by-encoder``,
    ``view-window=128``, ``where-encoder=alibi``, the folders' names when several). What a run or a sweep wrote
    for itself (its summary.md, its figures) is never replaced; the same report again replaces its own folder."""
    if out is not None:
        return Path(out)
    folders = [Path(p).parent if Path(p).is_file() else Path(p) for p in paths]
    where = options.where
    filters = [where] if isinstance(where, str) else list(where or [])
    parts = ["+".join(f.name or "." for f in folders)] if len(folders) > 1 else []
    parts += ["by-" + ",".join(parse_by(options.by))] if options.by else []
    parts += ["cols-" + ",".join(parse_by(options.cols))] if options.cols else []
    parts += ["where-" + "-".join(filters)] if filters else []
    parts += [view_slug(wanted)] if wanted else []
    name = re.sub(r"[^A-Za-z0-9=.,!+_-]+", "_", "-".join(parts) or "default")[:120]
    return (folders[0] if len(folders) == 1 else Path.cwd()) / REPORTS_DIR / name


def _check_metrics_apply(lm: Optional[list[str]], task: Optional[list[str]], lm_runs: bool, task_runs: bool) -> None:
    """A ``--metric`` of a kind no selected run has (acc@2x of perplexity runs, ratio of task runs) is an error
    naming the metrics that apply, not an empty column or a table without it."""
    if lm and not lm_runs:
        raise ConfigError("--metric", f"{', '.join(lm)}: metrics of perplexity runs, and the runs selected are task "
                                      f"runs; their metrics: {metric_help(ACCURACY)}")
    if task and not task_runs:
        raise ConfigError("--metric", f"{', '.join(task)}: metrics of task runs, and the runs selected are language-"
                                      f"model runs; their metrics: {metric_help(PERPLEXITY)}")


def _sorts_by(sort: Optional[str]) -> Optional[str]:
    """Which runs' metric ``--sort`` names (:data:`PERPLEXITY` or :data:`ACCURACY`); None: a key, ``n`` or none."""
    return applies_to(str(sort).strip().lstrip("+-")) if sort else None


def _split_tasks(run_dirs: list[Path], options: ReportOptions, task_metrics: Optional[list[str]] = None,
                 wanted: Optional[dict] = None) -> tuple[list[Path], Optional[Report]]:
    """The language-modelling run folders that pass ``--where`` (and those that cannot be read, which the perplexity
    report names), and the report of the task runs that pass it (None: none), its groups compared as ``--baseline``
    and ``--margin`` say. The ``--by`` and ``--where`` keys are checked against the runs of both kinds, so that a
    filter no task run passes is an error, not an empty report. With no perplexity run to report, what cannot be
    read is named in the task report's warnings (``--strict``: raised)."""
    by, where, strict, sort = options.by, options.where, options.strict, options.sort
    read: list[tuple[Path, Optional[Run]]] = []
    problems = []
    for folder in run_dirs:
        try:
            read.append((folder, read_run(folder)))
        except PosexpError as e:
            if strict:
                raise
            read.append((folder, None))
            problems.append(str(e))
    runs = [run for _, run in read if run is not None]
    if not any(is_task_run(run) for run in runs):
        return run_dirs, None
    kept = {id(run) for run in select_runs(runs, parse_where(where), parse_by(by))}
    task_runs = [run for run in runs if id(run) in kept and is_task_run(run)]
    lm_dirs = [folder for folder, run in read if run is not None and id(run) in kept and not is_task_run(run)]
    if lm_dirs:  # the perplexity report names the runs that cannot be read
        lm_dirs = [folder for folder, run in read if run is None or (id(run) in kept and not is_task_run(run))]
    if not task_runs:
        return lm_dirs, None
    by_keys = [k for k in parse_by(by) if k not in ("task", "task.name")]  # one table per task anyway
    try:
        task_report = build_task_report(task_runs, by_keys, task_metrics, wanted,
                                        None if lm_dirs and _sorts_by(sort) == PERPLEXITY else sort,
                                        options.baseline, options.margin)
    except ConfigError as e:
        if e.key != "--view" or not lm_dirs:
            raise
        return lm_dirs, None  # the view is the perplexity runs' alone; a missing one there says so
    if not lm_dirs:
        task_report.warnings[:0] = [f"not in the table: {problem}" for problem in problems]
    return lm_dirs, task_report


def _warn_unfinished_jobs(paths: Sequence[str | os.PathLike], report: Optional[Report],
                          sweep_notes: Sequence[str] = ()) -> None:
    """Warn in ``report`` (the perplexity report, else the task report) about sweep jobs without results, in
    ``sweep_notes`` those that never started, and folders given with no finished run in them (one still training),
    which would otherwise just be absent from the table."""
    if report is not None:
        report.warnings += [f"{sweep}: sweep job{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            f"{'have' if len(missing) > 1 else 'has'} no {RESULTS_JSON} (failed or still running) "
                            f"and {'are' if len(missing) > 1 else 'is'} not in the table"
                            for sweep, missing in unfinished_jobs(paths)] + list(sweep_notes)
        for folder in paths:  # one folder alone without a run is an error already
            if len(paths) > 1 and Path(folder).is_dir() and not is_sweep_dir(folder) and not runs_under(folder):
                running = still_running(folder)
                report.warnings.append(f"{running}, so it is not in the table yet" if running else
                                       f"{folder}: no run in it has written its {RESULTS_JSON} yet (still training, "
                                       "stopped early, or the wrong folder), so it is not in the table")


def sweep_summary(sweep_dir: str | os.PathLike) -> None:
    """The summary a sweep writes into its own folder when it ends (:class:`posexp.cli.jobs.SweepSummaryCallback`);
    never raises, since the runs themselves are already safe."""
    try:
        report_main([sweep_dir], out=sweep_dir, _sweep_end=True)
    except PosexpError as e:
        log.warning("sweep summary not written: %s", e)
    except Exception:  # a bug here must not turn a finished sweep into a failed one
        log.warning("sweep summary not written; the runs are intact, retry with `posexp report %s`",
                    sweep_dir, exc_info=True)


def refresh_sweep_summary(sweep: str | os.PathLike, console: Console,
                          sweep_notes: Sequence[str] = ()) -> Optional[Path]:
    """Rewrite a sweep folder's ``summary.md``/``summary.csv`` after one of its runs was evaluated or resumed.

    The summary was written when the sweep ended, without what changed since. A failure
    is printed, not raised: the runs themselves are already written.

    Args:
        sweep: the sweep folder.
        console: where the outcome is printed.
        sweep_notes: as for :func:`report_main` (the sweep's jobs that never started).

    Returns:
        The path of ``summary.md``, or None when it could not be rewritten.
    """
    sweep = Path(sweep)
    try:
        lm_dirs, task_report = _split_tasks(find_runs([sweep]), ReportOptions())
        report = build_report(lm_dirs) if lm_dirs else None
        _warn_unfinished_jobs([sweep], report or task_report, sweep_notes)
        summary = write_summary(report, sweep, task_report)
    except PosexpError as e:
        console.print(f"[yellow]could not refresh the sweep summary in {sweep}: {escape(str(e))}[/]", highlight=False)
        return None
    console.print(f"refreshed {summary}", highlight=False)
    return summary
