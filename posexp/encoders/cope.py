"""CoPE: contextual position encoding.

Golovneva, Wang, Weston and Sukhbaatar 2024, "Contextual Position Encoding:
Learning to Count What's Important", §3. Positions are not token counts but
counts of the tokens the query finds relevant, decided by gates from the
content itself:

* gates (Eq. 3):      ``g_ij = sigmoid(q_i . k_j)``
* positions (Eq. 4):  ``p_ij = sum_{t=j}^{i} g_it``, a fractional count of the
  keys between ``j`` and ``i`` that pass the gate (all gates 1 gives ``i - j + 1``)
* embedding (Eq. 5):  ``e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]``,
  linear interpolation of a learned table ``e[0 .. npos_max - 1]``
* logits (Eq. 6):     ``a_ij = softmax(q_i . k_j + q_i . e[p_ij])``

computed as the paper suggests: ``z_i[p] = q_i . e[p]`` for the integer ``p``
once, then interpolate the scalars. This encoder returns ``q_i . e[p_ij]``
through the ``scores`` hook. Positions past ``npos_max - 1`` share the last
entry, as in the paper's code.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder
from posexp.errors import require


def cope_positions(gates: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Contextual positions ``p_ij = sum_{t=j}^{i} g_it`` (Golovneva et al. 2024, Eq. 4).

    Args:
        gates: ``g_ij`` of shape ``(..., Lq, Lk)``, for keys ``k_pos`` ordered by position.
        q_pos: query positions ``(Lq,)``.
        k_pos: key positions ``(Lk,)``, increasing.

    Returns:
        ``p`` of the shape of ``gates``; 0 where the key is in the query's future.
    """
    # future keys must not count: zero their gates *before* the sum, or t > i would enter p_ij
    future = k_pos[None, :] > q_pos[:, None]  # (Lq, Lk)
    g = gates.masked_fill(future, 0.0)
    # sum over t >= j of the (now causal) gates: a cumulative sum from the right
    return g.flip(-1).cumsum(-1).flip(-1)


@register("cope")
class CoPE(PositionalEncoder):
    """Gated, content-counted positions with interpolated learned embeddings (Golovneva et al. 2024).

    As in the paper's code, the gate reads the attention logit the model
    actually uses, ``q . k / sqrt(d)`` (Eq. 3 writes ``q . k``; the code scales it
    before the sigmoid), and the position term ``q . e[p]`` is added unscaled.
    The table ``e`` is shared by the heads and starts at zero, as in the paper's
    code, so the model starts out as NoPE; one encoder module serves every layer,
    so it is shared by the layers too (the authors' code has one per attention layer).

    Args:
        d_model: model width.
        n_heads: attention heads; each computes its own gates and positions.
        npos_max: entries in the table ``e``, >= 2; counts beyond ``npos_max - 1``
            take the last entry. A count never exceeds ``i - j + 1``, so the
            training length is enough for every count seen in training.
    """

    description = "CoPE: positions count gated tokens, p_ij = sum_t sigmoid(q_i.k_t), q.e[p] (Golovneva et al. 2024)"
    relative = True  # positions are counts of gated keys between j and i, never token indices

    def __init__(self, d_model: int, n_heads: int, npos_max: int = 64):
        super().__init__(d_model, n_heads)
        require(npos_max >= 2, "encoder.npos_max",
                f"must be >= 2, the number of integer positions with an embedding (got {npos_max})")
        self.npos_max = int(npos_max)
        self.pos_emb = nn.Parameter(torch.zeros(self.head_dim, self.npos_max))  # e[p] is column p

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, Lq, Lk), as the attention sees them
        positions = cope_positions(torch.sigmoid(logits), q_pos, k_pos).clamp(max=self.npos_max - 1)
        # z_i[p] = q_i . e[p] for integer p, then interpolate between floor and ceil (Eq. 5 moved past the dot)
        z = q @ self.pos_emb.to(q.dtype)  # (B, H, Lq, npos_max)
        lo, hi = positions.floor(), positions.ceil()
        w = positions - lo  # weight of the ceiling entry; its gradient flows back into the gates
        return z.gather(-1, hi.long()) * w + z.gather(-1, lo.long()) * (1 - w)  # (B, H, Lq, Lk)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, npos_max={self.npos_max}"
