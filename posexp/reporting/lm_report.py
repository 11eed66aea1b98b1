"""Building the report: runs -> one row per run (a cell per length) -> groups with summary metrics.

Runs are only comparable when they were trained on the same corpus, with the
same training length, and evaluated the same way. Rather than refuse to report
(a sweep may legitimately contain a stray run), runs that differ from the
majority are flagged in every output, and grouping never averages them with
the others: they form groups of their own, flagged "kept apart".
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from posexp.errors import PosexpError
from posexp.reporting.comparability import flag_outliers
from posexp.reporting.formatting import MISSING, NOT_APPLICABLE, _fmt_ppl, _fmt_settings, _num, _short
from posexp.reporting.runs import Run, context_gain, load_run, parent_changed, window_key
from posexp.reporting.selection import (DEFAULT_TOLERANCE, EXECUTION_KEYS, Filter, Metric, SortKey, _ABSENT, _canon,
                                        _flatten, _show, _unknown_key_error, config_value, parse_by, parse_metric,
                                        parse_metrics, parse_sort, parse_where)
from posexp.reporting.compare import Comparison, compare_groups, parse_baseline, pick_reference
from posexp.reporting.stats import Stat, _stat
from posexp.runs.layout import RESULTS_JSON


MAIN_PROTOCOL = "nonoverlap"


@dataclass
class Cell:
    """One table cell. ``applicable`` is None when the run has no row for this length."""

    applicable: Optional[bool] = None
    ppl: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None

    def text(self) -> str:
        if self.applicable is None:
            return MISSING
        if not self.applicable or self.ppl is None:
            return NOT_APPLICABLE
        return _fmt_ppl(self.ppl)


@dataclass
class ReportRow:
    """One run's line in the table."""

    label: str
    run: Run
    cells: dict[int, Cell]
    ratio: Optional[float]
    flags: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything the writers need; built by :func:`build_report`.

    Attributes:
        rows: one per run, in run order.
        lengths: every evaluated length in the table, ascending.
        protocol: evaluation protocol shown in the table.
        scaling: context-extension scaling shown in the table (None = none).
        train_len: the (majority) training length.
        ratio_length: the length used for ``ratio``, or None when no ratio can be computed.
        shared_overrides: overrides common to every run, left out of the labels.
        corpus: (majority) corpus name and fingerprint.
        eval_settings: (majority) evaluation settings.
        warnings: human-readable problems, repeated in every output.
        other_views: (protocol, scaling, window) views present in the results but not in the table.
        window: (window, sinks) of the windowed rows the table shows (``eval.window``); None = plain rows.
        by: the ``--by`` keys (empty: one group per run).
        metrics: the summary metrics shown after the lengths.
        groups: the table's lines, in display order.
        filters: the ``--where`` filters applied.
        auc_multiple: the span of plain ``auc`` (multiple of the training length), None when no run has one.
        comparison: each group against the reference group (with ``--by`` and two or more groups), else None.
    """

    rows: list[ReportRow]
    lengths: list[int]
    protocol: Optional[str]
    scaling: Any
    train_len: Optional[int]
    ratio_length: Optional[int]
    shared_overrides: list[str]
    corpus: tuple[Optional[str], Optional[str]]
    eval_settings: Any
    warnings: list[str]
    other_views: list[tuple[Any, Any, Any]]
    by: list[str] = field(default_factory=list)
    metrics: list["Metric"] = field(default_factory=list)
    groups: list["Group"] = field(default_factory=list)
    filters: list["Filter"] = field(default_factory=list)
    auc_multiple: Optional[float] = None
    comparison: Optional[Comparison] = None
    window: Optional[tuple] = None

    @property
    def encoders(self) -> list[str]:
        return list(dict.fromkeys(str(r.run.info.get("encoder") or "?") for r in self.rows))


def build_report(
    run_dirs: Iterable[str | os.PathLike],
    by: Sequence[str] | str | None = None,
    metrics: Sequence[str] | str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    where: Sequence[str] | str | None = None,
    sort: Optional[str] = None,
    strict: bool = False,
    baseline: Sequence[str] | str | None = None,
) -> Report:
    """Load runs and line them up: one column per evaluated length, one line per run or group.

    Args:
        run_dirs: run folders, e.g. from :func:`posexp.runs.layout.find_runs`; their order is kept.
        by: dotted config keys to group by (``encoder``, ``base``, ``model.n_layers``); runs with the
            same values are averaged with a 95% t-interval. None: one line per run.
        metrics: summary metrics after the lengths (see :func:`parse_metric`); None: ratio, maxlen, auc.
        tolerance: the tolerance of a plain ``maxlen`` (0.1 = ppl within +10%).
        where: ``KEY=VALUE`` / ``KEY!=VALUE`` filters on config keys, all of which must hold.
        sort: a metric, ``--by`` key or ``n`` to sort the lines by; a leading ``-`` sorts descending.
        strict: refuse the whole report when one run's ``results.json`` cannot be loaded. Otherwise (the
            default) such a run is left out, with a warning naming its file and the problem.
        baseline: ``KEY=VALUE`` naming the reference group of the comparison (:mod:`.compare`); default: the first.

    Returns:
        The :class:`Report`.

    Raises:
        PosexpError: no run folders, no run that can be loaded (with ``strict``: any that cannot), or no
            run passes the filters.
        ConfigError: an unknown ``--by``/``--where`` key, metric, sort column or ``--baseline`` group.
    """
    by_keys = parse_by(by)
    chosen = parse_metrics(metrics, tolerance)
    filters = parse_where(where)
    sort_key = parse_sort(sort, chosen, by_keys, tolerance)
    if sort_key is not None and sort_key.metric is not None and sort_key.metric.name not in {m.name for m in chosen}:
        chosen.append(sort_key.metric)
    runs, skipped = _load_runs(run_dirs, by_keys, filters, strict)
    if metrics is None and any(r.get("protocol") == "last_k" for run in runs for r in run.rows):
        chosen.append(parse_metric("gain"))  # last_k rows measured: say whether longer context helped
    warnings: list[str] = [f"not in the table: {problem}" for problem in skipped]

    protocol, scaling, window, other_views = _pick_view(runs)
    if protocol is not None and protocol != MAIN_PROTOCOL:
        warnings.append(f'no "{MAIN_PROTOCOL}" results in these runs; the table shows protocol "{protocol}" instead')

    labels, shared = _labels(runs)
    rows = [ReportRow(label, run, _cells(run, protocol, scaling, window), None) for label, run in zip(labels, runs)]
    lengths = sorted({n for row in rows for n in row.cells})

    # Grouping by train_len compares training lengths on purpose: not a stray run to flag.
    train_len, corpus, eval_settings = flag_outliers(rows, warnings, train_len_varies="train_len" in by_keys)
    for row in rows:
        if row.run.status != "completed":
            row.flags.append(f"status: {row.run.status}")
            error = row.run.info.get("error")
            reason = f": {error['message']}" if isinstance(error, dict) and error.get("message") else ""
            warnings.append(f"{row.label}: status is \"{row.run.status}\", not completed; its numbers may be partial or missing{reason}")
        if not row.cells and protocol is not None:
            row.flags.append(f"no {protocol} results")

    ratio_length = _ratio_length(rows, lengths, train_len)
    if ratio_length is not None:
        for row in rows:
            row.ratio = _ratio(row, ratio_length)

    report = Report(
        rows=rows, lengths=lengths, protocol=protocol, scaling=scaling, train_len=train_len,
        ratio_length=ratio_length, shared_overrides=shared, corpus=corpus, eval_settings=eval_settings,
        warnings=warnings, other_views=other_views, window=window, by=by_keys, metrics=chosen, filters=filters,
        auc_multiple=_auc_multiple(rows),
    )
    groups = _group_rows(rows, by_keys, warnings)
    for group in groups:
        _aggregate(group, report)
    report.groups = _sort_groups(groups, sort_key)
    compare(report, parse_baseline(baseline, by_keys))
    _add_parent_metrics(report)
    return report


def compare(report: Report, reference: list[Filter]) -> None:
    """Set ``report.comparison`` when there are groups to compare (with ``--by``, two or more)."""
    if report.by and len(report.groups) > 1:
        chosen = pick_reference(report.groups, reference)
        if chosen is not None:
            report.comparison = compare_groups(report.groups, report.metrics, chosen, report.by)


def _add_parent_metrics(report: Report) -> None:
    """Fine-tuned runs (``posexp finetune``): every metric but ``ratio`` again on their parents, beside their own."""
    parents: dict[str, Optional[ReportRow]] = {}

    changed: dict[str, Optional[str]] = {}  # a fine-tune's label -> why its parent is not the one it started from

    def parent_of(row: ReportRow) -> Optional[ReportRow]:
        path = row.run.info.get("parent")
        if isinstance(path, str) and path not in parents:
            try:
                run = load_run(path)
                parents[path] = ReportRow(path, run, _cells(run, report.protocol, report.scaling, report.window), None)
            except PosexpError as e:
                parents[path] = None
                report.warnings.append(f"{row.label}: its parent cannot be read, its parent columns are blank ({e})")
        if isinstance(path, str) and parents.get(path) is not None and row.label not in changed:
            changed[row.label] = why = parent_changed(row.run, path)
            if why:
                report.warnings.append(f"{row.label}: {why}; its parent columns are blank")
        return parents.get(path) if isinstance(path, str) and not changed.get(row.label) else None

    if not [row for row in report.rows if parent_of(row) is not None]:
        return
    pairs = [(m, replace(m, name=f"parent {m.name}", of_parent=True)) for m in report.metrics if m.kind != "ratio"]
    for group in report.groups:
        for mine, theirs in pairs:
            values = {p.run.path: metric_value(mine, p, report) for row in group.rows if (p := parent_of(row))}
            group.metrics[theirs.name] = _stat(list(values.values()))  # a parent shared by seeds counts once
    beside = dict((mine.name, theirs) for mine, theirs in pairs)
    report.metrics = [m for mine in report.metrics for m in (mine, beside.get(mine.name)) if m is not None]


def _load_runs(run_dirs: Iterable[str | os.PathLike], by_keys: list[str], filters: list[Filter],
               strict: bool = False) -> tuple[list[Run], list[str]]:
    """The runs of ``run_dirs`` that pass ``filters``, after checking that every key names something,
    and the problems of the runs that could not be loaded (left out unless ``strict``)."""
    runs: list[Run] = []
    skipped: list[str] = []
    for folder in run_dirs:
        try:
            runs.append(load_run(folder))
        except PosexpError as e:
            # one damaged results.json in a sweep must not hide the others
            if strict:
                raise
            skipped.append(str(e))
    if not runs:
        if skipped:
            raise PosexpError(skipped[0] + (f" ({len(skipped) - 1} more run(s) cannot be read either)"
                                            if len(skipped) > 1 else ""))
        raise PosexpError(f"no runs to report; pass folders containing {RESULTS_JSON}")
    for option, keys in (("--by", by_keys), ("--where", [f.key for f in filters])):
        for key in keys:
            if all(config_value(run, key) is _ABSENT for run in runs):
                raise _unknown_key_error(option, key, runs)
    if filters:
        kept = [run for run in runs if all(f.matches(run) for f in filters)]
        if not kept:
            raise PosexpError(f"no run matches {' and '.join(str(f) for f in filters)} (of {len(runs)} runs); "
                              "values are compared as in results.json, e.g. --where encoder=rope --where base=10000")
        runs = kept
    return runs, skipped


def _pick_view(runs: list[Run]) -> tuple[Any, Any, Any, list[tuple[Any, Any, Any]]]:
    """Choose the (protocol, scaling, window) the table shows: nonoverlap without scaling or window if any run
    has it. A windowed row is a view of its own, like a scaled one: never in the same cell as a plain row."""
    views: list[tuple[Any, Any, Any]] = []
    for run in runs:
        for row in run.rows:
            view = (row.get("protocol"), row.get("scaling"), window_key(row))
            if view not in views:
                views.append(view)
    if not views:
        return None, None, None, []
    chosen = next(
        (v for v in views if v == (MAIN_PROTOCOL, None, None)),
        # otherwise the first protocol found, unscaled and unwindowed if possible
        next((v for v in views if v[1:] == (None, None)), next((v for v in views if v[1] is None), views[0])),
    )
    return chosen[0], chosen[1], chosen[2], [v for v in views if v != chosen]


def _labels(runs: list[Run]) -> tuple[list[str], list[str]]:
    """Label each run by the overrides that set it apart; make duplicates unique by folder.

    Overrides shared by every run (``train.steps=50`` given to a whole sweep) say
    nothing about the difference between rows, so they move to the header.
    """
    known = [r.overrides for r in runs if r.overrides is not None]
    shared: list[str] = []
    if len(runs) > 1 and len(known) == len(runs):
        shared = [o for o in known[0] if all(o in other for other in known[1:])]
    labels = []
    for run in runs:
        if run.overrides is None:
            labels.append(str(run.info.get("label") or run.path.name))
        else:
            labels.append(" ".join(o for o in run.overrides if o not in shared) or "default")

    counts = Counter(labels)
    if max(counts.values()) > 1:
        root = Path(os.path.commonpath([str(r.path.resolve()) for r in runs]))
        for i, run in enumerate(runs):
            if counts[labels[i]] > 1:
                where = run.path.resolve().relative_to(root).as_posix() if run.path.resolve() != root else run.path.name
                labels[i] = f"{labels[i]} [{where or run.path.name}]"
        # Still clashing (same folder names in different places): a counter is the last resort.
        seen: Counter = Counter()
        for i, label in enumerate(labels):
            seen[label] += 1
            if seen[label] > 1:
                labels[i] = f"{label} #{seen[label]}"
    return labels, shared


def _cells(run: Run, protocol: Any, scaling: Any, window: Optional[tuple] = None) -> dict[int, Cell]:
    cells: dict[int, Cell] = {}
    for row in run.rows:
        if row.get("protocol") != protocol or row.get("scaling") != scaling or window_key(row) != window:
            continue
        length = int(row["length"])
        if length in cells:
            continue  # duplicate rows: the trainer's first one wins
        ppl = _num(row.get("ppl"))
        applicable = bool(row.get("applicable", ppl is not None)) and ppl is not None
        cells[length] = Cell(applicable, ppl if applicable else None, _num(row.get("ppl_low")), _num(row.get("ppl_high")))
    return cells


def _ratio_length(rows: list[ReportRow], lengths: list[int], train_len: Optional[int]) -> Optional[int]:
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


def _ratio(row: ReportRow, length: int) -> Optional[float]:
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


def _auc_multiple(rows: list[ReportRow]) -> Optional[float]:
    """The span of plain ``auc``: the largest multiple of its training length that every run was evaluated at."""
    reach = []
    for row in rows:
        train_len = row.run.train_len
        if train_len and row.cells:
            reach.append(max(row.cells) / train_len)
    return min(reach) if reach else None


@dataclass
class Group:
    """One line of the grouped table: runs with the same ``--by`` values (or one run, without ``--by``).

    Attributes:
        key: ``--by`` key -> value (empty without ``--by``).
        label: how the group is named in warnings, plots and without ``--by``.
        rows: its runs.
        cells: length -> perplexity over the runs.
        metrics: metric name -> value over the runs.
        values: metric name -> each run's value (None: n/a or missing), in the order of ``rows``.
        flags: why its numbers need care (different corpus, pooled configs, failed...).
    """

    key: dict[str, Any]
    label: str
    rows: list[ReportRow]
    cells: dict[int, Stat] = field(default_factory=dict)
    metrics: dict[str, Stat] = field(default_factory=dict)
    values: dict[str, list[Optional[float]]] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def train_len(self) -> Optional[int]:
        return self.rows[0].run.train_len if self.rows else None


def _group_rows(rows: list[ReportRow], by: list[str], warnings: list[str]) -> list[Group]:
    """Split runs into groups by ``by``; never pool different corpora, eval settings, train lengths or failures."""
    if not by:
        return [Group({}, row.label, [row], flags=list(row.flags)) for row in rows]
    buckets: dict[tuple, Group] = {}
    for row in rows:
        info = row.run.info
        values = {k: config_value(row.run, k) for k in by}
        # Numbers measured on different text, or scored differently, are different quantities.
        guard = (
            _canon(info.get("corpus_fingerprint")),
            _canon(info.get("eval_settings")),
            "" if "train_len" in by else _canon(row.run.train_len),
            "" if row.run.status == "completed" else str(row.run.path),  # a failure stays visible on its own
        )
        bucket = (tuple(_canon(v) for v in values.values()), guard)
        if bucket not in buckets:
            label = " ".join(f"{k}={_show(v)}" for k, v in values.items())
            buckets[bucket] = Group(values, label, [])
        buckets[bucket].rows.append(row)
    groups = list(buckets.values())

    # Same --by values in several groups: name what separates them, in the label and the flags.
    by_values = Counter(_canon(list(g.key.values())) for g in groups)
    for group in groups:
        first = group.rows[0]
        group.flags = list(dict.fromkeys(f for row in group.rows for f in row.flags))
        if by_values[_canon(list(group.key.values()))] > 1:
            info = first.run.info
            parts = []
            if first.run.status != "completed":
                parts.append(first.label)
            if "different corpus" in group.flags:
                parts.append(f"corpus {info.get('corpus')} {_short(info.get('corpus_fingerprint'))}")
            if "different eval settings" in group.flags:
                parts.append(f"eval {_fmt_settings(info.get('eval_settings'))}")
            if "different train length" in group.flags:
                parts.append(f"train_len={first.run.train_len}")
            if parts:
                group.label += f" [{'; '.join(parts)}]"
            group.flags.append("kept apart: not comparable")
        pooled = _pooled_keys(group, by)
        if pooled:
            group.flags.append("averaged over " + ", ".join(pooled))
            warnings.append(f"{group.label}: averages runs that differ in {', '.join(pooled)}, not only in seed; "
                            f"add {', '.join(k for k, _ in zip(pooled, range(3)))} to --by to separate them")
    split = [g for g in groups if "kept apart: not comparable" in g.flags]
    if split:
        warnings.append(f"{len(split)} groups have the same --by values but a different corpus, eval settings, "
                        "train length or status; they are shown apart, never averaged together")
    return groups


def _pooled_keys(group: Group, by: list[str]) -> list[str]:
    """Config keys (other than seed and execution settings) on which a group's runs disagree."""
    if group.n < 2:
        return []
    flats = []
    for row in group.rows:
        flat = {k: v for k, v in _flatten(row.run.config).items() if not k.startswith("eval.")}
        for k in ("encoder", "base"):  # the effective values: base is null where an encoding ignores it
            flat[k] = row.run.info.get(k)
        flat.pop("encoder.name", None)
        flats.append(flat)
    keys = dict.fromkeys(k for flat in flats for k in flat)
    differ = [k for k in keys if k not in EXECUTION_KEYS and k not in by
              and len({_canon(flat.get(k, _ABSENT)) for flat in flats}) > 1]
    return differ


