"""Building the report: runs -> one row per run (a cell per length) -> groups with summary metrics.

The parts live beside it: the table's data (:mod:`.table`), the summary metrics (:mod:`.metrics`), the grouping,
the flags of runs not comparable with the others, and the sorting (:mod:`.grouping`); this module loads the runs,
lays out the table and puts the parts together. Task runs are built of the same parts (:mod:`.task_report`).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any, Iterable, Optional, Sequence

from posexp.errors import PosexpError
from posexp.reporting.compare import Margin, compare_groups, parse_baseline, parse_margin, pick_reference
from posexp.reporting.formatting import as_number
from posexp.reporting.grouping import aggregate_group, flag_outliers, group_rows, revision_compared, sort_groups
from posexp.reporting.options import ReportOptions
from posexp.reporting.metrics import metric_value
from posexp.reporting.metrics.perplexity import auc_span_multiple, ratio_of, common_ratio_length
from posexp.reporting.runs import Run, read_run, run_labels, read_runs, parent_changed, shown_settings, window_key
from posexp.reporting.selection import (Filter, SortKey, parse_by, parse_metric, parse_metrics, parse_sort,
                                        parse_where, select_runs)
from posexp.reporting.stats import Stat, aggregate_stat
from posexp.reporting.table import UNLEARNED, Group, Report, ReportRow, cells, measured_otherwise
from posexp.reporting.views import MAIN_PROTOCOL, parse_view, pick_view, view_text
from posexp.runs.layout import RESULTS_JSON
from posexp.runs.row import factor_text, fixed_factor

__all__ = ["Group", "MAIN_PROTOCOL", "Report", "ReportRow", "build_report", "group_and_compare", "metric_value"]

# perplexity at the training length at least this share of the corpus's unigram perplexity (what a model that reads no
# context scores, recorded by the run as ``unigram_ppl``): the run did not learn to use its context
NEAR_UNIGRAM = 0.9


def build_report(run_dirs: Iterable[str | os.PathLike], options: ReportOptions = ReportOptions()) -> Report:
    """Load runs and line them up: one column per evaluated length, one line per run or group.

    Args:
        run_dirs: run folders, e.g. from :func:`posexp.runs.layout.find_runs`; their order is kept.
        options: the table asked for, as :class:`~posexp.reporting.options.ReportOptions` describes each (all but
            ``fmt`` and ``cols``, which are the printing's).

    Returns:
        The :class:`Report`.

    Raises:
        PosexpError: no run folders, no run that can be loaded (with ``strict``: any that cannot), or no
            run passes the filters.
        ConfigError: an unknown ``--by``/``--where`` key, metric, sort column, ``--baseline`` group or ``--view``;
            a bad ``--margin``.
    """
    by_keys = parse_by(options.by)
    wanted = parse_view(options.view)
    equivalence = parse_margin(options.margin, by_keys)
    chosen = parse_metrics(options.metrics, options.tolerance)
    filters = parse_where(options.where)
    sort_key = parse_sort(options.sort, chosen, by_keys, options.tolerance)
    if sort_key is not None and sort_key.metric is not None and sort_key.metric.name not in {m.name for m in chosen}:
        chosen.append(sort_key.metric)
    runs, skipped = _load_runs(run_dirs, by_keys, filters, options.strict)
    if options.metrics is None and any(r.get("protocol") == "last_k" for run in runs for r in run.rows):
        chosen.append(parse_metric("gain"))  # last_k rows measured: say whether longer context helped

    report = _lay_out(runs, by_keys, [f"not in the table: {problem}" for problem in skipped], wanted)
    report.metrics, report.filters = chosen, filters
    group_and_compare(report, sort_key, parse_baseline(options.baseline, by_keys), equivalence)
    _add_parent_metrics(report)
    return report


def _lay_out(runs: list[Run], by_keys: list[str], warnings: list[str], wanted: Optional[dict] = None) -> Report:
    """The table of ``runs`` before grouping: the view it shows, a row per run (label, cells, flags, ratio), and
    the settings most runs share (the others flagged in ``warnings``)."""
    chosen, other_views = pick_view(runs, wanted or {})
    protocol, scaling, window = chosen or (None, None, None)
    if protocol is not None and protocol != MAIN_PROTOCOL and "protocol" not in (wanted or {}):
        warnings.append(f'no "{MAIN_PROTOCOL}" results in these runs; the table shows protocol "{protocol}" instead')
    labels, shared = run_labels(runs)
    report = Report(protocol=protocol, scaling=scaling, window=window, by=by_keys, shared_overrides=shared,
                    warnings=warnings, own_scaling="scaling" not in (wanted or {}))
    rows = [ReportRow(label, run, cells(run, report), None, settings=shown_settings(run, report.shown(run)))
            for label, run in zip(labels, runs)]
    report.rows = rows
    shown = {(r.get("protocol"), r.get("scaling"), window_key(r)) for row in rows for r in report.shown(row.run)}
    report.other_views = [v for v in other_views if v not in shown]  # a run's own scaling is in the table
    report.lengths = lengths = sorted({n for row in rows for n in row.cells})
    _per_byte(rows, warnings)
    for row in rows:
        if scaling is not None and (several := _settings_at_one_length(report.shown(row.run), row.run.train_len)):
            warnings.append(f"{row.label}: its {scaling} rows measure a length {len(several)} ways "
                            f"({'; '.join(several)}); the table shows the first measured, --cols scaling shows each")
        budgets = (row.settings or {}).get("tokens")
        if isinstance(budgets, list):  # a later posexp eval measured some lengths on another budget
            row.flags.append("different eval settings")
            warnings.append(f"{row.label}: its rows were measured on different token budgets (eval.tokens "
                            f"{', '.join(f'{b:,}' for b in budgets)}); evaluate it again with one eval.tokens")

    # Grouping by train_len (an encoder's revision) compares training lengths (its code) on purpose: not a stray run
    report.train_len, report.corpus, report.eval_settings = flag_outliers(rows, warnings, "train_len" in by_keys, scaling,
                                                                          revision_compared(by_keys))
    for row in rows:
        if row.run.status != "completed":
            row.flags.append(f"status: {row.run.status}")
            error = row.run.info.get("error")
            reason = f": {error['message']}" if isinstance(error, dict) and error.get("message") else ""
            warnings.append(f"{row.label}: status is \"{row.run.status}\", not completed; its numbers may be partial or missing{reason}")
        if not row.cells and protocol is not None:
            row.flags.append(_missing_view(protocol, scaling, window))

    _mark_unlearned(rows, warnings)
    # a run flagged as measured otherwise (a stray at another train_len) does not choose the others' ratio length
    compared = [row for row in rows if row.cells and not measured_otherwise(row.flags)]
    report.ratio_length = common_ratio_length(compared or rows, lengths, report.train_len)
    if report.ratio_length is not None:
        for row in rows:
            row.ratio = ratio_of(row, report.ratio_length)
    report.auc_multiple = auc_span_multiple(rows)
    return report


def _missing_view(protocol: Any, scaling: Any, window: Optional[tuple]) -> str:
    """The flag of a run with no rows in the view shown: ``no window=16 rows`` rather than a protocol it may have."""
    size, sinks = window or (None, None)
    view = {"protocol": None if protocol == MAIN_PROTOCOL else protocol, "scaling": scaling, "window": size,
            "sinks": sinks or None}
    shown = {key: value for key, value in view.items() if value is not None}
    return f"no {view_text(shown, ' ')} rows" if shown else f"no {protocol} results"


def did_not_learn(row: ReportRow) -> Optional[bool]:
    """Whether a run's perplexity at its own training length is within :data:`NEAR_UNIGRAM` of its corpus's unigram
    perplexity (``unigram_ppl`` in results.json; None where either is missing, as in runs written before it)."""
    unigram, cell = row.run.info.get("unigram_ppl"), row.cells.get(row.run.train_len or -1)
    if not isinstance(unigram, (int, float)) or cell is None or not cell.applicable or cell.mean is None:
        return None
    threshold = NEAR_UNIGRAM * unigram
    if row.per_byte:  # the cell is per byte (:func:`_per_byte`), the unigram perplexity per token of the run's own
        threshold **= float(row.run.info["tokens_per_byte"])
    return cell.mean >= threshold


def _mark_unlearned(rows: list[ReportRow], warnings: list[str]) -> None:
    """Flag the runs that did not learn at 1x (:func:`did_not_learn`), with one warning naming them."""
    marked = [row for row in rows if did_not_learn(row)]
    for row in marked:
        row.flags.append(UNLEARNED)
    if marked:
        warnings.append(f"{UNLEARNED}: {', '.join(row.label for row in marked)}: perplexity at the training length "
                        f"is at least {NEAR_UNIGRAM:.0%} of the corpus's unigram perplexity (a model that reads no "
                        "context), so how it changes past 1x says nothing of extrapolation")


def _settings_at_one_length(rows: list[dict], train_len: Optional[int]) -> list[str]:
    """The settings of scaled ``rows`` that measure one length several ways (string at two offsets, yarn at a fixed
    factor beside its default), each as its options and fixed factor say (``default`` for neither); [] if none."""
    settings: dict[tuple, dict[str, None]] = {}
    for r in rows:
        fixed = fixed_factor(r, train_len) if train_len else None
        text = " ".join(filter(None, ("" if fixed is None else factor_text(r.get("scaling"), fixed).strip(),
                                      str(r.get("scaling_options") or ""))))
        settings.setdefault((r.get("length"), r.get("depth")), {})[text or "default"] = None
    return next((list(s) for s in settings.values() if len(s) > 1), [])


def group_and_compare(report: Report, sort_key: Optional[SortKey] = None, reference: Sequence[Filter] = (),
                      margin: Optional[Margin] = None) -> None:
    """Group ``report.rows`` by ``report.by`` (each group aggregated, the groups in ``sort_key``'s order) and set
    ``report.comparison`` when there are groups to compare (with ``--by``, two or more) against ``reference``."""
    groups = group_rows(report.rows, report.by, report.warnings)
    for group in groups:
        aggregate_group(group, report)
    report.groups = sort_groups(groups, sort_key)
    if report.by and len(report.groups) > 1:
        chosen = pick_reference(report.groups, reference)
        if chosen is not None:
            report.comparison = compare_groups(report.groups, report.metrics, chosen, report.by, margin)


def _add_parent_metrics(report: Report) -> None:
    """Fine-tuned runs (``posexp finetune``): every metric but ``ratio`` again on their parents, beside their own."""
    read: dict[str, Optional[ReportRow]] = {}  # a parent's folder -> its row, None when it cannot be read
    parent: dict[int, ReportRow] = {}  # id of a fine-tune's row -> its parent's, when that is the one it started from
    for row in report.rows:
        path = row.run.info.get("parent")
        if not isinstance(path, str):
            continue
        if path not in read:
            try:
                run = read_run(path)
                read[path] = ReportRow(path, run, cells(run, report), None)
            except PosexpError as e:
                read[path] = None
                report.warnings.append(f"{row.label}: its parent cannot be read, its parent columns are blank ({e})")
        if (found := read[path]) is not None and (why := parent_changed(row.run, path)):
            report.warnings.append(f"{row.label}: {why}; its parent columns are blank")
        elif found is not None:
            parent[id(row)] = found
    if not parent:
        return
    pairs = [(m, replace(m, name=f"parent {m.name}", of_parent=True)) for m in report.metrics if m.kind != "ratio"]
    for group in report.groups:
        for mine, theirs in pairs:
            values = {p.run.path: metric_value(mine, p, report) for row in group.rows if (p := parent.get(id(row)))}
            group.metrics[theirs.name] = aggregate_stat(list(values.values()))  # a parent shared by seeds counts once
    beside = dict((mine.name, theirs) for mine, theirs in pairs)
    report.metrics = [m for mine in report.metrics for m in (mine, beside.get(mine.name)) if m is not None]


def _load_runs(run_dirs: Iterable[str | os.PathLike], by_keys: list[str], filters: list[Filter],
               strict: bool = False) -> tuple[list[Run], list[str]]:
    """The runs of ``run_dirs`` that pass ``filters``, after checking that every key names something,
    and the problems of the runs that could not be loaded (left out unless ``strict``)."""
    runs, skipped = read_runs(run_dirs, strict)
    if not runs:
        if skipped:
            raise PosexpError(skipped[0] + (f" ({len(skipped) - 1} more run(s) cannot be read either)"
                                            if len(skipped) > 1 else ""))
        raise PosexpError(f"no runs to report; pass folders containing {RESULTS_JSON}")
    return _once(select_runs(runs, filters, by_keys), skipped), skipped


def _once(runs: list[Run], skipped: list[str]) -> list[Run]:
    """``runs`` with each training counted once: a copy of a run (a sweep and its backup under one folder) has the
    same config hash, seed, overrides, final training loss and results; it would double n and turn a paired
    comparison into Welch's. The copies left out are named in ``skipped``."""
    seen: dict[tuple, Run] = {}
    kept = []
    for run in runs:
        train = run.info.get("train") if isinstance(run.info.get("train"), dict) else {}
        results = tuple(sorted(repr((r.get("length"), r.get("protocol"), r.get("scaling"), r.get("window"),
                                     r.get("ppl"), r.get("exact_match"))) for r in run.rows))
        key = (run.info.get("config_hash"), repr(run.info.get("seed")), repr(run.overrides),
               repr(train.get("final_loss")), results)  # repr: a hand-edited value may be a list
        if not isinstance(key[0], str) or train.get("final_loss") is None:
            kept.append(run)
        elif key in seen:
            skipped.append(f"{run.path}: the same run as {seen[key].path} (config hash {key[0]}, seed {key[1]}, "
                           "the same final loss and results), counted once")
        else:
            seen[key] = run
            kept.append(run)
    return kept


def _per_byte(rows: list[ReportRow], warnings: list[str]) -> None:
    """Runs that read the same text through different tokenizers (a pretrained model's, posexp's bytes or BPE) are
    compared per UTF-8 byte: each cell becomes ``exp(loss * tokens_per_byte)``, the perplexity per byte
    (``2 ** bits per byte``; Gao et al. 2020 compare models in bits per byte for this reason), which for a
    byte-level run is its perplexity unchanged. Ratios and ``maxlen`` then read per-byte perplexities.
    ``tokens_per_byte`` is the validation split's, so the conversion is exact for the split and close for the
    scored part of it. A run that recorded no byte count cannot be converted: it is flagged."""
    tokens = {row.run.info.get("corpus_fingerprint") for row in rows} - {None}
    texts = {row.run.info.get("text_fingerprint") for row in rows}
    if len(tokens) < 2 or len(texts) != 1 or None in texts:
        return  # one tokenization, or texts that are not one text (flagged as different corpora as always)
    for row in rows:
        tpb = as_number(row.run.info.get("tokens_per_byte"))
        if tpb is None:
            row.flags.append("no bytes count")
            warnings.append(f"{row.label}: its results record no tokens per byte, so it cannot be compared per byte "
                            "with runs of other tokenizers; evaluate it again with this posexp")
            continue
        row.per_byte = True
        per_byte = lambda v: None if v is None else math.exp(math.log(v) * tpb)  # noqa: E731
        row.cells = {n: Stat(c.applicable, per_byte(c.mean), per_byte(c.low), per_byte(c.high))
                     for n, c in row.cells.items()}


