"""``metrics.csv``, the training curve: a row (step, tokens, loss, lr, tokens_per_s, elapsed_s) per logging step,
flushed as it is written, so that a killed run keeps its curve and a resumed one continues it."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional

from posexp.runs.atomic import atomic_write_text


class MetricsWriter:
    """Appends rows to ``metrics.csv`` and flushes each one, so a killed run keeps its curve.

    Args:
        path: the CSV file.
        resume_step: when resuming, the step of the checkpoint: rows after it (they will be
            trained again) and a half-written last line are dropped first, so the file ends up
            with one row per logged step, as if the run had never stopped.
    """

    COLUMNS = ["step", "tokens", "loss", "lr", "tokens_per_s", "elapsed_s"]

    def __init__(self, path: Path, resume_step: Optional[int] = None):
        self.path = path
        if resume_step is not None and path.exists():
            atomic_write_text(path, self._rows_through(path, resume_step))
        new = not path.exists() or path.stat().st_size == 0
        self._f = open(path, "a", newline="")
        self._w = csv.writer(self._f)
        if new:
            self._w.writerow(self.COLUMNS)

    @classmethod
    def _rows_through(cls, path: Path, step: int) -> str:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()  # the write a kill interrupted
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cls.COLUMNS)
        for row in csv.reader(lines[1:]):
            if len(row) == len(cls.COLUMNS) and row[0].isdigit() and int(row[0]) <= step:
                w.writerow(row)
        return buf.getvalue()

    def write(self, **row) -> None:
        try:
            self._w.writerow([row[c] for c in self.COLUMNS])
            self._f.flush()
        except OSError as e:  # a full disk: the error names the file, which a flush does not
            e.filename = str(self.path)
            raise

    def close(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass  # a row whose flush failed (a full disk), already reported by write(): resume logs it again
