"""Transformer-XL relative positional encoding.

Dai et al. 2019 (ACL), "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context", §3.3. The absolute-position logit is re-derived with the
relative sinusoid ``R_{i-j}`` in place of the key's position and two learned
global vectors ``u, v`` in place of the query's::

    A_ij = q_i . k_j          (a) content-based addressing
         + q_i . W_R R_{i-j}  (b) content-dependent positional bias
         + u . k_j            (c) global content bias
         + v . W_R R_{i-j}    (d) global positional bias

``R`` is the non-learned sinusoid of Vaswani et al. (2017) evaluated at the
distance ``i - j``, and ``W_R`` a learned projection separate from the key's.
The model's attention computes (a); this encoder returns (b) + (c) + (d) through
the ``scores`` hook, grouped as ``(q_i + v) . W_R R_{i-j} + u . k_j``. The
reference implementation scales the whole ``A_ij`` by ``1 / sqrt(d_head)``, so
these terms carry that factor too. Segment-level recurrence (the memory of
previous segments, §3.2) is a training scheme, not an encoding, and is not used.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, relative_distance
from posexp.encoders.sinusoidal import sinusoidal_table
from posexp.errors import require


@register("transformer_xl")
class TransformerXL(PositionalEncoder):
    """Terms (b), (c), (d) of Transformer-XL's relative attention (Dai et al. 2019, §3.3).

    One encoder module serves every layer, so ``W_R``, ``u`` and ``v`` are shared by
    the layers; the paper's ``W_{k,R}`` is a per-layer projection.

    Args:
        d_model: model width; even, since ``R`` comes in (sin, cos) pairs.
        n_heads: attention heads; ``W_R``, ``u`` and ``v`` give each head its own slice.
        base: wavelength scale of the sinusoid ``R``, 10000 in the paper; > 1.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Transformer-XL: q.W_R R_{i-j} + u.k_j + v.W_R R_{i-j} with sinusoidal R (Dai et al. 2019)"
    relative = True  # R_{i-j}, u and v replace every absolute term

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for transformer_xl (got {base:g})")
        require(d_model % 2 == 0, "model.d_model",
                f"transformer_xl's sinusoid R has (sin, cos) pairs, so d_model must be even (got {d_model})")
        self._base = float(base)
        self.W_R = nn.Linear(d_model, d_model, bias=False)  # W_{k,R}: R (d_model) -> one key-sized slice per head
        self.u = nn.Parameter(torch.empty(n_heads, self.head_dim))  # global content bias
        self.v = nn.Parameter(torch.empty(n_heads, self.head_dim))  # global positional bias
        # the reference implementation's init_std = 0.02 for all three
        for p in (self.W_R.weight, self.u, self.v):
            nn.init.normal_(p, mean=0.0, std=0.02)

    @property
    def base(self) -> float:
        return self._base

    def relative_keys(self, max_distance: int, dtype: torch.dtype) -> Tensor:
        """``W_R R_d`` for distances ``d = 0 .. max_distance``, per head, ``(H, max_distance + 1, Dh)``."""
        dist = torch.arange(max_distance + 1, device=self.u.device)
        R = sinusoidal_table(dist, self.d_model, self._base, dtype=self.W_R.weight.dtype)  # (N, D)
        r = self.W_R(R).view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (H, N, Dh)
        return r.to(dtype)

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        B, H, Lq, Dh = q.shape
        dist = relative_distance(q_pos, k_pos).clamp(min=0)  # (Lq, Lk); future keys are masked by the model
        r = self.relative_keys(int(dist.max()) if dist.numel() else 0, q.dtype)  # (H, N, Dh)
        # (b) + (d) = (q_i + v) . W_R R_{i-j}: one product per distance, then each pair picks its distance
        per_dist = (q + self.v.to(q.dtype)[None, :, None, :]) @ r.transpose(-1, -2)[None]  # (B, H, Lq, N)
        bd = per_dist.gather(-1, dist.expand(B, H, Lq, dist.shape[-1]))  # (B, H, Lq, Lk)
        # (c) = u . k_j, the same for every query
        c = (k @ self.u.to(k.dtype)[None, :, :, None]).transpose(-1, -2)  # (B, H, 1, Lk)
        # the reference implementation scales all of A_ij by 1/sqrt(d_head); sdpa scales only (a)
        return (bd + c) * Dh**-0.5
