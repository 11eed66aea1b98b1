"""KERPLE: kernelized relative positional embedding.

Chi, Fan, Ramadge and Rudnicky 2022 (NeurIPS), "KERPLE: Kernelized Relative
Positional Embedding for Length Extrapolation". A conditionally positive
definite (CPD) kernel of the offset, shifted into a valid bias, is added to the
logits of each head. The paper's two practical variants:

* log:   ``b(m, n) = -r1 * log(1 + r2 * |m - n|)``,  ``r1, r2 > 0``
* power: ``b(m, n) = -r1 * |m - n|^r2``,             ``r1 > 0, 0 < r2 <= 2``

with ``r1, r2`` learned per head. Both are 0 on the diagonal and decrease
monotonically with distance for every admissible ``r1, r2`` (the log variant is
the one the paper recommends; ``r2 <= 2`` keeps ``-|x|^r2`` CPD). ALiBi is the
power variant frozen at ``r2 = 1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, ScoreMod, bias_score_mod, relative_distance
from posexp.errors import require

VARIANTS = ("log", "power")


def _softplus_inverse(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))  # log(exp(y) - 1), stable for small and large y


@register("kerple")
class Kerple(PositionalEncoder):
    """Learned per-head CPD-kernel logit bias, log or power variant (Chi et al. 2022).

    The bias also comes as a FlexAttention ``score_mod`` (the same kernel of ``|i - j|`` with the head's
    ``r1, r2``), which the model uses for fused attention on CUDA (:mod:`posexp.model.fused`).

    The paper keeps ``r1, r2`` admissible by clamping them after every optimiser
    step. A clamp has a zero gradient wherever it binds, so here they are
    reparametrised instead: ``r = softplus(raw)`` for the positive ones and
    ``r2 = 2 * sigmoid(raw)`` for the power exponent. The admissible sets are the
    same (open at the boundary); the optimiser just sees a smooth map.
    The initial values follow the authors' code: uniform in ``(0, 2)`` for the
    log variant's ``r1`` and the power exponent, uniform in ``(0, 1)`` for the other.

    Args:
        d_model: model width.
        n_heads: attention heads; each has its own ``r1, r2``.
        variant: ``log`` (``-r1 log(1 + r2 |m-n|)``) or ``power`` (``-r1 |m-n|^r2``).
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "KERPLE: learned per-head -r1*log(1+r2|i-j|) or -r1*|i-j|^r2 logit bias (Chi et al. 2022)"
    relative = True  # a kernel of |i - j|

    def __init__(self, d_model: int, n_heads: int, variant: str = "log"):
        super().__init__(d_model, n_heads)
        require(variant in VARIANTS, "encoder.variant",
                f"unknown KERPLE variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
        self.variant = variant
        eps = 1e-2  # the authors' lower clamp, kept away from the boundaries at init too
        if variant == "log":
            r1 = torch.empty(n_heads).uniform_(0, 2).clamp(min=eps)
            r2 = torch.empty(n_heads).uniform_(0, 1).clamp(min=eps)
            self.raw_r2 = nn.Parameter(_softplus_inverse(r2))
        else:
            r1 = torch.empty(n_heads).uniform_(0, 1).clamp(min=eps)
            r2 = torch.empty(n_heads).uniform_(0, 2).clamp(eps, 2 - eps)
            self.raw_r2 = nn.Parameter(torch.logit(r2 / 2))
        self.raw_r1 = nn.Parameter(_softplus_inverse(r1))

    @property
    def r1(self) -> Tensor:
        """The per-head scale ``r1 > 0``, ``(H,)``."""
        return F.softplus(self.raw_r1)

    @property
    def r2(self) -> Tensor:
        """The per-head ``r2``: ``> 0`` for log, in ``(0, 2)`` for power, ``(H,)``."""
        return F.softplus(self.raw_r2) if self.variant == "log" else 2 * torch.sigmoid(self.raw_r2)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = relative_distance(q_pos, k_pos).abs()[None]  # (1, Lq, Lk), |m - n|
        return self._kernel(self.r1[:, None, None], self.r2[:, None, None], dist)  # (H, Lq, Lk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        r1, r2 = self.r1, self.r2  # (H,), computed once per forward, looked up per logit
        return bias_score_mod(lambda h, i, j: self._kernel(r1[h], r2[h], (i - j).abs()), q_pos, k_pos)

    def _kernel(self, r1: Tensor, r2: Tensor, dist: Tensor) -> Tensor:
        """The bias at distances ``dist = |m - n|`` for (broadcastable) ``r1, r2``."""
        dist = dist.to(r1.dtype)
        if self.variant == "log":
            # -r1 log(1 + r2 |m - n|) (Chi et al. 2022, logarithmic variant)
            return -r1 * torch.log1p(r2 * dist)
        # -r1 |m - n|^r2 (Chi et al. 2022, power variant), written as exp(r2 log|m-n|) with log 1 on the diagonal:
        # pow(0, r2) has a NaN gradient with respect to r2
        safe = dist.clamp(min=1)
        power = torch.where(dist > 0, torch.exp(r2 * safe.log()), torch.zeros_like(safe))
        return -r1 * power

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, variant={self.variant}"
