"""Tab completion of the ``posexp`` command line: what a TAB offers after the words typed so far.

:func:`complete` answers for every subcommand: the subcommands themselves, each one's options, Hydra
overrides after ``posexp train`` / ``analyze`` / ``finetune`` (config groups as ``encoder=``, their options,
the schema's keys as ``train.steps=``, the values of keys that take a few), ``eval.KEY=`` after
``posexp eval``, and run folders where a command takes them (the shell lists those itself).

A TAB must answer at once, so this module imports neither torch nor Hydra: group options are the yaml
files of ``configs/GROUP/`` (and of the user's ``--config-dir``), keys come from the schema's dataclasses,
and the few value lists owned by torch-importing modules are copied here (``tests/process/test_completion.py``
holds each copy equal to its owner). How a shell asks and what it gets back: :mod:`posexp.cli.shell`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from posexp.cli.hydra_flags import CFG_PARTS, INFO_PARTS
from posexp.config.schema import Config, EvalConfig, FinetuneAppConfig, TrainConfig, config_dir

WORDS, DIRS, FILES = "words", "dirs", "files"


@dataclass(frozen=True)
class Reply:
    """What a TAB offers.

    Args:
        kind: ``words``: ``items`` only; ``dirs`` / ``files``: the shell's own folder (file) names, then ``items``.
        items: whole words, each starting with what was typed; one ending in ``=`` or ``.`` is a key the user
            goes on typing, so the shell adds no space after it.
    """

    kind: str = WORDS
    items: Tuple[str, ...] = ()


NOTHING = Reply()
FOLDERS = Reply(DIRS)

_FIELD = re.compile(r"^\s+(\w+)\s*:[^#=]*=[^#]*#\s*(.*)$")  # "    name: type = default  # comment"


@lru_cache(maxsize=None)
def field_choices(cls: type) -> Dict[str, Tuple[str, ...]]:
    """The values of each field of a schema dataclass whose comment lists them, ``a | b | c`` (``scaling: str =
    "none"  # eval-time context extension: none | linear | ...``): the schema documents a key's choices once, and
    completion offers them, a key added with such a comment included."""
    import inspect

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # a schema made at run time (a task's or tracker's options): no comments to read
        return {}
    found = {}
    for line in source.splitlines():
        m = _FIELD.match(line)
        if m and "|" in m.group(2):
            found[m.group(1)] = _alternatives(m.group(2))
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


# The value lists the tests hold equal to their owners (which import torch): derived from the schema's comments.
SCALINGS = field_choices(EvalConfig)["scaling"]  # posexp.encoders.scaling
FINETUNE_SCALINGS = field_choices(FinetuneAppConfig)["scaling"]  # posexp.encoders.extension
POSITION_SCHEMES = field_choices(TrainConfig)["positions"]  # posexp.model.positions
CURRICULA = field_choices(TrainConfig)["curriculum"]  # posexp.model.positions
COMPILE = field_choices(Config)["compile"]  # posexp.runtime.device.COMPILE_SETTINGS
# Not config keys, so copied (a TAB imports neither rich nor torch); the tests compare each with its owner.
REPORT_FORMATS = ("rich", "markdown", "csv", "json", "latex")  # posexp.reporting.render.FORMATS
CHECK_FORMATS = ("table", "json", "markdown")  # posexp.commands.check.FORMATS

BOOLEANS = ("true", "false")

# Flags of Hydra's own parser worth offering (posexp refuses --config-path), with what follows each.
# -sc install=bash prints posexp's completion script (posexp.cli.shell), for bash and zsh alike
SHELL_COMPLETION = ("install=bash", "install=zsh", "uninstall=bash", "uninstall=zsh")
OVERWRITE = "--overwrite"  # posexp.runs.lock.OVERWRITE_FLAG
ALLOW_CHANGED = "--allow-changed-encoder"  # posexp.commands.encoder_source.ALLOW_FLAG
HELP = {"--help": None, "-h": None}

Completer = Callable[[Sequence[str], str], Reply]  # (the words after the subcommand, the word typed) -> Reply


def _choices(values: Sequence[str]) -> Completer:
    return lambda words, typed: Reply(WORDS, tuple(v for v in values if v.startswith(typed)))


def _folders(words: Sequence[str], typed: str) -> Reply:
    return FOLDERS


# -- the configs: groups, their options, the schema's keys ---------------------------------------

def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError):
        return None


@lru_cache(maxsize=None)
def app_defaults(config_name: str) -> Dict[str, Optional[str]]:
    """``group -> default option`` of a Hydra app: its primary config's defaults list (and of the primary
    configs it builds on, as ``analyze`` does on ``config``); Hydra's own groups left out."""
    raw = _read_yaml(config_dir() / f"{config_name}.yaml")
    chosen: Dict[str, Optional[str]] = {}
    for entry in (raw or {}).get("defaults") or []:
        if isinstance(entry, str):
            if (config_dir() / f"{entry}.yaml").is_file():
                chosen.update(app_defaults(entry))
            continue
        for key, value in entry.items():
            group = str(key).split()[-1]  # "optional experiment", "override hydra/job_logging"
            if not group.startswith(("hydra", "/")):
                chosen[group] = value
    return chosen


