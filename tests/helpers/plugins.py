"""Components of a researcher's own, as the source text of their modules: a task (``task=first``) and a tracker
(``logger=jsonl``), written into a package outside posexp by the tests that use them (:func:`write_lab`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

FIRST_TASK = '''
"""task=first: read a string, then write its first symbol `repeats` times."""
from typing import Optional

import numpy as np

from posexp.tasks.task import TASKS, Task, fill, with_answer


@TASKS.register("first")
class First(Task):
    description = "read a string, then write its first symbol again"
    default_symbols = 8
    size_unit = "symbols"

    def __init__(self, symbols: Optional[int] = None, min_size: Optional[int] = None, repeats: int = 1):
        super().__init__(symbols, min_size)
        if repeats < 1:
            raise ValueError("repeats must be at least 1")
        self.repeats = int(repeats)

    @property
    def vocab_size(self) -> int:
        return self.symbols + 2  # padding, the symbols, the separator

    def tokens_for(self, size: int) -> int:
        return size + 1 + self.repeats

    def options(self) -> dict:
        return {"symbols": self.symbols, "repeats": self.repeats}

    def generate(self, size, count, rng, **options):
        text = fill(count, size, self.symbols + 1, rng, low=1)
        sep = np.full((count, 1), self.symbols + 1)
        return with_answer([(text, False), (sep, False), (np.repeat(text[:, :1], self.repeats, axis=1), True)])
'''

JSONL_TRACKER = '''
"""logger=jsonl: every event of a run as one JSON line."""
import json
from pathlib import Path
from typing import Optional

from posexp.tracking.tracker import TRACKERS, Tracker


@TRACKERS.register("jsonl")
class JsonlTracker(Tracker):
    needs_module = "json"
    description = "every event of a run as one JSON line"

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def start(cls, run, path: Optional[str] = None, prefix: str = "run"):
        tracker = cls(Path(path) if path else run.run_dir / "events.jsonl")
        tracker._write(prefix, config=run.config)
        return tracker

    @classmethod
    def reopen(cls, record, run):
        return cls(Path(record["path"]))

    def _write(self, event, **fields):
        with self.path.open("a") as f:
            f.write(json.dumps({"event": event, **fields}, default=str) + "\\n")

    def log_train(self, step, values):
        self._write("train", step=step, **values)

    def log_curve(self, step, values):
        self._write("curve", step=step, **values)

    def log_eval(self, points, rows):
        for p in points:
            self._write("eval", name=p.name, length=p.length, value=p.value)

    def log_artifacts(self, files):
        self._write("artifacts", files=[Path(f).name for f in files])

    def finish(self, status):
        self._write("finish", status=status)

    def record(self):
        return {"path": str(self.path)}

    def where(self):
        return f"jsonl: {self.path}"
'''

# the yamls of a package in the working folder: each names its module (task.module, logger.jsonl.module)
FIRST_YAML = """
# @package _global_
task:
  name: first
  module: my_lab.first
  symbols: 8
  min_size: null
  repeats: 2
"""

JSONL_YAML = """
# @package logger.jsonl
module: my_lab.jsonl
prefix: lab
path: null
"""


def write_lab(root: Path) -> Path:
    """``root/my_lab/`` (first.py, jsonl.py) and ``root/conf/`` (task/first.yaml, logger/jsonl.yaml naming them):
    a researcher's project folder, its components found through ``--config-dir conf``; returns ``root``."""
    (root / "my_lab").mkdir(parents=True)
    (root / "my_lab" / "__init__.py").write_text("")
    (root / "my_lab" / "first.py").write_text(textwrap.dedent(FIRST_TASK).lstrip())
    (root / "my_lab" / "jsonl.py").write_text(textwrap.dedent(JSONL_TRACKER).lstrip())
    for group, name, text in (("task", "first", FIRST_YAML), ("logger", "jsonl", JSONL_YAML)):
        (root / "conf" / group).mkdir(parents=True, exist_ok=True)
        (root / "conf" / group / f"{name}.yaml").write_text(text.lstrip())
    return root
