"""Peak memory of a block of work, and recovering from running out of it.

Evaluation records, per length, how much memory the forward passes took above
what was in use before (:class:`PeakMemory`) and retries a length smaller when
it runs out (:func:`is_out_of_memory`, :func:`free_memory`).

Before a run starts, :func:`check_memory` refuses a config whose weights and activations cannot fit
in the device's memory (a lower bound, so only a config that cannot run is refused), and
:func:`out_of_memory` turns running out inside a block into one line that names what to lower.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import math
import os
import sys
from typing import Iterator, Optional

import torch

from posexp.config.schema import Config, eval_lengths, is_task
from posexp.errors import ConfigError, PosexpError
from posexp.runtime.device import resolve_device
from posexp.runtime.precision import resolve_precision


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


# glibc serves an allocation this large or larger with its own mapping, returned to the OS when freed (below)
MMAP_THRESHOLD = 4 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def bound_heap_growth() -> None:
    """Have glibc map each allocation of :data:`MMAP_THRESHOLD` bytes or more on its own, and unmap it when freed.

    By default glibc raises its mmap threshold to the size of the largest mapped block freed so far (up to 32 MiB),
    so that afterwards such blocks come from the heap. A long evaluation on the bias path allocates per query block
    tensors that grow with the block's last key (``(H, Lq, end)``): each is a little larger than the freed one
    before it, cannot reuse its place, and the heap grows. Measured with ``scripts/bench_eval.py`` (t5, 16,384
    tokens, 2 threads), the process peaked at 1,247 MiB with glibc's default and 439 MiB with the threshold fixed at
    4 MiB (``mallopt(M_MMAP_THRESHOLD)``, which also turns the raising off). A no-op off glibc.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
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
        # The young generations only: what the previous length left in reference cycles. A full collection walks
        # every object of the process (0.15 s per length after a smoke run, more in a long-lived process), and
        # older garbage kept out of the allocator's reach raises the base, not the delta, that is measured.
        gc.collect(1)
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


GiB = 2**30


def parameters_lower_bound(model, vocab_size: int) -> int:
    """The parameters of a GPT of shape ``model`` that are certain: the attention and MLP matrices of every
    layer and the (tied) token embedding. Norms and an encoder's own parameters come on top."""
    d, ratio = int(model.d_model), float(model.mlp_ratio)
    hidden = int(ratio * d)
    return int(model.n_layers) * (4 * d * d + 2 * d * hidden) + vocab_size * d


def training_bytes_lower_bound(cfg: Config, vocab_size: int, activation_bytes: int,
                               processes: int = 1) -> tuple[int, int]:
    """Bytes one process must hold to train ``cfg``: ``(weights and optimizer, activations)``, both lower bounds.

    Weights, gradients and AdamW's two moments are fp32 whatever the precision (16 bytes per parameter).
    Backward keeps, per layer, at least the input of every linear map: three of width ``d_model`` (qkv,
    attention output, MLP input) and the MLP's hidden activation, for each of the ``batch_size x train_len``
    tokens of a process's share of the batch; and the logits, which the loss reads in fp32. Attention scores,
    norms and the encoder's own tensors come on top, so a config this refuses could not have trained.
    """
    m, t = cfg.model, cfg.train
    tokens = math.ceil(int(t.batch_size) / processes) * int(cfg.train_len)
    d = int(m.d_model)
    per_layer = (3 * d + int(float(m.mlp_ratio) * d)) * activation_bytes
    activations = tokens * (int(m.n_layers) * per_layer + vocab_size * 4)
    return 16 * parameters_lower_bound(m, vocab_size), activations


def memory_capacity(device) -> Optional[tuple[int, str]]:
    """The memory a run on ``device`` can use at most, in bytes, and its name; None where it is not known.

    CPU: physical RAM, or the container's cgroup limit where that is lower. CUDA: the GPU's total memory.
    """
    if device.type == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"GPU {torch.cuda.get_device_name(index)}"
    if device.type != "cpu":
        return None
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    capacity = (ram, "this machine's RAM")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < capacity[0]:
            capacity = (int(limit), "this container's memory limit")
    cap = _address_space_left()
    return cap if cap is not None and cap[0] < capacity[0] else capacity


