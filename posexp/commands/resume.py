"""``posexp resume RUN_DIR``: continue a killed or interrupted run in its own folder.

The run is rebuilt from what its folder says: the config Hydra saved
(``.hydra/config.yaml``), the overrides it was launched with, and the latest
resumable checkpoint (:mod:`posexp.training.checkpoint`). Training continues at the
checkpoint's step; ``metrics.csv`` drops the rows logged after that step (they
are logged again); then the run is evaluated and written as usual. Everything is
checked before anything is written, so refusing a folder leaves it as it was. :func:`interrupted_hint` says,
for a run stopped outside its training steps, what this command will do with its folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
from pathlib import Path
from typing import Any, Iterator, Optional

from rich.console import Console

from posexp.training.checkpoint import CHECKPOINT_DIR, RESUME_FILE, read_resume_pointer
from posexp.errors import PosexpError, Terminated
from posexp.commands.edge import folder_run_hash, load_saved
from posexp.runs.layout import CHECKPOINT, HYDRA_CONFIG, RESULTS_JSON, TRAIN_LOG, is_sweep_dir, load_overrides, run_status
from posexp.runs.lock import EVALUATING, run_lock
from posexp.runs.provenance import LOG_FORMAT
from posexp.runtime import terminal


def check_resumable(run_dir: Path) -> None:
    """Refuse folders that are not runs, or runs with nothing to resume.

    Raises:
        PosexpError: with what the folder is and what to do instead.
    """
    if not run_dir.exists():
        raise PosexpError(f"{run_dir}: no such folder; pass the run folder posexp train printed (run dir ...)")
    if not run_dir.is_dir():
        raise PosexpError(f"{run_dir}: is a file; pass the run folder that contains it")
    if not (run_dir / HYDRA_CONFIG).is_file():
        raise PosexpError(f"{run_dir}: not a run folder (no {HYDRA_CONFIG}); posexp resume continues a run "
                          "started with posexp train, e.g. posexp resume outputs/2026-11-22/10-00-00")
    results = run_dir / RESULTS_JSON
    from posexp.commands.pretrained import pretrained_hint, pretrained_of

    if pretrained_of(run_dir) is not None and run_status(run_dir) == "completed":
        raise PosexpError(f"{run_dir}: already finished ({RESULTS_JSON} has status completed); nothing to resume. "
                          f"{pretrained_hint(run_dir)}")
    if results.is_file():
        try:
            data = json.loads(results.read_text(encoding="utf-8"))
            run = data.get("run") or {}
            status = run.get("status")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            return  # not a finished run's file: resuming rewrites it
        if status == "completed" or (status is None and data.get("rows")):
            raise PosexpError(f"{run_dir}: already finished ({RESULTS_JSON} has status completed); nothing to "
                              f"resume. To evaluate it at other lengths: posexp eval {run_dir} eval.lengths=[...]")
        if status == "diverged":
            error = run.get("error")
            step = error.get("step") if isinstance(error, dict) else None
            raise PosexpError(f"{run_dir}: diverged{f' at step {step}' if step is not None else ''} "
                              f"({RESULTS_JSON}); resuming would repeat the same steps. Start a new run with a lower "
                              "train.lr or with train.grad_clip=1.0")


def resume_main(run_dir: str | Path, console: Optional[Console] = None, allow_changed_encoder: bool = False) -> dict:
    """``posexp resume RUN_DIR``: check the folder, then train on from its checkpoint, evaluate, write results.

    A run of a plugin encoder whose source changed since training started is refused unless
    ``allow_changed_encoder``.

    Raises:
        RunFolderTaken: another process is training in the folder.
    """
    from posexp.training.distributed import is_main

    run_dir = Path(run_dir)
    check_resumable(run_dir)
    from posexp.commands.pretrained import pretrained_of

    model = pretrained_of(run_dir)
    if model is not None:  # posexp eval hf:MODEL keeps no checkpoint: its evaluation runs again, in its folder
        with run_lock(run_dir, doing=EVALUATING):
            return _resume_pretrained(run_dir, model["name"], console or terminal.console())
    if not is_main():  # under torchrun rank 0 holds the folder and writes; the others train beside it
        return _resume(run_dir, Console(quiet=True), allow_changed_encoder, writes=False)
    with run_lock(run_dir):  # refused while another process trains there
        return _resume(run_dir, console or terminal.console(), allow_changed_encoder)


def _check_revision(run_dir: Path, encoder: Any) -> None:
    """A run started by another revision of its built-in encoder's code (:func:`posexp.encoders.revision_gap`) is
    not trained on by this one, whose initialisation or optimizer groups differ: the rest of the run would not be
    the training its config names (and its optimizer state may not fit the groups)."""
    from posexp.encoders import get, revision_gap

    gap = revision_gap(encoder)
    if gap is not None:
        raise PosexpError(f"{run_dir}: started with encoder {gap} (a fix changed how it is built or trained: "
                          f"{get(gap.name).__module__} says what), so this posexp cannot train it on "
                          "as it started; train it again with posexp train and the same overrides")


def _resume_pretrained(run_dir: Path, name: str, console: Console) -> dict:
    """:func:`resume_main` of a pretrained model's evaluation stopped before it wrote its results: the model is
    measured again from the start, in the same folder, with the config and overrides the folder holds."""
    from posexp.commands.edge import read_saved_config
    from posexp.commands.pretrained import check_pretrained, pretrained_run

    check_resumable(run_dir)  # again, now that no other process can finish it meanwhile
    spec = check_pretrained(read_saved_config(run_dir))
    console.print(f"{run_dir}: a pretrained model's evaluation keeps no checkpoint; evaluating {name} again from "
                  "the start in the same folder", highlight=False)
    with _logging_to(logging.FileHandler(run_dir / TRAIN_LOG, encoding="utf-8")):
        results = pretrained_run(spec, run_dir, load_overrides(run_dir), console)
    _refresh_sweep(run_dir, console)
    return results


def _resume(run_dir: Path, console: Console, allow_changed_encoder: bool = False, writes: bool = True) -> dict:
    """:func:`resume_main` in a run folder this process holds (``writes``), or beside rank 0, which holds it."""
    from posexp.commands.plugin_source import check_plugin_sources
    from posexp.commands.train import check_spec, train_run

    check_resumable(run_dir)  # again, now that no other process can finish the run meanwhile
    saved = load_saved(run_dir)  # the edge: what follows reads the typed config
    check_plugin_sources(run_dir, saved.raw, None, allow_changed_encoder,
                         lambda m: console.print(f"warning: {m}", style="yellow", highlight=False, soft_wrap=True))
    _check_revision(run_dir, saved.raw["encoder"])
    spec = check_spec(saved.spec)
    identity = folder_run_hash(run_dir, saved)  # a folder in another hash format is refused here
    pointer = read_resume_pointer(run_dir)
    if pointer is not None and pointer["config_hash"] != identity.value:
        raise PosexpError(f"{run_dir / CHECKPOINT_DIR / RESUME_FILE}: written by a run with a different config "
                          f"(config hash {pointer['config_hash']}, {run_dir / HYDRA_CONFIG} hashes to "
                          f"{identity.value}); was the config or the checkpoint folder changed?")
    if pointer is None:
        console.print(f"{run_dir}: no checkpoint yet, training again from step 0 in the same folder",
                      highlight=False)
    else:
        console.print(f"resuming {run_dir} at step {pointer['step']} of {spec.train.steps}", highlight=False)

    # Hydra is not running, so its log file handler is not either: append to the run's train.log ourselves.
    handler: logging.Handler = logging.FileHandler(run_dir / TRAIN_LOG, encoding="utf-8") if writes \
        else logging.NullHandler()
    with _logging_to(handler):
        results = train_run(spec, run_dir, load_overrides(run_dir), console, resume=identity)
    if writes:
        _refresh_sweep(run_dir, console)
    return results


def _refresh_sweep(run_dir: Path, console: Console) -> None:
    """A resumed sweep job belongs in its sweep's summary.md, written without it; the jobs of the sweep that never
    started are named there too."""
    sweep = run_dir.resolve().parent
    if is_sweep_dir(sweep):
        from posexp.commands.sweep_resume import unstarted_jobs
        from posexp.reporting.summary import refresh_sweep_summary

        refresh_sweep_summary(sweep, console, unstarted_jobs([sweep]))


@contextlib.contextmanager
def _logging_to(handler: logging.Handler) -> Iterator[None]:
    """The root logger at INFO writing to ``handler`` (the run's train.log) while the block runs, as Hydra's own
    file handler does for a job; both put back and the handler closed after."""
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()


def interrupted_hint(run_dir: Path, why: BaseException) -> str:
    """What a run stopped by Ctrl-C or SIGTERM outside its training steps leaves, and the command that goes on."""
    name = signal.Signals(why.signum).name if isinstance(why, Terminated) else "Ctrl-C"
    if (run_dir / RESULTS_JSON).is_file():
        return f"interrupted ({name}); {run_dir} holds its results as they were"
    from posexp.commands.pretrained import pretrained_of

    if pretrained_of(run_dir) is not None:  # posexp eval hf:MODEL keeps no checkpoint to continue from
        return f"interrupted ({name}); posexp resume {run_dir} evaluates the model again from the start in this folder"
    if (run_dir / CHECKPOINT).is_file():  # trained, stopped while evaluating: the weights are kept
        return (f"interrupted ({name}) while evaluating; the trained weights are kept: posexp resume {run_dir} "
                "evaluates them and finishes the run")
    return f"interrupted ({name}); posexp resume {run_dir} continues from its last checkpoint, if it wrote one"
