"""The comparison a grouped report supports: each group against a reference group, in numbers and in words.

With ``--by``, every group's summary metrics (ratio, maxlen, auc, ...) are compared with those of a reference group
(``--baseline KEY=VALUE``; the first group by default): paired over the seeds the two groups share (the same data
order and initialisation, so pairing removes that part of the noise), else Welch's test where each has two or more
runs, else no interval, and the output says so and how to add seeds. The comparisons of a report (groups ×
metrics) are one family for Holm's correction, and an equivalence is claimed only within ``--margin``; one
difference, its test and its verdict are :mod:`.difference`'s.

:func:`window_verdicts` says, per length, whether runs beat their own attention window
(``posexp eval RUN eval.window=W``), paired over the runs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

from posexp.errors import ConfigError
# Margin, parse_margin, interval_text and window_verdicts are read from here too, by those who compare groups
from posexp.reporting.difference import (ALPHA, BETTER, CONFIDENCE, EQUAL, EQUIVALENT, INCONCLUSIVE, NO_INTERVAL, NONE,
                                         NOT_COMPARED, WORSE, Difference, Margin, fill_difference, interval_text, judge,
                                         p_text, parse_margin, window_verdicts)
from posexp.reporting.formatting import fmt_signed, joined, md_escape
from posexp.reporting.tables import Column, Section, Table, TableCell, to_markdown
from posexp.reporting.selection import EXECUTION_KEYS, Filter, Metric, parse_where
# Comparison is read from here too, as Margin is
from posexp.reporting.table import Comparison, Group, measured_otherwise


SEEDS_HINT = "add seeds, e.g. `seed=0,1,2` in the sweep (posexp train -m ... seed=0,1,2)"


def parse_baseline(baseline: Sequence[str] | str | None, by: list[str]) -> list[Filter]:
    """``--baseline encoder=rope`` (or ``encoder=rope,base=100``) -> filters on ``--by`` keys.

    Raises:
        ConfigError: for ``--baseline``: without ``--by``, not KEY=VALUE, or a key that is not a ``--by`` key.
    """
    if not baseline:
        return []
    if not by:
        raise ConfigError("--baseline", "needs --by: the reference is one of the groups, e.g. "
                                        "--by encoder --baseline encoder=rope")
    items = [baseline] if isinstance(baseline, str) else list(baseline)
    # "encoder=rope,base=100" is two conditions, not one key with two values as in --where
    parts = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
    try:
        filters = parse_where(parts)
    except ConfigError:
        filters = []
    if len(filters) != len(parts) or not filters:
        raise ConfigError("--baseline", f"{','.join(parts)!r} is not KEY=VALUE; name one group, "
                                        "e.g. --baseline encoder=rope or --baseline encoder=rope,base=100")
    for f in filters:
        if f.negate or f.key not in by:
            raise ConfigError("--baseline", f"{f} does not name a group; use KEY=VALUE with KEY one of the --by "
                                            f"keys ({', '.join(by)})")
    return filters


def comparable(group: Group) -> bool:
    """A group whose numbers may be set against the others' (same corpus, eval settings, train length, finished)."""
    return not (measured_otherwise(group.flags) or any(f.startswith("status:") for f in group.flags))


def pick_reference(groups: Sequence[Group], filters: Sequence[Filter]) -> Optional[Group]:
    """The group ``filters`` name (all its runs match), else the first comparable group.

    Raises:
        ConfigError: for ``--baseline``, when no group matches, listing the groups.
    """
    candidates = [g for g in groups if comparable(g)]
    if not filters:
        return candidates[0] if candidates else None
    matched = [g for g in candidates if all(f.matches(row.run) for f in filters for row in g.rows)]
    if len(matched) > 1:
        raise ConfigError("--baseline", f"{','.join(str(f) for f in filters)} matches {len(matched)} groups ("
                                        + "; ".join(g.label for g in matched) + "); name one, with a value for each "
                                        "--by key that tells them apart")
    if matched:
        return matched[0]
    named = ",".join(str(f) for f in filters)
    apart = [g for g in groups if not comparable(g) and all(f.matches(row.run) for f in filters for row in g.rows)]
    if apart:  # in the table, yet not compared: say why rather than that it is not there
        raise ConfigError("--baseline", f"the groups with {named} are not compared with the others ("
                                        + "; ".join(f"{g.label}: {', '.join(g.flags)}" for g in apart)
                                        + "); the groups compared are: " + "; ".join(g.label for g in candidates))
    raise ConfigError("--baseline", f"no group has {named}; the groups are: "
                                    + "; ".join(g.label for g in candidates))


