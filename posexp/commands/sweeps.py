"""What ``posexp train`` needs to run well under Hydra's launchers and sweepers.

- :func:`set_job_threads`: parallel jobs on one machine share its cores, so a job of
  the joblib launcher runs torch on ``floor(cores / n_jobs)`` threads, and a submitit
  job on its ``cpus_per_task`` (``train.threads`` wins over both).
- :func:`objective_value`: the number the train task returns, which a sweeper such as
  ``hydra/sweeper=optuna`` minimises: the validation loss in nats per token (the log
  of the perplexity) at the longest eval length, at a chosen length, or averaged.
- :func:`check_plugins`: a clear message when a launcher or sweeper is asked for
  whose plugin is not installed (``pip install -e '.[sweeps]'``).
- :func:`failed_runs`: the runs of a sweep that failed in other processes, so the
  exit code of ``posexp train -m`` counts them too.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence


from posexp.errors import ConfigError, PosexpError
from posexp.runs.layout import RESULTS_JSON, run_status, runs_under

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.sweeps")

# hydra/<group>=<option> -> (the plugin module, its PyPI name)
PLUGINS = {
    "hydra/launcher=joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
    "hydra/launcher=submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "hydra/launcher=submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "hydra/sweeper=optuna": ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper"),
    "search=base": ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper"),  # configs/search/
}


# -- threads per job ---------------------------------------------------------------------------

def available_cores() -> int:
    """The cores this process may run on (the affinity mask where the OS has one, e.g. under SLURM)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parallel_jobs(n_jobs: int, cores: int) -> int:
    """How many jobs joblib runs at once for ``n_jobs`` (joblib's convention: -1 = all cores, -2 = all but one)."""
    if n_jobs < 0:
        return max(1, cores + 1 + n_jobs)
    return max(1, n_jobs)


