"""Hydra's command-line flags, read as ``@hydra.main`` reads them, so that posexp can look at a command line
(its overrides, ``-m``, ``--config-dir``) before Hydra runs it. Hydra 1.3 offers no public parser of its own
flags: this is its flag set, written out (``tests/process/test_completion.py`` holds it equal to what
``posexp train --hydra-help`` lists). Standard library only: tab completion reads it too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import dataclass
from typing import Optional, Sequence

CFG_PARTS = ("job", "hydra", "all")
INFO_PARTS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, prog="posexp")
    parser.add_argument("overrides", nargs="*")
    for flags in (("--help", "-h"), ("--hydra-help",), ("--version",), ("--resolve",), ("--run", "-r"),
                  ("--multirun", "-m"), ("--shell-completion", "-sc")):
        parser.add_argument(*flags, action="store_true")
    parser.add_argument("--cfg", "-c", choices=CFG_PARTS)
    parser.add_argument("--info", "-i", const="all", nargs="?", choices=INFO_PARTS)
    for flags in (("--package", "-p"), ("--config-path", "-cp"), ("--config-name", "-cn"), ("--config-dir", "-cd"),
                  ("--experimental-rerun",)):
        parser.add_argument(*flags)
    return parser


@dataclass(frozen=True)
class CommandLine:
    """A Hydra app's command line, read.

    Attributes:
        overrides: the ``KEY=VALUE`` arguments, in order.
        multirun: ``-m``: a sweep.
        helps: Hydra prints help, its version or a completion script, composing nothing of posexp's.
        runs: Hydra runs a job (or a sweep); not ``--cfg``, ``--info`` nor any of ``helps``.
        config_dir: ``--config-dir``; config_path: ``--config-path``.
    """

    overrides: tuple
    multirun: bool
    helps: bool
    runs: bool
    config_dir: Optional[str]
    config_path: Optional[str]


def read(args: Sequence[str]) -> Optional[CommandLine]:
    """``args`` as Hydra will read them; None when Hydra's parser will refuse them (it then prints its usage)."""
    parser, ns = _parser(), None
    try:  # overrides after a flag (``RUN train_len=512 -m scaling=none,yarn``) need the intermixed reading
        with contextlib.redirect_stderr(io.StringIO()):
            ns = parser.parse_args(list(args))
    except SystemExit:
        with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            ns = parser.parse_intermixed_args(list(args))
    if ns is None:
        return None
    helps = bool(ns.help or ns.hydra_help or ns.version or ns.shell_completion or ns.config_name)
    runs = not (helps or ns.cfg or ns.info or ns.experimental_rerun)
    return CommandLine(tuple(ns.overrides), bool(ns.multirun), helps, runs, ns.config_dir, ns.config_path)


def option_strings() -> set:
    """Every flag of the parser (for the test that holds it equal to Hydra's)."""
    return {o for action in _parser()._actions for o in action.option_strings}