def user_dirs(words: Sequence[str]) -> list[Path]:
    """The user's config folders on the command line (``--config-dir DIR``, ``-cd DIR``, ``--config-dir=DIR``, and
    the ``file://`` folders of ``hydra.searchpath=[file://DIR,...]``), read without Hydra: a TAB answers at once."""
    found = []
    for i, word in enumerate(words):
        if word.startswith("--config-dir="):
            found.append(word.partition("=")[2])
        elif word in ("--config-dir", "-cd") and i + 1 < len(words):
            found.append(words[i + 1])
        elif word.lstrip("+").startswith("hydra.searchpath="):
            items = word.partition("=")[2].strip("[]").split(",")
            found += [item.strip(" '\"").removeprefix("file://") for item in items
                      if item.strip(" '\"").startswith("file://")]
    return [Path(d).expanduser() for d in found]


@lru_cache(maxsize=None)
def plugin_encoders() -> Tuple[str, ...]:
    """The encoders installed packages declare (entry points of ``posexp.encoders``), read from the metadata
    without importing them."""
    import importlib.metadata

    return tuple(sorted({ep.name for ep in importlib.metadata.entry_points(group="posexp.encoders")}))


def group_options(group: str, dirs: Sequence[Path] = ()) -> list[str]:
    """The options of a config group: its yaml files in ``configs/`` and in the user's folders ``dirs``
    (and, for ``encoder``, the installed plugins)."""
    names = {p.stem for folder in (config_dir(), *dirs) for p in (folder / group).glob("*.yaml")}
    if group == "encoder":
        names.update(plugin_encoders())
    return sorted(names)


def _yaml_keys(path: Optional[Path]) -> Dict[str, Any]:
    raw = _read_yaml(path) if path is not None else None
    return {str(k): Any for k in raw if k != "defaults"} if isinstance(raw, dict) else {}


def encoder_keys(name: Optional[str], dirs: Sequence[Path] = ()) -> Dict[str, Any]:
    """The options of encoder ``name``: those its yaml lists (the user's folders first; a built-in's yaml lists
    every keyword of its ``__init__``), and ``lr_mult``, which every encoder has. A plugin that brings no yaml
    offers ``lr_mult`` only: its options are in its code, which completion does not import."""
    paths = [folder / "encoder" / f"{name}.yaml" for folder in (*dirs, config_dir())]
    keys = _yaml_keys(next((p for p in paths if p.is_file()), None)) if name else {}
    keys.pop("module", None)  # which module defines a plugin: not an option
    return {**keys, "lr_mult": float}


