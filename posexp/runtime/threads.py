"""How many CPU threads a run computes with: ``train.threads=auto`` (the default) or a number.

Torch's default is one thread per core the process may use, whether or not another process is busy on
them. On a shared machine (a laptop with a browser, a SLURM node with a neighbour, two runs on one
workstation) that is slower, not faster: with one other job on 2 cores, 2 threads trained at about a
third of the speed of 1, since each step's threads wait for the one the other job holds up. ``auto``
takes the cores this process may run on (its affinity mask) less those other runnable processes hold
now (``procs_running`` of ``/proc/stat``, sampled a few times; this process is not counted), at least
one. A launcher's share of the cores (:func:`pin`) wins over ``auto``; a number wins over both.

The thread count does not change what is computed, only the order of floating-point sums: a run's
numbers agree to rounding whatever it chooses, and :mod:`posexp.config.identity` leaves it out of the
run's hash. Tests and measurements that compare numbers bit for bit pin ``train.threads=1``.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

AUTO = "auto"
SAMPLES = 5  # readings of procs_running, SAMPLE_GAP_S apart: their median, so a blip of one moment counts less
SAMPLE_GAP_S = 0.01
PROC_STAT = Path("/proc/stat")

# a launcher's share of the cores for this job (posexp.commands.sweeps.set_job_threads): threads, and why
_pinned: dict = {}


@dataclass(frozen=True)
class Threads:
    """The thread count chosen, and why in words (the run's first line says both)."""

    count: int
    reason: str


def allowed_cores() -> int:
    """The cores this process may run on (the affinity mask where the OS has one, e.g. under SLURM or taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _procs_running(stat: Path) -> Optional[int]:
    """``procs_running`` of ``/proc/stat``: the threads runnable now, this reader included; None without it."""
    try:
        for line in stat.read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _own_running(tasks: Path = Path("/proc/self/task")) -> int:
    """This process's threads that are runnable now (the reader, and torch's pool if it spins): at least 1."""
    count = 0
    try:
        for task in tasks.iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue  # a thread that ended meanwhile
            count += stat.rpartition(")")[2].split()[:1] == ["R"]
    except OSError:
        pass
    return max(1, count)


def other_runnable(stat: Optional[Path] = None, samples: int = SAMPLES) -> Optional[int]:
    """How many other processes' threads are runnable now (the median of a few readings, this process's own
    not counted); None where the system does not say (no ``/proc``)."""
    stat = stat or PROC_STAT
    readings = []
    for i in range(samples):
        running = _procs_running(stat)
        if running is None:
            return None
        readings.append(max(0, running - _own_running()))
        if i + 1 < samples:
            time.sleep(SAMPLE_GAP_S)
    return int(statistics.median_low(readings))


def pin(count: Optional[int], reason: str = "") -> None:
    """A launcher's share of the cores for this job, which ``auto`` takes instead of measuring; None: none."""
    _pinned.clear()
    if count is not None:
        _pinned.update(count=count, reason=reason)


def choose(setting: Union[int, str, None]) -> Optional[Threads]:
    """The thread count for ``train.threads``: a number as given, ``auto`` from the cores free to this process
    (a launcher's share where one was pinned); None for ``null`` (torch's default, as runs before ``auto``)."""
    if setting is None:
        return None
    if not isinstance(setting, str):
        return Threads(int(setting), "train.threads")
    if _pinned:
        return Threads(int(_pinned["count"]), str(_pinned["reason"]))
    allowed = allowed_cores()
    others = other_runnable()
    if others is None:
        return Threads(allowed, f"auto: {allowed} cores allowed; no /proc/stat to see how busy they are")
    free = max(1, allowed - others)
    busy = f"{min(others, allowed)} busy with other processes" if others else "none busy"
    return Threads(free, f"auto: {allowed} cores allowed, {busy}; train.threads=N to choose")


def apply(setting: Union[int, str, None]) -> Optional[Threads]:
    """Set torch's thread count from ``train.threads``; returns the choice (None: torch's default kept)."""
    import torch

    chosen = choose(setting)
    if chosen is not None:
        torch.set_num_threads(chosen.count)
    return chosen


def describe(chosen: Optional[Threads], count: int) -> str:
    """``2 threads`` and, when ``auto`` chose them, why: for the run's first line."""
    text = f"{count} thread{'s' if count != 1 else ''}"
    return f"{text} ({chosen.reason})" if chosen is not None and chosen.reason != "train.threads" else text


__all__ = ["AUTO", "Threads", "allowed_cores", "apply", "choose", "describe", "other_runnable", "pin"]
