"""``curve.png``: the extrapolation-during-training curve drawn from a run's ``curve.csv``
(:mod:`posexp.runs.curve` reads and writes the csv)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from posexp.plots.curve import plot_curve
from posexp.runs.curve import read_curve
from posexp.runs.layout import CURVE_PLOT


def draw_curve(run_dir: str | os.PathLike, train_len: int, title: Optional[str] = None) -> list[dict]:
    """``curve.png`` from the run's ``curve.csv`` (nothing without points); returns the rows drawn."""
    metric, rows = read_curve(run_dir)
    if metric is not None and rows:
        plot_curve(rows, metric, Path(run_dir) / CURVE_PLOT, train_len=train_len, title=title)
    return rows


__all__ = ["draw_curve"]