def task_keys(name: Optional[str]) -> Dict[str, Any]:
    """The keys of task ``name`` (its class's ``__init__`` options; name and description for ``lm``), typed."""
    from posexp.tasks import LM, TASKS, options_schema

    if name not in TASKS:
        return {"name": str, "description": str} if name == LM else {}
    return dict(schema_tree(options_schema(TASKS[name])))


def _unwrap(hint: Any) -> Any:
    """``Optional[X]`` -> ``X``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


@lru_cache(maxsize=None)
def schema_tree(cls: type) -> Mapping[str, Any]:
    """A schema dataclass as ``key -> subtree`` (a nested dataclass), ``key -> values`` (a tuple: those its comment
    lists, :func:`field_choices`) or ``key -> type`` (any other value)."""
    hints, choices = typing.get_type_hints(cls), field_choices(cls)
    tree: Dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = _unwrap(hints[f.name])
        tree[f.name] = schema_tree(typing.cast(type, hint)) if dataclasses.is_dataclass(hint) else (
            choices.get(f.name, hint))
    return tree


@dataclass
class AppKeys:
    """The groups and keys one Hydra app accepts, for the command line typed so far."""

    groups: Dict[str, Optional[str]]
    tree: Dict[str, Any]
    dirs: List[Path]

    @classmethod
    def of(cls, app: str, words: Sequence[str]) -> "AppKeys":
        dirs = user_dirs(words)
        tree = dict(schema_tree(FinetuneAppConfig if app == "finetune" else Config))
        tree.pop("finetune", None)  # the lineage posexp finetune writes, not a setting
        if app == "analyze":  # its own keys, which its yaml lists (their schema sits with the analysis)
            analyze = _read_yaml(config_dir() / "analyze.yaml") or {}
            tree["analyze"] = {str(k): Any for k in analyze.get("analyze") or {}}
        groups = app_defaults(app)
        if "encoder" in tree:
            chosen = [w.partition("=")[2] for w in words if w.startswith("encoder=")]
            # the encoder chosen last (a sweep's first), else the app's default
            tree["encoder"] = encoder_keys(chosen[-1].split(",")[0] if chosen else groups.get("encoder"), dirs)
        if tree.get("task") is Any:  # the chosen task's keys: its own options (posexp.tasks.options_schema)
            chosen = [w.partition("=")[2] for w in words if w.startswith("task=")]
            tree["task"] = task_keys(chosen[-1].split(",")[0] if chosen else groups.get("task"))
        if tree.get("logger") is Any:  # each tracker's keys: the options of its start() (tracking.options_schema)
            from posexp.tracking.tracker import TRACKERS, options_schema

            tree["logger"] = {name: dict(schema_tree(options_schema(cls))) for name, cls in TRACKERS.items()}
        return cls(groups, tree, dirs)

    def keys(self, typed: str) -> list[str]:
        """Keys that start with ``typed``: ``group=`` and ``key=`` at the top, ``node.key=`` (``node.sub.``)
        below. A group's own keys are offered once its ``.`` is typed: ``enc`` completes to ``encoder=``."""
        node, _, _ = typed.rpartition(".")
        subtree = self._node(node)
        if not isinstance(subtree, dict):
            return []
        prefix = f"{node}." if node else ""
        found = [f"{prefix}{k}{'.' if isinstance(v, dict) else '='}" for k, v in subtree.items()
                 if v != {} and not (k in self.groups and not node)]
        if not node:
            found += [f"{g}=" for g in self.groups]
        return sorted({k for k in found if k.startswith(typed)})

    def value_reply(self, key: str, typed: str) -> Reply:
        """Values of ``key`` that complete ``typed`` (a sweep's ``a,b,`` and a list's ``[a,`` kept in front)."""
        cut = max(typed.rfind(","), 0 if typed.startswith("[") else -1) + 1
        head, part = typed[:cut], typed[cut:]
        node = self._node(key)
        if key in self.groups:
            values: Sequence[str] = group_options(key, self.dirs)
        elif isinstance(node, tuple):
            values = node
        elif node is bool:
            values = BOOLEANS
        elif key.endswith(("dir", "path")):
            return Reply(DIRS if key.endswith("dir") else FILES)
        else:
            values = ()
        return Reply(WORDS, tuple(head + v for v in values if v.startswith(part)))

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


