"""Claiming and locking run folders: one run, one folder, and no two processes training in it.

A default run folder (Hydra's ``outputs/DATE/TIME``, second resolution) is claimed by
creating it exclusively, with a numbered suffix when another run took the same second;
a folder the user named is refused when a run already wrote there (``--overwrite``
replaces it). While a process trains, it holds an ``flock`` on the folder's lock file,
which the kernel releases if the process dies, so a killed run never leaves it stuck.
Torch-free, like :mod:`posexp.runs.layout`, whose file names it uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import (CHECKPOINT_DIR, LOSS_BY_POSITION_CSV, LOSS_BY_POSITION_PNG, METRICS_CSV, MULTIRUN_YAML, PPL_PLOT, REPORT_ACCURACY_PLOT, REPORT_CURVE_PLOT, REPORT_MD, REPORT_PLOT, REPORT_POSITION_PLOT, REPORT_TRAINING_PLOT, RESULTS_CSV, RESULTS_JSON, RESULTS_MD, SUMMARY_CSV, SUMMARY_MD, TENSORBOARD_DIR, TRACKERS_JSON, TRAIN_LOG, WANDB_DIR, find_runs, is_sweep_dir, iter_jobs, run_status)

HYDRA_OUTPUT = ".hydra"
# What a run writes into its folder: a folder holding one of these is a run's, not a free one.
RUN_FILES = (RESULTS_JSON, RESULTS_CSV, RESULTS_MD, PPL_PLOT, LOSS_BY_POSITION_CSV, LOSS_BY_POSITION_PNG,
             METRICS_CSV, TRAIN_LOG, CHECKPOINT_DIR, HYDRA_OUTPUT, "analysis", TRACKERS_JSON, TENSORBOARD_DIR,
             WANDB_DIR)
# What a sweep writes into its own folder, besides its numbered job folders.
SWEEP_FILES = (MULTIRUN_YAML, SUMMARY_MD, SUMMARY_CSV, REPORT_MD, REPORT_PLOT, REPORT_POSITION_PLOT,
               REPORT_TRAINING_PLOT, PPL_PLOT, TRACKERS_JSON)
# What posexp report writes into a folder it is given (or into a view's reports/NAME/ there).
REPORT_FILES = (REPORT_MD, REPORT_PLOT, REPORT_POSITION_PLOT, REPORT_TRAINING_PLOT, REPORT_ACCURACY_PLOT,
                REPORT_CURVE_PLOT, SUMMARY_MD, SUMMARY_CSV)
REPORTS_DIR = "reports"
ANALYSIS_DIR, ANALYSIS_JSON = "analysis", "analysis.json"  # posexp analyze RUN: the json lists its figures
OVERWRITE_FLAG = "--overwrite"
# Who holds a run folder's claim and what it does there, so a refused or waiting command can say so.
# Written by the holder once it has the flock, removed when it lets go; a note left by a killed process
# is overwritten by the next holder, so a note is only ever read while its writer holds the claim.
LOCK_NOTE = ".posexp-lock.json"
TRAINING, EVALUATING = "training", "evaluating"

_held: dict[str, int] = {}  # resolved run folder -> the open descriptor whose flock claims it for this process


class RunFolderTaken(PosexpError):
    """The run folder is another run's: one that is still training, or one already written."""


def _cannot_create(path: Path, error: OSError, key: str) -> PosexpError:
    reason = {FileExistsError: "a file is in the way", NotADirectoryError: "a file is in the way",
              PermissionError: "permission denied"}.get(type(error), error.strerror or str(error))
    return PosexpError(f"{path}: cannot create the run folder ({reason}); choose another with {key}=DIR")


def check_name_lengths(path: Path, key: str) -> None:
    """A folder name longer than the filesystem allows is one line naming the key, not an OSError later.

    Raises:
        PosexpError: a component of ``path`` (or the whole path) is too long for the filesystem.
    """
    existing = next((p for p in [path, *path.parents] if _exists(p)), Path("/"))
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        name_max, path_max = 255, 4096
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise PosexpError(f"{key}={path}: the folder name {part[:24]}... is {len(os.fsencode(part))} bytes, "
                              f"longer than this filesystem allows ({name_max}); choose a shorter {key}=DIR")
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        raise PosexpError(f"{key}={path}: the path is longer than this filesystem allows ({path_max} bytes); "
                          f"choose a shorter {key}=DIR")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # ENAMETOOLONG, among others
        return False


