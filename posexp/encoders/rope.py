"""Rotary position embedding (RoPE).

Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
Eq. (34): each pair of query/key features ``(x_i, x_{i+d/2})`` is rotated by the
angle ``m * theta_i`` with ``theta_i = base^(-2i/d)``, so that
``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``m - n``.
Features are paired as halves (the GPT-NeoX layout), a fixed permutation of the
paper's interleaved pairs that the learned projections absorb.
"""

from __future__ import annotations

from typing import Optional

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
    # evaluation-time context extension, see posexp/scaling.py and with_scaling
    supported_scalings = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3")
    attention_scaling = 1.0  # YaRN's sqrt(1/t) on q and k; 1 unless scaled
    scaling: Optional[tuple[str, float, int]] = None  # (kind, factor, train_len) on a scaled copy

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

    def with_scaling(self, kind: str, factor: float, train_len: int) -> "RoPE":
        """A copy with frequencies scaled for evaluation past ``train_len`` (formulas in posexp/scaling.py).

        Args:
            kind: ``linear`` (PI), ``ntk``, ``dynamic_ntk``, ``yarn`` or ``llama3``.
            factor: the scaling factor ``s`` (for ``dynamic_ntk`` the factor ``a`` of its formula).
            train_len: the context length the model was trained at.

        Returns:
            A module sharing this one's state; this one is left unchanged.
        """
        from posexp.scaling import module_copy, rope_scaling

        clone = module_copy(self)
        clone.scaling = (kind, float(factor), int(train_len))
        theta, clone.attention_scaling = rope_scaling(kind, self.head_dim, self._base, factor, train_len)
        clone.inv_freq = theta.to(self.inv_freq)
        clone._dynamic_cache = {}
        return clone

    def frequencies(self, seq_len: int) -> tuple[Tensor, float]:
        """``theta (Dh/2,)`` and the q/k multiplier for a sequence of ``seq_len`` tokens."""
        if self.scaling is None or self.scaling[0] != "dynamic_ntk":
            return self.inv_freq, self.attention_scaling
        # dynamic NTK: the base follows the length actually read (transformers' `dynamic` rope type)
        if seq_len not in self._dynamic_cache:
            from posexp.scaling import rope_scaling

            kind, factor, train_len = self.scaling
            theta, _ = rope_scaling(kind, self.head_dim, self._base, factor, train_len, seq_len=seq_len)
            self._dynamic_cache[seq_len] = theta.to(self.inv_freq)
        return self._dynamic_cache[seq_len], 1.0

    def angles(self, pos: Tensor, inv_freq: Optional[Tensor] = None,
               scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``(L, Dh)`` for positions ``pos (L,)``, both times ``scale``."""
        inv_freq = self.inv_freq if inv_freq is None else inv_freq
        # float32 product of an exact integer and theta_i: exact enough up to ~1e6 positions
        freqs = pos.to(inv_freq.dtype)[:, None] * inv_freq[None, :]  # (L, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (L, Dh)
        if scale != 1.0:
            return emb.cos() * scale, emb.sin() * scale
        return emb.cos(), emb.sin()

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        dynamic = self.scaling is not None and self.scaling[0] == "dynamic_ntk" and k_pos.numel() > 0
        seq_len = int(k_pos.max()) + 1 if dynamic else 0  # like transformers: max position + 1
        inv_freq, scale = self.frequencies(seq_len)
        cos_q, sin_q = self.angles(q_pos, inv_freq, scale)
        if k_pos is q_pos:
            cos_k, sin_k = cos_q, sin_q
        else:
            cos_k, sin_k = self.angles(k_pos, inv_freq, scale)
        q = apply_rotary(q, cos_q.to(q.dtype), sin_q.to(q.dtype))
        k = apply_rotary(k, cos_k.to(k.dtype), sin_k.to(k.dtype))
        return q, k
