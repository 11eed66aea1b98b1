"""Figures of task runs: accuracy against context length, the passkey's length x depth grid, and accuracy against
depth at each length (the "lost in the middle" curve).

House style of :mod:`posexp.plots.style`; matplotlib is imported inside the functions. Torch-free: a run's
files (``posexp/evaluation/``) and ``posexp report`` both draw through here.
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

from posexp.plots.style import FIG_HEIGHT_IN, new_figure, save_png, style_axes
from posexp.plots.perplexity import Canvas, draw_series, finish_by_length

# (label, lengths, accuracies, lows, highs), accuracies in [0, 1]; None = not applicable (a gap)
AccuracySeries = tuple[str, Sequence[int], Sequence[Optional[float]], Optional[Sequence[Optional[float]]],
                       Optional[Sequence[Optional[float]]]]
# (label, depths in [0, 1], accuracies in [0, 1]; None = not applicable)
DepthSeries = tuple[str, Sequence[float], Sequence[Optional[float]]]


def _value(x: Optional[float]) -> float:
    return math.nan if x is None or not math.isfinite(float(x)) else 100.0 * float(x)


def plot_accuracy_vs_length(series: Sequence[AccuracySeries], path: str | os.PathLike,
                            train_len: Optional[int] = None, title: Optional[str] = None,
                            ylabel: str = "exact match (%)") -> Path:
    """Accuracy (in %) against evaluation length (log2 tokens), one line and 95% band per series.

    Lengths without a value (not applicable) break the line and get an ``x`` on the bottom edge.
    """
    fig = new_figure(FIG_HEIGHT_IN + (0.13 * math.ceil(len(series) / 2) if len(series) > 6 else 0))
    canvas = Canvas(fig, fig.add_subplot(), len(series), named=len(series) <= 30, legend_below=len(series) > 6,
                    legend_cols=2)
    ticks, _, any_gaps = draw_series(canvas.ax, series, canvas.named, value=_value, what="accuracies")
    return finish_by_length(canvas, path, ticks=ticks, any_gaps=any_gaps, train_len=train_len, ylabel=ylabel,
                            title=title, y_axis=_percent_axis)


def _percent_axis(ax: Any) -> None:
    ax.set_ylim(-3, 103)


def plot_passkey_heatmap(lengths: Sequence[int], depths: Sequence[float],
                         grid: Sequence[Sequence[Optional[float]]], path: str | os.PathLike,
                         train_len: Optional[int] = None, title: Optional[str] = None) -> Path:
    """Exact-match accuracy (%) of a task with depths (passkey, niah, kv_retrieval) per context length (columns) x
    depth (rows), each cell labelled.

    Args:
        grid: ``grid[i][j]`` the accuracy in [0, 1] at ``depths[i]`` and ``lengths[j]``; None = not applicable.
    """
    import numpy as np

    data = np.array([[_value(v) for v in row] for row in grid], dtype=float)
    fig = new_figure(FIG_HEIGHT_IN + 0.1 * max(0, len(depths) - 5))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(data), cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    ax.set_facecolor("0.85")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([str(n) + ("*" if train_len is not None and n == train_len else "") for n in lengths],
                       fontsize=7)
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{d:g}" for d in depths], fontsize=7)
    ax.set_xlabel("context length (tokens)" + ("; * = training length" if train_len in lengths else ""),
                  fontsize=8)
    # two lines: on one, the label is taller than the figure and loses both ends
    ax.set_ylabel("depth of the needle\n(0 = first, 1 = last before the question)", fontsize=8)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            value = data[i, j]
            text = "n/a" if math.isnan(value) else f"{value:.0f}"
            dark = not math.isnan(value) and (value < 25 or value > 85)  # the colour map's dark ends
            ax.text(j, i, text, ha="center", va="center", fontsize=6, color="white" if dark else "0.1")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("exact match (%)", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    if title:
        ax.set_title(textwrap.fill(title, 60), fontsize=9)
    return save_png(fig, path)


def plot_accuracy_vs_depth(series: Sequence[DepthSeries], path: str | os.PathLike, title: Optional[str] = None,
                           chance: Optional[float] = None) -> Path:
    """Exact match (%) against the depth of what is asked, one line per context length (and group): the U-curve
    of Liu et al. 2023 ("Lost in the Middle", Fig. 7 for key-value retrieval), best at the first and last place
    and worst in the middle, when a model has it.

    Args:
        series: ``(label, depths, accuracies)`` per line, accuracies in [0, 1] (None: not applicable, a gap).
        chance: exact match of a uniform guess in [0, 1], drawn as a dotted line.
    """
    fig = new_figure(FIG_HEIGHT_IN + (0.13 * math.ceil(len(series) / 2) if len(series) > 6 else 0))
    ax = fig.add_subplot()
    for label, depths, values in series:
        ax.plot(list(depths), [_value(v) for v in values], marker="o", markersize=3, linewidth=1.2, label=label)
    if chance is not None:
        ax.axhline(100.0 * chance, color="0.5", linestyle=":", linewidth=0.8, label="chance")
    ax.set_xlim(-0.03, 1.03)
    _percent_axis(ax)
    style_axes(ax, "depth of the key (0 = first, 1 = last, right before the question)", "exact match (%)",
               textwrap.fill(title, 60) if title else None)
    if series:
        ax.legend(fontsize=6, ncol=2 if len(series) > 4 else 1,
                  **({"loc": "upper center", "bbox_to_anchor": (0.5, -0.22)} if len(series) > 6 else {}))
    return save_png(fig, path)