def compare_groups(groups: Sequence[Group], metrics: list[Metric], reference: Group,
                   by: Sequence[str] = (), margin: Optional[Margin] = None) -> Comparison:
    """Each group's values of ``metrics`` (``Group.values``) against ``reference``'s, Holm-corrected as one family.

    Args:
        groups: the report's groups, in table order.
        metrics: the summary metrics; those without per-run values (a fine-tune's parent columns) are skipped.
        reference: one of ``groups``.
        by: the keys the groups differ in (``--by``).
        margin: the equivalence margin (``--margin``); None: no equivalence is claimed.

    Returns:
        The :class:`Comparison`.
    """
    metrics = [m for m in metrics if m.name in reference.values]
    comparison = Comparison(reference.label, metrics, list(by),
                            decimals={m.name: m.decimals + (1 if m.decimals else 0) for m in metrics}, margin=margin)
    for group in groups:
        if group is reference:
            continue
        for metric in metrics:
            diff = Difference(group.label, metric.name, reference.label, higher=metric.higher_is_better,
                              scaled=metric.relative)
            if not comparable(group):
                diff.reason = "measured differently: " + "; ".join(group.flags)
            else:
                fill_difference(diff, _seeded(group, metric.name), _seeded(reference, metric.name), metric.spec.bounds)
            comparison.differences.append(diff)
    comparison.family = judge(comparison.differences, margin)
    return comparison


def _seed(value: Any) -> Any:
    """A run's seed to pair by: an integer as recorded; None (never paired) for a hand-edited value of another type."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seeded(group: Group, metric: str) -> list[tuple[Any, float]]:
    """(seed, value) of each run of ``group`` that has a finite value of ``metric``."""
    return [(_seed(row.run.info.get("seed")), v) for row, v in zip(group.rows, group.values.get(metric, []))
            if v is not None and math.isfinite(v)]


def _are(items: list) -> str:
    return "is" if len(items) == 1 else "are"


def verdict_line(comparison: Comparison, metric: Metric, name: Callable[[str], str] = str) -> str:
    """The comparison on ``metric`` in one plain sentence (or a few, joined), e.g. for the table's notes; ``name``:
    how a group's label is written (:func:`~posexp.reporting.formatting.md_escape` in markdown)."""
    diffs = comparison.of_metric(metric.name)
    decimals = comparison.decimals[metric.name]
    used = sorted({d.method for d in diffs if d.method != NONE})
    reference = name(comparison.reference)
    head = (f"{metric.name} ({metric.spec.better} is better), each group − "
            f"{reference}" + (f" ({', '.join(used)}, 95%)" if used else "") + ": ")
    parts = []
    for verdict in (BETTER, WORSE):
        hits = [d for d in diffs if d.verdict == verdict]
        if hits:
            items = [f"{name(d.group)} ({interval_text(d, decimals)}, n = {d.n}, Holm-adjusted p "
                     f"{_p_phrase(d.p_adjusted)})" for d in hits]
            parts.append(f"{joined(items)} {_are(hits)} {verdict}")
    same = [d for d in diffs if d.verdict == EQUIVALENT]
    if same:
        parts.append(f"{joined([f'{name(d.group)} ({_equivalence_text(d, decimals)})' for d in same])} "
                     f"{_are(same)} equivalent to {reference} within {comparison.margin} (two one-sided tests)")
    open_ = [d for d in diffs if d.verdict == INCONCLUSIVE]
    if open_:
        parts.append(_inconclusive_text(comparison, open_, decimals, name))
    equal = [d for d in diffs if d.verdict == EQUAL]
    if equal:
        parts.append(f"{joined([name(d.group) for d in equal])} {'shows' if len(equal) == 1 else 'show'} no "
                     "difference at all")
    single = [d for d in diffs if d.verdict == NO_INTERVAL]
    if single:
        parts.append(f"{joined([name(d.group) for d in single])}: one run (n = 1) in the group or the reference, "
                     f"so no interval exists; {SEEDS_HINT}")
    apart = [d for d in diffs if d.verdict == NOT_COMPARED]
    if apart:
        parts.append(f"not compared: {'; '.join(f'{name(d.group)} ({d.reason})' for d in apart)}")
    return head + ("; ".join(parts) if parts else "no other group") + "."


