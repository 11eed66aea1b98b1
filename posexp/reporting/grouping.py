"""The table's lines: runs grouped by ``--by`` (never pooling different corpora, eval settings, train lengths or
failures), each group's cells and metrics over its runs, and the ``--sort`` order.

Runs are only comparable when they were trained on the same corpus, with the same training length, and evaluated
the same way: the runs that differ from the majority are flagged and named (:func:`flag_outliers`), never averaged
in silently.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Optional, Sequence

from posexp.reporting.compare import comparable
from posexp.reporting.formatting import fmt_settings, short_id
from posexp.reporting.metrics import CELLS, metric_value
from posexp.reporting.selection import EXECUTION_KEYS, SortKey, ABSENT, canon, flatten_config, show_value, config_value
from posexp.reporting.runs import base_train_len
from posexp.reporting.stats import Stat, aggregate_stat
from posexp.reporting.table import Group, Report, ReportRow


def text_key(row: Any) -> Any:
    """What makes two runs' numbers one quantity: the same tokens (the corpus fingerprint), or, for rows compared per
    byte (their tokenizers differ), the same text (the text fingerprint)."""
    info = row.run.info
    return info.get("text_fingerprint") if row.per_byte else info.get("corpus_fingerprint")


def _compared_settings(row: Any, scaling: Any) -> Optional[dict]:
    """The eval settings a run is compared by: a run shown under its own scaling (Report.shown), not the table's,
    differs in it on purpose."""
    if row.settings is None or row.settings.get("scaling") == scaling:
        return row.settings
    return {k: v for k, v in row.settings.items() if k != "scaling"}


EARLIER_REVISION = "earlier encoder revision"


def _revisions(run: Any) -> dict[str, Any]:
    """The code revision of each encoder a run builds, as its config records it (``encoder.revision``; a mix's
    layers: ``encoder.options.NAME.revision``), 1 where it records none (trained before the encoder's first fix)."""
    encoder = run.config_data.get("encoder")
    if not isinstance(encoder, dict):
        return {}
    if encoder.get("name") != "mixed":
        return {str(encoder.get("name")): encoder.get("revision", 1)}
    options = encoder.get("options") or {}
    return {str(n): (options.get(n) or {}).get("revision", 1) for n in encoder.get("layers") or []}


def earlier_revisions(runs: Sequence[Any]) -> list[list[str]]:
    """For each run, the encoders it builds at a revision below the latest that another of ``runs`` records for the
    same encoder, as ``"fox revision 1 (2 in others)"``: its numbers come from other code, another method than
    the runs of the latest, so it is kept apart from them (:data:`EARLIER_REVISION`), as a run on another corpus."""
    recorded = [_revisions(run) for run in runs]
    latest: dict[str, Any] = {}
    for revisions in recorded:
        for name, revision in revisions.items():
            latest[name] = max(latest.get(name, revision), revision)
    return [[f"{name} revision {revision} ({latest[name]} in others)" for name, revision in revisions.items()
             if revision != latest[name]] for revisions in recorded]


def revision_compared(by: Sequence[str]) -> bool:
    """Whether ``--by`` compares an encoder's revisions on purpose (``encoder.revision``, a mix's
    ``encoder.options.NAME.revision``), so that a run of an earlier one is no stray run to set apart."""
    return any(k.startswith("encoder.") and k.endswith("revision") for k in by)


def flag_outliers(rows: Sequence[Any], warnings: list[str], train_len_varies: bool = False,
                  scaling: Any = None, revision_varies: bool = False) -> tuple[Optional[int], tuple, Any]:
    """Flag runs whose corpus, eval settings or training length differ from the majority, and runs of an encoder
    whose code another run has at a later revision (:func:`earlier_revisions`).

    Args:
        rows: the report's rows (:class:`~posexp.reporting.table.ReportRow`); flags are appended to them.
        warnings: the report's warnings; one is appended per flagged run.
        train_len_varies: the training length is a compared variable (``--by train_len``): do not flag it.
        scaling: the scaling the table shows; a run shown under its own is not flagged for it.
        revision_varies: an encoder's revision is a compared variable (``--by encoder.revision``): do not flag it.

    Returns:
        The majority training length, (corpus, fingerprint) and eval settings.
    """

    # the settings of the rows each run shows (ReportRow.settings), not what the run recorded when it trained:
    # a later posexp eval may have measured them otherwise
    infos = [{**row.run.info, "eval_settings": _compared_settings(row, scaling), "compared_text": text_key(row)}
             for row in rows]

    def majority(values: list[Any], unknown: Sequence[bool]) -> tuple[Any, list[str]]:
        """The value most runs have (compared as canonical JSON, so that dicts count; ties go to the first run's),
        and each run's key. An ``unknown`` run whose value is None neither votes nor is flagged."""
        keys = [json.dumps(v, sort_keys=True, default=str) for v in values]
        voters = [k for k, v, u in zip(keys, values, unknown) if not (u and v is None)] or keys
        top = Counter(voters).most_common(1)[0][0]
        return values[keys.index(top)], [top if u and v is None else k for k, v, u in zip(keys, values, unknown)]

    # A run that stopped before it read its data or evaluated has no fingerprint or eval settings:
    # unknown is not different (its status is flagged already).
    stopped = [row.run.status != "completed" for row in rows]
    corpus_fp, fp_keys = majority([i.get("compared_text") for i in infos], stopped)
    corpus_name = next((i.get("corpus") for i in infos if i.get("compared_text") == corpus_fp), None)
    # nor does a run with no rows in the view shown (its flag says so): it was not measured otherwise
    eval_settings, eval_keys = majority([i.get("eval_settings") for i in infos],
                                        [s or row.settings is None for s, row in zip(stopped, rows)])
    # a fine-tune changes its training length by design: it is compared at its parent's
    train_len, len_keys = majority([base_train_len(row.run) for row in rows], [False] * len(rows))

    checks = [
        (fp_keys, "different corpus", lambda i: f"corpus {i.get('corpus')} ({short_id(i.get('compared_text'))}) "
                                                f"vs {corpus_name} ({short_id(corpus_fp)}) for the others"),
        (eval_keys, "different eval settings", lambda i: f"eval settings {fmt_settings(i.get('eval_settings'))} "
                                                         f"vs {fmt_settings(eval_settings)} for the others"),
        (len_keys, "different train length", lambda i: f"trained at {i.get('parent_train_len') or i.get('train_len')} "
                                                       f"tokens vs {train_len} for the others"),
    ][:2 if train_len_varies else 3]
    for keys, flag, detail in checks:
        top = Counter(keys).most_common(1)[0][0]
        for row, key, info in zip(rows, keys, infos):
            if key != top:
                row.flags += [flag] if flag not in row.flags else []  # a flag once, whichever check found it
                warnings.append(f"{row.label}: {flag}, {detail(info)}; not comparable with the other runs")
    for row, earlier in zip(rows, earlier_revisions([row.run for row in rows])):
        if earlier and not revision_varies:
            row.flags.append(EARLIER_REVISION)
            warnings.append(f"{row.label}: {EARLIER_REVISION}, {', '.join(earlier)}: trained by other code; not "
                            f"comparable with the other runs")
    return train_len, (corpus_name, corpus_fp), eval_settings


def group_rows(rows: list[ReportRow], by: list[str], warnings: list[str]) -> list[Group]:
    """Split runs into groups by ``by``; never pool different corpora, eval settings, train lengths or failures."""
    if not by:
        return [Group({}, row.label, [row], flags=list(row.flags)) for row in rows]
    buckets: dict[tuple, Group] = {}
    earlier = dict(zip(map(id, rows), earlier_revisions([row.run for row in rows])))
    for row in rows:
        values = {k: config_value(row.run, k) for k in by}
        # Numbers measured on different text, or scored differently, or by other code, are different quantities.
        guard = (
            canon(text_key(row)),
            canon(row.settings),
            "" if "train_len" in by else canon(base_train_len(row.run)),
            "" if row.run.status == "completed" else str(row.run.path),  # a failure stays visible on its own
            canon(earlier[id(row)]),
        )
        bucket = (tuple(canon(v) for v in values.values()), guard)
        if bucket not in buckets:
            label = " ".join(f"{k}={show_value(v)}" for k, v in values.items())
            buckets[bucket] = Group(values, label, [])
        buckets[bucket].rows.append(row)
    groups = list(buckets.values())

    # Same --by values in several groups: name what separates them, in the label and the flags.
    by_values = Counter(canon(list(g.key.values())) for g in groups)
    scalings: dict[str, set] = {}  # by values -> the scalings its groups show (a run's own, Report.shown)
    for g in groups:
        scalings.setdefault(canon(list(g.key.values())), set()).add((g.rows[0].settings or {}).get("scaling"))
        g.flags = list(dict.fromkeys(f for row in g.rows for f in row.flags))
    # of the groups of one --by value, the one measured as the others (when one is) is compared; the rest stand apart
    compared = Counter(canon(list(g.key.values())) for g in groups if comparable(g))
    for group in groups:
        key = canon(list(group.key.values()))
        if by_values[key] > 1 and not (compared[key] == 1 and comparable(group)):
            parts = _why_apart(group, len(scalings[key]) > 1, earlier[id(group.rows[0])])
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
        one = len(split) == 1
        code = ", encoder revision" if any(EARLIER_REVISION in g.flags for g in split) else ""
        warnings.append(f"{len(split)} group{' has' if one else 's have'} the same --by values but a different "
                        f"corpus, eval settings, train length{code} or status; {'it is' if one else 'they are'} shown "
                        f"apart, never averaged {'with the others' if one else 'together'}")
    return groups


def _why_apart(group: Group, scalings_differ: bool, earlier: list[str]) -> list[str]:
    """What sets a group apart from the others of its ``--by`` values, for its label (``earlier``: the encoder
    revisions its runs trained by, below the latest, :func:`earlier_revisions`)."""
    first = group.rows[0]
    info, parts = first.run.info, []
    if first.run.status != "completed":
        parts.append(first.label)
    if "different corpus" in group.flags:
        parts.append(f"corpus {info.get('corpus')} {short_id(info.get('corpus_fingerprint'))}")
    if "different eval settings" in group.flags:
        parts.append(f"eval {fmt_settings(first.settings)}")
    elif scalings_differ:  # runs shown under their own scaling (Report.shown)
        parts.append(f"scaling {(first.settings or {}).get('scaling') or 'none'}")
    if "different train length" in group.flags:
        parts.append(f"train_len={first.run.train_len}")
    return parts + earlier


def _pooled_keys(group: Group, by: list[str]) -> list[str]:
    """Config keys (other than seed and execution settings) on which a group's runs disagree."""
    if group.n < 2:
        return []
    flats = []
    for row in group.rows:
        flat = {k: v for k, v in flatten_config(row.run.config_data).items() if not k.startswith("eval.")}
        for k in ("encoder", "base"):  # the effective values: base is null where an encoding ignores it
            flat[k] = row.run.info.get(k)
        flat.pop("encoder.name", None)
        flats.append(flat)
    keys = dict.fromkeys(k for flat in flats for k in flat)
    differ = [k for k in keys if k not in EXECUTION_KEYS and k not in by
              and len({canon(flat.get(k, ABSENT)) for flat in flats}) > 1]
    return differ


def aggregate_group(group: Group, report: "Report") -> None:
    lengths = sorted({n for row in group.rows for n in row.cells})
    for n in lengths:
        pairs = [(c.applicable, c.mean) for row in group.rows if (c := row.cells.get(n)) is not None]
        single = next(((c.low, c.high) for row in group.rows if (c := row.cells.get(n)) is not None
                       and c.applicable), (None, None))
        group.cells[n] = aggregate_stat(pairs, single, CELLS[report.kind][2])
    for metric in report.metrics:
        values = [metric_value(metric, row, report) for row in group.rows]
        group.metrics[metric.name] = aggregate_stat(values, bounds=metric.spec.bounds)
        group.values[metric.name] = [v if ok else None for ok, v in values]


def sort_groups(groups: list[Group], sort: Optional[SortKey]) -> list[Group]:
    if sort is None:
        return groups

    def value(group: Group) -> Any:
        if sort.metric is not None:
            stat = group.metrics.get(sort.metric.name, Stat())
            return stat.mean if stat.applicable else None
        if sort.name == "n":
            return group.n
        return group.key.get(sort.name)

    present = [g for g in groups if value(g) not in (None, ABSENT)]
    absent = [g for g in groups if value(g) in (None, ABSENT)]  # n/a and missing stay last either way

    def order(group: Group) -> tuple:
        v = value(group)
        return (0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, show_value(v))

    return sorted(present, key=order, reverse=sort.descending) + absent

