"""One job of ``posexp train`` / ``finetune`` inside Hydra: the task functions Hydra calls, and a sweep job that
fails recorded in its folder and counted, so that the sweep goes on and the command's exit status says so.

The task functions are module-level names, so that launchers running jobs in other processes (joblib, submitit)
pickle them by reference.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from posexp.cli.console import console, say
from posexp.commands.edge import typed
from posexp.cli.folders import Carried, checker, current_claim, take_checked
from posexp.cli.hydra_flags import APPS
from posexp.commands.sweeps import failed_runs, objective_value, set_job_threads
from posexp.config.schema import Config
from posexp.errors import PluginFailed, PosexpError, Terminated, TrainingDiverged, TrainingInterrupted
from posexp.runs.lock import RunFolderTaken

ANALYZE_LOG = "analyze.log"  # posexp analyze's log in its output folder (configs/analyze.yaml)


def run_task(cfg: DictConfig) -> Optional[float]:
    """The Hydra task of ``posexp train``, ``finetune`` and ``eval hf:MODEL``: one job, run by its app's recipe
    (:data:`~posexp.cli.hydra_flags.APPS`). Returns its ``objective`` for sweepers (None if it failed)."""
    app = APPS[str(HydraConfig.get().job.config_name)]
    return _task(cfg, app.load(app.run))  # torch: see posexp/cli/app.py


def analyze_task(cfg: DictConfig) -> None:
    """The Hydra task of ``posexp analyze``: one encoding's geometry."""
    from posexp.analysis.app import run_analyze  # torch: see posexp/cli/app.py
    from posexp.commands.plugin_source import plugin_failures
    from posexp.runs.provenance import source_fields

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    try:
        spec = _checked(cfg, hc)
        # what a plugin encoder raises: one line, as training says it, the traceback in the job's log
        with plugin_failures(source_fields(spec.encoder), {"encoder": spec.encoder}, "the analysis stopped",
                             out / ANALYZE_LOG):
            run_analyze(spec, spec.analyze, out, console())
    except Exception as e:
        raise Carried(e) from None  # to the command, which says it: Hydra would print it as a traceback


def _checked(cfg: DictConfig, hc: Any) -> Any:
    """The job's config typed and checked: as the folder's claim checked it, else checked here."""
    spec = take_checked(list(hc.overrides.task))
    return spec if spec is not None else checker(str(hc.job.config_name))(cfg)


def _task(cfg: DictConfig, run) -> Optional[float]:
    hc = HydraConfig.get()
    run_dir, overrides = Path(hc.runtime.output_dir), list(hc.overrides.task)
    try:
        spec = _checked(cfg, hc)  # the edge: the sweep's threads and objective are read typed
        set_job_threads(getattr(getattr(spec, "train", None), "threads", None), hc.launcher)
        return objective_value(run(spec, run_dir, overrides, console()), getattr(spec, "objective", "longest"))
    except KeyboardInterrupt as e:
        if hc.mode != RunMode.MULTIRUN:
            from posexp.commands.resume import interrupted_hint  # torch: see posexp/cli/app.py

            say(interrupted_hint(run_dir, e))
        raise SystemExit(128 + e.signum if isinstance(e, Terminated) else 130)
    except Exception as e:
        if hc.mode != RunMode.MULTIRUN:
            raise Carried(e) from None  # to the command, which says it: Hydra would print it as a traceback
        if isinstance(e, TrainingInterrupted):  # stops the sweep too: the user asked to stop; `train` says where
            raise SystemExit(e.exit_code)
        if not isinstance(e, PosexpError):
            logging.getLogger(__name__).exception("sweep job %s failed", run_dir)  # the traceback to train.log
        _record_failed_job(cfg, run_dir, overrides, e)
    return None


def _record_failed_job(cfg: DictConfig, run_dir: Path, overrides: List[str], error: Exception) -> None:
    """Keep a sweep going past a failed job, which leaves a results.json with status "failed" (or "diverged")."""
    from posexp.runs.provenance import write_run_status  # torch: see posexp/cli/app.py

    # a diverged run, or one the user's code stopped, has written its own; nothing of this job's goes into another
    # run's folder
    if not isinstance(error, (TrainingDiverged, PluginFailed, RunFolderTaken)):
        spec: Optional[Config]
        try:
            spec = typed(cfg)
        except PosexpError:
            spec = None  # the config itself is what failed
        try:
            write_run_status(run_dir, spec, overrides, "failed", error)
        except OSError as e:
            say(f"could not record the failure in {run_dir}: {e}")
    say(f"sweep job {run_dir} failed: {error}", error=True)
    _count_failed(str(run_dir))


def _count_failed(run_dir: str) -> None:
    """Count a failed sweep job for the command's exit status (in a launcher's other process, its results.json
    does: :class:`SweepSummaryCallback`)."""
    claim = current_claim()
    if claim is not None:
        claim.failed.append(run_dir)


class SweepSummaryCallback(Callback):
    """Hydra callback (``hydra.callbacks.sweep_summary`` of configs/config.yaml, finetune.yaml, pretrained.yaml): when
    a multirun ends, count the jobs that failed in other processes (joblib, submitit) too, and write the sweep's
    summary into its folder (:func:`posexp.reporting.summary.sweep_summary`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start = time.time() - 1.0  # file times may trail the clock a little

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from posexp.reporting.summary import sweep_summary

        try:
            sweep_dir = str(config.hydra.sweep.dir)
        except Exception:  # no sweep folder in the config: nothing to summarise, and a finished sweep stays one
            logging.getLogger("posexp.report").warning("sweep summary not written: the config names no sweep folder")
            return
        for run_dir in failed_runs(Path(sweep_dir), getattr(self, "_start", 0.0)):
            _count_failed(run_dir)
        sweep_summary(sweep_dir)


class AnalyzeSweepCallback(Callback):
    """Hydra callback (``hydra.callbacks`` of configs/analyze.yaml): when a ``posexp analyze -m`` sweep ends, draw
    ``comparison.png`` in the sweep folder (:func:`posexp.analysis.app.compare_sweep`)."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from posexp.analysis.app import compare_sweep  # torch: see posexp/cli/app.py

        try:
            path = compare_sweep(Path(str(config.hydra.sweep.dir)))
            if path is not None:
                console().print(f"wrote {path}", highlight=False)
        except Exception:  # the jobs' own outputs are already safe
            logging.getLogger("posexp.analyze").warning("comparison figure not written", exc_info=True)