def _p_phrase(p: Optional[float]) -> str:
    text = p_text(p)
    return text if text.startswith("<") else f"= {text}"


def _equivalence_text(diff: Difference, decimals: int) -> str:
    """``+0.002 (+0.2%), 90% [+0.000, +0.004] inside ±0.025``."""
    assert diff.test is not None and diff.margin is not None
    low, high = diff.test.interval(1 - 2 * ALPHA)
    relative = interval_text(replace(diff, low=None, high=None), decimals)
    return (f"{relative}, {100 * (1 - 2 * ALPHA):g}% [{fmt_signed(low, decimals)}, {fmt_signed(high, decimals)}] inside "
            f"±{diff.margin:.{decimals}f}")


def _inconclusive_text(comparison: Comparison, diffs: list[Difference], decimals: int,
                       name: Callable[[str], str]) -> str:
    """``base=1000 (+0.030 (+2.4%) [...]) is inconclusive against base=100 at n = 3: about 12 seeds ...``."""
    sizes = {d.n for d in diffs}
    at = f"n = {sizes.pop()}" if len(sizes) == 1 else "their n"
    text = (f"{joined([f'{name(d.group)} ({interval_text(d, decimals)})' for d in diffs])} {_are(diffs)} "
            f"inconclusive against {name(comparison.reference)} at {at}")
    sized = [d for d in diffs if d.needed and d.needed <= 10_000]  # more: the table says so
    if sized:
        level = f"α = {ALPHA}" + (f"/{comparison.family}" if comparison.family > 1 else "")
        # named where some of them have no count here ("about 52 seeds for a"), never "about 52 for a seeds"
        counts = ([f"{d.needed}" for d in sized] if len(sized) == len(diffs) else
                  [f"{d.needed} seeds for {name(d.group)}" for d in sized])
        text += (f": about {joined(counts)}{' seeds' if len(sized) == len(diffs) else ''} "
                 f"would be needed to resolve {'this difference' if len(sized) == 1 else 'each difference'}"
                 + (f" or show it equivalent within {comparison.margin}" if comparison.margin else "")
                 + f" (80% power, {level})")
    return text


def family_note(comparison: Comparison) -> str:
    """What the verdicts rest on: Holm's correction over the report's comparisons, and the margin if any."""
    k = comparison.family
    text = (f"Holm-corrected over {k} comparison{'s' if k != 1 else ''} (groups × metrics; Holm 1979): better or "
            f"worse means a Holm-adjusted p < {ALPHA}; the intervals are unadjusted 95%.")
    if comparison.margin is None:
        return text + (" An interval containing 0 is inconclusive, not evidence of equivalence; --margin 2% "
                       "(of the reference's mean) or an absolute margin tests equivalence.")
    of = " of the reference's mean" if comparison.margin.relative else ""
    return text + (f" Equivalent within {comparison.margin}: the {100 * (1 - 2 * ALPHA):g}% interval of the "
                   f"difference lies inside ±{comparison.margin}{of} (two one-sided tests at α = {ALPHA}, "
                   "Schuirmann 1987; not corrected for multiplicity).")


def comparison_table(comparison: Comparison, method: bool = True) -> Table:
    """The comparison table, one line per group and metric: n, method (unless ``method`` is False: a terminal says it
    in the title, for room), the difference with its relative size and interval (``under``: the interval under it),
    the Holm-adjusted p, and the verdict."""
    header = ["group", "metric", "n", *(["method"] if method else []), "difference (95%)", "p (Holm)", "verdict"]
    columns = [Column(h, label=h not in ("n", "difference (95%)", "p (Holm)"), escape=True,
                      min_width=16 if h in ("group", "metric") else 0) for h in header]  # encoder=learned whole
    rows = []
    for d in comparison.differences:
        interval = interval_text(d, comparison.decimals[d.metric])
        rows.append([TableCell(d.group), TableCell(d.metric), TableCell(str(d.n) if d.n else "—"),
                     *([TableCell(d.method)] if method else []),
                     TableCell(interval, under=interval.replace(" [", "\n[")), TableCell(p_text(d.p_adjusted)),
                     TableCell(d.text())])
    used = sorted({d.method for d in comparison.differences if d.method != NONE})
    how = f"{', '.join(used)}, 95% interval" if used else "no interval"
    return Table(f"Each group − {comparison.reference} ({how})", columns,
                 [Section(rows)], compact=True, whole=True)


