"""Generated tasks beside language modelling: ``task=copy|reverse|sort|addition|parity|mqar|passkey|flipflop``,
RULER's ``niah|vartrack|cwe|fwe`` with the key-value retrieval of "lost in the middle", ``kv_retrieval``, and
BABILong's reasoning in a haystack, ``babilong``.

Each task is one file here and one yaml in ``configs/task/``; :func:`build_task` makes the task of a run's
config. A task is a data generator with an answer mask (:mod:`posexp.tasks.task`); the encoders, model,
trainer, sweeps and reports are the ones language modelling uses, and ``posexp/evaluation/accuracy.py``
measures it. Adding a task: a :class:`~posexp.tasks.task.Task` subclass in a new file, decorated with
``@TASKS.register("name")`` (:data:`~posexp.tasks.task.TASKS`, found as encoders and trackers are), a yaml in
``configs/task/``; options of its own are :class:`~posexp.config.schema.TaskConfig` fields
(default None) named in its ``config_keys``, and every other task refuses them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional

import numpy as np

from posexp.config.schema import TaskConfig
from posexp.errors import ConfigError
from posexp.tasks.passkey import Passkey
from posexp.tasks.task import PAD, TASKS, Instances, Task

LM = "lm"
DEFAULT_DIGITS = 5  # task.digits, the passkey's length (TaskConfig's default)
GENERATOR_VERSION = 1  # bump when a generator's output for the same seed changes
OPTION_KEYS = ("variant", "needles", "chains", "hops", "top_k")  # task.* keys some tasks read (Task.config_keys)


def check_task_name(name: str) -> None:
    """Raises: ConfigError: ``name`` is neither ``lm`` nor a registered task (naming the close one and all)."""
    if name != LM:
        TASKS.lookup(name, also=(LM,))


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
    for key in OPTION_KEYS:
        if getattr(task_cfg, key, None) is not None and key not in cls.config_keys:
            readers = "|".join(n for n, c in TASKS.items() if key in c.config_keys)
            raise ConfigError(f"task.{key}", f"only applies to task={readers} (the task is {name}); drop task.{key}")
    if issubclass(cls, Passkey):  # babilong: stories in data's text, as passkey's filler
        if symbols is not None:
            raise ConfigError("task.symbols", f"task={name} has no alphabet to size; drop task.symbols")
        empty = np.zeros(0, dtype=np.int64)
        return cls(train if train is not None else empty, val if val is not None else empty,
                   **{key: getattr(task_cfg, key, None) for key in cls.config_keys}, min_size=min_size)
    return cls(symbols, min_size, **{key: getattr(task_cfg, key, None) for key in cls.config_keys})


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


__all__ = ["LM", "PAD", "TASKS", "Instances", "Task", "build_task", "chance_exact_match",
           "check_task_name", "task_fingerprint"]