def make_parents(path: Path, key: str) -> list[Path]:
    """Create the missing folders above ``path``; returns those created, deepest last (to remove if unused)."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    try:
        for folder in missing:
            folder.mkdir(exist_ok=True)
    except OSError as e:
        raise _cannot_create(path, e, key) from None
    return missing


def new_run_dir(base: str | os.PathLike, key: str = "hydra.run.dir") -> tuple[Path, list[Path]]:
    """Claim a fresh folder ``base``, else ``base-1``, ``base-2``, ... (os.mkdir: one process gets each name),
    and lock it for this process.

    Returns:
        The folder, and every folder created for it (itself last), for :func:`discard_unused`.

    Raises:
        PosexpError: the folder cannot be created (a file in the way, no permission, a read-only place).
    """
    base = Path(base)
    check_name_lengths(base, key)
    created = make_parents(base, key)
    for n in range(10_000):
        path = base if n == 0 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise _cannot_create(path, e, key) from None
        lock_run(path)
        return path, [*created, path]
    raise PosexpError(f"{base}: 10000 run folders of that name exist already; choose another with {key}=DIR")


def _holder(path: Path, patience: float = 2.0) -> tuple[str, str]:
    """What the process holding ``path`` does there, and who it is, from its note.

    A holder writes its note just after it takes the claim, so a missing note is waited for a moment;
    a holder that never writes one (an older posexp, a read-only folder) is taken to be training.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            note = json.loads((path / LOCK_NOTE).read_text())
            return str(note["doing"]), f"another posexp process ({note['command']}, pid {int(note['pid'])})"
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return TRAINING, "another posexp process"
            time.sleep(0.05)


def still_running(folder: str | os.PathLike) -> Optional[str]:
    """Why run folder ``folder`` has no ``results.json`` yet when another process holds its claim, in one line naming
    that process; None when it has one, or no process holds it (the run stopped early, or there never was one).

    A holder keeps the claim until it has written ``results.json`` (or dies, and the kernel lets it go). The claim is
    probed with a shared flock taken and let go at once.
    """
    try:
        import fcntl
    except ImportError:  # no flock on this platform: no claim to read
        return None
    if (Path(folder) / RESULTS_JSON).is_file():
        return None
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        doing, who = _holder(Path(folder), patience=0)
        return (f"{folder}: the run is still running ({who} is {doing} in it); its {RESULTS_JSON} is written when "
                "training and evaluation finish")
    finally:
        os.close(fd)  # lets the probe's lock go
    return None


def refuse_running(folder: str | os.PathLike) -> None:
    """Refuse ``folder`` in :func:`still_running`'s line when a process is still training in it; nothing otherwise.

    Raises:
        PosexpError: the run is still running.
    """
    running = still_running(folder)
    if running is not None:
        raise PosexpError(running)


