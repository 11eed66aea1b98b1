"""Generated tasks beside language modelling: ``task=copy|reverse|sort|addition|parity|mqar|passkey|flipflop``.

Each task is one file here and one yaml in ``configs/task/``; :func:`build_task` makes the task of a run's
config. A task is a data generator with an answer mask (:mod:`posexp.tasks.task`); the encoders, model,
trainer, sweeps and reports are the ones language modelling uses, and ``posexp/evaluation/accuracy.py``
measures it. Adding a task: a :class:`~posexp.tasks.task.Task` subclass in a new file, an entry in
:data:`TASKS`, a yaml in ``configs/task/``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional

import numpy as np

from posexp.config.schema import TaskConfig
from posexp.errors import ConfigError
from posexp.tasks.addition import Addition
from posexp.tasks.task import PAD, Instances, Task
from posexp.tasks.copy import Copy
from posexp.tasks.flipflop import FlipFlop
from posexp.tasks.mqar import MQAR
from posexp.tasks.parity import Parity
from posexp.tasks.passkey import Passkey
from posexp.tasks.reverse import Reverse
from posexp.tasks.sort import Sort

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (Copy, Reverse, Sort, Addition, Parity, MQAR, Passkey,
                                                          FlipFlop)}
LM = "lm"
TASK_NAMES = (LM, *TASKS)
DEFAULT_DIGITS = 5  # task.digits, the passkey's length (TaskConfig's default)
GENERATOR_VERSION = 1  # bump when a generator's output for the same seed changes


def check_task_name(name: str) -> None:
    if name != LM and name not in TASKS:
        raise ConfigError("task", f"unknown task {name!r}; choose one of: {', '.join(TASK_NAMES)}")


def build_task(task_cfg: TaskConfig, train: Optional[np.ndarray] = None, val: Optional[np.ndarray] = None) -> Task:
    """The task of a run's ``task`` group; ``train`` / ``val`` are ``data``'s token splits (passkey's filler).

    Raises:
        ConfigError: an unknown task or option out of range.
    """
    name = str(task_cfg.name)
    check_task_name(name)
    if name == LM:
        raise ConfigError("task", "task=lm is language modelling on data, not a generated task")
    cls = TASKS[name]
    min_size, symbols = task_cfg.min_size, task_cfg.symbols
    if cls is Passkey:
        if symbols is not None:
            raise ConfigError("task.symbols", "task=passkey has no alphabet to size; drop task.symbols")
        empty = np.zeros(0, dtype=np.int64)
        return Passkey(train if train is not None else empty, val if val is not None else empty,
                       int(task_cfg.digits), min_size)
    if int(task_cfg.digits) != DEFAULT_DIGITS:
        raise ConfigError("task.digits", f"only applies to task=passkey (the task is {name}); drop task.digits")
    return cls(symbols, min_size)


def chance_exact_match(name: str, options: Mapping[str, Any], answer_tokens: float) -> Optional[float]:
    """The exact match of a guess that draws each of an instance's ``answer_tokens`` answer tokens uniformly from
    the task's answer alphabet (:meth:`Task.answer_values`): ``values ** -answer_tokens``. 0.5 for parity, 10^-5
    for a 5-digit passkey, about 0 for copying 16 symbols. None for a task not known here (e.g. ``lm``)."""
    cls = TASKS.get(name)
    values = cls.answer_values(options) if cls is not None else None
    if values is None or answer_tokens <= 0:
        return None
    return float(values) ** -float(answer_tokens)


def task_fingerprint(task: Task, data_fingerprint: Optional[str] = None) -> str:
    """16 hex digits naming what a task's instances are made from: generator, options, and data for passkey."""
    blob = json.dumps({"task": task.name, "options": task.options(), "version": GENERATOR_VERSION,
                       "data": data_fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


__all__ = ["LM", "PAD", "TASKS", "TASK_NAMES", "Instances", "Task", "build_task", "chance_exact_match",
           "check_task_name", "task_fingerprint"]
