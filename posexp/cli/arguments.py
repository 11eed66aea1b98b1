"""What a user types to the Hydra apps (``posexp train``, ``finetune``, ``analyze``, ``eval hf:MODEL``), and Hydra's
errors about it, each said in one line.

Hydra skips an ``optional`` config group whose option does not exist, so ``experiment=smok`` would silently run
the full default training, and ``+key=`` / ``++key=`` add keys the schema does not have, so ``+model.d_modle=64``
would be ignored; its own errors are several lines and exit 1. Nothing here composes a job's config: posexp reads
what Hydra composed. :func:`check_command_line` checks what needs no config before Hydra starts (syntax, group
choices, sweeps without ``-m``); :func:`check_added_keys` reads the config Hydra composed for a job;
:func:`explain` turns the error of a config Hydra could not compose into one :class:`OverrideError` naming the key
and what is allowed. :func:`key_table` is the table of keys ``posexp train --help`` prints: the schema's commented
fields.

This module imports Hydra and ``posexp.config.schema`` (no torch until an encoder is looked up).
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException
from rich.table import Table

from posexp.cli.completion import field_comments, group_options, optional_groups
from posexp.cli.console import console
from posexp.cli.hydra_flags import APPS, CommandLine
from posexp.commands.sweeps import override_values
from posexp.config.schema import config_dir
from posexp.errors import PosexpError
from posexp.registry import did_you_mean

HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"
FULL_ERROR_HINT = "HYDRA_FULL_ERROR=1 shows Hydra's full message"
# the `optional` groups of configs/config.yaml's defaults: Hydra skips an option of theirs that does not exist
OPTIONAL_GROUPS = optional_groups()
# keys a user might guess for an encoder of their own (and encoder.MODULE_KEY); none exists, the message names the
# way that does
GUESSED_KEYS = ("plugins", "encoder._target_", "encoders")
COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException)  # a config Hydra could not compose (:func:`explain`)


class OverrideError(PosexpError):
    """A command-line override Hydra cannot use.

    Args:
        message: what is wrong and what is allowed.
        hydra_reports: Hydra reports this one itself (with its full text when HYDRA_FULL_ERROR=1);
            False for the mistakes Hydra lets through silently.
    """

    def __init__(self, message: str, hydra_reports: bool = True):
        self.hydra_reports = hydra_reports
        super().__init__(message)


def full_error_requested() -> bool:
    """HYDRA_FULL_ERROR=1 (Hydra's own switch) or POSEXP_DEBUG=1: leave Hydra's errors to Hydra, in full."""
    return any(os.environ.get(v, "") not in ("", "0") for v in (HYDRA_FULL_ERROR, "POSEXP_DEBUG"))


def _parse(args: Sequence[str], folders: bool) -> list:
    """Hydra's own parse of each override; an argument that is none names itself (and the folder it is not)."""
    parser, parsed = OverridesParser.create(), []
    for arg in args:
        try:
            parsed.append(parser.parse_override(arg))
        except HydraException as e:  # the parser's syntax error: the argument alone names it better
            if "=" not in arg and folders:
                raise OverrideError(f"{arg}: no such run folder, and not an override KEY=VALUE "
                                    "(e.g. encoder=rope base=10000)") from None
            if not arg.isascii():
                raise OverrideError(_non_ascii_message(arg)) from None
            reason = str(e).splitlines()[0]
            raise OverrideError(f"{arg}: not an override KEY=VALUE (Hydra's parser: {reason}; quote a value "
                                f"with spaces or brackets, e.g. 'key=\"a b\"'; {FULL_ERROR_HINT})") from None
    return parsed


def _non_ascii_message(arg: str) -> str:
    char = next(c for c in arg if not c.isascii())
    key, _, value = arg.partition("=")
    example = f"{key}='{value}'" if value and not set("'\"\\[]{}(),") & set(value) else f"{key or 'key'}='...'"
    return (f"{arg}: {char!r} is not ASCII, and Hydra's override grammar takes such characters only inside quotes; "
            f"quote the text that has it, e.g. {example} (in a shell: \"{example}\")")


# a value's pieces between the list, dict, sweep and call separators of Hydra's grammar
_PIECE = re.compile(r"[^\[\]{}(),\s]+")
_KEY_VALUE = re.compile(r"^([+~]{0,2}[\w.\-/@]+)=(.+)$")


def quote_non_ascii(args: Sequence[str]) -> List[str]:
    """Quote what Hydra's grammar takes only quoted, letters outside ASCII: ``hydra.run.dir=runs/é`` becomes
    ``hydra.run.dir='runs/é'``, ``k=[a,é]`` becomes ``k=[a,'é']``; the value means the same either way (such a
    piece is a string, never a number). An argument that is quoted, escaped or interpolated already, or whose
    quoted form Hydra would not parse either, is left as it is, for :func:`check_command_line` to name the
    character."""
    out = []
    for arg in args:
        m = _KEY_VALUE.match(arg)
        if arg.isascii() or m is None or set("'\"\\$") & set(m.group(2)):
            out.append(arg)  # already quoted, escaped or interpolated: the user's own syntax
            continue
        key, value = m.groups()
        pieces = f"{key}=" + _PIECE.sub(lambda p: p.group() if p.group().isascii() else f"'{p.group()}'", value)
        whole = f"{key}='{value.strip()}'" if not set("[]{}(),") & set(value) else None  # "a b é": one string
        out.append(next((q for q in (pieces, whole) if q is not None and _parses(q)), arg))
    return out


def _parses(override: str) -> bool:
    try:
        OverridesParser.create().parse_override(override)
    except HydraException:
        return False
    return True


# KEY=~... (a `~` Hydra's grammar rejects, and a shell leaves alone after `KEY=`); `+`/`++` prefixes kept
_HOME_VALUE = re.compile(r"^(\+{0,2}[\w.\-/@]+)=(~[^'\"\\]*)$")


def expand_home(args: Sequence[str]) -> List[str]:
    """Expand a value's leading ``~`` as a shell expands ``~/x``: ``data.path=~/corpus`` is then a quoted
    absolute path Hydra accepts (and the run records), each value of a sweep ``KEY=~/a,~/b`` alike.
    Quoted values, flags and every other argument pass through unchanged."""
    out = []
    for arg in args:
        m = _HOME_VALUE.match(arg)
        if not m:
            out.append(arg)
            continue
        key, value = m.groups()
        parts = [os.path.expanduser(p) if p.startswith("~") else p for p in value.split(",")]
        out.append(f"{key}=" + ",".join(f"'{p}'" if "'" not in p else p for p in parts))
    return out


def _check_launcher(override) -> None:
    """Launcher settings that joblib and submitit would only refuse with a traceback once the sweep starts."""
    if override.key_or_group != "hydra.launcher.n_jobs":
        return
    for value in override_values(override) or []:
        try:
            ok = int(value) != 0
        except ValueError:
            ok = False
        if not ok:
            raise OverrideError(f"hydra.launcher.n_jobs={value}: must be a whole number of jobs run at once, "
                                "at least 1 (or -1: one per CPU core, -2: all but one)")


def _is_group(override, dirs: Sequence[Path]) -> bool:
    """A choice of one of posexp's config groups (``encoder=rope``), the user's folders' included; Hydra's own
    groups (``hydra/launcher``) are Hydra's to check."""
    key = override.key_or_group
    if "." in key or key.startswith(("hydra", "schema")) or override.package is not None or override.is_delete():
        return False
    return any((folder / key).is_dir() for folder in (config_dir(), *dirs))


def _check_group(override, options: List[str], multirun: bool) -> None:
    group = override.key_or_group
    values = override_values(override) or []
    if override.is_sweep_override() and not multirun:
        values = []  # the sweep check names it
    # several options of one group at once (logger=[tensorboard,mlflow]): each must exist
    values = [v.strip() for value in values for v in (value[1:-1].split(",") if value.startswith("[") else [value])]
    # a plugin encoder that cannot be used (its module fails to load...) is named first, with why, in one line; a
    # command line naming only unknown encoders is answered without loading them
    if group == "encoder" and any(v in options for v in values):
        from posexp.encoders import broken  # torch: see posexp/cli/app.py

        unusable = broken()
        value = next((v for v in values if v in unusable), None)
        if value is not None:
            raise PosexpError(f"encoder={value}: the plugin encoder cannot be used: {unusable[value]}")
    for value in values:
        if value not in options:
            raise OverrideError(_no_option(group, value, options), hydra_reports=group not in OPTIONAL_GROUPS)


def _no_option(group: str, value: str, options: Sequence[str]) -> str:
    from posexp.encoders.plugins import HOW_TO  # torch: see posexp/cli/app.py

    own = f"; {HOW_TO}" if group == "encoder" else ""
    return (f"{group}={value}: no such {group} option; {did_you_mean(value, list(options), f'{group}=')}"
            f"choose one of: {', '.join(options)}{own}")


def check_command_line(line: CommandLine, dirs: Sequence[Path] = (), folders: bool = False) -> None:
    """What can be checked of a command line before Hydra composes anything: each override's syntax, a sweep
    without ``-m``, launcher settings, and each choice of a config group (from the groups' files: Hydra skips an
    ``optional`` group's option that does not exist, so ``experiment=smok`` would run the default training).

    Args:
        line: the command line (:func:`posexp.cli.hydra_flags.read`).
        dirs: the user's config folders, whose options count.
        folders: the app also takes folders (``posexp analyze RUN_DIR``), for the message of a missing one.

    Raises:
        OverrideError: naming the argument and what is allowed.
    """
    if line.config_path:
        raise OverrideError(f"--config-path {line.config_path}: replaces posexp's own configs; to add a folder of "
                            "yours beside them use --config-dir DIR (or hydra.searchpath=[file://DIR])")
    if line.helps:
        return
    for o in _parse(line.overrides, folders):
        if o.is_sweep_override() and not line.multirun and o.key_or_group == "hf.model":  # posexp eval hf:A,B
            value = o.input_line.partition("=")[2]
            raise OverrideError(f"hf:{value}: several models sweep, which needs -m (posexp eval -m hf:{value}); for "
                                f"one folder whose name has commas quote it: posexp eval \"hf:'{value}'\"")
        if o.is_sweep_override() and not line.multirun:
            raise OverrideError(f"{o.input_line}: several values sweep, which needs -m (posexp ... -m "
                                f"{o.input_line}); for one list value write {o.key_or_group}=[...], for a string "
                                f"with commas quote it: {o.key_or_group}='...'")
        _check_launcher(o)
        if _is_group(o, dirs):
            _check_group(o, group_options(o.key_or_group, dirs), line.multirun)


def check_added_keys(config: DictConfig) -> None:
    """Each key a job's ``+key=`` / ``++key=`` added is one of the schema's (Hydra adds any), read from the config
    Hydra composed: a node's schema is the dataclass it was composed from (``model``: ModelConfig, ``encoder``:
    the chosen encoder's options).

    Raises:
        OverrideError: the key, the nearest known one, and the keys there are.
    """
    overrides = OverridesParser.create().parse_overrides([str(o) for o in config.hydra.overrides.task])
    for o in overrides:
        if o.type.name not in ("ADD", "FORCE_ADD") or o.key_or_group.startswith("hydra.") or o.package is not None:
            continue
        parent_key, _, name = o.key_or_group.rpartition(".")
        parent = OmegaConf.select(config, parent_key) if parent_key else config
        schema = OmegaConf.get_type(parent) if isinstance(parent, DictConfig) else None
        if schema is None or not dataclasses.is_dataclass(schema):
            continue  # a plain mapping, or a group added whole (+experiment=smoke): Hydra's to check
        keys = [f.name for f in dataclasses.fields(schema)]
        if name not in keys:
            raise OverrideError(_task_key(parent_key, name, parent) or _not_a_key(parent_key, name, keys, o.input_line),
                                hydra_reports=False)


def _task_key(where: str, name: str, parent: object) -> Optional[str]:
    """A key that the chosen task (``task.KEY``) or tracker (``logger.NAME.KEY``) does not take: the component's own
    word on it (:func:`posexp.tasks.option_refusal`: the tasks that read it, or the task's options;
    :func:`posexp.tracking.option_refusal`: the tracker's options); None for any other key."""
    if not isinstance(parent, DictConfig):
        return None
    module = str(parent.get("module")) if parent.get("module") else None
    if where == "task" and parent.get("name"):
        from posexp.tasks import option_refusal

        return f"task.{name}: {option_refusal(str(parent.get('name')), name, module)}"
    if where.startswith("logger.") and where.count(".") == 1:
        from posexp.tracking import option_refusal as tracker_refusal

        try:
            return f"{where}.{name}: {tracker_refusal(where.split('.')[1], name, module)}"
        except PosexpError:
            return None
    return None


def _not_a_key(where: str, name: str, keys: Sequence[str], what: str = "") -> str:
    """``where.name`` is no key of ``keys`` (the override ``what`` set it, if it is not the key alone)."""
    from posexp.encoders.plugins import HOW_TO, MODULE_KEY  # torch: see posexp/cli/app.py

    prefix = f"{where}." if where else ""
    said = f"{what}: " if what else ""
    if (prefix + name).lstrip("+") in (*GUESSED_KEYS, f"encoder.{MODULE_KEY}"):
        return f"{said or prefix + name + ': '}posexp builds no encoder from a command-line key; {HOW_TO}"
    return (f"{said}{prefix}{name} is not a config key; {did_you_mean(name, list(keys), prefix)}"
            f"keys of {where or 'the top level'}: {', '.join(keys)}")


def explain(error: Exception) -> OverrideError:
    """Hydra's error for a config it could not compose, as one line: the key, what is wrong and what is allowed."""
    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, value = str(error.missing_cfg_file).rpartition("/")
        return OverrideError(_no_option(group, value, [str(o) for o in error.options]))
    cause = error.__cause__ if error.__cause__ is not None else error
    if cause is error and isinstance(error.__context__, (ConfigKeyError, ConfigAttributeError)):
        cause = error.__context__  # a key of a yaml: Hydra raises its own error while handling the key's
    key, parent = getattr(cause, "full_key", None), getattr(cause, "parent_node", None)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and key and isinstance(parent, DictConfig):
        where, _, name = str(key).rpartition(".")
        message = _task_key(where, name, parent) or _not_a_key(where, name, [str(k) for k in parent.keys()])
        in_file = re.match(r"In '[^']+'", str(error))  # the yaml that sets the key
        return OverrideError(f"{in_file.group(0)}: {message}" if in_file else message)
    return OverrideError(_one_line(error))


def _one_line(error: Exception) -> str:
    """Hydra's composition error as one line: the key, what went wrong, and where the full text is."""
    cause = error.__cause__
    if cause is not None and getattr(cause, "full_key", None):
        reason = str(getattr(cause, "msg", cause)).splitlines()[0]
        return f"{getattr(cause, 'full_key')}: {reason} ({FULL_ERROR_HINT})"
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip() and "HYDRA_FULL_ERROR" not in ln]
    return f"{'; '.join(lines[:3])} ({FULL_ERROR_HINT})"