def _looks_like_path(typed: str) -> bool:
    return "/" in typed or typed.startswith((".", "~"))


# -- the subcommands ---------------------------------------------------------------------------------

def _hydra_app(app: str, folders_first: bool = False, folders: bool = False) -> Completer:
    """The arguments of a Hydra app: overrides; run folders first (``finetune RUN_DIR``) or anywhere a path
    is being typed (``analyze RUN_DIR``)."""
    def arguments(words: Sequence[str], typed: str) -> Reply:
        if folders_first and not _positionals(HYDRA_OPTIONS, words):
            return FOLDERS
        if folders and _looks_like_path(typed):
            return FOLDERS
        return overrides(app, words, typed)
    return arguments


def _eval_arguments(words: Sequence[str], typed: str) -> Reply:
    """``posexp eval``: run folders and ``eval.KEY=VALUE``."""
    if typed.startswith("eval."):
        return overrides("config", words, typed)
    return Reply(DIRS, ("eval.",) if "eval.".startswith(typed) else ())


def _check_arguments(words: Sequence[str], typed: str) -> Reply:
    """``posexp check ENCODER KEY=VALUE...``: an encoder, then its options."""
    named = _positionals(COMMANDS["check"].options, words)
    dirs = user_dirs(words)
    if not named:
        return Reply(WORDS, tuple(n for n in group_options("encoder", dirs) if n.startswith(typed)))
    keys = encoder_keys(named[0], dirs)
    if "=" in typed:
        return NOTHING
    return Reply(WORDS, tuple(f"{k}=" for k in keys if k.startswith(typed)))


def _one_folder(words: Sequence[str], typed: str) -> Reply:
    """``posexp resume RUN_DIR``: one run folder."""
    return NOTHING if _positionals(COMMANDS["resume"].options, words) else FOLDERS


def _two_folders(words: Sequence[str], typed: str) -> Reply:
    """``posexp export RUN_DIR OUT_DIR``: two folders."""
    return NOTHING if len(_positionals(COMMANDS["export"].options, words)) >= 2 else FOLDERS


def _report_keys(words: Sequence[str], typed: str) -> Reply:
    """``--by encoder,base``: config keys, comma-separated."""
    head, _, part = typed.rpartition(",")
    head = f"{head}," if head else ""
    keys = [k.rstrip("=") for k in AppKeys.of("config", words).keys(part)]
    return Reply(WORDS, tuple(head + k for k in keys))


def _metrics(words: Sequence[str], typed: str) -> Reply:
    """``--metric ratio@8x,auc``: the metric registry's examples, comma-separated."""
    from posexp.reporting.metrics import metric_examples

    head, _, part = typed.rpartition(",")
    head = f"{head}," if head else ""
    return Reply(WORDS, tuple(head + m for m in metric_examples() if m.startswith(part)))


def _where(words: Sequence[str], typed: str) -> Reply:
    """``--where KEY=VALUE`` / ``--baseline KEY=VALUE``: as an override."""
    return overrides("config", words, typed)


@dataclass(frozen=True)
class Command:
    """A subcommand: its options (each with what completes its value, None for a flag) and its arguments."""

    options: Mapping[str, Optional[Completer]]
    arguments: Completer = lambda words, typed: NOTHING


