"""Generated tasks beside language modelling: ``task=copy|reverse|sort|addition|parity|mqar|passkey|flipflop``,
RULER's ``niah|vartrack|cwe|fwe`` with the key-value retrieval of "lost in the middle", ``kv_retrieval``, and
BABILong's reasoning in a haystack, ``babilong``.

Each task is one file here and one yaml in ``configs/task/``; :func:`build_task` makes the task of a run's
config. A task is a data generator with an answer mask (:mod:`posexp.tasks.task`); the encoders, model,
trainer, sweeps and reports are the ones language modelling uses, and ``posexp/evaluation/accuracy.py``
measures it. Adding a task: a :class:`~posexp.tasks.task.Task` subclass in a new file, decorated with
``@TASKS.register("name")`` (:data:`~posexp.tasks.task.TASKS`, found as encoders and trackers are), and a yaml in
``configs/task/``. Its options are the keyword arguments of its ``__init__`` (``train`` / ``val``, data's token
splits, excepted), as an encoder's are: their type hints and defaults are the ``task`` schema of that task
(:func:`options_schema`), and a key no option of it names is refused, naming the task's options. A task of the
user's own registers the same way in their module, which its yaml names in ``task.module``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from posexp.config.identity import TASK_KEYS_BEFORE
from posexp.config.schema import TaskConfig
from posexp.errors import ConfigError
from posexp.registry import MODULE_KEY, code_record, construct, did_you_mean, option_params, options_dataclass
from posexp.tasks.task import GENERATOR_VERSION, PAD, TASKS, Instances, Task

LM = "lm"
DATA_ARGS = ("train", "val")  # what a task that uses_data takes of data: its token splits, never options
_COMMON = ("name", "description", MODULE_KEY)  # keys of every task's config besides its options


def check_task_name(name: str) -> None:
    """Raises: ConfigError: ``name`` is neither ``lm`` nor a registered task (naming the close one and all)."""
    if name != LM:
        TASKS.lookup(name, also=(LM,))


def option_names(cls: type[Task]) -> list[str]:
    """The task's options: the keyword arguments of its ``__init__`` (but data's ``train`` / ``val``), in order."""
    return [p.name for p in option_params(cls.__init__, DATA_ARGS)]


def options_schema(cls: type[Task]) -> type:
    """A dataclass of the ``task`` keys of ``cls`` (name, description, then its ``__init__``'s options with their
    type hints and defaults), for Hydra's ConfigStore as ``schema/task/NAME``.

    Raises:
        TypeError: an option without a default.
    """
    first: list[tuple[str, Any, Any]] = [("name", str, cls.name), ("description", str, "")]
    if not TASKS.own(cls):  # a task of the user's: the module it registers in
        first.append((MODULE_KEY, str, cls.__module__))
    return options_dataclass(f"{cls.__name__}Options", cls.__init__, DATA_ARGS, first, bases=(TaskConfig,))


def task_class(task_cfg: Mapping[str, Any], roots: Sequence[str] = ()) -> type[Task]:
    """The class of a ``task`` config: a built-in, or the one ``task.module`` (the user's module) registers,
    imported from the working folder, else from ``roots`` (where a run found it).

    Raises:
        ConfigError: an unknown task, ``task=lm`` (no generated task), or a module that registers no such task.
    """
    name, module = str(task_cfg.get("name", LM)), task_cfg.get(MODULE_KEY)
    if module:
        return TASKS.from_module(name, str(module), roots)
    check_task_name(name)
    if name == LM:
        raise ConfigError("task", "task=lm is language modelling on data, not a generated task")
    return TASKS[name]


def task_code(cls: type[Task]) -> Optional[dict]:
    """What a run records of the code of a task class of the user's (:func:`posexp.registry.code_record`), as of a
    plugin encoder's; None for posexp's own, whose code :data:`GENERATOR_VERSION` and posexp's version stand for."""
    return None if TASKS.own(cls) else code_record(cls)


def option_refusal(name: str, key: str, module: Optional[str] = None) -> str:
    """Why ``task.KEY`` is refused for task ``name`` (of the user's ``module``, if given): the tasks that read it,
    or, when none does, the task's own options (one line, after ``task.KEY: ``)."""
    readers = [n for n, c in TASKS.items() if key in option_names(c)]
    if readers:
        return f"only applies to task={'|'.join(readers)} (the task is {name}); drop task.{key}"
    try:
        allowed = option_names(task_class({"name": name, MODULE_KEY: module}))
    except ConfigError:
        allowed = []
    return (f"not an option of task {name!r}; {did_you_mean(key, allowed, 'task.')}its options are: "
            f"{', '.join(allowed) or 'none'}")


def task_options(task_cfg: Mapping[str, Any]) -> tuple[type[Task], dict[str, Any]]:
    """The class of a ``task`` config and its options, checked against the class's ``__init__``.

    A key of :data:`~posexp.config.identity.TASK_KEYS_BEFORE` at that value is what every run's config held before
    each task had its own options (a run folder's saved config): it is no option of the task, and is dropped.

    Raises:
        ConfigError: on ``task.KEY``: a key the task does not take (:func:`option_refusal`), or a value of the
            wrong type.
    """
    cls = task_class(task_cfg)
    allowed = option_names(cls)
    given = {k: v for k, v in task_cfg.items() if k not in _COMMON
             and not (k not in allowed and k in TASK_KEYS_BEFORE and v == TASK_KEYS_BEFORE[k])}
    for key in given:
        if key not in allowed:
            raise ConfigError(f"task.{key}", option_refusal(cls.name, key, task_cfg.get(MODULE_KEY)))
    try:
        checked = OmegaConf.merge(OmegaConf.structured(options_schema(cls)), given)
    except ValidationError as e:
        raise ConfigError(f"task.{e.full_key}", str(e.msg).splitlines()[0]) from None
    values = OmegaConf.to_container(checked)
    assert isinstance(values, dict)
    return cls, {k: values[k] for k in allowed}


def build_task(task_cfg: Mapping[str, Any], train: Optional[np.ndarray] = None,
               val: Optional[np.ndarray] = None) -> Task:
    """The task of a run's ``task`` config (a mapping: name, description, the task's options); ``train`` /
    ``val`` are ``data``'s token splits (the filler of a task that ``uses_data``).

    Raises:
        ConfigError: an unknown task, or an option it does not take or out of range; what a plugin task's own
            ``__init__`` raised, in one line.
    """
    cls, options = task_options(task_cfg)
    given = dict(options)
    if cls.uses_data:
        empty = np.zeros(0, dtype=np.int64)
        options.update(train=train if train is not None else empty, val=val if val is not None else empty)
    return construct(lambda: cls(**options), lambda: None if TASKS.own(cls) else cls, given, f"task={cls.name}")


def chance_exact_match(name: str, options: Mapping[str, Any], answer_tokens: float,
                       size: Optional[int] = None, version: Optional[int] = None) -> Optional[float]:
    """The exact match of a guess that draws each of an instance's ``answer_tokens`` answer tokens (their mean over
    the instances of ``size``) uniformly from the task's answer alphabet (:meth:`Task.chance`): ``values **
    -answer_tokens``. 0.5 for parity, 10^-5 for a 5-digit passkey, about 0 for copying 16 symbols; flip-flop's mean
    over its instances' reads. ``version``: the generator version the run recorded (None: the current one). None
    for a task not known here (e.g. ``lm``)."""
    cls = TASKS.get(name)
    return cls.chance(options, answer_tokens, size, version) if cls is not None else None


def task_fingerprint(task: Task, data_fingerprint: Optional[str] = None) -> str:
    """16 hex digits naming what a task's instances are made from: generator (and its version), options, and data for
    passkey."""
    blob = json.dumps({"task": task.name, "options": task.options(), "version": task.generator_version(),
                       "data": data_fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


__all__ = ["GENERATOR_VERSION", "LM", "PAD", "TASKS", "Instances", "Task", "build_task", "chance_exact_match",
           "check_task_name", "option_names", "option_refusal", "options_schema", "task_class", "task_code",
           "task_fingerprint", "task_options"]
