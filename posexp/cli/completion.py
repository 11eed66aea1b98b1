"""Tab completion of the ``posexp`` command line: what a TAB offers after the words typed so far.

Subcommands and their options; Hydra overrides (config groups as ``encoder=`` with their options, the schema's keys
as ``train.steps=`` with the values their comments list, the chosen encoder's and task's own options); run folders
where a command takes them (the shell lists those: :mod:`posexp.cli.shell`).

A TAB must answer at once, so this imports neither torch, Hydra nor the app: a group's options are the yaml files of
``configs/GROUP/`` (and of the user's ``--config-dir``), keys come from the schema's dataclasses, an encoder's options
from its yaml. The subcommands, their arguments and options are :mod:`posexp.cli.options`, which the app builds its
own from.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from posexp.cli.hydra_flags import APPS, named_config_dirs
from posexp.cli.options import (COMMANDS, DIR, ENCODER, ENCODER_OPTIONS, HELP, KEYS, METRICS, OVERRIDES, ROOT,
                                RUNS_AND_EVAL, RUNS_OR_OVERRIDES, arguments, find, options)
from posexp.config.schema import config_dir

WORDS, DIRS, FILES = "words", "dirs", "files"


@dataclass(frozen=True)
class Reply:
    """What a TAB offers: the shell's own folder (``dirs``) or file (``files``) names, then ``items``, whole words
    starting with what was typed; one ending in ``=`` or ``.`` is a key the user goes on typing (no space after it)."""

    kind: str = WORDS
    items: Tuple[str, ...] = ()


NOTHING, FOLDERS = Reply(), Reply(DIRS)


@dataclass(frozen=True)
class Line:
    """The command line a word is completed on.

    Attributes:
        words: the words after the subcommand.
        app: the Hydra app (its config's name) whose overrides complete the word.
        before: the arguments before the one typed.
    """

    words: Sequence[str]
    app: str = "config"
    before: Sequence[str] = ()


Completer = Callable[[Line, str], Reply]  # (the line, the word typed) -> Reply


def _offer(values: Iterable[str], typed: str, kind: str = WORDS, items: bool = False) -> Reply:
    """``values`` that complete ``typed``; with ``items``, its last item (a sweep's ``a,b,``, a list's ``[a,`` kept),
    from the values not given already."""
    cut = max(typed.rfind(","), 0 if typed.startswith("[") else -1) + 1 if items else 0
    given = set(typed[:cut].split("=", 1)[-1].lstrip("[").split(","))
    return Reply(kind, tuple(typed[:cut] + v for v in values if v.startswith(typed[cut:]) and v not in given))


# -- the schema's keys and the values its comments list ---------------------------------------------

_FIELD = re.compile(r"^\s+(\w+)\s*:[^#=]*=[^#]*#\s*(.*)$")  # "    name: type = default  # comment"


@lru_cache(maxsize=None)
def field_comments(cls: type) -> Dict[str, str]:
    """``field -> comment`` of each field of a schema dataclass that has a comment of its own (``lr: float = 3e-3
    # peak learning rate``); none for a schema made at run time (a task's or tracker's options)."""
    import inspect

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return {m[1]: m[2] for m in map(_FIELD.match, source.splitlines()) if m}


def field_choices(cls: type) -> Dict[str, Tuple[str, ...]]:
    """The values of each field whose comment lists them, ``a | b | c`` (``scaling: str = "none"  # eval-time context
    extension: none | linear | ...``): the schema documents a key's choices once."""
    found = {key: _alternatives(comment) for key, comment in field_comments(cls).items() if "|" in comment}
    return {k: v for k, v in found.items() if v}


def _alternatives(comment: str) -> Tuple[str, ...]:
    """``a | b (why) | c: what`` -> ``(a, b, c)``; clauses apart (``niah: x | y; babilong: z | w``), the word before
    the first ``|``, and no alternative of several words (``longest | mean | an eval length``)."""
    words = []
    for clause in re.sub(r"\([^()]*\)", "", comment).split(";"):
        pieces = clause.split("|")
        if len(pieces) > 1:
            words += [piece.split(":")[0].strip() for piece in [pieces[0].split()[-1], *pieces[1:]]]
    return tuple(dict.fromkeys(w for w in words if re.fullmatch(r"[\w.\-]+", w)))


@lru_cache(maxsize=None)
def schema_tree(cls: type) -> Mapping[str, Any]:
    """A schema dataclass as ``key -> subtree`` (a nested dataclass), ``key -> values`` (those its comment lists)
    or ``key -> type``."""
    hints, choices, tree = typing.get_type_hints(cls), field_choices(cls), {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint  # Optional[X]: X
        tree[f.name] = schema_tree(typing.cast(type, hint)) if dataclasses.is_dataclass(hint) else (
            choices.get(f.name, hint))
    return tree


# -- the configs: groups and their options -----------------------------------------------------------

def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None


@lru_cache(maxsize=None)
def app_defaults(config_name: str) -> Dict[str, Optional[str]]:
    """``group -> default option`` of a Hydra app: its primary config's defaults list (and of the primary configs it
    builds on, as ``analyze`` does on ``config``); Hydra's own groups left out."""
    chosen: Dict[str, Optional[str]] = {}
    for entry in (_read_yaml(config_dir() / f"{config_name}.yaml") or {}).get("defaults") or []:
        if isinstance(entry, str):
            chosen.update(app_defaults(entry) if (config_dir() / f"{entry}.yaml").is_file() else {})
            continue
        for key, value in entry.items():
            group = str(key).split()[-1]  # "optional experiment", "override hydra/job_logging"
            if not group.startswith(("hydra", "/")):
                chosen[group] = value
    return chosen


def optional_groups(config_name: str = "config") -> Tuple[str, ...]:
    """The groups a Hydra app's defaults list marks ``optional`` (``optional experiment: null``)."""
    entries = (_read_yaml(config_dir() / f"{config_name}.yaml") or {}).get("defaults") or []
    return tuple(str(k).split()[-1] for e in entries if isinstance(e, dict) for k in e if str(k).startswith("optional "))


def user_dirs(words: Sequence[str]) -> List[Path]:
    """The user's config folders on the command line (:func:`~posexp.cli.hydra_flags.named_config_dirs`)."""
    return [Path(text).expanduser() for _, text in named_config_dirs(words)]


def group_options(group: str, dirs: Sequence[Path] = ()) -> List[str]:
    """The options of a config group: its yaml files in ``configs/`` and in the user's folders ``dirs``, and for
    ``encoder`` the plugins installed packages declare (read from their metadata, not imported)."""
    import importlib.metadata

    names = {p.stem for folder in (config_dir(), *dirs) for p in (folder / group).glob("*.yaml")}
    if group == "encoder":
        names.update(ep.name for ep in importlib.metadata.entry_points(group="posexp.encoders"))
    return sorted(names)


def encoder_keys(name: Optional[str], dirs: Sequence[Path] = ()) -> Dict[str, Any]:
    """The options of encoder ``name``: those its yaml lists (the user's folders first; a built-in's lists every
    keyword of its ``__init__``), and ``lr_mult``, which every encoder has. A plugin without a yaml: ``lr_mult``."""
    paths = [folder / "encoder" / f"{name}.yaml" for folder in (*dirs, config_dir())]
    path = next((p for p in paths if p.is_file()), None) if name else None
    raw = _read_yaml(path) if path else None
    keys = {str(k): Any for k in raw if k not in ("defaults", "module")} if isinstance(raw, dict) else {}
    return {**keys, "lr_mult": float}


def yaml_task_keys(name: Optional[str], dirs: Sequence[Path]) -> Dict[str, Any]:
    """The keys the user's ``task/NAME.yaml`` lists under ``task`` (a task of theirs, its module not imported at a
    TAB), but the ``module`` that names it."""
    path = next((p for p in (folder / "task" / f"{name}.yaml" for folder in dirs) if p.is_file()), None)
    raw = _read_yaml(path) if path and name else None
    task = raw.get("task") if isinstance(raw, dict) else None
    return {str(k): Any for k in task if k != "module"} if isinstance(task, dict) else {}


@dataclass
class AppKeys:
    """The groups and keys one Hydra app accepts, for the command line typed so far."""

    groups: Dict[str, Optional[str]]
    tree: Dict[str, Any]
    dirs: List[Path]

    @classmethod
    def of(cls, app: str, words: Sequence[str]) -> "AppKeys":
        dirs, groups = user_dirs(words), app_defaults(app)
        tree = dict(schema_tree(APPS[app].schema))
        tree.pop("finetune", None)  # the lineage posexp finetune writes, not a setting

        def chosen(group: str) -> Optional[str]:  # the option chosen last (a sweep's first), else the app's default
            given = [w.partition("=")[2].split(",")[0] for w in words if w.startswith(f"{group}=")]
            return given[-1] if given else groups.get(group)

        if app == "analyze":  # its own keys, which its yaml lists (their schema sits with the analysis)
            tree["analyze"] = dict.fromkeys(map(str, (_read_yaml(config_dir() / "analyze.yaml") or {}).get("analyze")
                                                or {}), Any)
        if "encoder" in tree:
            tree["encoder"] = encoder_keys(chosen("encoder"), dirs)
        if tree.get("task") is Any:  # the chosen task's own options (posexp.tasks.options_schema)
            from posexp.tasks import LM, TASKS, options_schema

            task = chosen("task")
            tree["task"] = dict(schema_tree(options_schema(TASKS[task]))) if task in TASKS else (
                {"name": str, "description": str} if task == LM else yaml_task_keys(task, dirs))
        if tree.get("logger") is Any:  # each tracker's keys: the options of its start()
            from posexp.tracking.tracker import TRACKERS, options_schema as tracker_schema

            tree["logger"] = {name: dict(schema_tree(tracker_schema(c))) for name, c in TRACKERS.items()}
        return cls(groups, tree, dirs)

    def keys(self, typed: str) -> List[str]:
        """Keys that start with ``typed``: ``group=`` and ``key=`` at the top, ``node.key=`` (``node.sub.``) below.
        A group's own keys are offered once its ``.`` is typed: ``enc`` completes to ``encoder=``."""
        node, _, _ = typed.rpartition(".")
        subtree = self._node(node)
        if not isinstance(subtree, dict):
            return []
        prefix = f"{node}." if node else ""
        found = [f"{prefix}{k}{'.' if isinstance(v, dict) else '='}" for k, v in subtree.items()
                 if v != {} and not (k in self.groups and not node)]
        found += [] if node else [f"{g}=" for g in self.groups]
        return sorted({k for k in found if k.startswith(typed)})

    def value_reply(self, key: str, typed: str) -> Reply:
        """Values of ``key`` that complete ``typed``: a group's options, the values the schema lists, booleans;
        folders and files for a key named ``...dir`` or ``...path``."""
        node = self._node(key)
        if key in self.groups:
            return _offer(group_options(key, self.dirs), typed, items=True)
        if isinstance(node, tuple) or node is bool:
            return _offer(("true", "false") if node is bool else node, typed, items=True)
        return Reply(DIRS if key.endswith("dir") else FILES) if key.endswith(("dir", "path")) else NOTHING

    def _node(self, path: str) -> Any:
        """The subtree (a dict) or the type of the key ``path`` (``train.steps``); None if there is none."""
        node: Any = self.tree
        for part in path.split(".") if path else []:
            node = node.get(part) if isinstance(node, dict) else None
        return node


def overrides(app: str, words: Sequence[str], typed: str) -> Reply:
    """Hydra overrides of ``app``: keys being typed, or the values after ``KEY=`` (``+``, ``++``, ``~`` kept)."""
    known = AppKeys.of(app, words)
    body = typed.lstrip("+~")
    sign = typed[:len(typed) - len(body)]
    if "=" not in body:
        return Reply(WORDS, tuple(sign + k for k in known.keys(body)))
    key, _, value = body.partition("=")
    reply = known.value_reply(key, value)
    return Reply(reply.kind, tuple(f"{sign}{key}={v}" for v in reply.items))


# -- the subcommands: their arguments and options (posexp.cli.options), and what completes each ------------------

def _report_keys(line: Line, typed: str) -> Reply:
    """``--by encoder,base``: config keys, comma-separated."""
    keys = AppKeys.of("config", line.words).keys(typed[typed.rfind(",") + 1:])
    return _offer([k.rstrip("=") for k in keys], typed, items=True)


def _metrics(line: Line, typed: str) -> Reply:
    """``--metric ratio@8x,auc``: the metric registry's examples, comma-separated."""
    from posexp.reporting.metrics import metric_examples

    return _offer(metric_examples(), typed, items=True)


def _runs_or_overrides(line: Line, typed: str) -> Reply:
    """Run folders where a path is being typed, else overrides (``posexp analyze``)."""
    return FOLDERS if "/" in typed or typed.startswith((".", "~")) else overrides(line.app, line.words, typed)


def _runs_and_eval(line: Line, typed: str) -> Reply:
    """Run folders and ``eval.KEY=VALUE`` (``posexp eval``); after ``hf:MODEL``, the pretrained app's overrides."""
    if any(w.startswith("hf:") for w in line.words):
        return overrides("pretrained", line.words, typed)
    return overrides(line.app, line.words, typed) if typed.startswith("eval.") else _offer(("eval.",), typed, DIRS)


def _encoders(line: Line, typed: str) -> Reply:
    """The registered encoders: the configs' and the user's yaml files, the plugins installed packages declare."""
    return _offer(group_options("encoder", user_dirs(line.words)), typed)


def _encoder_options(line: Line, typed: str) -> Reply:
    """``KEY=`` of the encoder the argument before names (``posexp check t5 num_buckets=``)."""
    if "=" in typed:  # a value: nothing to list
        return NOTHING
    return _offer([f"{k}=" for k in encoder_keys(line.before[-1], user_dirs(line.words))], typed)


VALUES: Dict[str, Completer] = {
    DIR: lambda line, typed: FOLDERS, KEYS: _report_keys, METRICS: _metrics,
    OVERRIDES: lambda line, typed: overrides(line.app, line.words, typed), RUNS_OR_OVERRIDES: _runs_or_overrides,
    RUNS_AND_EVAL: _runs_and_eval, ENCODER: _encoders, ENCODER_OPTIONS: _encoder_options}


def _value_of(command: str, name: str) -> Optional[Completer]:
    """What completes option ``name``'s value; None for a flag without values (or an option ``command`` lacks)."""
    found = find(command, name)
    if found is None or (found.flag and not found.values):
        return None
    values = found.values
    return VALUES[values] if isinstance(values, str) else lambda line, typed: _offer(values, typed)


def _names(command: str) -> List[str]:
    return [name for o in options(command) for name in o.names] + list(HELP)


def _positionals(command: str, words: Sequence[str]) -> List[str]:
    """The arguments among ``words`` that are neither options nor an option's value."""
    takes_value = [(o := find(command, w)) is not None and not o.flag for w in words]
    return [w for i, w in enumerate(words) if not w.startswith("-") and not (i and takes_value[i - 1])]


def _arguments(command: str, words: Sequence[str], typed: str) -> Reply:
    """The argument of ``command`` the word typed is, completed as its declaration says; nothing past the last."""
    given = _positionals(command, words)
    for at, declared in enumerate(arguments(command)):
        if declared.many or at == len(given):
            values = declared.first if declared.first and at == len(given) else declared.values
            return VALUES[values](Line(words, declared.app, given[:at]), typed)
    return NOTHING


def complete(words: Sequence[str], typed: str) -> Reply:
    """What a TAB offers for the word ``typed``, after ``words`` (what follows ``posexp``, complete words)."""
    command = next((w for w in words if not w.startswith("-")), None)
    if command is None:
        return _offer(_names(ROOT) if typed.startswith("-") else COMMANDS, typed)
    if command not in COMMANDS:
        return NOTHING
    words = list(words[list(words).index(command) + 1:])
    completer = _value_of(command, words[-1]) if words else None
    if completer is not None:
        return completer(Line(words), typed)
    if typed.startswith("--") and "=" in typed:  # --format=json
        option, _, value = typed.partition("=")
        completer = _value_of(command, option)
        reply = completer(Line(words), value) if completer else NOTHING
        return Reply(reply.kind, tuple(f"{option}={v}" for v in reply.items))
    if typed.startswith("-"):
        return _offer(_names(command), typed)
    return _arguments(command, words, typed)
