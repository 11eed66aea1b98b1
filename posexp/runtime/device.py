"""Where a run computes: the device, the step's compile settings, the autocast context of the forward pass,
and this process's place among the ones ``torchrun`` started.

``device=auto|cpu|cuda|mps``: ``auto`` = cuda, else mps, else cpu; under torchrun each
process takes the CUDA device of its ``LOCAL_RANK`` (:func:`world`); what the processes
do together is :mod:`posexp.training.distributed`. The precision the forward pass runs in
is :mod:`posexp.runtime.precision`; :class:`Placement` holds the four together for a training step.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from posexp.errors import ConfigError, PosexpError
from posexp.runtime.precision import PrecisionChoice


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


@dataclass(frozen=True)
class Placement:
    """Where and how this process trains, settled once before the first step: its device, its place among the
    ranks, the step's settings on that device and the forward pass's precision (results.json's ``train`` records
    all four)."""

    device: torch.device
    world: World
    settings: StepSettings
    precision: PrecisionChoice

    @property
    def dtype(self) -> torch.dtype:
        """The autocast dtype of the forward pass."""
        return self.precision.dtype
