"""Where and how a run computes: the device, the precision, and the autocast context of the forward pass.

``device=auto|cpu|cuda|mps``: ``auto`` = cuda, else mps, else cpu; under torchrun each
process takes the CUDA device of its ``LOCAL_RANK``. ``precision=auto|fp32|bf16``
runs the forward pass under bf16 autocast (weights, gradients and optimizer state
stay fp32; losses are computed in fp32), ``auto`` only where the hardware has
native bf16 matmuls (:func:`bf16_is_native`). Training and evaluation share this
policy, so a run is evaluated in the precision it was trained in.

Also this process's place among the ones ``torchrun`` started (:func:`world`), which decides its
device; what the processes do together is :mod:`posexp.training.distributed`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from posexp.errors import ConfigError, PosexpError

__all__ = ["World", "autocast", "bf16_is_native", "resolve_device", "resolve_precision", "world"]


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
    """``fp32``, ``bf16``, or ``auto`` = bf16 where the hardware runs it natively, else fp32."""
    if name == "bf16" or (name == "auto" and bf16_is_native(device)):
        return torch.bfloat16
    return torch.float32


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
