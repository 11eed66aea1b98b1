"""Where and how a run computes: the device, the precision, and the autocast context of the forward pass.

``device=auto|cpu|cuda|mps``: ``auto`` = cuda, else mps, else cpu; under torchrun each
process takes the CUDA device of its ``LOCAL_RANK``. ``precision=auto|fp32|bf16``
runs the forward pass under bf16 autocast (weights, gradients and optimizer state
stay fp32; losses are computed in fp32). ``auto`` (:func:`choose_precision`) is bf16
on a GPU with native bf16 matmuls (:func:`bf16_is_native`); on a CPU with them it is
whichever of fp32 and bf16 a short probe of the run's own training step measures
faster (:func:`measured_cpu_precision`, cached per machine), because a CPU that
*has* bf16 instructions need not run them faster: oneDNN's AVX512-BF16 kernels
without AMX are often slower than its fp32 ones. Everywhere else fp32. The choice
and its reason go into results.json; a run is evaluated in the precision it was
trained in.

Also this process's place among the ones ``torchrun`` started (:func:`world`), which decides its
device; what the processes do together is :mod:`posexp.training.distributed`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from posexp.errors import ConfigError, PosexpError
from posexp.io import atomic_write_json

__all__ = ["COMPILE_SETTINGS", "PrecisionChoice", "StepSettings", "World", "autocast", "bf16_is_native",
           "check_compile", "choose_precision", "measured_cpu_precision", "resolve_device", "resolve_precision", "step_settings",
           "world"]


def resolve_device(name: str, key: str = "device") -> torch.device:
    """``auto`` = cuda, else mps, else cpu. Under torchrun each process takes the CUDA device of its ``LOCAL_RANK``.

    Args:
        name: ``auto``, ``cpu``, ``cuda`` or ``mps``.
        key: the config key the name came from, for the error message.

    Raises:
        ConfigError: a device torch cannot see, or fewer CUDA devices than processes on this node.
    """

    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(key, "cuda was asked for but torch sees no CUDA device; use auto or cpu")
        w = world()
        if w.distributed:
            if w.local_rank >= torch.cuda.device_count():
                raise ConfigError(key, f"process LOCAL_RANK={w.local_rank} needs a CUDA device of its own but "
                                       f"torch sees {torch.cuda.device_count()}; start at most that many "
                                       "processes per node (torchrun --nproc_per_node)")
            torch.cuda.set_device(w.local_rank)
            return torch.device("cuda", w.local_rank)
        return torch.device("cuda")
    if name == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise ConfigError(key, "mps was asked for but torch sees no Apple GPU; use auto or cpu")
    return torch.device(name)


def bf16_is_native(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware, so bf16 autocast is faster than fp32.

    CUDA: compute capability 8.0 or newer (Ampere); older GPUs only emulate bf16,
    which ``torch.cuda.is_bf16_supported()`` counts unless told not to. CPU:
    x86 with AVX512-BF16 or AMX; without them (AVX2 machines) oneDNN converts
    every bf16 matmul back and forth, many times slower than fp32. MPS: bf16
    depends on the macOS version and chip and is not fast on M1/M2, so fp32.
    """
    if device.type == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.3 has no including_emulation and counts native support only
            return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool((probe is not None and probe()) or (amx is not None and amx()))
    return False


def resolve_precision(name: str, device: torch.device) -> torch.dtype:
    """The dtype :func:`choose_precision` picks without a probe: ``fp32``, ``bf16``, or for ``auto`` bf16 on a
    GPU with native bf16 matmuls and fp32 everywhere else (a CPU's ``auto`` needs a measurement to pick bf16)."""
    return choose_precision(name, device).dtype


@dataclass(frozen=True)
class PrecisionChoice:
    """The dtype of a run's forward pass, what was asked for, and why (results.json's ``train.precision_choice``).

    Attributes:
        dtype: ``torch.float32`` or ``torch.bfloat16``.
        asked: the ``precision`` setting, ``auto``, ``fp32`` or ``bf16``.
        reason: one sentence a person reads.
        probe: for a measured choice, the seconds per probe step of each precision, the workload and the cache file.
    """

    dtype: torch.dtype
    asked: str
    reason: str
    probe: Optional[dict] = None

    @property
    def name(self) -> str:
        """``float32`` or ``bfloat16``, as results.json writes dtypes."""
        return str(self.dtype).replace("torch.", "")

    def record(self) -> dict:
        return {"asked": self.asked, "dtype": self.name, "reason": self.reason,
                **({"probe": self.probe} if self.probe is not None else {})}


