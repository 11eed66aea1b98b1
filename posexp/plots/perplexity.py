"""Perplexity-vs-context-length plots, and the other figures of runs and reports.

Each figure follows the house style of :mod:`posexp.plots.style` (size, resolution,
saving). matplotlib is imported inside the functions, not at module level: the
report and the CLI import this module, and most of their work (tables, CSV) never draws.
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from posexp.plots.style import FIG_HEIGHT_IN, fit_label, mark_train_len, new_figure, save_png

# A legend inside the axes can hide data ("best" placement still covered a curve that ran along the top), so
# every legend goes below the axes, outside the data.
MAX_INSIDE_LEGEND = 0
# Past this many, a legend is a wall of text taller than the plot; colours then follow
# series order on a gradient and the caller's table is the key.
MAX_LEGEND_SERIES = 30

# (label, lengths, ppls, lows, highs); a None ppl means "not applicable" and leaves a gap.
Series = tuple[
    str,
    Sequence[int],
    Sequence[Optional[float]],
    Optional[Sequence[Optional[float]]],
    Optional[Sequence[Optional[float]]],
]


def plot_ppl_vs_length(
    series: Sequence[Series],
    path: str | os.PathLike,
    train_len: int | None = None,
    title: str | None = None,
    ylabel: str = "perplexity",
    colour_by: Optional[Sequence[Any]] = None,
) -> Path:
    """Plot perplexity against evaluation length, one line per series, and save it as PNG.

    The x axis is log2 in tokens with a tick at every evaluated length; the y axis
    is log scale. Lengths where a series has no perplexity (not applicable, or
    not evaluated) break its line and are marked with an ``x`` on the bottom edge,
    so a gap is never mistaken for missing data points joined by a straight line.

    Args:
        series: ``(label, lengths, ppls, lows, highs)`` per line. ``lows``/``highs``
            (the interval around each perplexity) may be None to draw no band.
        path: where to write the PNG; written atomically.
        train_len: training context length, drawn as a dashed vertical line.
        title: optional figure title.
        ylabel: y axis label, e.g. ``"perplexity (per byte)"``.
        colour_by: per series, the group it belongs to (e.g. its encoder, for a sweep's seeds): series of one
            group share a colour. None: a colour per series.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    canvas = _new_figure(len(series))
    ticks, any_points, any_gaps = draw_series(canvas.ax, series, canvas.named, colour_by=colour_by)
    return finish_by_length(canvas, path, ticks=ticks, any_gaps=any_gaps, train_len=train_len, ylabel=ylabel,
                            title=title, y_axis=lambda a: _ppl_axis(a, any_points))


def draw_series(ax, series: Sequence[Series], named: bool, value: Callable[[Optional[float]], float] | None = None,
                what: str = "perplexities", colour_by: Optional[Sequence[Any]] = None) -> tuple[set[int], bool, bool]:
    """One line (and band) per series, gaps marked on the bottom edge; returns (lengths, any point, any gap).

    ``value`` maps each number (and interval bound) to what is drawn, NaN for a gap (default: the number
    when finite); ``what`` names the numbers in the error for a series whose lengths do not match them.
    """
    from matplotlib.transforms import blended_transform_factory

    # x in data coordinates, y in axes coordinates: puts "n/a" markers on the bottom edge.
    bottom_edge = blended_transform_factory(ax.transData, ax.transAxes)
    ticks: set[int] = set()
    any_points = any_gaps = False
    value = value or _finite_or_nan
    groups = list(colour_by) if colour_by is not None else list(range(len(series)))
    palette = dict(zip(dict.fromkeys(groups), _colors(len(set(groups)))))
    for (label, lengths, ppls, lows, highs), group in zip(series, groups):
        color = palette[group]
        if len(lengths) != len(ppls):
            raise ValueError(f"series {label!r}: {len(lengths)} lengths but {len(ppls)} {what}")
        ticks.update(int(n) for n in lengths)
        x = [float(n) for n in lengths]
        y = [value(p) for p in ppls]
        any_points |= any(not math.isnan(v) for v in y)
        ax.plot(x, y, marker="o", markersize=3, linewidth=1.2, color=color, label=label if named else None)
        if lows is not None and highs is not None:
            lo = [value(v) for v in lows]
            hi = [value(v) for v in highs]
            ax.fill_between(x, lo, hi, color=color, alpha=0.18, linewidth=0)
        gaps = [xi for xi, yi in zip(x, y) if math.isnan(yi)]
        if gaps:
            any_gaps = True
            ax.plot(gaps, [0.0] * len(gaps), transform=bottom_edge, linestyle="none", marker="x",
                    markersize=5, color=color, clip_on=False)
    return ticks, any_points, any_gaps


def finish_by_length(canvas: Canvas, path, *, ticks: set[int], any_gaps: bool, train_len: Optional[int],
                     ylabel: str, title: Optional[str], y_axis: Callable[[object], None]) -> Path:
    """What every figure of a value against context length shares after its lines are drawn: the training
    length, the log2 length axis, ``y_axis`` (the figure's own y scale), labels, grid, title, the legend
    with its "not applicable" entry when a series has gaps; then the PNG at ``path``."""
    from matplotlib.lines import Line2D

    ax = canvas.ax
    if train_len is not None:
        ticks.add(int(train_len))
        mark_train_len(ax, train_len)
    _length_axis(ax, ticks)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    if len(ticks) > 7:
        ax.tick_params(axis="x", labelrotation=45)
    y_axis(ax)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    _title_and_note(ax, title, canvas.named, canvas.n_series)

    handles, labels = ax.get_legend_handles_labels()
    if any_gaps:
        handles.append(Line2D([], [], linestyle="none", marker="x", color="0.35"))
        labels.append("not applicable")
    _legend(canvas, handles, labels, inside_fontsize=7)
    return save_png(canvas.fig, path)


def _length_axis(ax, ticks: set[int]) -> None:
    """Context length on log2 x, a labelled tick at every evaluated length and nowhere else."""
    from matplotlib import ticker

    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xlim(min(ticks) / 1.3, max(ticks) * 1.3)
    ax.xaxis.set_major_locator(ticker.FixedLocator(sorted(ticks)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _format_tokens(v)))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("context length (tokens)", fontsize=8)


def _ppl_axis(ax, any_points: bool) -> None:
    """Perplexity on a log y axis with plain-number labels, or a note when nothing was applicable."""
    from matplotlib import ticker

    if any_points:
        ax.set_yscale("log")
        # Perplexities usually span less than a decade, where default log ticks would
        # label only one power of ten (or none); plain numbers on minor ticks fix that.
        plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.6)))
    else:
        ax.text(0.5, 0.5, "no applicable lengths", transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="0.4")
        ax.set_yticks([])


