"""The comparison a grouped report supports: each group against a reference group, in numbers and in words.

With ``--by``, every group's summary metrics (ratio, maxlen, auc, ...) are compared with
those of a reference group (``--baseline KEY=VALUE``; the first group by default):

- **paired** where the two groups share seeds: the difference group − reference is taken
  per seed, and its mean gets a 95% paired t-interval (Student 1908, n − 1 degrees of
  freedom, n = the number of shared seeds). Runs with the same seed share their data order
  and initialisation, so pairing removes that part of the noise.
- **unpaired** where they share fewer than two seeds but each has two or more runs:
  Welch's t-interval (Welch 1947), said as such in every output.
- **no interval** where a group (or the reference) has a single run: the output says so and
  how to add seeds.

A bootstrap is not used: with the 2-5 seeds a sweep usually has, a resample of the
differences takes only a handful of distinct values and its percentile interval is too
narrow; the t-interval is exact for normal differences and the usual choice at this n.

A difference whose interval excludes 0 is called better or worse (by the metric's
direction); one whose interval contains 0 cannot be told apart from the reference at
this n, and the verdict says how many seeds would resolve a difference of the observed
size (:func:`~posexp.reporting.stats.runs_needed`, 80% power, α = 0.05).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

from posexp.errors import ConfigError
from posexp.reporting.selection import EXECUTION_KEYS, Filter, Metric, parse_where
from posexp.reporting.stats import mean_interval, runs_needed, sample_sd, welch_interval


class Group(Protocol):
    """What a comparison reads of a report's group (:class:`posexp.reporting.lm_report.Group`)."""

    label: str
    rows: list[Any]  # ReportRow: .run.info["seed"]
    values: dict[str, list[Optional[float]]]
    flags: list[str]


CONFIDENCE = 0.95
PAIRED, WELCH, NONE = "paired t", "Welch t", "none"
BETTER, WORSE, SAME, EQUAL = "better", "worse", "indistinguishable", "equal"
NO_INTERVAL, NOT_COMPARED = "no interval", "not compared"
SEEDS_HINT = "add seeds, e.g. `seed=0,1,2` in the sweep (posexp train -m ... seed=0,1,2)"
# flags of posexp.reporting.lm_report's groups whose numbers were measured differently from the others'
NOT_COMPARABLE = {"kept apart: not comparable", "different corpus", "different eval settings", "different train length"}


def higher_is_better(metric: Metric) -> bool:
    """Whether a larger value of ``metric`` is the better one (maxlen, context gain); else lower is better."""
    return metric.kind in ("maxlen", "gain")


@dataclass
class Difference:
    """One group's metric against the reference's.

    Attributes:
        group: the group's label.
        metric: the metric's name.
        reference: the reference group's label.
        difference: mean of group − reference (paired: over shared seeds); None without values.
        low, high: its 95% interval; None when no interval exists.
        n: paired: the number of shared seeds; unpaired: the smaller group's number of runs.
        method: ``paired t``, ``Welch t`` or ``none``.
        verdict: ``better``, ``worse``, ``indistinguishable``, ``equal`` (the same value for every seed),
            ``no interval`` or ``not compared``.
        needed: runs (pairs, or per group) a test would need to detect this difference; None unless indistinguishable.
        reason: why there is no interval or no comparison.
    """

    group: str
    metric: str
    reference: str
    difference: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    n: int = 0
    method: str = NONE
    verdict: str = NOT_COMPARED
    needed: Optional[int] = None
    reason: str = ""

    def as_dict(self) -> dict:
        return {"group": self.group, "metric": self.metric, "reference": self.reference,
                "difference": self.difference, "low": self.low, "high": self.high, "n": self.n,
                "method": self.method, "verdict": self.verdict, "n_needed": self.needed, "reason": self.reason}


@dataclass
class Comparison:
    """Every group against the reference group, per compared metric.

    Attributes:
        reference: the reference group's label.
        metrics: the compared metrics, in table order.
        differences: one per (non-reference group, metric), groups in table order.
        decimals: metric name -> decimals of its differences.
        by: the keys the groups differ in.
    """

    reference: str
    metrics: list[Metric]
    by: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    decimals: dict[str, int] = field(default_factory=dict)

    def of_metric(self, name: str) -> list[Difference]:
        return [d for d in self.differences if d.metric == name]


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
    return not any(f in NOT_COMPARABLE or f.startswith("status:") for f in group.flags)


def pick_reference(groups: Sequence[Group], filters: list[Filter]) -> Optional[Group]:
    """The group ``filters`` name (all its runs match), else the first comparable group.

    Raises:
        ConfigError: for ``--baseline``, when no group matches, listing the groups.
    """
    candidates = [g for g in groups if comparable(g)]
    if not filters:
        return candidates[0] if candidates else None
    for group in candidates:
        if all(f.matches(row.run) for f in filters for row in group.rows):
            return group
    raise ConfigError("--baseline", f"no group has {','.join(str(f) for f in filters)}; the groups are: "
                                    + "; ".join(g.label for g in candidates))