NO_HINT = _choices(())  # an option that takes a value, none of which can be listed
# posexp report --view (posexp.reporting.views, not imported: a TAB loads no more than it needs)
REPORT_VIEWS = ("protocol=nonoverlap", "protocol=sliding", "protocol=last_k", "window=", "sinks=", "scaling=")
HYDRA_OPTIONS: Dict[str, Optional[Completer]] = {
    "-m": None, "--multirun": None, "--cfg": _choices(CFG_PARTS), "-c": _choices(CFG_PARTS), "--package": NO_HINT,
    "-p": NO_HINT, "--resolve": None, "--info": _choices(INFO_PARTS), "-i": _choices(INFO_PARTS),
    "--config-dir": _folders, "-cd": _folders, "--shell-completion": _choices(SHELL_COMPLETION),
    "-sc": _choices(SHELL_COMPLETION), "--hydra-help": None, OVERWRITE: None, **HELP}

COMMANDS: Dict[str, Command] = {
    "train": Command(HYDRA_OPTIONS, _hydra_app("config")),
    "analyze": Command(HYDRA_OPTIONS, _hydra_app("analyze", folders=True)),
    "finetune": Command({**HYDRA_OPTIONS, ALLOW_CHANGED: None}, _hydra_app("finetune", folders_first=True)),
    "eval": Command({"--strict": None, ALLOW_CHANGED: None, **HELP}, _eval_arguments),
    "resume": Command({ALLOW_CHANGED: None, **HELP}, _one_folder),
    "report": Command({"--out": _folders, "-o": _folders, "--by": _report_keys, "--metric": _metrics,
                       "--tolerance": NO_HINT, "--sort": NO_HINT, "--where": _where,
                       "--format": _choices(REPORT_FORMATS), "-f": _choices(REPORT_FORMATS), "--strict": None,
                       "--baseline": _where, "--view": _choices(REPORT_VIEWS), "--margin": NO_HINT,
                       "--cols": _report_keys, **HELP},
                      _folders),
    "check": Command({"--format": _choices(CHECK_FORMATS), "-f": _choices(CHECK_FORMATS), "--config-dir": _folders,
                      "-cd": _folders, **HELP}, _check_arguments),
    "list": Command({"--config-dir": _folders, "-cd": _folders, **HELP}),
    "export": Command({OVERWRITE: None, **HELP}, _two_folders),
    "search": Command({"--target-len": NO_HINT, "--out": _folders, "-o": _folders,
                       "--objective": _choices(("ppl", "needle")), "--restart": None, **HELP,
                       **{o: NO_HINT for o in ("--tokens", "--needles", "--population", "--generations", "--parents",
                                               "--seed", "--start")}}, _folders),
}
ROOT_OPTIONS = ("--install-completion", "--show-completion", "--help", "-h")


def _positionals(options: Mapping[str, Optional[Completer]], words: Sequence[str]) -> list[str]:
    """The arguments among ``words`` that are neither options nor an option's value."""
    found, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in options:
            skip = options[word] is not None and word not in ("-sc", "--shell-completion")
        elif not word.startswith("-"):
            found.append(word)
    return found


def complete(words: Sequence[str], typed: str) -> Reply:
    """What a TAB offers for the word ``typed``, after ``words`` (what follows ``posexp``, complete words)."""
    rest = [w for w in words if not w.startswith("-")]
    if not rest:
        names = ROOT_OPTIONS if typed.startswith("-") else tuple(COMMANDS)
        return Reply(WORDS, tuple(n for n in names if n.startswith(typed)))
    command = COMMANDS.get(rest[0])
    if command is None:
        return NOTHING
    words = list(words[list(words).index(rest[0]) + 1:])
    value_of = command.options.get(words[-1]) if words else None
    if value_of is not None:
        return value_of(words, typed)
    if typed.startswith("--") and "=" in typed:  # --format=json
        option, _, value = typed.partition("=")
        completer = command.options.get(option)
        reply = completer(words, value) if completer else NOTHING
        return Reply(reply.kind, tuple(f"{option}={v}" for v in reply.items))
    if typed.startswith("-"):
        return Reply(WORDS, tuple(o for o in command.options if o.startswith(typed)))
    return command.arguments(words, typed)