def choose_precision(name: str, device: torch.device, probe: Optional[Callable[[torch.dtype], None]] = None,
                     workload: Optional[dict] = None, cache_dir: Optional[Path] = None) -> PrecisionChoice:
    """The precision of a run: what was asked for, or for ``auto`` the faster one where that is known.

    Args:
        name: ``auto``, ``fp32`` or ``bf16``.
        device: where the run computes.
        probe: one forward and backward pass of the run's own model at its own shapes under autocast of the
            given dtype; only a CPU with native bf16 matmuls uses it (:func:`measured_cpu_precision`). Without
            it, such a CPU's ``auto`` is fp32, the reference numerics.
        workload: what ``probe`` computes (model shape, batch), part of the cache key.
        cache_dir: where measured choices are kept; None: measured again every time.
    """
    if name == "fp32":
        return PrecisionChoice(torch.float32, name, "asked for")
    if name == "bf16":
        return PrecisionChoice(torch.bfloat16, name, "asked for" + (
            "" if bf16_is_native(device) else f"; {device.type} has no native bf16 matmuls, it emulates them"))
    if not bf16_is_native(device):
        return PrecisionChoice(torch.float32, name, f"{device.type} has no native bf16 matmuls: fp32")
    if device.type != "cpu":
        return PrecisionChoice(torch.bfloat16, name, f"{device.type} multiplies bf16 natively: bf16 autocast")
    if probe is None:
        return PrecisionChoice(torch.float32, name, "CPU with bf16 instructions, not measured for this workload: "
                                                    "fp32, the reference numerics")
    return measured_cpu_precision(probe, workload or {}, cache_dir)


# bf16 has to take at most this fraction of fp32's time, in every round, to be chosen: within the margin the
# two are as fast, and a noisy measurement on a shared machine must not pick bf16; fp32 wins those, being the
# numerics every table was made with
BF16_MARGIN = 0.95
PROBE_ROUNDS = 3
PROBE_MIN_SECONDS = 0.05  # a tiny workload repeats its probe within a round until a round takes about this long
PROBE_FORMAT = 2  # in the cache key: a change of how the probe measures measures again


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(workload: dict) -> dict:
    """What a measured precision choice holds for: this CPU, its bf16 units, torch, the thread count, the workload."""
    flags = {flag: bool(getattr(torch.cpu, f"_is_{flag}_supported", lambda: False)())
             for flag in ("avx512_bf16", "amx_tile")}
    return {"probe": PROBE_FORMAT, "cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(),
            **flags, "torch": torch.__version__, "threads": torch.get_num_threads(), "workload": workload}