def job_threads(launcher: Any, cores: Optional[int] = None) -> Optional[int]:
    """Torch threads for one job of ``launcher`` (the ``hydra.launcher`` config); None = torch's default.

    joblib runs up to ``n_jobs`` jobs at once on this machine: each gets an equal share,
    ``floor(cores / jobs)``, at least one. submitit gives each job ``cpus_per_task`` cores.
    """
    cores = cores or available_cores()
    if launcher is None:
        return None
    n_jobs = launcher.get("n_jobs")  # joblib's; submitit's and the basic launcher have none
    if n_jobs is not None:
        return max(1, cores // parallel_jobs(int(n_jobs), cores))
    cpus = launcher.get("cpus_per_task")
    return int(cpus) if cpus else None


def set_job_threads(threads: Any, launcher: Any) -> Optional[int]:
    """Set torch's thread count for this job from the launcher, unless ``threads`` (the job's typed
    ``train.threads``; None for a config that trains nothing) is a number (auto takes the launcher's share)."""
    import torch

    from posexp.runtime.threads import pin

    share = job_threads(launcher)
    pin(share, f"{_launcher_name(launcher)}'s share of the cores")  # what train.threads=auto then takes
    if isinstance(threads, int):  # a number: run_train sets it
        return None
    if share is not None:
        torch.set_num_threads(share)
        log.info("%d torch threads for this job (%s)", share, _launcher_name(launcher))
    return share


def _launcher_name(launcher: Any) -> str:
    return str(launcher.get("_target_", "launcher")).rsplit(".", 1)[-1]


# -- the objective ------------------------------------------------------------------------------

def objective_value(results: dict, objective: Any = "longest") -> Optional[float]:
    """The loss in nats per token (log perplexity) that ``objective`` (the job's typed ``objective``) picks from a
    run's rows; lower is better (a task run: the loss of its answer tokens).

    ``longest``: at the longest eval length; ``mean``: the mean over the eval lengths (the log of
    the geometric mean perplexity); an integer: at that eval length. A length the encoder cannot
    reach counts as infinitely bad.

    Raises:
        ConfigError: an integer ``objective`` that is not one of the run's eval lengths.
    """
    rows = [r for r in results.get("rows", []) if r.get("length") is not None]
    if not rows:
        return None
    by_length: dict[int, Optional[float]] = {}
    for r in rows:  # one row per length for one run; the first wins if a protocol added more
        loss = r.get("loss") if "loss" in r else r.get("answer_loss")  # a task row: nats per answer token
        by_length.setdefault(int(r["length"]), loss if r.get("applicable", True) else None)
    if objective == "mean":
        picked = list(by_length.values())
    else:
        length = max(by_length) if objective == "longest" else int(objective)
        if length not in by_length:
            raise ConfigError("objective", f"eval length {length} was not measured; choose one of "
                                           f"{', '.join(map(str, sorted(by_length)))}, longest or mean")
        picked = [by_length[length]]
    if any(v is None or not math.isfinite(float(v)) for v in picked):
        log.warning("objective %s: a length was not applicable or not finite; returning inf", objective)
        return math.inf
    return float(sum(picked) / len(picked))


# -- plugins and failed jobs ----------------------------------------------------------------------

def check_plugins(args: Sequence[str]) -> None:
    """Refuse, in one line, ``args`` that select a launcher or sweeper whose Hydra plugin is not installed.

    Raises:
        PosexpError: naming the plugin and the command that installs it.
    """
    for arg in args:
        choice = arg.lstrip("+~").replace(" ", "")
        if choice in PLUGINS:
            module, package = PLUGINS[choice]
            if importlib.util.find_spec(module) is None:
                raise PosexpError(f"{choice} needs the Hydra plugin {package}, which is not installed: "
                                  f"pip install -e '.[sweeps]' (or pip install {package})")


def failed_runs(sweep_dir: Path, since: float) -> list[str]:
    """Run folders under ``sweep_dir`` whose results.json, written at or after ``since``, says failed or diverged."""
    out = []
    for run_dir in runs_under(sweep_dir):
        try:
            if (run_dir / RESULTS_JSON).stat().st_mtime < since:
                continue
        except OSError:
            continue
        if run_status(run_dir) in ("failed", "diverged"):
            out.append(str(run_dir))
    return out


def unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(str(Path(item).resolve()), None)
    return list(seen)


# -- the jobs of a sweep, checked before the first one trains --------------------------------------

# A sweep with more jobs than this has a covering subset checked (every value of every swept key once).
MAX_CHECKED_JOBS = 64


def sweep_jobs(overrides: Sequence[str]) -> Optional[list[list[str]]]:
    """The overrides of each job of a basic sweep, in the order Hydra's basic sweeper numbers them.

    The basic sweeper runs the cartesian product of the swept values, the first override varying slowest.

    Returns:
        One list per job; None when a value is a sweeper's to draw (``interval(...)``, a glob).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, list[str]] = {}  # as BasicSweeper.split_arguments: a key given twice keeps its first place
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        key, values = o.get_key_element(), override_values(o)
        if values is None:
            return None
        choices[key] = [f"{key}={v}" for v in values]
    return [list(job) for job in itertools.product(*choices.values())]


def override_values(override: Any) -> Optional[list[str]]:
    """The values a parsed override sets, as override text (a sweep's each); None for a sweep that cannot be
    listed (an interval, a glob), which a sweeper draws."""
    from hydra.core.override_parser.types import Glob

    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    if override.is_interval_sweep() or isinstance(override.value(), Glob):
        return None
    return list(override.sweep_string_iterator())


def fixed_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that are not sweeps: what every job of a sweeper's search shares."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return [o.input_line for o in OverridesParser.create().parse_overrides(list(overrides))
            if not o.is_sweep_override()]


def jobs_to_check(jobs: list[list[str]], limit: int = MAX_CHECKED_JOBS) -> list[list[str]]:
    """All jobs up to ``limit``; beyond it, jobs that together hold every value of every swept key."""
    if len(jobs) <= limit:
        return jobs
    values = [list(dict.fromkeys(job[i] for job in jobs)) for i in range(len(jobs[0]))]
    return [[v[n % len(v)] for v in values] for n in range(max(len(v) for v in values))]


def swept_values(jobs: list[list[str]]) -> list[str]:
    """Each job's overrides that differ between jobs, as one label per job (``encoder=rope base=100``)."""
    common = set.intersection(*(set(job) for job in jobs)) if jobs else set()
    return [" ".join(o for o in job if o not in common and not o.startswith("hydra")) for job in jobs]


def job_list(numbers: Iterable[int], jobs: list[list[str]], most: int = 10) -> str:
    """Jobs ``numbers`` of ``jobs`` in words, each with what it sweeps (``2 (encoder=rope), 3 (encoder=alibi)``): the
    first ``most`` and how many more; ``none`` for none."""
    labels = swept_values(jobs)
    shown = [f"{n} ({labels[n]})" if labels[n] else str(n) for n in numbers]
    return ", ".join(shown[:most] + ([f"... {len(shown) - most} more"] if len(shown) > most else [])) or "none"


def sweep_progress(sweep_dir: Path, jobs: Optional[list[list[str]]]) -> str:
    """Where an interrupted sweep stands, in one line: jobs finished, interrupted (with the command that
    continues each) and never started (with their overrides)."""
    from posexp.runs.layout import iter_jobs

    started = {int(d.name): d for d in iter_jobs(sweep_dir)} if sweep_dir.is_dir() else {}
    status = {n: run_status(d) if (d / RESULTS_JSON).is_file() else None for n, d in started.items()}
    finished = [str(n) for n, s in status.items() if s == "completed"]
    failed = [str(n) for n, s in status.items() if s in ("failed", "diverged")]
    stopped = [n for n, s in status.items() if s is None]
    parts = [f"finished: {', '.join(finished) or 'none'}"]
    if failed:
        parts.append(f"failed: {', '.join(failed)}")
    resume = "; ".join(f"posexp resume {started[n]}" for n in stopped)
    parts.append(f"interrupted: {', '.join(map(str, stopped))} (continue with: {resume})" if stopped
                 else "interrupted: none")
    if jobs is not None:
        parts.append(f"never started: {job_list([n for n in range(len(jobs)) if n not in started], jobs)}")
    if stopped or (jobs is not None and len(started) < len(jobs)):
        parts.append(f"finish the whole sweep with: posexp resume {sweep_dir}")
    return "; ".join(parts)
