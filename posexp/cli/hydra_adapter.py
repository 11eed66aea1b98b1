"""The one place posexp reaches into Hydra's private API (``hydra._internal``) and its launchers' ways: reading a
command line as ``@hydra.main`` will, so that posexp checks it before Hydra runs, starting Hydra on posexp's configs
with the user's own folders in front, as ``--config-dir`` does, and composing a sweep job as a launcher does.

Hydra 1.3 offers no public parser of its own flags; if a Hydra release moves it, this module is what changes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Optional, Sequence

from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path, get_args_parser
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig


def parse_command_line(args: Sequence[str]) -> Optional[argparse.Namespace]:
    """Hydra's flags and overrides in ``args`` (``ns.overrides``, ``ns.multirun``, ``ns.cfg``, ``ns.help``, ...);
    None when Hydra's own parser refuses them (it has then printed its usage and the reason)."""
    parser = get_args_parser()
    try:  # overrides after a flag (``RUN train_len=512 -m scaling=none,yarn``) need the intermixed reading
        with contextlib.redirect_stderr(io.StringIO()):
            return parser.parse_args(list(args))
    except SystemExit:
        pass
    try:
        return parser.parse_intermixed_args(list(args))
    except SystemExit:
        return None


def start_hydra(primary: str, user_dirs: Sequence[str]) -> None:
    """(Re)create the global Hydra on the config folder ``primary`` with ``user_dirs`` searched before it,
    where ``--config-dir`` puts its folder. The caller clears the global Hydra first and restores it after."""
    search_path = create_config_search_path(primary)
    for folder in reversed(list(user_dirs)):
        search_path.prepend(provider="command-line", path=f"file://{folder}", anchor=SearchPathQuery(provider="schema"))
    Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)


def compose_job(sweep_config: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The config of the sweep job ``overrides`` as Hydra's launchers compose it: from the running Hydra's sweep
    config (its ``hydra`` overrides, then the job's), run mode, the sweep's resolved values (``${now:...}``) kept.

    Raises:
        HydraException, OmegaConfBaseException: the job's config cannot be composed.
    """
    return GlobalHydra.instance().config_loader().load_sweep_config(sweep_config, list(overrides))