def time_precisions(probe: Callable[[torch.dtype], None], rounds: int = PROBE_ROUNDS,
                    clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """Seconds per ``probe`` call in fp32 and bf16: one warm-up each, then ``rounds`` interleaved rounds (the
    order alternating, so a load change hits both alike), each of as many calls as take about
    :data:`PROBE_MIN_SECONDS`. The default clock is the process's CPU time, which leaves out the time other
    processes held the cores. The global RNG states are left as found."""
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    dtypes = [torch.float32, torch.bfloat16]
    with torch.random.fork_rng(devices=[]):
        warm = []
        for dtype in dtypes:
            start = clock()
            probe(dtype)
            warm.append(clock() - start)
        reps = max(1, min(50, math.ceil(PROBE_MIN_SECONDS / max(min(warm), 1e-6))))
        for r in range(rounds):
            for dtype in dtypes if r % 2 == 0 else dtypes[::-1]:
                start = clock()
                for _ in range(reps):
                    probe(dtype)
                times[str(dtype).replace("torch.", "")].append(round((clock() - start) / reps, 6))
    return times


def measured_cpu_precision(probe: Callable[[torch.dtype], None], workload: dict, cache_dir: Optional[Path] = None,
                           clock: Callable[[], float] = time.process_time) -> PrecisionChoice:
    """``precision=auto`` on a CPU with native bf16 matmuls: bf16 only if its probe step is faster in every round.

    bf16 is chosen when it took at most :data:`BF16_MARGIN` of fp32's time in each of the
    :data:`PROBE_ROUNDS` interleaved rounds (:func:`time_precisions`); otherwise fp32. The measurement is kept
    in ``cache_dir/precision/<key>.json``, keyed on :func:`machine_key`, so every later run of the workload on
    this machine makes the same choice without measuring; a cache that cannot be written only costs the probe.
    """
    key = machine_key(workload)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "precision" / f"{digest}.json" if cache_dir is not None else None
    cached = None
    if path is not None and path.is_file():
        try:
            cached = json.loads(path.read_text())
            cached = cached if cached.get("key") == json.loads(json.dumps(key, default=str)) else None
        except (OSError, ValueError, AttributeError):
            cached = None
    times = cached["seconds"] if cached else time_precisions(probe, clock=clock)
    if path is not None and cached is None:
        try:
            atomic_write_json(path, {"key": key, "seconds": times})
        except OSError:
            pass
    fp32, bf16 = times["float32"], times["bfloat16"]
    bf16_wins = all(b <= BF16_MARGIN * f for f, b in zip(fp32, bf16))
    dtype = torch.bfloat16 if bf16_wins else torch.float32
    faster = "bf16 is faster in every round" if bf16_wins else (
        "fp32 is faster" if min(fp32) <= min(bf16) else
        f"bf16 is not {1 - BF16_MARGIN:.0%} faster in every round")
    rounds = ", ".join(f"{f * 1e3:.1f}/{b * 1e3:.1f}" for f, b in zip(fp32, bf16))
    reason = (f"measured on this CPU (threads={key['threads']}): a training step's forward and backward took "
              f"{min(fp32) * 1e3:.1f} ms in fp32, {min(bf16) * 1e3:.1f} ms in bf16 (CPU time, best of "
              f"{len(fp32)} interleaved rounds; fp32/bf16 per round {rounds} ms): {faster}"
              + (f"; measured by an earlier run, read from {path}" if cached else ""))
    return PrecisionChoice(dtype, "auto", reason, {"seconds": times, "workload": workload, "cached": bool(cached),
                                                   **({"file": str(path)} if path is not None else {})})


COMPILE_SETTINGS = ("auto", True, False)  # compile=auto|true|false


@dataclass(frozen=True)
class StepSettings:
    """How a training step runs on its device, beyond the precision (results.json's ``train``).

    Attributes:
        compile: ``torch.compile`` the step. ``compile=auto`` (the default) is on for CUDA, where the
            compiled step is much faster and the compile time is small next to a GPU run, and off elsewhere
            (on a CPU the first step would take ~20 s longer, a tenth of the default run).
        tf32: fp32 matmuls on CUDA may use TensorFloat-32 (10-bit mantissa products, fp32 accumulation),
            as PyTorch's ``set_float32_matmul_precision("high")``; losses are still summed in fp32/float64.
        pin_memory: batches are copied from pinned host memory, so the host-to-device copy does not block.
    """

    compile: bool
    tf32: bool
    pin_memory: bool

    def apply(self) -> "StepSettings":
        """Set what is process-wide (TF32); returns these settings."""
        if self.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        return self


def check_compile(compile: object) -> None:
    """Raises ConfigError unless ``compile`` is ``auto``, true or false."""
    if compile not in COMPILE_SETTINGS or isinstance(compile, (int, float)) and not isinstance(compile, bool):
        raise ConfigError("compile", f"must be auto, true or false (got {compile!r})")


def step_settings(device: torch.device, compile: object = "auto") -> StepSettings:
    """The training step's settings on ``device``: what a GPU user expects on CUDA, today's behaviour elsewhere.

    Args:
        compile: the ``compile`` setting, ``auto``, true or false.

    Raises:
        ConfigError: ``compile`` is none of those.
    """
    check_compile(compile)
    cuda = device.type == "cuda"
    return StepSettings(compile=cuda if compile == "auto" else bool(compile), tf32=cuda, pin_memory=cuda)


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the forward pass: matmuls in ``dtype``, the weights and optimizer state stay fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class World:
    """This process's place among the ones torchrun started (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise PosexpError(f"environment variable {name}={value!r} is not an integer; it is set by torchrun "
                          "(torchrun --nproc_per_node=N -m posexp train ...)") from None


def world() -> World:
    """Rank, world size and local rank from the environment torchrun sets."""
    size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if size < 1 or not 0 <= rank < size:
        raise PosexpError(f"RANK={rank} WORLD_SIZE={size}: not a valid process group (0 <= RANK < WORLD_SIZE)")
    return World(rank=rank, size=size, local_rank=_env_int("LOCAL_RANK", rank))
