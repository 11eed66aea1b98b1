"""Frequency schedules ``theta_i``, shared by the sinusoidal and rotary encodings.

Every sinusoid-based encoding turns feature pair ``i = 0 .. d/2 - 1`` at position
``m`` by the angle ``m * theta_i``; the encodings differ only in where the angle is
applied (added vectors, rotated q/k) and in the schedule of ``theta_i``. Su 2021,
"Transformer升级之路 1" §2.3 (Eqs. 30, 41-43), compares three schedules through the
oscillatory integral ``int_0^1 exp(i * Delta * theta_t) dt`` that approximates the
inner product ``<p_m, p_n> = sum_i cos((m - n) theta_i)`` (his Eq. 31):

``exponential``  ``theta_i = base^(-2i/d)`` (Vaswani et al. 2017 §3.5; Su Eq. 30):
                 decays as ``O(1/|m-n|)`` (Su Eq. 40), the balanced choice.
``power``        ``theta_i = (i + 1)^(-alpha)`` (Su Eq. 41, written there as
                 ``i^(-alpha)``; the ``+1`` keeps ``theta_0 = 1`` finite).
``linear``       ``theta_i = 1 - i/(d/2)``, i.e. ``1 - t`` with ``t = 2i/d`` (Su Eq. 43):
                 the integral is ``e^{iD}(1 - e^{-iD})/(iD)``, whose real part
                 ``sin(D)/D`` returns to zero at every ``D = 2 pi k``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.errors import require

FREQ_SCHEDULES = ("exponential", "power", "linear")


def check_schedule(schedule: str, alpha: float) -> None:
    """Raise :class:`~posexp.errors.ConfigError` for an unknown schedule or ``alpha <= 0``."""
    require(schedule in FREQ_SCHEDULES, "encoder.freq_schedule",
            f"unknown frequency schedule {schedule!r}; choose one of: {', '.join(FREQ_SCHEDULES)}")
    require(alpha > 0, "encoder.alpha",
            f"must be > 0 so that theta_i = (i+1)^(-alpha) decreases with i (got {alpha:g})")


def frequency_schedule(dim: int, base: float = 10000.0, schedule: str = "exponential",
                       alpha: float = 1.0) -> Tensor:
    """``theta_i`` for ``i = 0 .. dim/2 - 1``, float64 (Su 2021, §2.3).

    Args:
        dim: the width the pairs are taken from (``d_model`` for sinusoidal, the
            rotated part of a head for rotary); even.
        base: ``b`` of the exponential schedule ``b^(-2i/dim)``; unused by the others.
        schedule: ``exponential``, ``power`` or ``linear`` (module docstring).
        alpha: the exponent of the ``power`` schedule; unused by the others.

    Returns:
        ``theta (dim/2,)``; every schedule starts at ``theta_0 = 1``, one radian per token.
    """
    check_schedule(schedule, alpha)
    i = torch.arange(dim // 2, dtype=torch.float64)
    if schedule == "exponential":
        # theta_i = base^(-2i/d) (Vaswani et al. 2017, §3.5; Su 2021, Eq. 30)
        return base ** (-2 * i / dim)
    if schedule == "power":
        # theta_i = i^(-alpha) (Su 2021, Eq. 41), counted from i + 1 so that theta_0 = 1
        return (i + 1) ** (-alpha)
    # theta_i = 1 - t with t = 2i/d (Su 2021, Eq. 43)
    return 1 - i / (dim / 2)


def rope_frequencies(dim: int, base: float, schedule: str = "exponential", alpha: float = 1.0) -> Tensor:
    """``theta_i`` for ``i = 0 .. dim/2 - 1``, float64: ``base^(-2i/dim)`` (RoFormer Eq. 15) by default,
    or another schedule of :func:`frequency_schedule`."""
    return frequency_schedule(dim, base, schedule, alpha)


__all__ = ["FREQ_SCHEDULES", "check_schedule", "frequency_schedule", "rope_frequencies"]