def find_finished_runs(paths: Sequence[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """:func:`~posexp.runs.layout.find_runs`, where folders with no run in them are refused saying so when one of them
    (or a job of a sweep among them) is still training, instead of asking whether the run stopped early.

    Raises:
        PosexpError: as :func:`~posexp.runs.layout.find_runs`, or :func:`still_running`'s line.
    """
    given = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    try:
        return find_runs(given)
    except PosexpError:
        if not given or not all(p.is_dir() for p in given):  # a folder missing, or a file: find_runs said which
            raise
        jobs = [job for p in given for job in (iter_jobs(p) if is_sweep_dir(p) else [p])]
        running = next(filter(None, map(still_running, jobs)), None)
        if running is None:
            raise
        raise PosexpError(running) from None


def _write_note(path: Path, doing: str) -> None:
    command = " ".join(["posexp", *sys.argv[1:2]]) if Path(sys.argv[0]).name in ("posexp", "__main__.py") else "posexp"
    try:  # atomic: a process refused or waiting at this moment reads the whole note or none
        atomic_write_text(path / LOCK_NOTE, json.dumps({"pid": os.getpid(), "doing": doing, "command": command}))
    except OSError:
        pass  # a read-only folder: the claim holds without its note


def lock_run(run_dir: str | os.PathLike, doing: str = TRAINING, wait_for: Sequence[str] = (),
             on_wait: Optional[Callable[[str], None]] = None) -> bool:
    """Claim ``run_dir`` for this process until :func:`unlock_run` (or the process ends).

    Args:
        run_dir: the run folder.
        doing: what this process does there ("training", "evaluating"), told to a process refused.
        wait_for: wait (rather than refuse) while the holder does one of these; e.g. an evaluation waits
            for another evaluation of the same run, whose rows it then merges with its own.
        on_wait: called once with a line saying whom this process waits for.

    Returns:
        True if this call took the lock, False if this process held it already.

    Raises:
        RunFolderTaken: another process holds it, doing something not in ``wait_for``.
        PosexpError: the folder cannot be opened.
    """
    try:
        import fcntl
    except ImportError:  # no flock on this platform: folders are still claimed by os.mkdir
        return False
    path, name = Path(run_dir), str(Path(run_dir).resolve())
    if name in _held:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise PosexpError(f"{path}: cannot open the run folder ({e.strerror})") from None
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            held_for, who = _holder(path)
            if held_for not in wait_for:
                os.close(fd)
                raise RunFolderTaken(f"{path}: {who} is {held_for} in this folder; wait for it to finish "
                                     "(or stop it), or choose another folder") from None
            if not told and on_wait is not None:
                on_wait(f"{path}: waiting for {who}, {held_for} in this folder")
                told = True
            time.sleep(0.2)
    _held[name] = fd
    _write_note(path, doing)
    return True


def unlock_run(run_dir: Optional[str | os.PathLike] = None) -> None:
    """Give up this process's claim on ``run_dir`` (closing the descriptor releases the flock); on every
    folder when None (the end of a command run in-process, e.g. from tests)."""
    names = list(_held) if run_dir is None else [str(Path(run_dir).resolve())]
    for name in names:
        fd = _held.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                (Path(name) / LOCK_NOTE).unlink(missing_ok=True)
            os.close(fd)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, doing: str = TRAINING, wait_for: Sequence[str] = (),
             on_wait: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Hold the claim on ``run_dir`` for the block (a claim this process held already is kept after it);
    the arguments are :func:`lock_run`'s."""
    took = lock_run(run_dir, doing, wait_for, on_wait)
    try:
        yield
    finally:
        if took:
            unlock_run(run_dir)


def run_contents(run_dir: str | os.PathLike) -> Optional[str]:
    """What run ``run_dir`` holds, in words ("a finished run", ...); None when it holds none."""
    path = Path(run_dir)
    if (path / RESULTS_JSON).is_file():
        status = run_status(path)
        return f"a {status} run" if status and status != "completed" else "a finished run"
    return "an unfinished run" if any((path / name).exists() for name in RUN_FILES) else None


def clear_run_files(folder: str | os.PathLike) -> None:
    """Remove what a run (or a sweep) wrote into ``folder``; files of the user's own are left."""
    import shutil

    own_files = {WANDB_DIR: _clear_wandb, ANALYSIS_DIR: _clear_analysis, REPORTS_DIR: _clear_reports}
    for name in dict.fromkeys((*RUN_FILES, *SWEEP_FILES, *REPORT_FILES, REPORTS_DIR)):
        target = Path(folder) / name
        if name in own_files and target.is_dir() and not target.is_symlink():
            own_files[name](target)  # a folder posexp shares with the user's own files
        elif target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


# W&B's own files in its folder: its runs (offline-run-*, run-*), their latest-run link and debug logs; the user's
# settings file there (wandb/settings: entity, project, base_url) is theirs
_WANDB_RUN_FILES = ("run-", "offline-run-", "latest-run", "debug")


def _clear_wandb(folder: Path) -> None:
    import shutil

    for entry in folder.iterdir():
        if not entry.name.startswith(_WANDB_RUN_FILES):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    _remove_if_empty(folder)


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()  # when nothing of the user's is left


def _clear_analysis(folder: Path) -> None:
    """``posexp analyze RUN``'s ``analysis.json`` and the figures it lists; the user's notes there stay."""
    try:
        figures = json.loads((folder / ANALYSIS_JSON).read_text(encoding="utf-8")).get("figures") or []
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        figures = []
    for name in [*(f for f in (figures if isinstance(figures, list) else []) if isinstance(f, str)
                   and Path(f).name == f), ANALYSIS_JSON]:
        (folder / name).unlink(missing_ok=True)
    _remove_if_empty(folder)


def _clear_reports(folder: Path) -> None:
    """The reports of other views (``reports/NAME/``): their files, each folder when nothing else is in it."""
    for report in folder.iterdir():
        if report.is_dir() and not report.is_symlink():
            for name in REPORT_FILES:
                (report / name).unlink(missing_ok=True)
            _remove_if_empty(report)
    _remove_if_empty(folder)


def claim_named_dir(path: str | os.PathLike, key: str, *, sweep: bool, overwrite: bool) -> list[Path]:
    """Claim the folder the user named (``hydra.run.dir`` / ``hydra.sweep.dir``) for a new run or sweep.

    Args:
        key: the override that named it, for the messages.
        sweep: it is a sweep folder (its numbered job folders are checked too).
        overwrite: replace a run or sweep written there before (never one still training).

    Returns:
        The folders created for it, for :func:`discard_unused`.

    Raises:
        RunFolderTaken: it holds a run (or a sweep), or one is training there.
        PosexpError: it cannot be created or written.
    """
    path = Path(path)
    check_name_lengths(path, key)
    if path.exists() and not path.is_dir():
        raise PosexpError(f"{path}: is a file, not a folder; choose another {key}=DIR")
    created = make_parents(path, key) if not path.exists() else []
    if not path.exists():
        try:
            path.mkdir()
            created.append(path)
        except FileExistsError:
            pass  # made by another process just now: the lock below decides
        except OSError as e:
            raise _cannot_create(path, e, key) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _cannot_create(path, PermissionError(), key)
    lock_run(path)
    held = run_contents(path)
    runs = [d for d in iter_jobs(path) if run_contents(d)] if sweep else []
    if runs or (sweep and is_sweep_dir(path)):
        held = f"a sweep ({len(runs)} run folder{'s' if len(runs) != 1 else ''})"
    if held is not None and not overwrite:
        advice = f"continue it with: posexp resume {path}; " if held == "an unfinished run" and not sweep else ""
        raise RunFolderTaken(f"{path}: holds {held}; {advice}choose another {key}=DIR, or replace it with "
                             f"posexp train ... {OVERWRITE_FLAG}")
    if held is not None:
        jobs = list(iter_jobs(path)) if sweep else []
        with contextlib.ExitStack() as claims:
            for job in jobs:  # every job is claimed before any is emptied: one busy job means nothing is touched
                claims.enter_context(run_lock(job))
            for job in jobs:  # then released for the job's own process to take
                clear_run_files(job)
        clear_run_files(path)
    return created


def discard_unused(run_dir: str | os.PathLike, created: Sequence[Path]) -> None:
    """Remove a run folder a command made but never used: it holds only what Hydra writes before the run
    starts (``.hydra/``, ``train.log``). Folders it created above it go too, if left empty."""
    import shutil

    path = Path(run_dir)
    try:
        names = {p.name for p in path.iterdir()}
    except OSError:
        return
    if not names <= {HYDRA_OUTPUT, TRAIN_LOG, LOCK_NOTE}:
        return
    unlock_run(path)
    shutil.rmtree(path / HYDRA_OUTPUT, ignore_errors=True)
    (path / TRAIN_LOG).unlink(missing_ok=True)
    for folder in reversed(list(created)):
        try:
            folder.rmdir()  # only an empty one: a folder another run uses since stays
        except OSError:
            break
