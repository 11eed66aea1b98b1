"""What a report is asked for: ``posexp report``'s options, filled once at the command line and passed down whole.

:func:`posexp.reporting.summary.report_main` reads all of them; :func:`posexp.reporting.lm_report.build_report`
the ones that shape the perplexity table (everything but ``fmt`` and ``cols``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from posexp.reporting.selection import DEFAULT_TOLERANCE


@dataclass(frozen=True)
class ReportOptions:
    """The options of one report; each default is the report of the runs as they are.

    Attributes:
        by: dotted config keys to group by (``encoder``, ``base``, ``model.n_layers``); runs with the same values are
            averaged with a 95% t-interval. None: one line per run.
        metrics: summary metrics after the lengths (:func:`posexp.reporting.selection.parse_metric`); None: ratio,
            maxlen, auc (task runs: acc@2x, acc@4x, maxlen@acc90).
        tolerance: the tolerance of a plain ``maxlen`` (0.1 = ppl within +10%).
        where: ``KEY=VALUE`` / ``KEY!=VALUE`` filters on config keys, all of which must hold.
        sort: a metric, ``--by`` key or ``n`` to sort the lines by; a leading ``-`` sorts descending.
        fmt: ``rich`` (terminal), ``markdown``, ``csv``, ``json`` or ``latex``. The last four print only the
            table, so the output can be redirected; notes and warnings go to the error console.
        strict: stop at the first run whose ``results.json`` cannot be loaded. By default such runs are left out
            of the table and named in a one-line warning each.
        baseline: ``KEY=VALUE`` naming the reference group the others are compared with (needs ``by``); default:
            the first group (:mod:`posexp.reporting.compare`).
        view: ``KEY=VALUE`` of the rows to show (:mod:`posexp.reporting.views`: ``window=128``,
            ``protocol=last_k``, ``scaling=yarn``); default: the plain rows.
        margin: ``2%`` (of the reference group's mean) or ``0.05`` (in the metric's unit): groups whose difference
            lies within it are called equivalent (two one-sided tests; needs ``by``); None: no equivalence.
        cols: a pivot (:mod:`posexp.reporting.pivot`): the values of these keys as columns, the lines by ``by``.
    """

    by: Sequence[str] | str | None = None
    metrics: Sequence[str] | str | None = None
    tolerance: float = DEFAULT_TOLERANCE
    where: Sequence[str] | str | None = None
    sort: Optional[str] = None
    fmt: str = "rich"
    strict: bool = False
    baseline: Sequence[str] | str | None = None
    view: Sequence[str] | str | None = None
    margin: str | float | None = None
    cols: Sequence[str] | str | None = None
