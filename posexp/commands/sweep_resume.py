"""``posexp resume SWEEP``: finish a sweep that was stopped, its interrupted jobs and those that never started.

A sweep stopped part-way (Ctrl-C, a killed launcher, a job limit) leaves three kinds of job: finished ones (kept),
interrupted ones (a folder without a finished ``results.json``: ``posexp resume JOB`` continues each) and jobs
that never started (no folder). The sweep's ``multirun.yaml`` records the overrides it was started with; the
basic sweeper's order (:func:`posexp.commands.sweeps.sweep_jobs`) numbers the jobs, so job ``N`` of the plan
is ``SWEEP/N``. Each interrupted job is resumed and each one that never started is trained into its own
``SWEEP/N`` with its overrides, one after the other, each in a fresh ``posexp`` process as a user would run it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from posexp.errors import PosexpError
from posexp.reporting.frame import sweeps_under
from posexp.runs.layout import MULTIRUN_YAML, RESULTS_JSON, run_status

DEFAULT_SUBDIR = "${hydra.job.num}"
# the sweeps posexp resume finishes, by the app that ran them: its command starts a job that never started
# (posexp eval hf.model=MODEL ... is posexp eval hf:MODEL ...)
COMMAND_OF = {"config": "train", "pretrained": "eval"}


@dataclass
class SweepPlan:
    """What finishing a sweep takes: the jobs to resume and those to start (number -> overrides)."""

    finished: list[int]
    resume: list[int]
    start: dict[int, list[str]]
    config_dirs: list[str]
    command: str = "train"  # what starts a job that never started: posexp train, or posexp eval (hf:MODEL)
    jobs: list[list[str]] = field(default_factory=list)  # every job's overrides, as planned


def plan_sweep(sweep: Path) -> SweepPlan:
    """The jobs of ``sweep`` by state, read from its ``multirun.yaml``.

    Raises:
        PosexpError: not a posexp train sweep of the basic sweeper's kind (a fine-tune sweep, a sweeper's
            search, jobs in folders not named by their number).
    """
    import yaml
    from hydra.errors import OverrideParseException
    from omegaconf import OmegaConf

    from posexp.commands.sweeps import sweep_jobs

    try:
        raw = OmegaConf.to_container(OmegaConf.load(sweep / MULTIRUN_YAML), resolve=False)
        hydra = (raw.get("hydra") if isinstance(raw, dict) else None) or {}
        jobs = sweep_jobs([str(o) for o in (hydra.get("overrides") or {}).get("task") or []])
    except (OSError, yaml.YAMLError, OverrideParseException) as e:
        reason = str(e).partition("\n")[0]  # yaml's and Hydra's messages go on to show where, over lines
        raise PosexpError(f"{sweep / MULTIRUN_YAML} cannot be read ({reason}); posexp resume JOB_FOLDER continues each "
                          "job that started") from None
    app = (hydra.get("job") or {}).get("config_name")
    if app not in COMMAND_OF:
        raise PosexpError(f"{sweep}: posexp resume finishes a posexp train sweep; for a fine-tune sweep, posexp "
                          "resume each of its job folders")
    if (hydra.get("sweep") or {}).get("subdir") != DEFAULT_SUBDIR:
        raise PosexpError(f"{sweep}: its jobs are not in folders named by their number (hydra.sweep.subdir); "
                          "posexp resume JOB_FOLDER continues each")
    sweeper = str((hydra.get("sweeper") or {}).get("_target_") or "BasicSweeper")  # the one that ran the sweep
    if not sweeper.endswith("BasicSweeper"):  # Optuna's trials are not the product of the overrides
        raise PosexpError(f"{sweep}: its sweeper ({sweeper.rsplit('.', 1)[-1]}) drew its jobs; posexp resume "
                          "JOB_FOLDER continues each job that started")
    if jobs is None:
        raise PosexpError(f"{sweep}: a sweeper drew its jobs (interval, glob); posexp resume JOB_FOLDER continues "
                          "each job that started")
    sources = (hydra.get("runtime") or {}).get("config_sources") or []
    dirs = [str(s["path"]) for s in sources if s.get("provider") == "command-line" and s.get("schema") == "file"]
    plan = SweepPlan([], [], {}, dirs, COMMAND_OF[str(app)], jobs)
    for n, job in enumerate(jobs):
        folder = sweep / str(n)
        if not folder.is_dir():
            plan.start[n] = job
        elif (folder / RESULTS_JSON).is_file() and run_status(folder) in ("completed", "failed", "diverged"):
            plan.finished.append(n)
        else:
            plan.resume.append(n)
    return plan


def unstarted_jobs(folders: Iterable[Path]) -> list[str]:
    """A line for the report of each sweep of ``folders`` and under them (``posexp report outputs/``) stopped before
    some of its jobs started, naming them (they are in no table) and what finishes the sweep; none for a sweep posexp
    resume does not finish."""
    from posexp.commands.sweeps import job_list

    lines = []
    for sweep in sweeps_under(folders):
        try:
            plan = plan_sweep(sweep)
        except PosexpError:
            continue
        if plan.start:
            lines.append(f"{sweep}: {len(plan.start)} of the sweep's {len(plan.jobs)} jobs never started and "
                         f"{'is' if len(plan.start) == 1 else 'are'} not in the table: "
                         f"{job_list(plan.start, plan.jobs)}; finish the sweep with: posexp resume {sweep}")
    return lines


def resume_sweep(sweep: Path, say: Callable[[str], None], allow_changed_encoder: bool = False,
                 runner: Optional[Callable[[list[str]], int]] = None) -> list[int]:
    """Resume the interrupted jobs of ``sweep`` and train those that never started; the numbers that failed."""
    plan = plan_sweep(sweep)
    run = runner or (lambda args: subprocess.run([sys.executable, "-m", "posexp", *args]).returncode)
    say(f"{sweep}: {len(plan.finished)} job(s) finished, {len(plan.resume)} to resume, {len(plan.start)} never "
        "started")
    failed = []
    allow = ["--allow-changed-encoder"] if allow_changed_encoder else []
    for n in plan.resume:
        say(f"job {n}: posexp resume {sweep / str(n)}")
        if run(["resume", str(sweep / str(n)), *allow]) != 0:
            failed.append(n)
    for n, job in plan.start.items():
        dirs = [a for d in plan.config_dirs for a in ("--config-dir", d)]
        say(f"job {n}: posexp {plan.command} {' '.join(job)} (never started)")
        if run([plan.command, *dirs, *job, f"hydra.run.dir={sweep / str(n)}"]) != 0:
            failed.append(n)
    return failed


def finish_sweep(sweep: Path, say: Callable[[str], None], allow_changed_encoder: bool = False) -> None:
    """``posexp resume SWEEP``: :func:`resume_sweep`, then the summary the sweep writes when it ends (its jobs
    that never started trained in their own processes, each a single run, which leaves the sweep's summary to this),
    and how to compare the jobs.

    Raises:
        PosexpError: a job did not finish (each said why as it ran).
    """
    from posexp.reporting.summary import sweep_summary

    failed = resume_sweep(sweep, say, allow_changed_encoder)
    sweep_summary(sweep)
    if failed:
        raise PosexpError(f"{sweep}: job(s) {', '.join(map(str, failed))} did not finish (each said why above); "
                          f"posexp resume {sweep} tries them again")
    say(f"{sweep}: every job finished; compare them with: posexp report {sweep}")
