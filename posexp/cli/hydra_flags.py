"""Hydra's command line, read by Hydra's own parser, and a Hydra app run on the arguments the user typed.

Hydra 1.3 reads an app's arguments from ``sys.argv`` in ``@hydra.main`` and has no public way to hand them over;
its parser (``get_args_parser``) and runner (``_run_hydra``), which ``@hydra.main`` calls, are the two names of
its private API posexp uses, here only. :data:`APPS` is the one table of posexp's Hydra apps, read by the command,
its jobs, the folder's claim, ``--help`` and tab completion. Standard library and the schema at import: tab
completion reads :data:`APPS`; what the apps run is imported when they run (torch).

The user's own config folders are read from the command line here too (:func:`user_config_dirs`): ``posexp train
--config-dir conf encoder=logrope`` and ``hydra.searchpath=[file://conf]`` both reach ``conf/encoder/logrope.yaml``,
whose ``module:`` key names the module that defines the encoder; its encoders are imported before Hydra composes
(:func:`posexp.encoders.config_folder.load_config_folder`), so that each schema is in Hydra's ConfigStore as a
built-in's is.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from posexp.config.schema import Config, FinetuneAppConfig, PretrainedConfig, config_dir
from posexp.errors import PosexpError

SEARCHPATH = "hydra.searchpath"


@dataclass(frozen=True)
class HydraApp:
    """One Hydra app of posexp (its config's name in configs/ is its key in :data:`APPS`).

    Attributes:
        command: the command that names it in Hydra's messages.
        schema: its config's schema (``analyze`` adds its own group to the training config's).
        module: the module of its recipe (imported when a job runs: torch), which names the functions below.
        check: the function that types and checks a job's config.
        run: the recipe each job runs, ``(spec, run_dir, overrides, console) -> results``; empty: ``posexp
            analyze``'s job draws an encoding's geometry instead.
        arguments: the function that turns the command's arguments into Hydra's; empty: they are Hydra's.
    """

    command: str
    schema: type
    module: str
    check: str
    run: str = ""
    arguments: str = ""

    def load(self, name: str) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.module), name)

    def hydra_arguments(self, args: Sequence[str]) -> List[str]:
        return list(self.load(self.arguments)(args)) if self.arguments else list(args)


APPS = {
    "config": HydraApp("posexp train", Config, "posexp.commands.train", "check_config", "train_run"),
    "analyze": HydraApp("posexp analyze", Config, "posexp.analysis.schema", "check_analyze_job"),
    "finetune": HydraApp("posexp finetune", FinetuneAppConfig, "posexp.commands.finetune", "check_finetune",
                         "finetune_run", "parent_argument"),
    "pretrained": HydraApp("posexp eval", PretrainedConfig, "posexp.commands.pretrained", "check_pretrained",
                           "pretrained_run", "pretrained_arguments"),
}


def _parse(args: Sequence[str], prog: str = "posexp") -> Tuple[argparse.ArgumentParser, Optional[argparse.Namespace]]:
    """Hydra's parser and its reading of ``args``; None when it refuses them (it then says so itself)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog = prog
    quiet = (contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()))  # --version too
    try:  # overrides after a flag (``RUN train_len=512 -m scaling=none,yarn``) need the intermixed reading
        with quiet[0], quiet[1]:
            return parser, parser.parse_args(list(args))
    except SystemExit:
        with contextlib.suppress(SystemExit), quiet[0], quiet[1]:
            return parser, parser.parse_intermixed_args(list(args))
    return parser, None


@dataclass(frozen=True)
class CommandLine:
    """A Hydra app's command line, read.

    Attributes:
        overrides: the ``KEY=VALUE`` arguments, in order.
        multirun: ``-m``: a sweep.
        helps: Hydra prints help, its version or a completion script, composing nothing of posexp's.
        config_path: ``--config-path``.
    """

    overrides: tuple
    multirun: bool
    helps: bool
    config_path: Optional[str]


def read(args: Sequence[str]) -> Optional[CommandLine]:
    """``args`` as Hydra will read them; None when Hydra's parser will refuse them (it then prints its usage)."""
    ns = _parse(args)[1]
    if ns is None:
        return None
    helps = bool(ns.help or ns.hydra_help or ns.shell_completion or ns.config_name)
    return CommandLine(tuple(ns.overrides), bool(ns.multirun), helps, ns.config_path)


def option_strings() -> set:
    """Every flag of Hydra's parser."""
    return {o for action in _parse([])[0]._actions for o in action.option_strings}


