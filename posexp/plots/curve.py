"""Figures of the extrapolation curve (``eval.during_training``): perplexity (a task run: exact match) at each
multiple of the training length against the training step, for one run (``curve.png``) and for several side
by side (``posexp report``).

House style of :mod:`posexp.plots.style`; matplotlib is imported inside the functions. Torch-free: the rows
are curve.csv's (:func:`posexp.runs.curve.read_curve`).
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Optional, Sequence

from posexp.plots.perplexity import _ppl_axis
from posexp.plots.style import FIG_WIDTH_IN, fit_label, new_figure, save_png, style_axes
from posexp.runs.layout import PERPLEXITY

# (title, metric, rows): one panel, rows as read from a run's curve.csv
Panel = tuple[str, str, Sequence[dict]]

MAX_COLUMNS = 3  # panels per row of a report's figure
PANEL_TITLE_WIDTH = 40  # characters of a run's label over its 2.6-inch panel


def _value(metric: str, row: dict) -> float:
    value = row.get("ppl" if metric == PERPLEXITY else "exact_match")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return math.nan
    return float(value) if metric == PERPLEXITY else 100.0 * float(value)


def _ylabel(metric: str) -> str:
    return "perplexity (log scale)" if metric == PERPLEXITY else "exact match (%)"


def _colors(multiples: Sequence[float]) -> dict[float, tuple]:
    """One colour per multiple, the same in every panel: dark for 1x, light for the longest."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    n = len(multiples)
    return {m: cmap(0.85 * i / max(1, n - 1)) for i, m in enumerate(multiples)}


def _draw(ax, metric: str, rows: Sequence[dict], colors: dict[float, tuple]) -> None:
    """One line per multiple: the value against the step, with a dot at each point."""
    for multiple, color in colors.items():
        points = sorted((r["step"], _value(metric, r)) for r in rows if r["multiple"] == multiple)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], color=color, linewidth=1.1, marker="o",
                    markersize=2.0, label=f"{multiple:g}x")
    if metric == PERPLEXITY:
        _ppl_axis(ax, any_points=True)
    else:
        ax.set_ylim(-3, 103)


def _multiples(rows: Sequence[dict]) -> list[float]:
    return sorted({float(r["multiple"]) for r in rows})


def plot_curve(rows: Sequence[dict], metric: str, path: str | os.PathLike, train_len: Optional[int] = None,
               title: Optional[str] = None) -> Path:
    """One run's curve: perplexity (log y) or exact match against the training step, one line per multiple of
    the training length, saved as PNG (atomically).

    Args:
        rows: curve.csv's rows.
        metric: ``perplexity`` or ``accuracy`` (curve.csv's kind).
        train_len: the training length, for the legend's title.
        title: the figure's title.
    """
    fig = new_figure()
    ax = fig.add_subplot()
    _draw(ax, metric, rows, _colors(_multiples(rows)))
    style_axes(ax, "training step", _ylabel(metric), textwrap.fill(title, 60) if title else None)
    ax.tick_params(which="both", labelsize=7)
    legend_title = f"× train_len ({train_len})" if train_len else "× train_len"
    ax.legend(fontsize=6, title=legend_title, title_fontsize=6, loc="best", framealpha=0.85)
    return save_png(fig, path)


def plot_curve_panels(panels: Sequence[Panel], path: str | os.PathLike, title: Optional[str] = None) -> Path:
    """Several runs' curves side by side, one panel each, up to :data:`MAX_COLUMNS` a row; panels of one metric
    share their y axis, so the height of a line compares across panels, and every multiple keeps its colour.

    Args:
        panels: ``(title, metric, rows)`` per panel.
        title: the figure's title.
    """
    n = max(1, len(panels))
    cols = min(MAX_COLUMNS, n)
    rows_of_panels = math.ceil(n / cols)
    fig = new_figure(height=0.3 + 2.2 * rows_of_panels, width=max(FIG_WIDTH_IN, 2.6 * cols))
    colors = _colors(sorted({m for _, _, rows in panels for m in _multiples(rows)}))
    metrics = {metric for _, metric, _ in panels}
    axes = fig.subplots(rows_of_panels, cols, squeeze=False, sharex=False, sharey=len(metrics) == 1)
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        name, metric, rows = panels[i]
        _draw(ax, metric, rows, colors)
        style_axes(ax, "training step" if i >= len(panels) - cols else "",
                   _ylabel(metric) if i % cols == 0 or len(metrics) > 1 else "", fit_label(name, PANEL_TITLE_WIDTH))
        ax.tick_params(which="both", labelsize=6)
    handles = [axes.flat[0].plot([], [], color=c, linewidth=1.1, label=f"{m:g}x")[0] for m, c in colors.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 8), fontsize=6, frameon=False,
               title="multiple of the training length", title_fontsize=6)
    if title:
        fig.suptitle(title, fontsize=8)
    if not panels:
        axes.flat[0].set_visible(True)
        axes.flat[0].text(0.5, 0.5, "no curve.csv in these runs", transform=axes.flat[0].transAxes, ha="center",
                          va="center", fontsize=8, color="0.4")
    return save_png(fig, path)