# -- posexp train --help: the keys the schema documents ----------------------------------------------

def documented_keys(cls: type, prefix: str = "") -> dict:
    """``key -> meaning`` of each field of the schema dataclass ``cls`` that has a comment of its own
    (:func:`~posexp.cli.completion.field_comments`), and of a group's fields (``model.d_model``) one level down."""
    own = field_comments(cls)
    hints, keys = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        group = hints[f.name]
        if isinstance(group, type) and dataclasses.is_dataclass(group) and not prefix:
            keys.update(documented_keys(group, f"{f.name}."))
        elif f.name in own and not any(map(dataclasses.is_dataclass, (group, *typing.get_args(group)))):
            keys[prefix + f.name] = " ".join(own[f.name].split())
    return keys


def key_table(config_name: str, cfg: DictConfig) -> list:
    """Rows ``(key, default, meaning)`` of the keys the app's schema documents, the defaults as written in its
    composed config ``cfg``."""
    defaults: Any = OmegaConf.to_container(cfg, resolve=False)  # train.device stays ${device}, as the yaml says
    rows = []
    documented = documented_keys(APPS[config_name].schema)
    for key in sorted(documented, key=lambda k: "." in k):  # the top level's first, then each group's
        meaning = documented[key]
        value: Any = defaults
        for part in key.split("."):
            value = value[part]
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        rows.append((key, text.replace(" ", ""), meaning))
    return rows


def print_key_table(config_name: str) -> None:
    """Print :func:`key_table` of the shipped defaults (``posexp train --help``)."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name)
    prog = APPS[config_name].command
    table = Table(title=f"main keys  ({prog} KEY=VALUE; every key: {prog} --cfg job)", title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("default", no_wrap=True)
    table.add_column("meaning")
    for row in key_table(config_name, cfg):
        table.add_row(*row)
    console().print(table)