def _title_and_note(ax, title: str | None, named: bool, n_series: int) -> None:
    """The wrapped title, and where series are too many to name, how their colours read."""
    if title:
        ax.set_title(textwrap.fill(title, 60), fontsize=9)
    if not named:
        ax.text(0.01, 0.99, f"{n_series} series, coloured in order (dark first)", transform=ax.transAxes,
                ha="left", va="top", fontsize=6, color="0.3")


def _finite_or_nan(value: float | None) -> float:
    """NaN makes matplotlib break the line, which is how gaps are drawn."""
    if value is None:
        return math.nan
    value = float(value)
    # A log axis cannot show 0 or inf; treat them as gaps instead of crashing the scale.
    return value if math.isfinite(value) and value > 0 else math.nan


def _format_tokens(value: float) -> str:
    """128 -> "128", 2048 -> "2k", 1536 -> "1.5k": short enough for a column-width axis."""
    n = int(round(value))
    if n >= 1024 and n % 512 == 0:
        return f"{n / 1024:g}k"
    return str(n)


def _colors(n: int) -> list:
    """Distinct colours for n series; qualitative maps run out, so fall back to a gradient."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["viridis"](i / (n - 1)) for i in range(n)]


# (length, positions, mean losses, counts) for one window length
PositionSeries = tuple[int, Sequence[int], Sequence[float], Sequence[int]]
# Per-position means are noisy where few windows reach a position; log-spaced bins
# of this many per doubling of the context smooth them without hiding the trend.
BINS_PER_OCTAVE = 2


def _log_bins(positions: Sequence[int], losses: Sequence[float], counts: Sequence[int]) -> tuple[list, list]:
    """Count-weighted mean loss in log2-spaced bins of the context size (position + 1)."""
    import numpy as np

    if len(positions) == 0:
        return [], []
    context = np.asarray(positions, dtype=np.float64) + 1
    weight = np.asarray(counts, dtype=np.float64)
    bins = np.floor(np.log2(context) * BINS_PER_OCTAVE).astype(np.int64)
    _, index = np.unique(bins, return_inverse=True)
    total = np.bincount(index, weights=weight)
    keep = total > 0
    where = np.bincount(index, weights=context * weight)[keep] / total[keep]
    mean = np.bincount(index, weights=np.asarray(losses, dtype=np.float64) * weight)[keep] / total[keep]
    return where.tolist(), mean.tolist()


def plot_loss_by_position(
    series: Sequence[PositionSeries],
    path: str | os.PathLike,
    train_len: int | None = None,
    title: str | None = None,
) -> Path:
    """Mean loss against position in the window, one line per window length, saved as PNG.

    The x axis is the context a prediction had (position + 1 tokens, log2); each
    line is the count-weighted mean over log-spaced bins (2 per doubling), so
    the long tail of a long window, reached by few windows, is not drawn as noise.

    Args:
        series: ``(length, positions, losses, counts)`` per window length; positions
            are 0-based indices of the predicting token in the window.
        path: where to write the PNG; written atomically.
        train_len: training length, drawn as a dashed vertical line.
        title: optional figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    labelled = [(f"L = {_format_tokens(length)}", length, positions, losses, counts)
                for length, positions, losses, counts in series]
    return plot_position_overlay(labelled, path, train_len=train_len, title=title)


