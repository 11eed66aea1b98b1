"""What a report is made of: a cell per length, a row per run, groups of rows (the table's lines), the comparison of
the groups, the report.

A run's cell and a group's are one :class:`~posexp.reporting.stats.Stat`: a run's is its own value with its
evaluation interval (``n`` 0), a group's the mean over its runs.

Built by :func:`posexp.reporting.lm_report.build_report`; read by the writers (:mod:`.render`, :mod:`.document`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from posexp.reporting.difference import Difference, Margin
from posexp.reporting.metrics import CELLS, PERPLEXITY, read_values
from posexp.reporting.runs import Run, window_key
from posexp.reporting.selection import Filter, Metric
from posexp.reporting.stats import Stat
from posexp.runs.row import row_metric

UNLEARNED = "did not learn at 1×"  # the flag of a run that did not learn at its training length
# flags of posexp.reporting.lm_report's groups whose numbers were measured differently from the others'
NOT_COMPARABLE = {"kept apart: not comparable", "different corpus", "different eval settings", "different train length",
                  "different instances",  # a task run's, scored on another generator's or options' instances
                  "earlier encoder revision"}  # a run trained by an encoder's code of before a fix (grouping.py)


def measured_otherwise(flags: Iterable[str]) -> bool:
    """Whether a run or group with ``flags`` was measured differently from the others (:data:`NOT_COMPARABLE`), so
    that its numbers are not set against theirs."""
    return bool(NOT_COMPARABLE.intersection(flags))


@dataclass
class Comparison:
    """Every group against the reference group, per compared metric (made by
    :func:`posexp.reporting.compare.compare_groups`).

    Attributes:
        reference: the reference group's label.
        metrics: the compared metrics, in table order.
        differences: one per (non-reference group, metric), groups in table order.
        decimals: metric name -> decimals of its differences.
        by: the keys the groups differ in.
        margin: the equivalence margin (``--margin``), if any.
        family: how many comparisons were tested, and Holm-corrected together.
    """

    reference: str
    metrics: list[Metric]
    by: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    decimals: dict[str, int] = field(default_factory=dict)
    margin: Optional[Margin] = None
    family: int = 0

    def of_metric(self, name: str) -> list[Difference]:
        return [d for d in self.differences if d.metric == name]


@dataclass
class ReportRow:
    """One run's line in the table."""

    label: str
    run: Run
    cells: dict[int, Stat]  # length -> its perplexity (task runs: accuracy in %); absent: no row at that length
    ratio: Optional[float]
    flags: list[str] = field(default_factory=list)
    settings: Optional[dict] = None  # how the shown rows were measured (reporting.runs.shown_settings)
    per_byte: bool = False  # cells are perplexity per UTF-8 byte: the report's runs read the text with other tokenizers


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
        comparisons: a task report's: each task's comparison, as ``comparison`` (the tasks with two groups or more).
        kind: the runs' kind, of :mod:`.metrics`: ``perplexity`` (language-model runs) or ``accuracy`` (task runs).
        own_scaling: no scaling was asked for (``--view``): a run evaluated only under its own scaling shows it.
    """

    rows: list[ReportRow] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    protocol: Optional[str] = None
    scaling: Any = None
    train_len: Optional[int] = None
    ratio_length: Optional[int] = None
    shared_overrides: list[str] = field(default_factory=list)
    corpus: tuple[Optional[str], Optional[str]] = (None, None)
    eval_settings: Any = None
    warnings: list[str] = field(default_factory=list)
    other_views: list[tuple[Any, Any, Any]] = field(default_factory=list)
    by: list[str] = field(default_factory=list)
    metrics: list["Metric"] = field(default_factory=list)
    groups: list["Group"] = field(default_factory=list)
    filters: list["Filter"] = field(default_factory=list)
    auc_multiple: Optional[float] = None
    comparison: Optional[Comparison] = None
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    window: Optional[tuple] = None
    kind: str = PERPLEXITY
    own_scaling: bool = False

    def shown(self, run: Run) -> list[dict]:
        """The result rows of ``run`` the table shows: of its kind, in its view (task rows: of any protocol). With
        ``own_scaling``, a run with none there whose rows are all under one scaling (a pretrained model evaluated
        with its own ``eval.scaling``) shows those: its own view, not "no results"."""
        rows = [r for r in run.rows if row_metric(r) == self.kind and window_key(r) == self.window
                and self.protocol in (None, r.get("protocol"))]
        shown = [r for r in rows if r.get("scaling") == self.scaling]
        return rows if not shown and self.own_scaling and len({r.get("scaling") for r in rows}) == 1 else shown

    @property
    def view(self) -> str:
        """The scaling and window shown, in words ("" for the plain rows)."""
        text = f"scaling {self.scaling}" if self.scaling is not None else ""
        if self.window is not None:
            text += (", " if text else "") + f"window {self.window[0]}" + (
                f" + {self.window[1]} sinks" if self.window[1] else "")
        return text

    @property
    def encoders(self) -> list[str]:
        return list(dict.fromkeys(str(r.run.info.get("encoder") or "?") for r in self.rows))

    def other_train_lens(self, compared: bool = False) -> str:
        """The runs trained at another length than ``train_len`` (fine-tunes, compared at their parent's), in words:
        ``512 for a, b``; "" when every run trained at it. ``compared``: only of the runs compared, not of one
        flagged as measured otherwise (a stray trained at another length, whose ratio is no other run's)."""
        others: dict[int, list[str]] = {}
        for row in self.rows:
            if compared and measured_otherwise(row.flags):
                continue
            if row.run.train_len is not None and row.run.train_len != self.train_len:
                others.setdefault(row.run.train_len, []).append(row.label)
        return "; ".join(f"{n} for {', '.join(labels)}" for n, labels in sorted(others.items()))


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
        task: the task of a group of task runs (a table per task).
    """

    key: dict[str, Any]
    label: str
    rows: list[ReportRow]
    cells: dict[int, Stat] = field(default_factory=dict)
    metrics: dict[str, Stat] = field(default_factory=dict)
    values: dict[str, list[Optional[float]]] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    task: Optional[str] = None

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def runs(self) -> list[Run]:
        return [row.run for row in self.rows]

    @property
    def unlearned(self) -> int:
        """How many of its runs did not learn at 1x (flagged :data:`UNLEARNED` by the builder)."""
        return sum(UNLEARNED in row.flags for row in self.rows)

    @property
    def shown_label(self) -> str:
        """The label as task tables show it: marked when runs of the group did not learn the task at 1x."""
        if not self.unlearned:
            return self.label
        how_many = "" if self.unlearned == self.n else f"{self.unlearned} of {self.n} "
        return f"{self.label} ({how_many}{UNLEARNED})"

    @property
    def train_len(self) -> Optional[int]:
        return self.rows[0].run.train_len if self.rows else None


def cells(run: Run, report: Report) -> dict[int, Stat]:
    """length -> the :class:`~posexp.reporting.stats.Stat` of ``run``'s rows the table shows: the field of the
    report's kind, scaled (:data:`posexp.reporting.metrics.CELLS`)."""
    name, scale, _ = CELLS[report.kind]
    return {n: Stat(ok, *(None if v is None else scale * v for v in values))
            for n, (ok, *values) in read_values(report.shown(run), name).items()}
