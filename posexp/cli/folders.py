"""The run or sweep folder of a Hydra app's job, claimed by a Hydra callback (:class:`ClaimFolder`) on the config
Hydra composed for it: every job's config is checked, then the folder claimed, before Hydra makes or writes
anything (so a typo in job 7 of a sweep trains nothing, and two commands never share a folder).

A run's config is composed by Hydra alone, and typed and checked once: the job takes the checked config the
callback kept (:func:`take_checked`). A sweep's jobs are composed as its launcher composes them (Hydra's config
loader, from the sweep config Hydra composed): those of a covering subset, one per swept value, before any
job starts. ``posexp analyze``, which claims no folder, has its output folder checked there too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional

from hydra.core.global_hydra import GlobalHydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from posexp.cli.arguments import COMPOSITION_ERRORS, check_added_keys, explain, full_error_requested
from posexp.cli.hydra_flags import APPS
from posexp.commands.edge import override_text
from posexp.commands.finetune import CONFIG_NAME, check_finetune, overridden_keys, refuse_own_parent
from posexp.commands.sweeps import fixed_overrides, jobs_to_check, swept_values, sweep_jobs
from posexp.errors import PosexpError
from posexp.runs.atomic import unwritable
from posexp.runs.lock import claim_named_dir, new_run_dir


@dataclass
class Claim:
    """What a command asks of :class:`ClaimFolder`, and what its Hydra app found.

    Attributes:
        overwrite: ``--overwrite``: a folder the user named may hold a run, which is replaced.
        path: the run folder, or the sweep folder with ``-m``, once claimed; None until Hydra starts a run or sweep
            (and for ``--cfg``, ``--info``, ``--help``, shell completion and ``posexp analyze``).
        created: the folders made for it (to remove again if the run never starts).
        multirun: a sweep (``-m``).
        jobs: each sweep job's overrides (a basic sweep's); None when a sweeper draws them.
        checked: each checked job's typed config by its overrides, for the job to take.
        failed: the run folders of the sweep jobs that failed.
        held: the command's stderr, held until Hydra has composed (:class:`~posexp.cli.hydra_flags.HeldStream`).
    """

    overwrite: bool
    path: Optional[Path] = None
    created: List[Path] = dataclasses.field(default_factory=list)
    multirun: bool = False
    jobs: Optional[List[List[str]]] = None
    checked: dict = dataclasses.field(default_factory=dict)
    failed: List[str] = dataclasses.field(default_factory=list)
    held: Any = None


class Carried(BaseException):
    """An error of a job or of a callback, carried through Hydra's run to the command, which says it: a
    BaseException, as SystemExit is, so that Hydra's report of a failed app (which catches Exception and prints a
    traceback) lets it through."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


ANALYZE = "analyze"  # the Hydra app that claims no folder
# The running command's request: a context variable, set for the command's duration and reset after it (as Click
# keeps its current context), so that nothing outlives the command or crosses threads.
_CLAIM: ContextVar[Optional[Claim]] = ContextVar("posexp_claim", default=None)


@contextlib.contextmanager
def claiming(overwrite: bool) -> Iterator[Claim]:
    """While inside, the Hydra app's run (or sweep) is checked and its folder claimed by :class:`ClaimFolder`."""
    claim = Claim(overwrite)
    token = _CLAIM.set(claim)
    try:
        yield claim
    finally:
        _CLAIM.reset(token)


def current_claim() -> Optional[Claim]:
    """The request of the posexp command running here; None in a launcher's other process, or for a Hydra app
    started some other way."""
    return _CLAIM.get()


class ClaimFolder(Callback):
    """Hydra callback (``hydra.callbacks`` of configs/config.yaml and finetune.yaml): check the job(s), then claim
    the folder and name it in the config Hydra goes on with. It acts only under :func:`claiming`, so a Hydra app
    started some other way (or a rank other than 0 under torchrun) claims nothing."""

    def on_run_start(self, config: DictConfig, config_name: Optional[str] = None, **kwargs: Any) -> None:
        self._start(config, str(config_name), multirun=False)

    def on_multirun_start(self, config: DictConfig, config_name: Optional[str] = None, **kwargs: Any) -> None:
        self._start(config, str(config_name), multirun=True)

    @staticmethod
    def _start(config: DictConfig, config_name: str, multirun: bool) -> None:
        claim, key = current_claim(), "hydra.sweep.dir" if multirun else "hydra.run.dir"
        if claim is None:
            return
        if claim.held is not None:
            claim.held.release()  # composed: what Hydra writes is no composition error
        try:  # an error is carried to the command: Hydra would print it as a traceback
            jobs = check_sweep(claim, config, config_name) if multirun else None
            if not multirun:
                _check(claim, config, config_name)
            if config_name == ANALYZE:
                return check_writable(config, key)
            if config.get("parent") is not None:  # a fine-tune's new run
                refuse_own_parent(Path(str(config.parent)), Path(str(OmegaConf.select(config, key))), key)
            claim.path, claim.created = _claim_dir(claim, config, key, sweep=multirun)
        except Exception as e:
            raise Carried(e) from None
        claim.multirun, claim.jobs = multirun, jobs


