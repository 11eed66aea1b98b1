"""The house style of every figure posexp draws: size, resolution, axes, saving.

Shared by the reports' plots (:mod:`posexp.plots.perplexity`) and the analysis
figures (:mod:`posexp.analysis.drawing`), so a figure of either reads the same
in a paper column. Torch-free, and matplotlib is imported only inside the
functions: the report and the CLI import this module, and most of their work
never draws. A bare ``Figure`` on the Agg canvas is used instead of pyplot, so
there is no global figure state and no display is ever needed.
"""

from __future__ import annotations

import os
import textwrap
from io import BytesIO
from pathlib import Path
from typing import Optional

from posexp.runs.atomic import atomic_write_bytes

# Sized for a paper column: readable at 100% when placed 3.5-5 in wide.
FIG_WIDTH_IN = 4.5
FIG_HEIGHT_IN = 3.0
DPI = 150


def new_figure(height: float = FIG_HEIGHT_IN, width: float = FIG_WIDTH_IN):
    """A bare column-width ``Figure`` (constrained layout) on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: str | os.PathLike) -> Path:
    """Render ``fig`` as PNG and write it atomically to ``path``; returns ``path`` as a Path."""
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return atomic_write_bytes(path, buf.getvalue())


def fit_label(label: str, width: int) -> str:
    """A run's label wrapped to ``width`` characters, at most three lines: the start and the end are kept, where
    the middle is left out (``…``), as the end is what tells a scalings sweep's runs apart. A label as long as a
    fine-tune's (its parent's path and every override) was wider than the figure, and constrained layout gave
    up: the axes collapsed to nothing."""
    lines = textwrap.wrap(label, width) or [label]
    if len(lines) > 3:
        lines = [lines[0], f"… {lines[-2]}", lines[-1]]
    return "\n".join(lines)


def style_axes(ax, xlabel: str, ylabel: str, title: Optional[str] = None) -> None:
    """Axis labels, small tick labels and a light grid, for a column-width figure."""
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    if title:
        ax.set_title(title, fontsize=8)


def mark_train_len(ax, train_len: int) -> None:
    """The training context length as a dashed vertical line, labelled for the legend."""
    ax.axvline(train_len, color="0.35", linestyle="--", linewidth=0.9, label=f"train length ({train_len})")
