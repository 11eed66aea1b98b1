"""xPos: rotary position embedding with an exponential decay.

Sun et al. 2023 (ACL; arXiv 2022), "A Length-Extrapolatable Transformer", §3.
RoPE's score oscillates with distance instead of decaying, which the paper blames
for unstable attention on long contexts. xPos keeps the rotation and also scales
each rotated pair ``i = 0 .. d/2 - 1`` of the query at position ``n`` by
``zeta_i^(n/B)`` and of the key at ``m`` by ``zeta_i^(-m/B)``, with::

    zeta_i = (i / (d/2) + gamma) / (1 + gamma)   in (0, 1),  gamma = 0.4,  B = scale_base = 512

so pair ``i``'s contribution to ``q_n . k_m`` is multiplied by ``zeta_i^((n-m)/B)``:
still a function of ``n - m`` only, and shrinking exponentially with distance,
fastest for the high-frequency pairs (small ``zeta_i``) whose rotation is least
useful far away.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.rope import apply_rotary
from posexp.errors import require


def xpos_zeta(head_dim: int, gamma: float) -> Tensor:
    """``zeta_i = (i/(d/2) + gamma) / (1 + gamma)`` for ``i = 0 .. d/2 - 1`` (Sun et al. 2023, §3), float64."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return (i / (head_dim / 2) + gamma) / (1 + gamma)


@register("xpos")
class XPos(PositionalEncoder):
    """RoPE plus a per-pair exponential decay ``zeta^((n-m)/B)`` of the score (Sun et al. 2023).

    Features are paired as halves, as in :mod:`posexp.encoders.rope`. The scale
    factors are formed in float64 from positions centred on the middle of the key
    range (the reference implementation centres them too): the offset cancels in
    ``zeta^(n/B) zeta^(-m/B)``, but it keeps each factor near 1 so neither
    overflows nor underflows at long contexts.

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: RoPE's frequency base, ``theta_i = base^(-2i/d)``; > 1.
        gamma: ``gamma`` of ``zeta_i``, 0.4 in the paper; > 0 (so every ``zeta_i > 0``).
        scale_base: ``B``, the distance over which pair ``i`` decays by ``zeta_i``;
            512 in the paper; > 0.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "xPos: RoPE with per-pair exponential decay zeta^((n-m)/B) of the score (Sun et al. 2023)"
    relative = True  # zeta^((n-m)/B) times RoPE's rotation by n - m

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, gamma: float = 0.4,
                 scale_base: float = 512.0):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for xpos (got {base:g})")
        require(self.head_dim % 2 == 0, "model.d_model",
                f"xpos rotates pairs of features, so d_model / n_heads must be even "
                f"(got {d_model} / {n_heads} = {self.head_dim})")
        require(gamma > 0, "encoder.gamma", f"must be > 0 so that every zeta_i > 0 (got {gamma:g})")
        require(scale_base > 0, "encoder.scale_base", f"must be > 0 (got {scale_base:g})")
        self._base = float(base)
        self.gamma = float(gamma)
        self.scale_base = float(scale_base)
        self.register_buffer("inv_freq", rope_frequencies(self.head_dim, self._base), persistent=False)
        self.register_buffer("zeta", xpos_zeta(self.head_dim, self.gamma), persistent=False)

    @property
    def base(self) -> float:
        return self._base

    def _factors(self, pos: Tensor, centre: Tensor, sign: float) -> tuple[Tensor, Tensor]:
        """``cos * s, sin * s`` with ``s = zeta^(sign * (pos - centre) / B)``, each ``(L, Dh)`` float64."""
        p = pos.to(torch.float64)
        # float64 even if the module was cast: these are constants, cheap to keep exact
        angles = p[:, None] * self.inv_freq.double()[None, :]  # (L, Dh/2), RoPE's m * theta_i
        scale = self.zeta.double()[None, :] ** (sign * (p - centre)[:, None] / self.scale_base)  # (L, Dh/2)
        angles, scale = torch.cat((angles, angles), -1), torch.cat((scale, scale), -1)  # (L, Dh), halves layout
        return angles.cos() * scale, angles.sin() * scale

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if k_pos.numel() == 0:
            return q, k
        # any common offset cancels in q.k; the middle of the keys keeps the exponents small
        centre = (k_pos.min() + k_pos.max()).to(torch.float64) / 2
        cos_q, sin_q = self._factors(q_pos, centre, +1.0)  # query at n: zeta^(n/B)
        cos_k, sin_k = self._factors(k_pos, centre, -1.0)  # key at m: zeta^(-m/B)
        q = apply_rotary(q, cos_q.to(q.dtype), sin_q.to(q.dtype))
        k = apply_rotary(k, cos_k.to(k.dtype), sin_k.to(k.dtype))
        return q, k

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gamma={self.gamma:g}, scale_base={self.scale_base:g}"
