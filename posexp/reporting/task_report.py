"""The report of task runs: accuracy per context length, beside (never mixed with) the perplexity report.

Task runs (``task=copy``, ``reverse``, ...) have accuracy rows instead of perplexity rows. ``posexp report``
gives them their own table: one line per task and ``--by`` group, exact-match accuracy (%) at every length
(for passkey, the mean over the depths measured), the mean over a group's runs (seeds) with a 95% t-interval
over them (a single run: its own Wilson interval), and the task metrics of :mod:`.metrics.accuracy` (by default
acc@2x, acc@4x and maxlen@acc90). The table is built of the perplexity report's parts: a
:class:`~posexp.reporting.table.Report` of ``accuracy`` runs, whose groups each hold one task's runs, each task's
groups compared with its reference group as perplexity groups are (with ``--by``; without, a sweep's runs over what
the sweep varies), the best of each column bold.

A run whose exact match at the training length (the plain rows) is within :data:`NEAR_CHANCE` of chance, what a
guess scores without reading the instance (:func:`posexp.tasks.chance_exact_match`: a uniform guess of each answer
token from the task's answer alphabet, or of the whole answer where the task says so; 0 where the alphabet is not
known), did not learn the task at 1×: its row is marked so, with a warning, for
what it shows past 1× says nothing of extrapolation.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.compare import (best_cells, compare_groups, comparison_json, comparison_markdown, parse_baseline,
                                      parse_margin, pick_reference, sweep_keys)
from posexp.reporting.formatting import md_escape, short_id
from posexp.reporting.tables import Column, Section, Table, TableCell, render, to_markdown
from posexp.reporting.frame import LM_TASK
from posexp.reporting.grouping import EARLIER_REVISION, aggregate_group, earlier_revisions, revision_compared, sort_groups
from posexp.reporting.metrics import ACCURACY as TASK_RUNS, DEFAULT_TOLERANCE, applies_to, parse_metric, read_values
from posexp.reporting.runs import Run, run_labels
from posexp.reporting.selection import config_value, option_items, parse_sort, show_value
from posexp.reporting.stats import CUT_NOTE, Stat
from posexp.reporting.table import UNLEARNED, Group, Report, ReportRow, cells
from posexp.reporting.views import view_text
from posexp.runs.layout import ACCURACY, row_metric

DEFAULT_TASK_METRICS = ("acc@2x", "acc@4x", "maxlen@acc90")
RULER_METRIC = "efflen@85"  # Hsieh et al. 2024 (RULER, §3): the effective length, at the 85% threshold
NEAR_CHANCE = 0.05  # exact match at 1x at most this far above chance: the run did not learn the task


def is_ruler_task(run: Run) -> bool:
    """Whether a run's task is one of RULER's (Hsieh et al. 2024), as its recorded citation says."""
    task = run.info.get("task")
    return isinstance(task, dict) and "RULER" in str(task.get("citation") or "")


def default_task_metrics(runs: Sequence[Run]) -> tuple[str, ...]:
    """The metrics a task table shows without ``--metric``: with a RULER task among the runs, its effective length
    too (``efflen@85``, the longest length scoring ≥ 85%, as RULER reports it)."""
    return DEFAULT_TASK_METRICS + (RULER_METRIC,) * any(is_ruler_task(run) for run in runs)


def is_task_run(run: Run) -> bool:
    """Whether a run trained on a generated task (its rows are accuracy rows)."""
    return isinstance(run.info.get("task"), dict) or any(row_metric(r) == ACCURACY for r in run.rows)


def did_not_learn(run: Run) -> Optional[bool]:
    """Whether a task run's exact match at its training length (its plain rows; passkey: the mean over depths) is
    within :data:`NEAR_CHANCE` of chance (:func:`posexp.tasks.chance_exact_match`; 0 where the task's answer
    alphabet is not known); None where the run has no such row."""
    from posexp.tasks import chance_exact_match

    plain = Report(kind=TASK_RUNS).shown(run)
    ok, value, *_ = read_values(plain, "exact_match").get(run.train_len, (None, None))
    if not ok:
        return None
    task = run.info.get("task") if isinstance(run.info.get("task"), dict) else {}
    chances = [chance_exact_match(str(task.get("name")), task.get("options") or {},
                                  r["answer_tokens"] / r["examples"], r.get("size"), task.get("generator_version"))
               or 0.0 for r in plain
               if r.get("length") == run.train_len and r.get("examples") and r.get("answer_tokens")]
    return value <= (sum(chances) / len(chances) if chances else 0.0) + NEAR_CHANCE


def build_task_report(runs: Sequence[Run], by: Sequence[str] = (), metrics: Sequence[str] | None = None,
                      view: Optional[dict] = None, sort: Optional[str] = None, baseline: Any = None,
                      margin: Any = None) -> Report:
    """Group task runs by task and ``by`` keys (none: one group per run) and aggregate their accuracy, of the
    rows ``view`` names (``--view``'s scaling, window and sinks; :mod:`posexp.reporting.views`), plain by default.
    Each task's groups are in ``sort``'s order (``--sort``: a metric, shown or not, a ``by`` key or ``n``) and, with
    ``by``, compared with its reference group (``baseline``, ``--baseline``: the first by default) as perplexity
    groups are (:func:`~posexp.reporting.compare.compare_groups`; ``margin``: ``--margin``)."""
    view = view or {}
    window = None if view.get("window") is None else (view["window"], view.get("sinks"))
    report = Report(kind=TASK_RUNS, scaling=view.get("scaling"), window=window, by=list(by),
                    metrics=[parse_metric(m, applies=TASK_RUNS) for m in (metrics or default_task_metrics(runs))])
    sort_key = parse_sort(sort, report.metrics, list(by), DEFAULT_TOLERANCE, TASK_RUNS)
    if sort_key is not None and sort_key.metric is not None and sort_key.name not in {m.name for m in report.metrics}:
        report.metrics.append(sort_key.metric)  # what the table is sorted by is shown
    groups: dict[tuple, Group] = {}
    run_label, report.shared_overrides = run_labels(list(runs))  # no --by: a line per run, named by what sets it apart
    earlier = [[] if revision_compared(by) else e for e in earlier_revisions(list(runs))]
    for i, run in enumerate(runs):
        task = str((run.info.get("task") or {}).get("name") or "?")
        values = tuple(show_value(config_value(run, key)) for key in by)
        # runs trained at different lengths are never averaged: "acc@2x" would mix different lengths; nor runs scored
        # on different instances (the task's fingerprint: its options and generator version), nor by other code
        instances, code = run.info.get("corpus_fingerprint"), tuple(earlier[i])
        key = (task, values, run.train_len, instances, code) if by else (task, (i,), run.train_len, instances, code)
        label = " ".join(f"{k}={v}" for k, v in zip(by, values)) if by else run_label[i]
        row = ReportRow(label, run, cells(run, report), None)
        groups.setdefault(key, Group(dict(zip(by, values)), label, [], task=task)).rows.append(row)
    apart = 0
    for key, group in groups.items():
        same = [other for other in groups if other[:2] == key[:2]]
        group.label += f" train_len={show_value(key[2])}" if len({k[2] for k in same}) > 1 else ""
        if len({k[3] for k in same}) > 1:
            group.label += f" [instances {short_id(key[3])}]"
            apart += 1
        _set_apart_by_code(group, key[4], report.warnings)
        aggregate_group(group, report)
    if apart:
        report.warnings.append(f"{apart} groups have the same --by values but were scored on different instances (the "
                               "task's fingerprint: its options or generator version differ); they are shown apart, "
                               "never averaged together")
    report.groups = sorted(sort_groups(list(groups.values()), sort_key), key=lambda g: g.task)
    report.rows = [row for group in report.groups for row in group.rows]
    report.lengths = sorted({n for group in report.groups for n in group.cells})
    report.train_len = train.pop() if len(train := {run.train_len for run in runs}) == 1 else None
    report.warnings += _mark_unlearned(report.groups)
    reference, equivalence = parse_baseline(baseline, list(by)), parse_margin(margin, list(by))
    for task in dict.fromkeys(g.task for g in report.groups) if by else ():
        lines = [g for g in report.groups if g.task == task]
        usual = Counter(_instances(g) for g in lines for _ in g.rows).most_common(1)[0][0]
        for group in (g for g in lines if _instances(g) != usual):  # never compared with the others
            group.flags.append("different instances")
        if len(lines) > 1 and (chosen := pick_reference(lines, reference)) is not None:
            report.comparisons[task] = compare_groups(lines, report.metrics, chosen, report.by, equivalence)
    if not by and (keys := sweep_keys(list(runs))):  # a sweep's runs, a line each: compared over what it varies
        report.comparisons = build_task_report(runs, keys, [m.name for m in report.metrics], view).comparisons
    if view and not report.lengths:
        raise ConfigError("--view", f"no accuracy rows of the selected task runs are {view_text(view)} "
                                    "(posexp eval RUN eval.window=K measures windowed ones)")
    return report


def _set_apart_by_code(group: Group, earlier: Sequence[str], warnings: list[str]) -> None:
    """A group of runs that trained by an encoder's ``earlier`` revisions (:func:`earlier_revisions`): named so,
    flagged, and said in a warning; never compared with the runs of the latest."""
    if earlier:
        group.label += f" [{', '.join(earlier)}]"
        group.flags.append(EARLIER_REVISION)
        warnings.append(f"{group.task}: {group.label}: {EARLIER_REVISION}: trained by other code; not comparable with "
                        "the other runs")


def _instances(group: Group) -> Any:
    """The fingerprint of the instances a group's runs were scored on (one per group)."""
    return group.rows[0].run.info.get("corpus_fingerprint")


def _mark_unlearned(groups: list[Group]) -> list[str]:
    """Count each group's runs that did not learn the task at 1x; the warning that names them (none if none)."""
    for row in (row for group in groups for row in group.rows if did_not_learn(row.run)):
        row.flags.append(UNLEARNED)
    marked = [f"{g.task}: {g.label}" for g in groups if g.unlearned]
    if not marked:
        return []
    return [f"{UNLEARNED}: {'; '.join(marked)}: exact match at the training length within {100 * NEAR_CHANCE:g} "
            "percentage points of chance (what a guess of the answer scores, reading nothing), so what such a run "
            "shows past 1x says nothing of extrapolation."]


def _cell_text(stat: Optional[Stat], decimals: int = 1, of: int = 0) -> str:
    return "" if stat is None else stat.text(decimals, of=of)


INTRO = ("Exact-match accuracy (%) of the whole answer, teacher-forced, on the same fresh instances for every run; "
         "a group of several runs (seeds) shows mean ± the 95% t-interval over them, a single run its own accuracy "
         "(its 95% Wilson interval is in its results.md). passkey: the mean over the depths measured (the per-depth "
         "grid is each run's passkey_heatmap.png). n/a: not applicable at that length (positions never trained, or "
         "past a learned table).")


BOLD = "Bold: the best value of its column (the highest accuracy and length); ties are all bold."
CUT = CUT_NOTE.format(bounds="0 or 100% (an accuracy lies within them) or 0 tokens (a length)")


def _task_section(report: Report, task: str) -> Section:
    """One task's table: its groups' exact match by length and the chosen metrics."""
    groups = [g for g in report.groups if g.task == task]
    lengths = sorted({n for g in groups for n in g.cells})
    train = {g.train_len for g in groups}
    train_len = train.pop() if len(train) == 1 else None
    columns = [Column("group" if report.by else "run", label=True, min_width=12), Column("n"),
               *(Column(f"{n}" + (f" ({n / train_len:g}x)" if train_len else ""), short=str(n)) for n in lengths),
               *(Column(m.name) for m in report.metrics)]
    stats = [[*(g.cells.get(n) for n in lengths), *(g.metrics.get(m.name) for m in report.metrics)] for g in groups]
    decimals = [1] * len(lengths) + [m.decimals for m in report.metrics]
    higher = [True] * len(lengths) + [m.higher_is_better for m in report.metrics]
    best = best_cells(groups, stats, higher, decimals)  # bold, as in the perplexity table
    rows = [[TableCell(g.shown_label), TableCell(str(g.n)),
             *(TableCell(_cell_text(s, d, g.n), s, (i, j) in best) for j, (s, d) in enumerate(zip(stats[i], decimals)))]
            for i, g in enumerate(groups)]
    return Section(rows, f"task {task}" + (f" (trained up to {train_len} tokens)" if train_len else ""),
                   [f"Rows shown: {report.view}.", ""] if report.view else [],
                   f"task {task}: exact match (%) by context length" + (f", {report.view}" if report.view else ""),
                   columns)


def task_table(report: Report) -> Table:
    """The report as a :class:`~posexp.reporting.tables.Table`: a section (a table of its own) per task."""
    sections = [_task_section(report, task) for task in dict.fromkeys(g.task for g in report.groups)]
    cut = any(s.cut for g in report.groups for s in (*g.cells.values(), *g.metrics.values()))
    return Table("tasks", [], sections,
                 notes=[*[BOLD] * any(len(section.rows) > 1 for section in sections), *[CUT] * cut,
                        *(m.describe() for m in report.metrics)], csv=long_csv(report),
                 json={"tasks": _task_records(report),
                       "task_comparisons": {task: comparison_json(comparison) for task, comparison
                                            in report.comparisons.items()},
                       "warnings": report.warnings}, keys=2)


def long_csv(*reports: Report) -> list[list[Any]]:
    """The task table's csv: a line per group and value (exact match at each length, then each metric); of a
    perplexity report too, its groups under task ``lm`` and their ppl at each length, so that one csv holds both."""
    rows: list[list[Any]] = [["task", "group", "n", "train_len", "what", "mean", "low", "high", "did_not_learn"]]
    for report in reports:
        cell = "exact_match" if report.kind == TASK_RUNS else "ppl"
        for g in report.groups:
            values = [*((f"{cell}@{n}", stat) for n, stat in sorted(g.cells.items())), *g.metrics.items()]
            rows += [[g.task or LM_TASK, g.label, g.n, g.train_len, what,
                      *("" if v is None else v for v in (stat.mean, stat.low, stat.high)), g.unlearned]
                     for what, stat in values]
    return rows


def task_table_lines(report: Report, level: int = 1) -> list[str]:
    """The report's markdown under a heading of ``level`` (2: after the perplexity report): one table per task
    (exact match %, mean ± 95% t-interval over runs)."""
    lines = [f"{'#' * level} Tasks: accuracy vs context length", "", INTRO, ""]
    if report.shared_overrides and not report.by:
        lines += [f"Overrides shared by all runs: {', '.join(f'`{o}`' for o in report.shared_overrides)}.", ""]
    for warning in report.warnings:
        lines += [f"> **Warning:** {md_escape(warning)}", ""]
    lines += to_markdown(task_table(report), level + 1).splitlines()
    for task, comparison in report.comparisons.items():  # the verdicts, each task's under its table's heading level
        lines += ["", f"{'#' * (level + 1)} Comparison, task {task}", *comparison_markdown(comparison)[1:]]
    return lines


# -- output ------------------------------------------------------------------------------------------

def split_task_metrics(metrics: Sequence[str] | str | None) -> tuple[Optional[list[str]], Optional[list[str]]]:
    """``--metric`` values as (perplexity metrics, task metrics); None where none of a kind was asked for."""
    if metrics is None:
        return None, None
    items = [m for m in option_items(metrics) if m]
    lm = [m for m in items if applies_to(m) != TASK_RUNS]
    task = [m for m in items if applies_to(m) == TASK_RUNS]
    return lm or None, task or None


def task_section(report: Report, out_dir, level: int = 1) -> str:
    """Draw ``report_accuracy_vs_length.png`` (and the depth figure, where tasks have depths) into ``out_dir``;
    returns the markdown of the task section, under a heading of ``level`` (2: after the perplexity report)."""
    from pathlib import Path

    from posexp.plots.accuracy import plot_accuracy_vs_length
    from posexp.reporting.depth_curve import write_depth_curve
    from posexp.reporting.render import stat_series
    from posexp.runs.layout import REPORT_ACCURACY_PLOT

    series = [stat_series(f"{g.task}: {g.label}", g.cells, per=100) for g in report.groups]  # accuracy in [0, 1]
    plot_accuracy_vs_length(series, Path(out_dir) / REPORT_ACCURACY_PLOT, train_len=report.train_len,
                            title="exact match vs context length (mean over each group's runs)")
    lines = task_table_lines(report, level)
    lines += ["", f"![accuracy vs context length]({REPORT_ACCURACY_PLOT})", "",
              "Lines: mean exact match of each group; bands: 95% interval (over runs, or the run's Wilson interval). "
              "Dashed: the training length. x: not applicable."]
    if depth_text := write_depth_curve(report.groups, out_dir):  # tasks with depths: lost in the middle
        lines += ["", depth_text]
    return "\n".join(lines) + "\n"


# -- machine-readable formats (posexp report --format) ---------------------------------------------

def _task_records(report: Report) -> list[dict]:
    """One record per group: its task, label, runs, training length, how many of its runs did not learn at 1x,
    accuracy per length and metrics."""
    return [{"task": g.task, "group": g.label, "n": g.n, "train_len": g.train_len,
             "did_not_learn": g.unlearned,
             "exact_match": {str(n): stat.as_dict() for n, stat in sorted(g.cells.items())},
             "metrics": {name: stat.as_dict() for name, stat in g.metrics.items()}} for g in report.groups]


def render_task(report: Report, fmt: str) -> str:
    """The task report in ``fmt`` (``--format``): markdown with its introduction, as report.md has it."""
    if fmt == "markdown":
        return "\n".join(task_table_lines(report)) + "\n"
    return render(task_table(report), fmt)