def compare_groups(groups: Sequence[Group], metrics: list[Metric], reference: Group,
                   by: Sequence[str] = ()) -> Comparison:
    """Each group's values of ``metrics`` (``Group.values``) against ``reference``'s.

    Args:
        groups: the report's groups, in table order.
        metrics: the summary metrics; those without per-run values (a fine-tune's parent columns) are skipped.
        reference: one of ``groups``.
        by: the keys the groups differ in (``--by``).

    Returns:
        The :class:`Comparison`.
    """
    metrics = [m for m in metrics if m.name in reference.values]
    comparison = Comparison(reference.label, metrics, list(by),
                            decimals={m.name: m.decimals + (1 if m.decimals else 0) for m in metrics})
    for group in groups:
        if group is reference:
            continue
        for metric in metrics:
            diff = Difference(group.label, metric.name, reference.label)
            if not comparable(group):
                diff.reason = "measured differently: " + "; ".join(group.flags)
            else:
                _fill(diff, _seeded(group, metric.name), _seeded(reference, metric.name), higher_is_better(metric))
            comparison.differences.append(diff)
    return comparison


def _seeded(group: Group, metric: str) -> list[tuple[Any, float]]:
    """(seed, value) of each run of ``group`` that has a finite value of ``metric``."""
    return [(row.run.info.get("seed"), v) for row, v in zip(group.rows, group.values.get(metric, []))
            if v is not None and math.isfinite(v)]


def _fill(diff: Difference, mine: list[tuple[Any, float]], ref: list[tuple[Any, float]], higher: bool) -> None:
    """Set ``diff``'s numbers and verdict from the two groups' (seed, value) lists."""
    if not mine or not ref:
        diff.reason = "no value in " + ("this group" if not mine else "the reference group")
        return
    mine_by, ref_by = dict(mine), dict(ref)
    unique = len(mine_by) == len(mine) and len(ref_by) == len(ref) and None not in mine_by and None not in ref_by
    shared = [s for s in mine_by if s in ref_by] if unique else []
    if len(shared) >= 2:  # pairs: group − reference for each seed both have
        deltas = [mine_by[s] - ref_by[s] for s in shared]
        diff.difference, diff.low, diff.high = mean_interval(deltas, CONFIDENCE)
        diff.n, diff.method, sd, groups = len(shared), PAIRED, sample_sd(deltas), 1
    elif len(mine) >= 2 and len(ref) >= 2:
        a, b = [v for _, v in mine], [v for _, v in ref]
        diff.difference, diff.low, diff.high, _ = welch_interval(a, b, CONFIDENCE)
        diff.n, diff.method, groups = min(len(a), len(b)), WELCH, 2
        sd = math.sqrt((sample_sd(a) ** 2 + sample_sd(b) ** 2) / 2)
        diff.reason = ("unpaired: the groups share fewer than two seeds" if unique
                       else "unpaired: a seed repeats within a group")
    else:
        diff.difference = math.fsum(v for _, v in mine) / len(mine) - math.fsum(v for _, v in ref) / len(ref)
        diff.n, diff.verdict = min(len(mine), len(ref)), NO_INTERVAL
        diff.reason = "n = 1: no interval exists"
        return
    if diff.low > 0 or diff.high < 0:
        diff.verdict = BETTER if (diff.difference > 0) == higher else WORSE
    elif diff.low == diff.high == 0:
        diff.verdict = EQUAL
    else:
        diff.verdict = SAME
        # at least one more than now: the interval at this n already contains 0
        diff.needed = max(diff.n + 1, math.ceil(runs_needed(diff.difference, sd, groups))) \
            if diff.difference else None


def _signed(value: Optional[float], decimals: int) -> str:
    if value is None:
        return "—"
    text = f"{value:+.{decimals}f}"
    return text.replace("-", "−")


def interval_text(diff: Difference, decimals: int) -> str:
    """``+0.030 [−0.050, +0.110]``; the difference alone when there is no interval."""
    if diff.difference is None:
        return "—"
    if diff.low is None or diff.high is None:
        return _signed(diff.difference, decimals)
    return f"{_signed(diff.difference, decimals)} [{_signed(diff.low, decimals)}, {_signed(diff.high, decimals)}]"


