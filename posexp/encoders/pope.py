"""PoPE: polar coordinate position embedding, the "what" in magnitudes and the "where" in phases.

Gopalakrishnan, Csordás, Schmidhuber and Mozer 2025, "Decoupling the 'What' and 'Where' With Polar Coordinate
Positional Embeddings" (arXiv 2509.10534), §3. RoPE rotates pairs of features, so a pair's content sets both the
length and the angle of its vector and content and position interfere in the score. PoPE makes each of the ``d``
features of a head one complex number whose magnitude is the content and whose phase is the position alone:

* magnitudes:  ``mu_q,c = softplus(q_c)``, ``mu_k,c = softplus(k_c)``           (non-negative "what")
* phases:      ``phi_q,c = s theta_c``,  ``phi_k,c = t theta_c + delta_c``     (``theta_c = base^(-c/d)``, ``d`` of them)
* score:       ``Re sum_c q~_c conj(k~_c) = sum_c mu_q,c mu_k,c cos((s - t) theta_c - delta_c)``

with ``delta_c`` a learned phase bias per head and feature, clamped to ``[-2 pi, 0]``, starting at 0 (as in the
reference implementation, lucidrains' PoPE-pytorch ``bias.clamp(-2 pi, 0)``). The score reads positions only
through ``s - t``: PoPE is relative, as RoPE.

The complex numbers are laid out as ``2d`` real features ``(mu cos phi, mu sin phi)`` so the real dot product is
the score above, and ``q`` is multiplied by ``sqrt 2``: the attention then divides by ``sqrt(2d)`` (the width it
sees), and the logits keep the paper's ``1 / sqrt(d)``. q and k leave :meth:`PoPE.rotate` twice as wide.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, layer_copies
from posexp.errors import require


def pope_frequencies(head_dim: int, base: float) -> Tensor:
    """PoPE's ``d`` frequencies ``theta_c = base^(-c/d)``, ``c = 0 .. d - 1`` (Gopalakrishnan et al. 2025, §3:
    one per feature, where RoPE has one per pair), float64."""
    return base ** -(torch.arange(head_dim, dtype=torch.float64) / head_dim)


@register("pope")
class PoPE(PositionalEncoder):
    """Each feature a complex number: magnitude ``softplus`` of the content, phase the position (plus a key bias).

    Every layer has its own phase bias (a parameter per head and feature), as in the paper: this encoder serves the
    first layer and builds one copy per further layer (:meth:`for_layers`).

    Args:
        d_model: model width.
        n_heads: attention heads.
        base: the base of the frequencies ``theta_c = base^(-c/d)``; > 1.

    Raises:
        ConfigError: ``base <= 1``.
    """

    description = "PoPE: softplus magnitudes (content), phases (position), a learned key phase bias (Gopalakrishnan et al. 2025)"
    relative = True  # the score reads positions only through s - t (module docstring)
    revision = 2  # 2: encoder.lr_mult on every layer's phase bias (1: on the first layer's only)

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for pope (got {base:g})")
        self._base = float(base)
        self.register_buffer("inv_freq", pope_frequencies(self.head_dim, self._base).float(), persistent=False)
        self.phase_bias = nn.Parameter(torch.zeros(n_heads, self.head_dim))  # delta, (H, Dh)
        self.other_layers = nn.ModuleList()  # the phase biases of layers 2 .. n_layers (for_layers)

    @property
    def explicit_attention(self) -> bool:
        """True: q and k are wider than v, which CPU's fused SDPA kernels refuse (they fall back to forming the
        whole ``L x L`` score matrix), so attention is formed block by block, memory linear in length."""
        return True

    @property
    def base(self) -> float:
        return self._base

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        return layer_copies(self, self.other_layers, n_layers, lambda: PoPE(self.d_model, self.n_heads, self._base))

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``q (B, H, Lq, Dh)``, ``k (B, H, Lk, Dh)`` → ``(B, H, Lq, 2 Dh)``, ``(B, H, Lk, 2 Dh)``: each feature's
        ``(mu cos phi, mu sin phi)``, q times ``sqrt 2`` (module docstring)."""
        dtype = torch.promote_types(q.dtype, torch.float32)  # phases of long positions need fp32
        phi_q = q_pos.to(dtype)[:, None] * self.inv_freq.to(dtype)  # (Lq, Dh)
        delta = self.phase_bias.clamp(-2 * math.pi, 0).to(dtype)[:, None, :]  # (H, 1, Dh)
        phi_k = k_pos.to(dtype)[:, None] * self.inv_freq.to(dtype) + delta  # (H, Lk, Dh)
        mu_q, mu_k = F.softplus(q.to(dtype)) * math.sqrt(2), F.softplus(k.to(dtype))
        q2 = torch.cat((mu_q * phi_q.cos(), mu_q * phi_q.sin()), dim=-1)
        k2 = torch.cat((mu_k * phi_k.cos(), mu_k * phi_k.sin()), dim=-1)
        return q2.to(q.dtype), k2.to(k.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, base={self._base:g}, frequencies={self.head_dim} per head"


__all__ = ["PoPE", "pope_frequencies"]
