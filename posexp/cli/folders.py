"""The run or sweep folder of a ``posexp train`` / ``finetune`` command line: every job's config checked, then
the folder claimed, before Hydra starts (so a typo in job 7 of a sweep trains nothing, and two commands never
share a folder)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from posexp.cli.arguments import full_error_requested, override_text
from posexp.errors import PosexpError


@dataclass
class Folders:
    """The run (or sweep) folder of a ``posexp train`` command line, claimed before Hydra starts.

    Attributes:
        path: the run folder, or the sweep folder with ``-m``.
        created: the folders made for it (to remove again if the run never starts).
        multirun: a sweep (``-m``).
        jobs: each sweep job's overrides (a basic sweep's); None when a sweeper draws them.
        args: the command line for Hydra, naming the claimed folder.
    """

    path: Path
    created: List[Path]
    multirun: bool
    jobs: Optional[List[List[str]]]
    args: List[str] = field(default_factory=list)


def check_jobs(jobs: List[List[str]], multirun: bool, config_name: str = "config", user_dirs=()) -> dict:
    """Compose and validate the config of each job (a covering subset of a large sweep) before any trains.

    Returns:
        The first job's run and sweep folders as Hydra would name them (``run``, ``sweep``), and whether
        its sweeper is Hydra's basic one (``basic``).
    """
    from hydra import compose
    from hydra.core.utils import setup_globals
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from posexp.cli.plugins import initialize_configs
    from posexp.commands.finetune import CONFIG_NAME, check_finetune
    from posexp.commands.sweeps import jobs_to_check, swept_values
    from posexp.commands.train import check_config

    first: dict = {}
    checked = jobs_to_check(jobs)
    setup_globals()  # the ${now:...} resolver of Hydra's folder names
    with initialize_configs(user_dirs):
        for job, label in zip(checked, swept_values(checked)):
            try:
                cfg = compose(config_name, overrides=job, return_hydra_config=True)
                first = first or {"run": str(cfg.hydra.run.dir), "sweep": str(cfg.hydra.sweep.dir),
                                  "basic": str(cfg.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper")}
            except (HydraException, OmegaConfBaseException) as e:
                if full_error_requested():
                    raise  # Hydra's own report, in full
                raise PosexpError(f"{' '.join(str(e).split())} ({label or 'the run'})") from None
            with open_dict(cfg):
                del cfg["hydra"]
            try:
                check_finetune(cfg) if config_name == CONFIG_NAME else check_config(cfg)
            except PosexpError as e:
                if multirun and label:
                    raise PosexpError(f"{e} (in the sweep job with {label}; no job was started)") from None
                raise
    return first


def claim_folders(args: List[str], overwrite: bool, config_name: str = "config",
                   user_dirs=()) -> Optional[Folders]:
    """Check every job's config, then claim the run (or sweep) folder of ``posexp train ARGS``.

    A folder Hydra would name from the clock (``outputs/DATE/TIME``) becomes ``TIME-1``, ``TIME-2``, ...
    when another run has it; a folder the user named (``hydra.run.dir``) must hold no run.

    Returns:
        The folders, and the command line naming the claimed one; None when Hydra writes no run
        (``--cfg``, ``--info``, ``--help``, shell completion).

    Raises:
        PosexpError: a config error, a folder that cannot be created, or one that holds a run.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from posexp.cli.hydra_adapter import parse_command_line
    from posexp.commands.sweeps import fixed_overrides, sweep_jobs
    from posexp.runs.lock import claim_named_dir, new_run_dir

    ns = parse_command_line(args)
    if ns is None:
        return None  # Hydra's argparse says what is wrong
    if ns.help or ns.hydra_help or ns.cfg or ns.info or ns.shell_completion or ns.experimental_rerun:
        return None
    jobs = sweep_jobs(ns.overrides) if ns.multirun else [list(ns.overrides)]
    first = check_jobs(jobs or [fixed_overrides(ns.overrides)], ns.multirun, config_name, user_dirs)
    if not first["basic"]:
        jobs = None  # a sweeper such as Optuna chooses the jobs as it goes
    key = "hydra.sweep.dir" if ns.multirun else "hydra.run.dir"
    path = Path(first["sweep" if ns.multirun else "run"])
    named = {o.input_line for o in OverridesParser.create().parse_overrides(ns.overrides) if o.key_or_group == key}
    if named:
        created = claim_named_dir(path, key, sweep=ns.multirun, overwrite=overwrite)
    else:
        path, created = new_run_dir(path, key)
    rest = [a for a in args if a not in named]
    return Folders(path, created, ns.multirun, jobs if ns.multirun else None, [*rest, override_text(key, path)])


def check_output_folder(args: List[str], config_name: str, user_dirs=()) -> None:
    """Refuse, before Hydra starts, a command line whose output folder cannot be made: ``posexp analyze`` from a
    folder the user cannot write to, whose default ``outputs/...`` Hydra would fail to create with a traceback.

    Raises:
        PosexpError: naming the folder, the place that is not writable, and the key that chooses another.
    """
    from hydra import compose
    from hydra.core.utils import setup_globals
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from posexp.cli.hydra_adapter import parse_command_line
    from posexp.cli.plugins import initialize_configs
    from posexp.commands.sweeps import fixed_overrides
    from posexp.runs.atomic import unwritable

    ns = parse_command_line(args)
    if ns is None or ns.help or ns.hydra_help or ns.cfg or ns.info or ns.shell_completion or ns.experimental_rerun:
        return  # Hydra writes no folder (or reports the command line itself)
    key = "hydra.sweep.dir" if ns.multirun else "hydra.run.dir"
    setup_globals()  # the ${now:...} resolver of Hydra's folder names
    try:
        with initialize_configs(user_dirs):
            cfg = compose(config_name, overrides=fixed_overrides(ns.overrides), return_hydra_config=True)
        path = Path(str(cfg.hydra.sweep.dir if ns.multirun else cfg.hydra.run.dir))
    except (HydraException, OmegaConfBaseException):
        return  # Hydra reports it as it starts
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    problem = unwritable(existing) if existing.is_dir() else "a file is in the way"
    if problem is not None:
        where = "" if existing == path else f": {existing} is not writable"
        raise PosexpError(f"{path}: cannot create the output folder ({problem}{where}); run the command from a "
                          f"folder you can write to, or choose the output folder with {key}=DIR")
