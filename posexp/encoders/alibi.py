"""ALiBi: attention with linear biases.

Press et al. 2022 (ICLR), "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation", §3: no position vectors at all; head ``h``
adds ``-m_h * (i - j)`` to the logit of query ``i`` attending to key ``j``,
with fixed head-specific slopes ``m_h`` forming a geometric sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, ScoreMod, bias_score_mod, relative_distance


def _geometric_slopes(n: int) -> Tensor:
    # m_h = 2^(-8h/n), h = 1..n: start and ratio both 2^(-8/n) (Press et al. 2022, §3)
    return torch.pow(2.0, -8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)


def alibi_slopes(n_heads: int) -> Tensor:
    """The ALiBi slope of each head, ``(n_heads,)`` float64 (Press et al. 2022, §3).

    For a power of two ``n`` the slopes are ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``
    (1/2 ... 1/256 for 8 heads). Otherwise, following the authors' reference code,
    the ``p`` slopes of the largest power of two ``p < n`` are kept and the rest
    are taken from every other slope of the ``2p`` sequence, which interleave
    between them.

    Args:
        n_heads: number of attention heads, >= 1.
    """
    if n_heads & (n_heads - 1) == 0:
        return _geometric_slopes(n_heads)
    p = 1 << (n_heads.bit_length() - 1)  # largest power of two below n_heads
    # the closest-power-of-two rule of Press et al.'s reference implementation
    extra = _geometric_slopes(2 * p)[0::2][: n_heads - p]
    return torch.cat((_geometric_slopes(p), extra))


@register("alibi")
class ALiBi(PositionalEncoder):
    """Fixed, head-specific linear distance penalties on the attention logits (Press et al. 2022).

    The bias also comes as a FlexAttention ``score_mod`` (``-m_h (i - j)`` per logit), which the model
    uses for fused attention on CUDA (:mod:`posexp.model.fused`).

    Args:
        d_model: model width.
        n_heads: attention heads; each gets its own slope.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "ALiBi: linear distance penalty with a fixed slope per head (Press et al. 2022)"
    relative = True  # -m_h (i - j)

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        # a buffer, so it follows .to(device) but stays out of checkpoints: it is a constant
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # -m_h * (i - j) (Press et al. 2022, §3); positive above the diagonal, which the model masks
        dist = relative_distance(q_pos, k_pos).to(self.slopes.dtype)  # (Lq, Lk)
        return -self.slopes[:, None, None] * dist[None]  # (H, Lq, Lk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        slopes = self.slopes
        # the same -m_h * (i - j), one logit at a time inside a fused kernel
        return bias_score_mod(lambda h, i, j: -slopes[h] * (i - j).to(slopes.dtype), q_pos, k_pos)
