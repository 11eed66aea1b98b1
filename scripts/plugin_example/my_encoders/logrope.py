"""Log-position RoPE: rotary embedding whose angle grows like log(1 + pos / scale).

An example of one idea, not a method from a paper. RoPE (Su et al. 2021, RoFormer, eq. 34) rotates
feature pair ``i`` of a query or key at position ``m`` by ``m * theta_i``, ``theta_i = base^(-2i/d)``.
Here the position is first compressed, ``m -> scale * log(1 + m / scale)``: close to ``m`` for
``m << scale``, logarithmic beyond, so positions far past the training length map to angles not far
past those seen in training. The price: the score no longer depends on ``m - n`` alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.encoders import PositionalEncoder, register
from posexp.encoders.rope import apply_rotary
from posexp.errors import require


@register("logrope")
class LogRoPE(PositionalEncoder):
    """RoPE on compressed positions ``scale * log(1 + pos / scale)``.

    Args:
        d_model: model width.
        n_heads: attention heads.
        base: RoPE's base frequency.
        scale: tokens over which the angle grows about linearly before it turns logarithmic.
    """

    description = "Log-position RoPE: angle grows like scale * log(1 + pos / scale) (an example plugin)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, scale: float = 64.0):
        super().__init__(d_model, n_heads)
        require(scale > 0, "encoder.scale", f"must be > 0 tokens (got {scale})")  # one line, no traceback
        self._base = base
        self.scale = scale
        # theta_i = base^(-2i/d), i = 0 .. d/2 - 1 (RoFormer, eq. 15)
        inv_freq = base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    @property
    def base(self) -> float:
        return self._base

    def angles(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        squashed = self.scale * torch.log1p(pos.double() / self.scale)  # (L,)
        angle = (squashed[:, None] * self.inv_freq.double()[None, :]).float()  # (L, Dh/2)
        angle = torch.cat((angle, angle), dim=-1)  # (L, Dh): the halves rotate together
        return angle.cos(), angle.sin()

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cos_q, sin_q = self.angles(q_pos)
        cos_k, sin_k = self.angles(k_pos)
        return (apply_rotary(q, cos_q.to(q.dtype), sin_q.to(q.dtype)),
                apply_rotary(k, cos_k.to(k.dtype), sin_k.to(k.dtype)))

    def extra_repr(self) -> str:
        return f"base={self._base:g}, scale={self.scale:g}"
