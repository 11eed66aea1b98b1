"""Shaw et al. relative position representations (key side).

Shaw, Uszkoreit and Vaswani 2018 (NAACL), "Self-Attention with Relative Position
Representations", §3. Each clipped offset ``clip(j - i, k) = max(-k, min(k, j - i))``
has learned vectors ``w^K`` and ``w^V``; with ``a_ij^K = w^K_{clip(j-i, k)}`` the
logit becomes (Eq. 5)::

    e_ij = x_i W^Q (x_j W^K + a_ij^K)^T / sqrt(d_z)
         = q_i . k_j / sqrt(d_z)  +  q_i . a_ij^K / sqrt(d_z)

The model's attention already computes the first term; this encoder returns the
second through the ``scores`` hook. Offsets beyond ``k = max_relative_position``
share the last vector, which the paper argues is enough since precise relative
position is unlikely to matter past a certain distance.

Not implemented: the value side of Eq. 3, ``z_i = sum_j alpha_ij (x_j W^V + a_ij^V)``.
It adds a per-pair vector to the values, and the four encoder hooks can only
change embeddings, q/k, or logits, never what the attention weights average.
The paper's own ablation reports the key-side vectors alone doing about as well
as both sides together on English-German translation.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, relative_distance
from posexp.errors import require


@register("shaw")
class ShawRelative(PositionalEncoder):
    """Learned key-side relative position vectors, clipped at ``max_relative_position`` (Shaw et al. 2018).

    A causal decoder only sees ``j <= i``, so of the paper's ``2k + 1`` vectors
    (offsets ``-k .. k``) only the ``k + 1`` for offsets ``0, -1, .., -k`` can ever
    be used; the table holds those. As in the paper (§3.3) the vectors are shared by
    all heads; one encoder module serves every layer, so they are shared by the
    layers too (the reference implementation learns a table per layer).

    Args:
        d_model: model width.
        n_heads: attention heads; the vectors have the head width ``d_model / n_heads``.
        max_relative_position: the clipping distance ``k``, >= 1 (the paper uses 16 for
            its machine translation models).
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Shaw: learned relative key vectors q.a_{i-j} clipped at max_relative_position (Shaw et al. 2018)"
    relative = True  # q_i . a_{clip(j - i)}

    def __init__(self, d_model: int, n_heads: int, max_relative_position: int = 16):
        super().__init__(d_model, n_heads)
        require(max_relative_position >= 1, "encoder.max_relative_position",
                f"must be a positive integer, the distance k at which offsets are clipped "
                f"(got {max_relative_position})")
        self.max_relative_position = int(max_relative_position)
        # row r is w^K for the offset j - i = -r, r = 0 .. k
        self.relative_keys = nn.Parameter(torch.empty(self.max_relative_position + 1, self.head_dim))
        nn.init.normal_(self.relative_keys, mean=0.0, std=0.02)

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        B, H, Lq, Dh = q.shape
        # clip(j - i, k) for j <= i is -min(i - j, k); future keys (masked by the model) take row 0
        rows = relative_distance(q_pos, k_pos).clamp(0, self.max_relative_position)  # (Lq, Lk)
        # q_i . w^K_r for every row r once, then pick each pair's row: no (Lq, Lk, Dh) tensor
        per_row = q @ self.relative_keys.to(q.dtype).T  # (B, H, Lq, k+1)
        picked = per_row.gather(-1, rows.expand(B, H, Lq, rows.shape[-1]))  # (B, H, Lq, Lk)
        # the 1/sqrt(d_z) of Eq. 5; scaled_dot_product_attention does not scale an additive mask
        return picked * Dh**-0.5

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_relative_position={self.max_relative_position}"