def _aggregate(group: Group, report: "Report") -> None:
    lengths = sorted({n for row in group.rows for n in row.cells})
    for n in lengths:
        pairs = [(c.applicable, c.ppl) for row in group.rows if (c := row.cells.get(n)) is not None]
        single = next(((c.low, c.high) for row in group.rows if (c := row.cells.get(n)) is not None
                       and c.applicable), (None, None))
        group.cells[n] = _stat(pairs, single)
    for metric in report.metrics:
        values = [metric_value(metric, row, report) for row in group.rows]
        group.metrics[metric.name] = _stat(values)
        group.values[metric.name] = [v if ok else None for ok, v in values]


def _sort_groups(groups: list[Group], sort: Optional[SortKey]) -> list[Group]:
    if sort is None:
        return groups

    def value(group: Group) -> Any:
        if sort.metric is not None:
            stat = group.metrics.get(sort.metric.name, Stat())
            return stat.mean if stat.applicable else None
        if sort.name == "n":
            return group.n
        return group.key.get(sort.name)

    present = [g for g in groups if value(g) not in (None, _ABSENT)]
    absent = [g for g in groups if value(g) in (None, _ABSENT)]  # n/a and missing stay last either way

    def order(group: Group) -> tuple:
        v = value(group)
        return (0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, _show(v))

    return sorted(present, key=order, reverse=sort.descending) + absent
