"""``curve.csv``: the points of ``eval.during_training``, written as training goes.

The whole file is rewritten atomically after every point (it holds a few hundred short lines at most), so a
run killed at any moment leaves every point it measured and never a half-written line. A resumed run first
keeps only the points up to its checkpoint's step: the later ones are measured again, so the file holds
each step once, as if the run had never stopped. :func:`read_curve` reads it (for reports, ``load_run``).
Torch-free.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Optional, Sequence

from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import ACCURACY, CURVE_CSV, PERPLEXITY

# how each column is written: counts as integers, measurements to 8 significant digits, seconds to ms
_FORMATS = {"step": "d", "length": "d", "tokens": "d", "examples": "d", "multiple": "g", "eval_s": ".3f"}


# curve.csv's columns: a language model's (perplexity) and a task run's (accuracy); the header says which
CURVE_COLUMNS = {PERPLEXITY: ["step", "length", "multiple", "ppl", "loss", "tokens", "eval_s"],
                 ACCURACY: ["step", "length", "multiple", "exact_match", "token_accuracy", "answer_loss", "examples",
                            "eval_s"]}


def curve_metric(header: Sequence[str]) -> Optional[str]:
    """Which kind of curve.csv a header belongs to (:data:`CURVE_COLUMNS`), or None for another file."""
    return next((metric for metric, columns in CURVE_COLUMNS.items() if list(header) == columns), None)


def read_curve(run_dir: str | os.PathLike) -> tuple[Optional[str], list[dict]]:
    """A run's ``curve.csv``: its metric and rows (numbers parsed; ``step``, ``length`` and ``tokens`` /
    ``examples`` as ints), in file order. A missing or unreadable file is ``(None, [])``; a line a kill cut
    short is left out."""
    try:
        lines = (Path(run_dir) / CURVE_CSV).read_text(encoding="utf-8").splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()  # the write a kill interrupted
        records = list(csv.reader(lines))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None, []
    metric = curve_metric(records[0]) if records else None
    if metric is None:
        return None, []
    columns, rows = CURVE_COLUMNS[metric], []
    for record in records[1:]:
        try:
            rows.append({c: int(v) if c in ("step", "length", "tokens", "examples") else float(v)
                         for c, v in zip(columns, record, strict=True)})
        except ValueError:
            continue
    return metric, rows


class CurveWriter:
    """Writes one run's ``curve.csv``.

    Args:
        run_dir: the run folder.
        metric: ``perplexity`` (a language model) or ``accuracy`` (a task run): which columns
            (:data:`CURVE_COLUMNS`).
        resume_step: when resuming, the step of the checkpoint training continues from: the points up to it
            are kept, the later ones dropped. None: a new run, a new file.
    """

    def __init__(self, run_dir: str | os.PathLike, metric: str, resume_step: Optional[int] = None):
        self.path = Path(run_dir) / CURVE_CSV
        self.metric, self.columns = metric, CURVE_COLUMNS[metric]
        self.lines = self._kept(resume_step) if resume_step is not None else []
        self._write()

    def _kept(self, step: int) -> list[list[str]]:
        """The file's lines up to ``step`` (none when the file is missing, or another kind of file)."""
        try:
            records = list(csv.reader(io.StringIO(self.path.read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, csv.Error):
            return []
        if not records or curve_metric(records[0]) != self.metric:
            return []
        return [r for r in records[1:] if len(r) == len(self.columns) and r[0].isdigit() and int(r[0]) <= step]

    def write(self, rows: list[dict]) -> None:
        """Add one point's rows (each with every column) and rewrite the file."""
        for row in rows:
            self.lines.append([_text(row[c], _FORMATS.get(c, ".8g")) for c in self.columns])
        self._write()

    def _write(self) -> None:
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(self.columns)
        out.writerows(self.lines)
        atomic_write_text(self.path, buf.getvalue())


def _text(value, fmt: str) -> str:
    """A value as curve.csv writes it; a missing one (a length not measured) as an empty field."""
    return "" if value is None else format(value, fmt)