def _address_space_left() -> Optional[tuple[int, str]]:
    """What ``ulimit -v`` (``RLIMIT_AS``) leaves this process: the cap less what it maps already (torch's
    libraries included); None without a cap."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    mapped = 1024 * (_proc_status_kb("VmSize") or 0)
    return max(0, soft - mapped), f"what this process's address-space cap (ulimit -v {soft // 1024}) leaves"


def check_memory(cfg: Config, training: bool = True) -> None:
    """Refuse a model whose weights (and, to train, gradients, optimizer state and activations) cannot fit in
    the memory of the run's device, before anything is allocated.

    The estimate is a lower bound (:func:`training_bytes_lower_bound`), so only a config that cannot run is
    refused; one that fits the estimate may still run out (the commands turn that into one line too).

    Raises:
        ConfigError: naming the keys to lower.
    """
    try:
        device = resolve_device(str(cfg.train.device), "train.device")
        element_bytes = resolve_precision(str(cfg.train.precision), device).itemsize
    except ConfigError:
        return  # the run's own device check says what is wrong
    capacity = memory_capacity(device)
    if capacity is None:
        return
    available, where = capacity
    symbols = cfg.task.get("symbols") if is_task(cfg) else None
    # bytes (a byte-level BPE vocabulary has these 256 and may end up smaller than asked for); a task's alphabet
    vocab_size = 256 if symbols is None else int(symbols)
    _check_task_examples(cfg, available, where)
    processes = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    weights, activations = training_bytes_lower_bound(cfg, vocab_size, element_bytes, processes)
    if not training:
        weights, activations = weights // 4, 0  # fp32 weights alone
    if weights + activations <= available:
        return
    params = parameters_lower_bound(cfg.model, vocab_size)
    have = f"{where} is {_size(available)}"
    if symbols is not None and 16 * vocab_size * int(cfg.model.d_model) > available / 2:
        raise ConfigError("task.symbols", f"an alphabet of task.symbols={symbols:,} needs an embedding of at least "
                                          f"{vocab_size * int(cfg.model.d_model):,} parameters "
                                          f"({_size(16 * vocab_size * int(cfg.model.d_model))} to train) but "
                                          f"{have}; lower task.symbols")
    if weights > available / 2 or not training:
        need = "16 bytes each for weights, gradients and AdamW state" if training else "4 bytes each"
        raise ConfigError("model.d_model", f"a model of model.d_model={cfg.model.d_model} and "
                                           f"model.n_layers={cfg.model.n_layers} has at least {params:,} parameters "
                                           f"({need}: {_size(weights)}) but {have}; lower model.d_model "
                                           "or model.n_layers")
    tokens = int(cfg.train.batch_size) * int(cfg.train_len)
    if symbols is not None and 4 * vocab_size * tokens > activations / 2:  # the logits, not the model's width
        raise ConfigError("task.symbols", f"an alphabet of task.symbols={symbols:,} makes the logits of train."
                                          f"batch_size={cfg.train.batch_size} x train_len={cfg.train_len} tokens "
                                          f"alone {_size(4 * vocab_size * tokens)} (and the model "
                                          f"{_size(weights)} more) but {have}; lower task.symbols")
    raise ConfigError("train.batch_size", f"training activations of train.batch_size={cfg.train.batch_size} x "
                                          f"train_len={cfg.train_len} tokens through model.n_layers="
                                          f"{cfg.model.n_layers} layers of model.d_model={cfg.model.d_model} need at "
                                          f"least {_size(activations)} (and the model "
                                          f"{_size(weights)} more) but {have}; lower train.batch_size, "
                                          "train_len, model.d_model or model.n_layers")


def _check_task_examples(cfg: Config, available: int, where: str) -> None:
    """A task's evaluation holds its ``eval.examples`` instances at an eval length as one int64 array at least,
    and one forward pass at that length at least the residual stream with a layer's widest inner tensor, and
    the logits, of one instance (fp32): refuse a count, or a length, that cannot fit."""
    if not is_task(cfg):
        return
    examples, longest = int(cfg.eval.examples), max(eval_lengths(cfg))
    instances = 8 * examples * longest
    if instances > available:
        raise ConfigError("eval.examples", f"eval.examples={examples:,} instances at {longest:,} tokens need at "
                                           f"least {_size(instances)} but {where} is {_size(available)}; lower "
                                           "eval.examples or the eval lengths")
    # per token, in fp32: the residual stream with the MLP's hidden layer, or with q, k and v; and the logits
    d = int(cfg.model.d_model)
    alphabet = cfg.task.get("symbols")  # None: a task on the data's bytes (passkey), or one without an alphabet
    width = max(int((1 + float(cfg.model.mlp_ratio)) * d), 4 * d)
    symbols = (256 if alphabet is None else int(alphabet)) + 8  # and the task's own marks
    forward = 4 * longest * (width + symbols)
    if instances + forward > available and alphabet is not None and symbols > width:  # the logits, at any length
        raise ConfigError("task.symbols", f"an alphabet of task.symbols={alphabet:,} makes the logits of one "
                                          f"instance at {longest:,} tokens {_size(4 * longest * symbols)} but "
                                          f"{where} is {_size(available)}; lower task.symbols")
    if instances + forward > available:
        raise ConfigError("eval.lengths", f"evaluating at {longest:,} tokens needs at least "
                                          f"{_size(instances + forward)} ({examples:,} instances: {_size(instances)}; "
                                          f"one forward pass: {_size(forward)}) but {where} is {_size(available)}; "
                                          "lower the eval lengths (or eval.examples)")


@contextlib.contextmanager
def out_of_memory(doing: str, device, lower: str) -> Iterator[None]:
    """Turn running out of memory inside the block (where :func:`check_memory` could not foresee it) into one
    line naming the keys to lower; torch's own message goes to the log.

    Args:
        doing: what the block does, e.g. ``"building the model"``.
        device: where it allocates.
        lower: the keys that shrink what it allocates.

    Raises:
        PosexpError: the block ran out of memory.
    """
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        logging.getLogger("posexp.train").warning("out of memory %s on %s: %s", doing, device, e)
        capacity = memory_capacity(device)
        where = f" ({capacity[1]} is {_size(capacity[0])})" if capacity is not None else ""
        raise PosexpError(f"ran out of memory {doing} on {device}{where}; lower {lower}") from None


def _size(n: float) -> str:
    return f"{n / GiB:,.1f} GiB" if n >= GiB else f"{n / 2**20:,.0f} MiB"
