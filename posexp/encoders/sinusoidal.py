"""Sinusoidal absolute position encoding.

Vaswani et al. 2017, "Attention Is All You Need", §3.5: position ``k`` is the
vector ``p_{k,2i} = sin(k / base^(2i/d))``, ``p_{k,2i+1} = cos(k / base^(2i/d))``
with ``base = 10000``, added to the token embedding. Each (sin, cos) pair turns
at its own frequency, so ``p_{k+s}`` is a fixed rotation of ``p_k`` for every
``k`` (the paper's stated reason for the choice) and ``<p_m, p_n>`` depends only
on ``m - n``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.base import PositionalEncoder
from posexp.errors import require


def sinusoidal_table(pos: Tensor, d_model: int, base: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """The encodings ``(L, d_model)`` of integer positions ``pos (L,)`` (Vaswani et al. 2017, §3.5).

    Args:
        pos: absolute positions, any integers (no length limit).
        d_model: encoding width; even.
        base: the wavelength scale, 10000 in the paper.
        dtype: dtype of the result; the angles are always formed in float64.

    Returns:
        ``table[l, 2i] = sin(pos[l] * w_i)`` and ``table[l, 2i+1] = cos(pos[l] * w_i)``
        with ``w_i = base^(-2i/d_model)``.
    """
    # w_i = 1 / base^(2i/d) (Vaswani et al. 2017, §3.5)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=pos.device) / d_model)
    # float64 angles: in float32 pos * w_0 loses ~pos * 6e-8 rad, already 0.06 rad at pos 1e6
    angles = pos.to(torch.float64)[:, None] * inv_freq[None, :]  # (L, d/2)
    # interleave so that sin lands on even features and cos on odd ones, as in the paper
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(dtype)  # (L, d)


@register("sinusoidal")
class Sinusoidal(PositionalEncoder):
    """Fixed sinusoidal position vectors added to the token embeddings (Vaswani et al. 2017).

    The table is computed for the positions asked for, so every length is supported.
    As in the paper (§3.4) the token embeddings are multiplied by ``sqrt(d_model)``
    before the encodings are added; without it, unit-amplitude encodings drown
    embeddings initialised at std 0.02 and the model trains visibly worse even at
    its training length.

    Args:
        d_model: model width; even, since features come in (sin, cos) pairs.
        n_heads: attention heads (unused).
        base: the wavelength scale; wavelengths run from ``2*pi`` to ``2*pi*base``; > 1.
    """

    description = "Sinusoidal: fixed sin/cos position vectors added to the embeddings (Vaswani et al. 2017)"
    # evaluation-time context extension: position interpolation (posexp/scaling.py)
    supported_scalings = ("linear",)
    position_scale = 1.0  # positions are multiplied by this; 1 / s on a scaled copy

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for sinusoidal (got {base:g})")
        require(d_model % 2 == 0, "model.d_model",
                f"sinusoidal encodes (sin, cos) pairs, so d_model must be even (got {d_model})")
        self._base = float(base)
        self.embed_scale = d_model**0.5

    @property
    def base(self) -> float:
        return self._base

    def with_scaling(self, kind: str, factor: float, train_len: int) -> "Sinusoidal":
        """A copy that reads position ``m`` as ``m / factor`` (position interpolation, Chen et al. 2023, §2.3).

        Args:
            kind: ``linear``, the only method for absolute sinusoids.
            factor: ``s``; positions ``0 .. s*train_len`` map into the trained ``0 .. train_len``.
            train_len: the training context length (unused: the table is defined at any position).
        """
        from posexp.scaling import module_copy

        clone = module_copy(self)
        clone.position_scale = 1.0 / float(factor)
        return clone

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        if self.position_scale != 1.0:
            pos = pos.to(torch.float64) * self.position_scale  # fractional positions; the table takes them
        # x * sqrt(d_model) + PE (Vaswani et al. 2017, §3.4 and §3.5)
        return x * self.embed_scale + sinusoidal_table(pos, self.d_model, self._base, dtype=x.dtype)
