"""Reporting: compare finished runs from their run folders, without a model and without torch.

Owns the comparison of runs: loading them (:mod:`.runs`), choosing and describing
them (:mod:`.selection`), replicate statistics (:mod:`.stats`), the table and its
groups for language-modelling runs (:mod:`.lm_report`, built of :mod:`.table`'s parts, with :mod:`.metrics`'
summary metrics and :mod:`.grouping`'s groups) and for task runs (:mod:`.task_report`),
the table in five formats (:mod:`.render`, with :mod:`.formatting`'s number formats; the pivot, context-extension
and task tables as one :class:`~.tables.Table` each, rendered by :mod:`.tables`), every ``--metric`` declared
once in the registry :mod:`.metrics`, ``report.md``,
``summary.md`` and their figures (:mod:`.document`, drawn by :mod:`posexp.plots.perplexity`), and the entry
points (:mod:`.summary`: ``posexp report``, the end-of-sweep Hydra callback).

Run-folder files are named, found and read through :mod:`posexp.runs.layout`. This
package must never import torch, directly or through another posexp module
(``posexp report`` runs where no model can be built), nor anything of
``posexp.commands``, ``training``, ``evaluation`` or ``analysis``.
"""

import importlib
from typing import Any

# Each public name and the module that owns it, imported on first use (PEP 562): reading the metric registry
# (shell completion) or the options loads no more than it needs.
_OWNERS = {
    **dict.fromkeys(("Group", "Report", "ReportRow", "build_report", "metric_value"), "lm_report"),
    "ReportOptions": "options",
    **dict.fromkeys(("write_report", "write_summary"), "document"),
    **dict.fromkeys(("FORMATS", "RENDERERS", "print_report", "render_csv", "render_json", "render_latex",
                     "render_markdown", "render_table_csv", "render_table_markdown"), "render"),
    **dict.fromkeys(("Run", "read_run"), "runs"),
    **dict.fromkeys(("DEFAULT_METRICS", "DEFAULT_TOLERANCE", "Filter", "Metric", "SortKey", "check_tolerance",
                     "config_value", "parse_by", "parse_metric", "parse_metrics", "parse_sort", "parse_where"),
                    "selection"),
    **dict.fromkeys(("Stat", "mean_interval", "t_quantile"), "stats"),
    **dict.fromkeys(("refresh_sweep_summary", "report_main", "sweep_summary"), "summary"),
    "find_runs": "posexp.runs.layout",
}


def __getattr__(name: str) -> Any:
    if name not in _OWNERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    owner = _OWNERS[name]
    return getattr(importlib.import_module(owner if "." in owner else f"{__name__}.{owner}"), name)


__all__ = list(_OWNERS)
