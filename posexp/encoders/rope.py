"""Rotary position embedding (RoPE).

Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
Eq. (34): each pair of query/key features ``(x_i, x_{i+d/2})`` is rotated by the
angle ``m * theta_i`` with ``theta_i = base^(-2i/d)``, so that
``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``m - n``.
Features are paired as halves (the GPT-NeoX layout), a fixed permutation of the
paper's interleaved pairs that the learned projections absorb.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.base import PositionalEncoder
from posexp.errors import require


def rope_frequencies(dim: int, base: float) -> Tensor:
    """``theta_i = base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1`` (RoFormer Eq. 15), float64."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x (..., L, Dh)`` by per-position angles given as ``cos, sin (L, Dh)``."""
    return x * cos + rotate_half(x) * sin


@register("rope")
class RoPE(PositionalEncoder):
    """Rotary position embedding (Su et al. 2021), relative by construction.

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: the base of the frequency schedule ``theta_i = base^(-2i/d)``; > 1.
    """

    description = "RoPE: rotate q and k by position-dependent angles (Su et al. 2021)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for rope (got {base:g})")
        require(self.head_dim % 2 == 0, "model.d_model",
                f"rope rotates pairs of features, so d_model / n_heads must be even "
                f"(got {d_model} / {n_heads} = {self.head_dim})")
        self._base = float(base)
        self.register_buffer("inv_freq", rope_frequencies(self.head_dim, self._base).float(), persistent=False)

    @property
    def base(self) -> float:
        return self._base

    def angles(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``(L, Dh)`` for integer positions ``pos (L,)``."""
        # float32 product of an exact integer and theta_i: exact enough up to ~1e6 positions
        freqs = pos.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]  # (L, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (L, Dh)
        return emb.cos(), emb.sin()

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cos_q, sin_q = self.angles(q_pos)
        if k_pos is q_pos:
            cos_k, sin_k = cos_q, sin_q
        else:
            cos_k, sin_k = self.angles(k_pos)
        q = apply_rotary(q, cos_q.to(q.dtype), sin_q.to(q.dtype))
        k = apply_rotary(k, cos_k.to(k.dtype), sin_k.to(k.dtype))
        return q, k