# (label, window length, positions, mean losses, counts) for one line of an overlay
LabelledPositionSeries = tuple[str, int, Sequence[int], Sequence[float], Sequence[int]]


def plot_position_overlay(
    series: Sequence[LabelledPositionSeries],
    path: str | os.PathLike,
    train_len: int | None = None,
    title: str | None = None,
) -> Path:
    """Mean loss against position in the window, one labelled line per series, saved as PNG.

    The report overlays runs (or groups of runs) with it, each at its own window
    length, so a curve that rises past the training length stands out against one
    that stays flat. Binning is that of :func:`plot_loss_by_position`.

    Args:
        series: ``(label, length, positions, losses, counts)`` per line.
        path: where to write the PNG; written atomically.
        train_len: training length, drawn as a dashed vertical line.
        title: optional figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    from matplotlib import ticker

    canvas = _new_figure(len(series))
    ax, named = canvas.ax, canvas.named
    ticks: set[int] = set()
    for (label, length, positions, losses, counts), color in zip(series, _colors(len(series))):
        x, y = _log_bins(positions, losses, counts)
        ax.plot(x, y, linewidth=1.2, color=color, label=label if named else None)
        ticks.add(int(length))
    if train_len is not None:
        ticks.add(int(train_len))
        mark_train_len(ax, train_len)
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xlim(1, max(ticks) * 1.2)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _format_tokens(v)))
    ax.set_xlabel("context of the prediction (tokens, position in window + 1)", fontsize=8)
    ax.set_ylabel("mean loss (nats/token)", fontsize=8)
    if not series:
        ax.text(0.5, 0.5, "no applicable lengths", transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="0.4")
    return _finish(canvas, path, title)


# (label, steps, losses) for one training curve
CurveSeries = tuple[str, Sequence[float], Sequence[float]]


def plot_training_curves(
    series: Sequence[CurveSeries],
    path: str | os.PathLike,
    title: str | None = None,
) -> Path:
    """Training loss against step, one line per series, saved as PNG.

    Args:
        series: ``(label, steps, losses)`` per line, from ``metrics.csv`` (losses in nats/token).
        path: where to write the PNG; written atomically.
        title: optional figure title.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    canvas = _new_figure(len(series))
    ax, named = canvas.ax, canvas.named
    for (label, steps, losses), color in zip(series, _colors(len(series))):
        ax.plot([float(s) for s in steps], [_finite_or_nan(v) for v in losses], linewidth=1.1, color=color,
                label=label if named else None)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("training loss (nats/token)", fontsize=8)
    if not series:
        ax.text(0.5, 0.5, "no metrics.csv in these runs", transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="0.4")
    return _finish(canvas, path, title)


@dataclass(frozen=True)
class Canvas:
    """A figure of ``n_series`` lines, its axes, and where its legend goes: the lines are ``named`` in it (else
    coloured in order, the caller's table the key); below the axes in ``legend_cols`` columns, or inside them."""

    fig: Any
    ax: Any
    n_series: int
    named: bool
    legend_below: bool
    legend_cols: int


def _new_figure(n_series: int) -> Canvas:
    """A column-width figure with room below the axes for a long legend."""
    named = n_series <= MAX_LEGEND_SERIES
    legend_below = named and n_series > MAX_INSIDE_LEGEND
    legend_cols = 2 if n_series <= 16 else 3
    legend_rows = math.ceil((n_series + 1) / legend_cols) if legend_below else 0
    fig = new_figure(FIG_HEIGHT_IN + 0.13 * legend_rows)
    return Canvas(fig, fig.add_subplot(), n_series, named, legend_below, legend_cols)


def _finish(canvas: Canvas, path, title) -> Path:
    ax = canvas.ax
    ax.tick_params(which="both", labelsize=7)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    _title_and_note(ax, title, canvas.named, canvas.n_series)
    handles, labels = ax.get_legend_handles_labels()
    _legend(canvas, handles, labels, inside_fontsize=6)
    return save_png(canvas.fig, path)


def _legend(canvas: Canvas, handles: list, labels: list, inside_fontsize: float) -> None:
    """The legend inside the axes, or below them for many series (or unnamed ones); none without entries."""
    if not handles:
        return
    fig, ax = canvas.fig, canvas.ax
    below, ncol = canvas.legend_below or not canvas.named, canvas.legend_cols
    width = max(24, 84 // ncol) if below else 56
    labels = [fit_label(label, width) for label in labels]
    if below:
        # unnamed lines: only the training length and "not applicable" remain, and "best" inside
        # the axes would test every point of a hundred lines against candidate boxes (seconds)
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=6, frameon=False)
    else:
        ax.legend(handles, labels, fontsize=inside_fontsize, loc="best", framealpha=0.85)
