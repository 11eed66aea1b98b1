"""The precision a run computes in: ``precision=auto|fp32|bf16``.

``bf16`` runs the forward pass under bf16 autocast (weights, gradients and optimizer state
stay fp32; losses are computed in fp32). ``auto`` (:func:`choose_precision`) is bf16
on a GPU with native bf16 matmuls (:func:`bf16_is_native`); on a CPU with them it is
whichever of fp32 and bf16 a measurement says is faster, because a CPU that *has* bf16
instructions need not run them faster: oneDNN's AVX512-BF16 kernels without AMX are often
slower than its fp32 ones. Everywhere else fp32. The choice and its reason go into
results.json; a run is evaluated in the precision it was trained in.

The measurement (a probe of the run's own training step) and the machine's cache of it belong to training:
:mod:`posexp.training.precision`, which hands :func:`choose_precision` its result.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch


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


def choose_precision(name: str, device: torch.device,
                     measure: Optional[Callable[[], PrecisionChoice]] = None) -> PrecisionChoice:
    """The precision of a run: what was asked for, or for ``auto`` the faster one where that is known.

    Args:
        name: ``auto``, ``fp32`` or ``bf16``.
        device: where the run computes.
        measure: the choice measured on this machine; only a CPU with native bf16 matmuls asks for it
            (:func:`posexp.training.precision.measured_cpu_precision`, which times the run's own training step
            and caches what it found). Without it, such a CPU's ``auto`` is fp32, the reference numerics.
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
    if measure is None:
        return PrecisionChoice(torch.float32, name, "CPU with bf16 instructions, not measured for this workload: "
                                                    "fp32, the reference numerics")
    return measure()


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
