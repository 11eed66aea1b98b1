"""T5 relative position bias.

Raffel et al. 2020 (JMLR), "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", §2.1: each head adds a learned scalar to the
attention logit, chosen by a bucket of the query-key offset. Small offsets get
a bucket each, larger ones share logarithmically wider buckets up to
``max_distance``, and everything further shares the last bucket. A decoder only
looks back, so the buckets are the unidirectional ones of Mesh TensorFlow's
``_relative_position_bucket`` (``bidirectional=False``). As in the paper, one
table is shared by all layers (the model calls the same encoder in each).

The biases are logits that have to reach several nats to make attention local,
but AdamW moves a parameter by about ``lr`` per step: over the default
schedule the learning rates add up to about 0.8, so at ``lr_mult=1`` the
table stays within about ±1 nat and the far buckets are never suppressed
(measured: −0.72 to +0.84; T5 then drifts like NoPE, 1.46× its training-length
perplexity at 8×; at ``lr_mult=10``: −4.61 to +4.10 and 1.02×). The paper
trained 2^19 steps; in a short run the table needs a larger step, hence
``lr_mult = 10`` (``encoder.lr_mult``; 1 gives the plain learning rate).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, ScoreMod, bias_score_mod, relative_distance
from posexp.errors import require


def t5_bucket(distance: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Unidirectional T5 bucket of each query-minus-key distance (Raffel et al. 2020, §2.1).

    Args:
        distance: ``i - j`` for query ``i`` and key ``j``, integers of any shape;
            negative values (future keys) count as 0.
        num_buckets: buckets in all, >= 2; the first ``num_buckets // 2`` are exact.
        max_distance: distances from here on share the last bucket; > ``num_buckets // 2``.

    Returns:
        LongTensor of the same shape, values in ``[0, num_buckets)``.
    """
    n = distance.long().clamp(min=0)
    max_exact = num_buckets // 2
    # clamped so the log is never taken of 0; those entries take the exact branch anyway
    ratio = n.clamp(min=max_exact).to(torch.float64) / max_exact
    # max_exact + log(n / max_exact) / log(max_distance / max_exact) * (num_buckets - max_exact)
    # (Mesh TensorFlow's _relative_position_bucket, used by Raffel et al. 2020); float64 so that
    # no distance lands in a neighbouring bucket through rounding
    large = max_exact + (ratio.log() / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n, large)


@register("t5")
class T5Bias(PositionalEncoder):
    """A learned logit bias per (distance bucket, head), shared by all layers (Raffel et al. 2020).

    The bias also comes as a FlexAttention ``score_mod`` (a lookup of the bucket table and the
    (bucket, head) entry per logit, gradients included), which the model uses for fused attention
    on CUDA (:mod:`posexp.model.fused`).

    Args:
        d_model: model width.
        n_heads: attention heads; each has its own bias per bucket.
        num_buckets: distance buckets, half exact and half logarithmic; >= 2.
        max_distance: distance at which buckets stop growing; > num_buckets // 2.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "T5: learned scalar logit bias per log-bucketed distance and head (Raffel et al. 2020)"
    relative = True  # a bias per bucket of i - j
    lr_mult = 10.0  # see the module docstring

    def __init__(self, d_model: int, n_heads: int, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(d_model, n_heads)
        require(num_buckets >= 2, "encoder.num_buckets",
                f"must be >= 2: half the buckets are exact distances, half logarithmic (got {num_buckets})")
        require(max_distance > num_buckets // 2, "encoder.max_distance",
                f"must be > encoder.num_buckets // 2 = {num_buckets // 2}, the last exact distance "
                f"(got {max_distance})")
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.relative_attention_bias = nn.Embedding(self.num_buckets, n_heads)
        # zeros: the model starts out exactly as NoPE and the bias holds only what training
        # put there; no symmetry needs breaking since each (bucket, head) gets its own gradient
        nn.init.zeros_(self.relative_attention_bias.weight)
        # every distance >= max_distance has the last bucket, so a table of max_distance + 1
        # entries answers all lengths with a gather instead of logs on every call
        table = t5_bucket(torch.arange(self.max_distance + 1), self.num_buckets, self.max_distance)
        self.register_buffer("bucket_table", table, persistent=False)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = relative_distance(q_pos, k_pos).clamp(0, self.max_distance)  # (Lq, Lk)
        buckets = self.bucket_table[dist]  # (Lq, Lk)
        return self.relative_attention_bias(buckets).permute(2, 0, 1)  # (H, Lq, Lk)

    # measured on an H100 (torch 2.11, d_model 768, 12 heads, sequence 1,024, bf16, compiled step): Inductor's
    # default forward tiles fused with the (bucket, head) lookup asked 278,528 bytes of shared memory against
    # 232,448 and no config compiled; 64 x 64 tiles compile and train
    flex_kernel_options = {"BLOCK_M": 64, "BLOCK_N": 64}

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        table, weight, far = self.bucket_table, self.relative_attention_bias.weight, self.max_distance

        def bias_at(h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return weight[table[(i - j).clamp(0, far)], h]  # the (bucket, head) entry, as bias() looks it up

        return bias_score_mod(bias_at, q_pos, k_pos)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_buckets={self.num_buckets}, max_distance={self.max_distance}"
