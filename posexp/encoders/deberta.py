"""DeBERTa disentangled attention: content-to-position and position-to-content terms.

He et al. 2021 (ICLR), "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", §3.1. Relative position embeddings ``P`` (one row per distance
bucket, shared by all layers) are projected to position queries and keys,
``Q^r = P W_{q,r}`` and ``K^r = P W_{k,r}``, and Eq. 4 adds two terms to the
content logit::

    A~_ij = Q^c_i . K^c_j  +  Q^c_i . K^r_{delta(i,j)}  +  K^c_j . Q^r_{delta(j,i)}
            content->content   content->position           position->content
    H_o = softmax(A~ / sqrt(3d)) V^c

with ``delta(i, j)`` the bucket of the offset ``i - j`` (Eq. 3: clipped at
``+-k``, then shifted into ``[0, 2k)``). Note the third term indexes by
``delta(j, i)``, the key's offset from the query, as printed in Eq. 4; public
implementations differ on this (microsoft/DeBERTa#162), we follow the paper.

Buckets: DeBERTa-v2/v3 replace Eq. 3's plain clipping by log buckets
(``make_log_bucket_position`` in the authors' code): offsets with ``|i - j| <=
position_buckets / 2`` keep their own bucket, larger ones share buckets whose
width grows logarithmically up to ``max_relative_positions``. With
``position_buckets = 0`` the encoder falls back to Eq. 3's clipping at
``k = max_relative_positions``.

Scaling: Eq. 4 divides all three terms by ``sqrt(3d)`` (``d`` = head width),
because the logit now sums three dot products. The model's
``scaled_dot_product_attention`` already adds the content term as
``q.k / sqrt(d)``, and it cannot be told otherwise through the hooks. So the
``scores`` hook returns ``q.k (1/sqrt(3d) - 1/sqrt(d)) + (c2p + p2c)/sqrt(3d)``:
added to sdpa's term the total is exactly Eq. 4's ``A~ / sqrt(3d)``. The price
is one extra ``q.k`` product per query block.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, relative_distance
from posexp.errors import require


def deberta_log_bucket(relative: Tensor, position_buckets: int, max_position: int) -> Tensor:
    """DeBERTa-v2's log bucket of each signed offset (``make_log_bucket_position``).

    Offsets with ``|r| <= mid = position_buckets // 2`` are their own bucket; a larger
    ``|r|`` maps to ``sign(r) * (mid + ceil(log(|r|/mid) / log((max_position-1)/mid) * (mid-1)))``,
    which reaches ``+-(2 mid - 1)`` at ``|r| = max_position - 1`` and keeps growing
    (slowly) beyond, until the caller clips it to the table.

    Args:
        relative: signed integer offsets ``i - j`` of any shape.
        position_buckets: the bucket count of one sign, >= 2.
        max_position: the offset at which the log buckets reach ``2 mid - 1``; > mid + 1.

    Returns:
        LongTensor of signed buckets, the shape of ``relative``.
    """
    rel = relative.long()
    mid = position_buckets // 2
    magnitude = rel.abs()
    # float64 so that no offset lands in a neighbouring bucket through rounding (as in t5_bucket);
    # offsets inside the exact range are clamped to mid only to keep the log finite, their value is unused
    far = magnitude.clamp(min=mid).to(torch.float64)
    log_bucket = mid + torch.ceil((far / mid).log() / math.log((max_position - 1) / mid) * (mid - 1)).long()
    return torch.where(magnitude <= mid, rel, rel.sign() * log_bucket)


@register("deberta")
class DeBERTa(PositionalEncoder):
    """Disentangled content-to-position and position-to-content logits (He et al. 2021, §3.1, Eq. 4).

    Args:
        d_model: model width; ``P``, ``W_{q,r}``, ``W_{k,r}`` are ``d_model`` wide as in the paper.
        n_heads: attention heads; each takes its slice of ``Q^r`` and ``K^r``.
        position_buckets: log buckets per sign, as in DeBERTa-v3 (256 there); 0 for the
            paper's Eq. 3 clipping at ``max_relative_positions``. Otherwise >= 2.
        max_relative_positions: the offset where the log buckets end (512 in DeBERTa-v3),
            or the clipping distance ``k`` when ``position_buckets = 0``; >= 1, and
            > ``position_buckets // 2 + 1`` with buckets. The defaults, 32 and 128, are
            the t5 encoder's so the two bucketings can be compared at equal size.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "DeBERTa: content-to-position + position-to-content logits, log buckets (He et al. 2021)"
    relative = True  # P is read at delta(i, j), a bucket of i - j

    def __init__(self, d_model: int, n_heads: int, position_buckets: int = 32, max_relative_positions: int = 128):
        super().__init__(d_model, n_heads)
        require(position_buckets == 0 or position_buckets >= 2, "encoder.position_buckets",
                f"must be 0 (plain clipping, Eq. 3) or >= 2 log buckets per sign (got {position_buckets})")
        require(max_relative_positions >= 1, "encoder.max_relative_positions",
                f"must be a positive integer (got {max_relative_positions})")
        if position_buckets > 0:
            require(max_relative_positions > position_buckets // 2 + 1, "encoder.max_relative_positions",
                    f"must be > encoder.position_buckets // 2 + 1 = {position_buckets // 2 + 1}, where the "
                    f"log buckets start (got {max_relative_positions})")
        self.position_buckets = int(position_buckets)
        self.max_relative_positions = int(max_relative_positions)
        # k of Eq. 3: offsets map into [0, 2k)
        self.span = self.position_buckets if self.position_buckets > 0 else self.max_relative_positions
        self.rel_embeddings = nn.Parameter(torch.empty(2 * self.span, d_model))  # P
        self.W_q_r = nn.Linear(d_model, d_model, bias=False)
        self.W_k_r = nn.Linear(d_model, d_model, bias=False)
        # BERT's initialisation, which DeBERTa keeps
        for p in (self.rel_embeddings, self.W_q_r.weight, self.W_k_r.weight):
            nn.init.normal_(p, mean=0.0, std=0.02)

    def delta(self, relative: Tensor) -> Tensor:
        """``delta`` of Eq. 3 for signed offsets: the row of ``P`` each offset reads, in ``[0, 2k)``."""
        if self.position_buckets > 0:
            relative = deberta_log_bucket(relative, self.position_buckets, self.max_relative_positions)
        return (relative.long() + self.span).clamp(0, 2 * self.span - 1)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (2k, D) -> (H, 2k, Dh)

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        B, H, Lq, Dh = q.shape
        Lk = k.shape[2]
        Q_r = self._heads(self.W_q_r(self.rel_embeddings)).to(q.dtype)  # (H, 2k, Dh)
        K_r = self._heads(self.W_k_r(self.rel_embeddings)).to(q.dtype)  # (H, 2k, Dh)
        rel = relative_distance(q_pos, k_pos)  # (Lq, Lk), i - j
        # content->position: Q^c_i . K^r_{delta(i,j)}, one product per bucket, then each pair picks its bucket
        c2p = (q @ K_r.transpose(-1, -2)[None]).gather(-1, self.delta(rel).expand(B, H, Lq, Lk))
        # position->content: K^c_j . Q^r_{delta(j,i)}, gathered per key row, then transposed to (query, key)
        p2c_rows = self.delta(-rel).T  # (Lk, Lq): [j, i] = delta(j, i)
        p2c = (k @ Q_r.transpose(-1, -2)[None]).gather(-1, p2c_rows.expand(B, H, Lk, Lq)).transpose(-1, -2)
        # Eq. 4's 1/sqrt(3d) for all three terms; sdpa has already added q.k / sqrt(d), so trade that for q.k / sqrt(3d)
        scale = (3 * Dh) ** -0.5
        content_fix = (q @ k.transpose(-1, -2)) * (scale - Dh**-0.5)
        return content_fix + (c2p + p2c) * scale  # (B, H, Lq, Lk)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, position_buckets={self.position_buckets}, "
                f"max_relative_positions={self.max_relative_positions}")