def _names(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def verdict_line(comparison: Comparison, metric: Metric) -> str:
    """The comparison on ``metric`` in one plain sentence (or a few, joined), e.g. for the table's notes."""
    diffs = comparison.of_metric(metric.name)
    decimals = comparison.decimals[metric.name]
    used = sorted({d.method for d in diffs if d.method != NONE})
    head = (f"{metric.name} ({'higher' if higher_is_better(metric) else 'lower'} is better), each group − "
            f"{comparison.reference}" + (f" ({', '.join(used)}, 95%)" if used else "") + ": ")
    parts = []
    for verdict in (BETTER, WORSE):
        hits = [d for d in diffs if d.verdict == verdict]
        if hits:
            parts.append(f"{_names([f'{d.group} ({interval_text(d, decimals)}, n = {d.n})' for d in hits])} "
                         f"{'is' if len(hits) == 1 else 'are'} {verdict} beyond the interval")
    same = [d for d in diffs if d.verdict == SAME and d.needed]
    if same:
        sizes = {d.n for d in same}
        at = f"n = {sizes.pop()}" if len(sizes) == 1 else "their n"
        unit = "seed pairs" if all(d.method == PAIRED for d in same) else "runs per group"
        parts.append(f"{_names([f'{d.group} ({interval_text(d, decimals)})' for d in same])} cannot be told apart "
                     f"from {comparison.reference} at {at}; about {_names([str(d.needed) for d in same])} {unit} "
                     f"would be needed to resolve a difference of {'this' if len(same) == 1 else 'each'} size "
                     "(80% power, α = 0.05)")
    equal = [d for d in diffs if d.verdict == EQUAL or d.verdict == SAME and not d.needed]
    if equal:
        parts.append(f"{_names([d.group for d in equal])} {'shows' if len(equal) == 1 else 'show'} no difference "
                     "at all")
    single = [d for d in diffs if d.verdict == NO_INTERVAL]
    if single:
        parts.append(f"{_names([d.group for d in single])}: one run (n = 1) in the group or the reference, "
                     f"so no interval exists; {SEEDS_HINT}")
    apart = [d for d in diffs if d.verdict == NOT_COMPARED]
    if apart:
        parts.append(f"not compared: {'; '.join(f'{d.group} ({d.reason})' for d in apart)}")
    return head + ("; ".join(parts) if parts else "no other group") + "."


def comparison_rows(comparison: Comparison, method: bool = True) -> tuple[list[str], list[list[str]]]:
    """The comparison table, one line per group and metric: n, method (unless ``method`` is False), the
    difference with its interval, and the verdict."""
    header = ["group", "metric", "n", *(["method"] if method else []), "difference (95%)", "verdict"]
    rows = [[d.group, d.metric, str(d.n) if d.n else "—", *([d.method] if method else []),
             interval_text(d, comparison.decimals[d.metric]), d.verdict] for d in comparison.differences]
    return header, rows


def methods(comparison: Comparison) -> list[str]:
    """The interval methods the comparison used (``paired t``, ``Welch t``)."""
    return sorted({d.method for d in comparison.differences if d.method != NONE})


def comparison_markdown(comparison: Comparison, md) -> list[str]:
    """Lines of the ``## Comparison`` section of report.md and summary.md; ``md`` escapes a table cell."""
    header, rows = comparison_rows(comparison)
    lines = ["## Comparison", "", f"Each group against the reference **{md(comparison.reference)}**: mean "
             "difference (group − reference) with its 95% interval. Paired t: over the seeds both groups share "
             "(Student 1908, n − 1 degrees of freedom); Welch t: unpaired, where the seeds differ (Welch 1947).", "",
             "| " + " | ".join(md(h) for h in header) + " |",
             "| --- | --- | ---: | --- | ---: | --- |"]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    lines.append("")
    # prose, not a table cell: the seed hint keeps its code span
    lines += [f"- {line}" for line in verdict_lines(comparison)]
    return lines


def verdict_lines(comparison: Comparison) -> list[str]:
    """One plain line per compared metric; a single one when no group has an interval at all (one seed each)."""
    if comparison.differences and all(d.verdict == NO_INTERVAL for d in comparison.differences):
        return [f"Every comparison has one run on a side (n = 1): no interval exists, so none of these differences "
                f"can be told from seed-to-seed noise; {SEEDS_HINT}."]
    return [verdict_line(comparison, m) for m in comparison.metrics]


def comparison_json(comparison: Comparison) -> dict:
    """The comparison's machine-readable fields (``--format json``)."""
    return {
        "reference": comparison.reference, "confidence": CONFIDENCE,
        "verdicts": verdict_lines(comparison),
        "metrics": {m.name: {"better": "higher" if higher_is_better(m) else "lower",
                             "verdict": verdict_line(comparison, m)} for m in comparison.metrics},
        "differences": [d.as_dict() for d in comparison.differences],
    }


def best_groups(groups: Sequence[Group], higher: bool, stats: list[Any]) -> set[int]:
    """Indexes of the groups with the best mean in one column (ties all marked); empty with fewer than two values
    or when all are equal."""
    values = {i: s.mean for i, (g, s) in enumerate(zip(groups, stats))
              if comparable(g) and s is not None and s.applicable and s.mean is not None and math.isfinite(s.mean)}
    if len(values) < 2:
        return set()
    best = max(values.values()) if higher else min(values.values())
    marked = {i for i, v in values.items() if v == best}
    return marked if len(marked) < len(values) else set()  # all equal: nothing stands out


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