def checker(config_name: str):
    """The function that types and checks a job's config of the Hydra app ``config_name``."""
    return APPS[config_name].load(APPS[config_name].check)


def _check(claim: Claim, config: DictConfig, config_name: str, label: str = "", multirun: bool = False) -> None:
    """Check one job's composed config (its ``hydra`` node left out, as the job receives it) and keep it typed."""
    job = copy.deepcopy(config)
    with read_write(job), open_dict(job):
        del job["hydra"]
    try:
        check_added_keys(config)
        if config_name == CONFIG_NAME:  # no Hydra job runs yet: a fine-tune is told what its command line set
            spec = check_finetune(job, overridden_keys(config.hydra.overrides.task))
        else:
            spec = checker(config_name)(job)
        if "${hydra:" not in OmegaConf.to_yaml(job):  # else a value of the job's own (${hydra:job.num}): typed there
            claim.checked[tuple(str(o) for o in config.hydra.overrides.task)] = spec
    except PosexpError as e:
        if multirun and label:
            raise PosexpError(f"{e} (in the sweep job with {label}; no job was started)") from None
        raise


def take_checked(overrides: List[str]) -> Any:
    """The typed config :class:`ClaimFolder` checked for the job of ``overrides`` in this process (None if none:
    a job of a launcher's other process, or a Hydra app started without :func:`claiming`); taken once."""
    claim = current_claim()
    return claim.checked.pop(tuple(overrides), None) if claim is not None else None


def check_sweep(claim: Claim, config: DictConfig, config_name: str) -> Optional[List[List[str]]]:
    """Compose and check each job of the sweep Hydra composed (a covering subset of a large one) before any trains.

    Returns:
        Each job's overrides, in the order Hydra's basic sweeper runs them; None when a sweeper draws them
        (its jobs' shared overrides are checked).
    """
    overrides = [str(o) for o in config.hydra.overrides.task]
    basic = str(config.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper")
    jobs = sweep_jobs(overrides) if basic else None
    checked = jobs_to_check(jobs or [fixed_overrides(overrides)])
    for job, label in zip(checked, swept_values(checked)):
        try:  # as Hydra's launchers compose a job: the sweep's resolved values (``${now:...}``) kept
            composed = GlobalHydra.instance().config_loader().load_sweep_config(config, list(job))
        except COMPOSITION_ERRORS as e:
            if full_error_requested():
                raise  # Hydra's own report, in full
            raise PosexpError(f"{explain(e)} (with {label or 'the sweep'}; no job was started)") from None
        _check(claim, composed, config_name, label, multirun=True)
    return jobs


def _claim_dir(claim: Claim, config: DictConfig, key: str, sweep: bool) -> tuple[Path, list[Path]]:
    """Claim the folder ``key`` names in ``config`` and name the claimed one there, for Hydra to make and write.

    A folder Hydra would name from the clock (``outputs/DATE/TIME``) becomes ``TIME-1``, ``TIME-2``, ...
    when another run has it; a folder the user named (``hydra.run.dir``) must hold no run.

    Raises:
        PosexpError: a folder that cannot be created, or one that holds a run (:class:`RunFolderTaken`).
    """
    path = Path(str(OmegaConf.select(config, key)))
    if key in overridden_keys(config.hydra.overrides.hydra):
        return path, claim_named_dir(path, key, sweep=sweep, overwrite=claim.overwrite)
    path, created = new_run_dir(path, key)
    with read_write(config.hydra), open_dict(config.hydra):
        OmegaConf.update(config, key, str(path))
        # a launcher composes each sweep job again from these overrides: the claimed folder becomes one of them
        config.hydra.overrides.hydra.append(override_text(key, path))
    return path, created


def check_writable(config: DictConfig, key: str) -> None:
    """Refuse an output folder (``key``) that cannot be made: ``posexp analyze`` from a folder the user cannot
    write to, whose default ``outputs/...`` Hydra would fail to create with a traceback.

    Raises:
        PosexpError: naming the folder, the place that is not writable, and the key that chooses another.
    """
    path = Path(str(OmegaConf.select(config, key)))
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    problem = unwritable(existing) if existing.is_dir() else "a file is in the way"
    if problem is not None:
        where = "" if existing == path else f": {existing} is not writable"
        raise PosexpError(f"{path}: cannot create the output folder ({problem}{where}); run the command from a "
                          f"folder you can write to, or choose the output folder with {key}=DIR")
