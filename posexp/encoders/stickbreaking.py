"""Stick-breaking attention: each query breaks a stick from its nearest key backwards, in place of softmax.

Tan, Yang, Courville, Panda and Shen 2025, "Scaling Stick-Breaking Attention: An Efficient Implementation
and In-depth Study" (ICLR 2025), §2, the attention weights as written here. With ``beta_ij = sigmoid(z_ij)`` of the logit
``z_ij = q_i . k_j / sqrt(d)``, query ``i`` gives key ``j < i``

    ``A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik)``

the share of the stick the keys closer than ``j`` left over, so the nearest key with a large logit takes the
mass (a recency bias from the order alone: no position encoding), and ``sum_j A_ij <= 1`` with no
normalisation over the row. As in the authors' code (``o = A v + (1 - sum_j A_ij) v_i``, the released
kernels' "remainder" added to the query's own value), what is left of the stick goes to the query's own token:
its weight is ``prod_{k < i} (1 - beta_ik)``, computed as that product so it is exact, not ``1 - sum``.

Computed in log space, as the paper's reference does: ``log A_ij = log sigmoid(z_ij) + sum_{j<k<i} log
sigmoid(-z_ik)``, the inner sum a cumulative sum from the right. A masked key (logit ``-inf``: the future, or
outside ``eval.window``) has ``beta = 0``: it takes nothing and leaves the stick whole.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder


def stick_breaking_weights(logits: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Stick-breaking attention weights (Tan et al. 2025, §2), ``(..., Lq, Lk)``, the remainder on the diagonal.

    Args:
        logits: ``z (..., Lq, Lk)``, ``-inf`` where a key is masked; keys ordered by position.
        q_pos: query positions ``(Lq,)``; each query's own key is the one at its position.
        k_pos: key positions ``(Lk,)``, increasing.
    """
    earlier = k_pos[None, :] < q_pos[:, None]  # (Lq, Lk): the keys a stick is broken over
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # the paper's reference: at least fp32
    z = z.masked_fill(~earlier, float("-inf"))
    log_keep = F.logsigmoid(-z)  # log (1 - beta_ik); 0 for a masked key
    # sum over the keys after j (closer to the query): a cumulative sum from the right, shifted by one key
    after = F.pad(log_keep.flip(-1).cumsum(-1).flip(-1)[..., 1:], (0, 1))
    weights = (F.logsigmoid(z) + after).exp()  # A_ij; exp(-inf) = 0 for masked keys
    left = log_keep.sum(-1, keepdim=True).exp()  # prod_{k < i} (1 - beta_ik): the stick no earlier key took
    own = k_pos[None, :] == q_pos[:, None]
    return torch.where(own, left, weights).to(logits.dtype)


@register("stickbreaking")
class StickBreaking(PositionalEncoder):
    """Stick-breaking attention (Tan et al. 2025): no position encoding; the order of the keys, through the
    stick each query breaks from its nearest key backwards, is the only position signal.

    Args:
        d_model: model width.
        n_heads: attention heads; each breaks its own stick.
    """

    description = "Stick-breaking: A_ij = sigmoid(z_ij) prod_{j<k<i} (1 - sigmoid(z_ik)) replaces softmax (Tan et al. 2025)"
    relative = True  # no position index enters; only the keys' order

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)

    def normalise(self, logits: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return stick_breaking_weights(logits, q_pos, k_pos)


__all__ = ["StickBreaking", "stick_breaking_weights"]
