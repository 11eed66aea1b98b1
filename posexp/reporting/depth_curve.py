"""The "lost in the middle" figure of a report: exact match by the depth of what is asked, at each length.

Liu et al. 2023 ("Lost in the Middle: How Language Models Use Long Contexts", §4, Fig. 7) sweep the place of the
gold key-value pair and find a U-curve: best first and last, worst in the middle. Every task run with depths
(``kv_retrieval``, ``passkey``, ``niah``, ``babilong``: rows per ``eval.depths``) gives that curve at each length;
here one line per report group and length, the mean exact match over the group's runs at each depth, from the
plain rows (no evaluation-time scaling, no window). Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

from posexp.runs.layout import ACCURACY, REPORT_DEPTH_PLOT, row_metric


def group_depth_series(label: str, runs: Sequence[Any], many: bool) -> list[tuple]:
    """``(label, depths, mean exact match)`` per length of one group's ``runs`` (report runs: ``.rows``), from
    their plain accuracy rows with a depth; a depth any run cannot read at a length is None there.

    Args:
        many: more than one group is drawn: the group's label goes into each line's.
    """
    cells: dict[tuple[int, float], list[Optional[float]]] = {}
    for run in runs:
        for r in run.rows:
            if (row_metric(r) == ACCURACY and r.get("depth") is not None and r.get("scaling") is None
                    and r.get("window") is None):
                value = r.get("exact_match") if r.get("applicable", True) else None
                cells.setdefault((int(r["length"]), float(r["depth"])), []).append(value)
    out = []
    for length in sorted({n for n, _ in cells}):
        depths = sorted(d for n, d in cells if n == length)
        values = [_mean(cells[(length, d)]) for d in depths]
        out.append((f"{label}, L={length}" if many else f"L={length}", depths, values))
    return out


def _mean(values: list[Optional[float]]) -> Optional[float]:
    if not values or any(v is None or not math.isfinite(float(v)) for v in values):
        return None
    return math.fsum(float(v) for v in values) / len(values)


def write_depth_curve(groups: Sequence[Any], out_dir: str | Path) -> Optional[str]:
    """Draw ``report_accuracy_vs_depth.png`` for the ``groups`` (``.label``, ``.runs``) with depth rows; returns
    the markdown that shows it, or None when no group has depths (nothing is drawn)."""
    from posexp.plots.accuracy import plot_accuracy_vs_depth

    many = len(groups) > 1
    series = [s for g in groups for s in group_depth_series(g.label, g.runs, many)]
    if not series:
        return None
    plot_accuracy_vs_depth(series, Path(out_dir) / REPORT_DEPTH_PLOT,
                           title="exact match by depth at each length (Liu et al. 2023's curve)")
    return (f"![exact match vs depth]({REPORT_DEPTH_PLOT})\n\nLines: mean exact match of each group's runs by the "
            "depth of what is asked (0 = first, 1 = last, right before the question), one per context length: "
            "the \"lost in the middle\" U-curve (Liu et al. 2023) where a model has it.")
