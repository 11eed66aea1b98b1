"""Figures of task runs: accuracy against context length, and the passkey's length x depth grid.

House style of :mod:`posexp.figures`; matplotlib is imported inside the functions. Torch-free: a run's
files (``posexp/evaluation/``) and ``posexp report`` both draw through here.
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Optional, Sequence

from posexp.figures import FIG_HEIGHT_IN, mark_train_len, new_figure, save_png
from posexp.plots import _colors, _length_axis, _legend, _title_and_note

# (label, lengths, accuracies, lows, highs), accuracies in [0, 1]; None = not applicable (a gap)
AccuracySeries = tuple[str, Sequence[int], Sequence[Optional[float]], Optional[Sequence[Optional[float]]],
                       Optional[Sequence[Optional[float]]]]


def _value(x: Optional[float]) -> float:
    return math.nan if x is None or not math.isfinite(float(x)) else 100.0 * float(x)


def plot_accuracy_vs_length(series: Sequence[AccuracySeries], path: str | os.PathLike,
                            train_len: Optional[int] = None, title: Optional[str] = None,
                            ylabel: str = "exact match (%)") -> Path:
    """Accuracy (in %) against evaluation length (log2 tokens), one line and 95% band per series.

    Lengths without a value (not applicable) break the line and get an ``x`` on the bottom edge.
    """
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    named = len(series) <= 30
    fig = new_figure(FIG_HEIGHT_IN + (0.13 * math.ceil(len(series) / 2) if len(series) > 6 else 0))
    ax = fig.add_subplot()
    bottom_edge = blended_transform_factory(ax.transData, ax.transAxes)
    ticks: set[int] = set()
    any_gaps = False
    for (label, lengths, values, lows, highs), color in zip(series, _colors(len(series))):
        x = [float(n) for n in lengths]
        ticks.update(int(n) for n in lengths)
        y = [_value(v) for v in values]
        ax.plot(x, y, marker="o", markersize=3, linewidth=1.2, color=color, label=label if named else None)
        if lows is not None and highs is not None:
            ax.fill_between(x, [_value(v) for v in lows], [_value(v) for v in highs], color=color, alpha=0.18,
                            linewidth=0)
        gaps = [xi for xi, yi in zip(x, y) if math.isnan(yi)]
        if gaps:
            any_gaps = True
            ax.plot(gaps, [0.0] * len(gaps), transform=bottom_edge, linestyle="none", marker="x", markersize=5,
                    color=color, clip_on=False)
    if train_len is not None:
        ticks.add(int(train_len))
        mark_train_len(ax, train_len)
    _length_axis(ax, ticks)
    ax.set_ylim(-3, 103)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    if len(ticks) > 7:
        ax.tick_params(axis="x", labelrotation=45)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    _title_and_note(ax, title, named, len(series))
    handles, labels = ax.get_legend_handles_labels()
    if any_gaps:
        handles.append(Line2D([], [], linestyle="none", marker="x", color="0.35"))
        labels.append("not applicable")
    _legend(fig, ax, handles, labels, below=len(series) > 6 or not named, ncol=2, inside_fontsize=7)
    return save_png(fig, path)


def plot_passkey_heatmap(lengths: Sequence[int], depths: Sequence[float],
                         grid: Sequence[Sequence[Optional[float]]], path: str | os.PathLike,
                         train_len: Optional[int] = None, title: Optional[str] = None) -> Path:
    """Exact-match accuracy (%) of the passkey per context length (columns) x depth (rows), each cell labelled.

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
    ax.set_ylabel("depth of the key (0 = start of the filler)", fontsize=8)
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
