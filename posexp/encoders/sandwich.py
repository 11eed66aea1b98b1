"""Sandwich: the inner product of sinusoidal encodings as a logit bias.

Chi, Fan, Rudnicky and Ramadge 2023 (ACL), "Dissecting Transformer Length
Extrapolation via the Lens of Receptive Field Analysis", the Sandwich section. The
sinusoidal encodings ``p_m`` of Vaswani et al. (2017) are not added to the
embeddings; their inner product is added to the logits instead. For encodings
of width ``d~`` that inner product depends only on the offset::

    p_m . p_n = sum_{i=1}^{d~/2} cos((m - n) / base^(2i / d~))

It is largest (``d~/2``) at ``m = n`` and decays, with ripples, roughly
logarithmically in ``|m - n|``: the same shape KERPLE and T5 learn, but with no
parameters, and it keeps changing past the training length. The paper shifts it
so the diagonal is 0 and, like ALiBi, compresses it per head, giving head
``h = 1 .. H`` the bias::

    b_h(m, n) = (p_m . p_n - d~/2) / (8h / H)

(the per-head divisor as implemented in NVIDIA NeMo's
``SandwichRelativePositionEmbedding``, which cites the paper).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, ScoreMod, bias_score_mod, relative_distance
from posexp.errors import require


def sandwich_kernel(distance: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """``p_m . p_n - d~/2`` as a function of ``distance = m - n``, float64, the shape of ``distance``.

    Args:
        distance: integer offsets ``m - n`` (the kernel is even in them).
        dim: the sinusoid width ``d~``; even.
        base: wavelength scale, 10000 in the paper.
    """
    # frequencies base^(-2i/d~) for i = 1 .. d~/2, as in the sum of Chi et al. 2023
    freqs = base ** (-2 * torch.arange(1, dim // 2 + 1, dtype=torch.float64, device=distance.device) / dim)
    angles = distance.to(torch.float64)[..., None] * freqs  # (..., d~/2)
    return angles.cos().sum(-1) - dim / 2


@register("sandwich")
class Sandwich(PositionalEncoder):
    """Parameter-free logit bias ``(p_m . p_n - d~/2) / (8h/H)`` from sinusoids (Chi et al. 2023).

    The bias also comes as a FlexAttention ``score_mod`` (a lookup into the kernel of every distance
    the positions can have, built once per forward), which the model uses for fused attention on
    CUDA (:mod:`posexp.model.fused`).

    Args:
        d_model: model width.
        n_heads: attention heads; head ``h`` divides the bias by ``8h / H``.
        sinusoid_dim: ``d~``, the width of the sinusoids whose inner product is taken;
            even, >= 2. It sets the depth and reach of the decay (the kernel sums
            ``d~/2`` cosines). It is independent of ``d_model``; NeMo's
            implementation uses the head width, 128 in the large models it targets.
        base: wavelength scale of the sinusoids, 10000 in the paper; > 1.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Sandwich: parameter-free bias p_m.p_n of sinusoids, scaled per head (Chi et al. 2023)"
    relative = True  # p_m . p_n is a function of m - n

    def __init__(self, d_model: int, n_heads: int, sinusoid_dim: int = 128, base: float = 10000.0):
        super().__init__(d_model, n_heads)
        require(sinusoid_dim >= 2 and sinusoid_dim % 2 == 0, "encoder.sinusoid_dim",
                f"must be an even integer >= 2, the width of (sin, cos) pairs (got {sinusoid_dim})")
        require(base > 1, "base", f"must be > 1 for sandwich (got {base:g})")
        self.sinusoid_dim = int(sinusoid_dim)
        self._base = float(base)
        # 1 / (8h / H) for h = 1 .. H: ALiBi's head range 8h/H, used as a divisor (Chi et al. 2023)
        head_scale = n_heads / (8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64))
        self.register_buffer("head_scale", head_scale.float(), persistent=False)

    @property
    def base(self) -> float:
        return self._base

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = relative_distance(q_pos, k_pos).abs()  # (Lq, Lk); the kernel is even, future keys are masked
        # one kernel value per distance, then a gather: no (Lq, Lk, d~/2) tensor
        n = int(dist.max()) + 1 if dist.numel() else 1
        table = sandwich_kernel(torch.arange(n, device=dist.device), self.sinusoid_dim, self._base)  # (n,)
        kernel = table.to(self.head_scale.dtype)[dist]  # (Lq, Lk)
        return self.head_scale[:, None, None] * kernel[None]  # (H, Lq, Lk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        # the kernel of every distance a causal entry can have, once; each logit is then a lookup
        far = int(q_pos.max() - k_pos.min()) + 1 if q_pos.numel() and k_pos.numel() else 1
        table = sandwich_kernel(torch.arange(max(far, 1), device=q_pos.device), self.sinusoid_dim, self._base)
        table, scale = table.to(self.head_scale.dtype), self.head_scale
        return bias_score_mod(lambda h, i, j: scale[h] * table[(i - j).clamp(0, far - 1)], q_pos, k_pos)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sinusoid_dim={self.sinusoid_dim}"