def comparison_markdown(comparison: Comparison) -> list[str]:
    """Lines of the ``## Comparison`` section of report.md and summary.md."""
    lines = ["## Comparison", "", f"Each group against the reference **{md_escape(comparison.reference)}**: mean "
             "difference (group − reference), in % of the reference's mean, with its 95% interval. Paired t: over "
             "the seeds both groups share (Student 1908, n − 1 degrees of freedom); Welch t: unpaired, where the "
             "seeds differ (Welch 1947). p (Holm): the two-sided p-value, Holm-adjusted over all comparisons.", "",
             *to_markdown(comparison_table(comparison)).splitlines(), ""]
    # prose, not a table cell: its labels escaped, the seed hint keeping its code span
    lines += [f"- {line}" for line in verdict_lines(comparison, md_escape)]
    return lines


def verdict_lines(comparison: Comparison, name: Callable[[str], str] = str) -> list[str]:
    """One plain line per compared metric and one on the correction; a single line when no group has an interval
    at all (one seed each). ``name``: how a group's label is written (as :func:`verdict_line` takes it)."""
    if comparison.differences and all(d.verdict == NO_INTERVAL for d in comparison.differences):
        return [f"Every comparison has one run on a side (n = 1): no interval exists, so none of these differences "
                f"can be told from seed-to-seed noise; {SEEDS_HINT}."]
    notes = [family_note(comparison)] if comparison.family else []
    return [verdict_line(comparison, m, name) for m in comparison.metrics] + notes


def comparison_json(comparison: Comparison) -> dict:
    """The comparison's machine-readable fields (``--format json``)."""
    return {
        "reference": comparison.reference, "confidence": CONFIDENCE, "alpha": ALPHA,
        "correction": {"method": "Holm (1979)", "comparisons": comparison.family},
        "margin": None if comparison.margin is None else {
            "value": comparison.margin.value, "relative": comparison.margin.relative, "text": str(comparison.margin),
            "test": f"two one-sided tests (Schuirmann 1987): {100 * (1 - 2 * ALPHA):g}% interval inside ±margin"},
        "verdicts": verdict_lines(comparison),
        "metrics": {m.name: {"better": m.spec.better,
                             "verdict": verdict_line(comparison, m)} for m in comparison.metrics},
        "differences": [d.as_dict() for d in comparison.differences],
    }


def best_groups(groups: Sequence[Group], higher: bool, stats: list[Any], decimals: int) -> set[int]:
    """Indexes of the groups with the best mean in one column, as shown to ``decimals`` (ties all marked: two means
    printed alike are both bold or neither); empty with fewer than two values or when all are equal."""
    values = {i: round(s.mean, decimals) for i, (g, s) in enumerate(zip(groups, stats))
              if comparable(g) and s is not None and s.applicable and s.mean is not None and math.isfinite(s.mean)}
    if len(values) < 2:
        return set()
    best = max(values.values()) if higher else min(values.values())
    marked = {i for i, v in values.items() if v == best}
    return marked if len(marked) < len(values) else set()  # all equal: nothing stands out


def best_cells(groups: Sequence[Group], stats: list[list[Any]], higher: list[bool],
               decimals: list[int]) -> set[tuple[int, int]]:
    """``(group, column)`` of each column's best means (:func:`best_groups`) in a table of ``stats``, a line of
    statistics per group, each column's direction ``higher`` and its ``decimals``."""
    return {(g, j) for j, (high, d) in enumerate(zip(higher, decimals))
            for g in best_groups(groups, high, [line[j] for line in stats], d)}


def sweep_keys(runs: list[Any]) -> list[str]:
    """The override keys that vary across a sweep's runs, other than the seed and execution settings.

    A sweep's summary is written without ``--by``; these keys are the configurations it compares.
    """
    per_run = []
    for run in runs:
        pairs = (str(o).lstrip("+~").partition("=") for o in run.overrides or [])
        per_run.append({key: value for key, sep, value in pairs if sep and "/" not in key})  # hydra/launcher: how
    keys = dict.fromkeys(k for overrides in per_run for k in overrides)
    return [k for k in keys if k not in EXECUTION_KEYS and not k.startswith("hydra.")
            and len({overrides.get(k) for overrides in per_run}) > 1]