def named_config_dirs(words: Sequence[str]) -> List[Tuple[str, str]]:
    """The user's config folders a command line names, each with the flag or key that names it: ``--config-dir DIR``
    (``-cd DIR``, ``--config-dir=DIR``), then the folders of ``hydra.searchpath=[...]`` (``pkg://`` ones are configs
    inside a package). Read from the words alone, as a TAB reads them (:mod:`posexp.cli.completion`)."""
    flags, searched = [], []
    for before, word in zip(["", *words], words):
        if before in ("--config-dir", "-cd") or word.startswith("--config-dir="):
            flags.append(("--config-dir", word.removeprefix("--config-dir=")))
        elif word.lstrip("+").startswith(SEARCHPATH + "="):
            items = (item.strip(" '\"") for item in word.partition("=")[2].strip("[]").split(","))
            searched += [(SEARCHPATH, item.removeprefix("file://")) for item in items
                         if item and not item.startswith("pkg://")]
    return flags + searched


def user_config_dirs(words: Sequence[str]) -> List[Path]:
    """The user's config folders a Hydra command line names (:func:`named_config_dirs`), their encoders imported.

    Raises:
        PosexpError: a named folder does not exist.
    """
    dirs: List[Path] = []
    for key, text in named_config_dirs(words):
        folder = Path(text).expanduser().resolve()
        if not folder.is_dir():
            raise PosexpError(f"{key}: no such folder {folder} (the folder that holds your encoder/NAME.yaml)")
        dirs += [] if folder in dirs else [folder]
    from posexp.encoders.config_folder import load_config_folder  # torch: see posexp/cli/app.py

    for folder in dirs:
        load_config_folder(folder)
        for line in shadowed_components(folder):
            logging.getLogger("posexp.registry").warning("%s", line)
    return dirs


# what a group's yaml naming the user's ``module`` is, in the user's words
PLUGIN_KINDS = {"logger": "tracker"}


def shadowed_components(folder: Path) -> List[str]:
    """Why a config of the user's is never read: its yaml in ``folder`` (``model/small.yaml``, ``task/NAME.yaml``...)
    has the name of one of posexp's own configs in that group, which Hydra reads first; one line each, as a plugin
    encoder's shadowed name is said (a plugin encoder's yaml is left to that line)."""
    lines: List[str] = []
    if folder.resolve() == config_dir().resolve():  # posexp's own folder named again shadows nothing
        return lines
    for group in sorted(p.name for p in config_dir().iterdir() if p.is_dir()):
        for yaml in sorted((folder / group).glob("*.yaml")):
            if not (config_dir() / group / yaml.name).is_file():
                continue
            plugin = _names_a_module(yaml)
            if plugin and group == "encoder":  # the encoder registry says it (posexp.encoders)
                continue
            what = f"the plugin {PLUGIN_KINDS.get(group, group)}" if plugin else f"your {group}"
            lines.append(f"{what} {yaml.stem!r} ({yaml}) is shadowed by posexp's built-in {group}/{yaml.name}, "
                         f"which Hydra reads first; rename yours (the file{' and its name' if plugin else ''})")
    return lines


def _names_a_module(yaml: Path) -> bool:
    """The yaml sets a ``module`` key (``task.module``, ``logger.NAME.module``): it is a component of the user's."""
    try:
        return any(line.split("#")[0].strip().startswith("module:") for line in yaml.read_text().splitlines())
    except (OSError, UnicodeDecodeError):
        return False


class HeldStream:
    """A stream whose writes wait until :meth:`release`, then go through: what Hydra writes before it has composed
    the config (its report of a config it cannot compose, in several lines) waits for the command, which says such
    an error in one line instead (:meth:`discard`)."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.held: Optional[list] = []

    def write(self, text: str) -> int:
        if self.held is None:
            return self.stream.write(text)
        self.held.append(text)
        return len(text)

    def flush(self) -> None:
        if self.held is None:
            self.stream.flush()

    @property
    def holding(self) -> bool:
        return self.held is not None

    def release(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            self.stream.write("".join(held))
            self.stream.flush()

    def discard(self) -> None:
        self.held = None

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the stream's
        return getattr(self.stream, name)


def run_app(task: Callable[[Any], Any], config_name: str, args: Sequence[str]) -> None:
    """Run ``task`` as the Hydra app of ``config_name`` would run it had its command (``posexp train``) been typed
    with ``args`` (as ``@hydra.main`` does, with the arguments given instead of ``sys.argv``)."""
    from hydra._internal.utils import _run_hydra
    from hydra.main import _get_rerun_conf

    parser, ns = _parse(args, APPS[config_name].command)
    if ns is None:
        parser.parse_args(list(args))  # Hydra's usage and error, exit status 2
        return
    if ns.experimental_rerun is not None:
        task(_get_rerun_conf(ns.experimental_rerun, ns.overrides))
        return
    _run_hydra(args=ns, args_parser=parser, task_function=task, config_path=str(config_dir()),
               config_name=config_name)
