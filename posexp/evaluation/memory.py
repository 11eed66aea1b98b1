"""Peak memory of a block of work, and recovering from running out of it.

Evaluation records, per length, how much memory the forward passes took above
what was in use before (:class:`PeakMemory`) and retries a length smaller when
it runs out (:func:`is_out_of_memory`, :func:`free_memory`).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from typing import Optional

import torch


def _proc_status_kb(field_name: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_high_water_mark() -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc), so the next peak is not hidden in reused memory."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


class PeakMemory:
    """Peak memory of a block of work, above what was in use when it started.

    CUDA: ``torch.cuda.max_memory_allocated`` (tensor memory held by the caching
    allocator). CPU: the process's resident-set high-water mark ``VmHWM``, reset
    just before the work through ``/proc/self/clear_refs`` after ``malloc_trim``
    has returned freed heap pages. Unlike Python-level tracing (tracemalloc does
    not see torch's allocator) or a sampling thread (which can miss a short
    peak), the kernel counts every page, including oneDNN scratch buffers and
    allocator overhead that a tensor-level profile misses; the price is that it
    also counts anything else the process touches meanwhile (nothing, here).
    Where the mark cannot be reset (not Linux) only the lifetime peak
    ``ru_maxrss`` is known and ``delta_mb`` is None.

    Attributes (after the block):
        delta_mb: peak minus the memory in use at the start, MiB (None when unknown).
        peak_mb: the absolute peak (CUDA: allocated; CPU: process RSS), MiB.
        method: how it was measured, recorded in each row.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.delta_mb: Optional[float] = None
        self.peak_mb: Optional[float] = None
        self.method = "none"

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.device.type == "cpu":
            release_free_heap()
            self._resettable = _reset_rss_high_water_mark() and _proc_status_kb("VmHWM") is not None
            self._base = _proc_status_kb("VmRSS") if self._resettable else None
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.peak_mb, self.delta_mb = peak / 2**20, (peak - self._base) / 2**20
            self.method = "cuda max_memory_allocated"
        elif self.device.type == "cpu":
            if self._resettable:
                hwm = _proc_status_kb("VmHWM")
                self.peak_mb, self.delta_mb = hwm / 1024, max(0, hwm - self._base) / 1024
                self.method = "rss high-water mark (VmHWM reset per length)"
            else:
                import resource

                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                self.peak_mb = rss / 2**20 if sys.platform == "darwin" else rss / 1024
                self.method = "process lifetime peak rss (ru_maxrss)"


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed: CUDA's, the CPU allocator's (``not enough memory``,
    ``can't allocate memory``) or Python's own :class:`MemoryError`."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        s in text for s in ("out of memory", "can't allocate memory", "not enough memory"))


def free_memory(device: torch.device) -> None:
    """Give back what a failed (out-of-memory) batch left behind before it is retried smaller."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        release_free_heap()
