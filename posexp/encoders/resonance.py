"""Resonance RoPE: rotary wavelengths rounded to whole tokens.

Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization of Large Language
Models" (Findings of ACL 2024), §3, Algorithm 1. RoPE's pair ``i`` turns with wavelength
``lambda_i = 2 pi / theta_i`` tokens, almost never a whole number, so past the training length
a feature meets rotation angles (phases) it never saw. Rounding every wavelength to an integer::

    lambda~_i = round(2 pi / theta_i),      theta~_i = 2 pi / lambda~_i

makes each feature periodic in whole tokens: its rotation at position ``m + lambda~_i`` is exactly
its rotation at ``m``, so every phase a longer context produces was already produced in training
for the features whose wavelength fits in it (the paper's "pre-critical" dimensions).

The rounding composes with evaluation-time scalings: "Resonance YaRN" (§3.2) rounds the wavelengths
after YaRN has rescaled them, which is what ``eval.scaling=yarn`` (and every other rotary scaling)
does here, through :meth:`RoPE.adjust_frequencies`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.rope import RoPE


def resonant_wavelengths(theta: Tensor) -> Tensor:
    """``round(2 pi / theta_i)``, float64, never below 1 (Wang et al. 2024, Algorithm 1)."""
    return torch.round(2 * math.pi / theta.double()).clamp(min=1)


@register("resonance")
class ResonanceRoPE(RoPE):
    """RoPE whose every wavelength is a whole number of tokens (Wang et al. 2024, §3).

    Relative as RoPE is: a rotation by ``(m - n) theta~_i``. Offers RoPE's evaluation-time scalings;
    each rounds the wavelengths it produces (Resonance YaRN, §3.2, for ``yarn``).

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: the base of the schedule ``theta_i = base^(-2i/d)`` that is rounded; > 1.

    Raises:
        ConfigError: ``base <= 1`` or an odd head width.
    """

    description = "Resonance RoPE: rotary wavelengths rounded to whole tokens (Wang et al. 2024)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0):
        super().__init__(d_model, n_heads, base=base)
        # rounded from the float64 schedule: a float32 frequency could put a wavelength near a half-integer
        # on the other side of it
        self.inv_freq = self.adjust_frequencies(rope_frequencies(self.rot_dim, self.base)).float()

    def adjust_frequencies(self, theta: Tensor) -> Tensor:
        """``2 pi / round(2 pi / theta_i)``, float64 (Wang et al. 2024, Algorithm 1)."""
        return 2 * math.pi / resonant_wavelengths(theta)

    @property
    def wavelengths(self) -> Tensor:
        """Each pair's wavelength in tokens, ``lambda~_i``, an integer (float64)."""
        return resonant_wavelengths(self.inv_freq)

