"""CABLE: context-aware biases for length extrapolation.

"Context-aware Biases for Length Extrapolation" (CABLE, 2025; code: github.com/axiomlab/Cable, ``src/Cable.py``).
Each head learns a non-negative bias per token from the token's content and the attention logits are penalised by
the biases of every token between key and query:

* per-token bias:   ``beta_t = softplus(w_h . x_t + b_h) >= 0``
* cumulative:       ``B_t = - sum_{l <= t} beta_l``
* attention:        ``softmax(q_i . k_j / sqrt(d) + B_i - B_j)``, i.e. ``- sum_{l = j+1}^{i} beta_l``

so, like ALiBi, a key's logit falls with its distance, but by a slope the content sets token by token (ALiBi is
the special case ``beta_t = m_h`` for every token). No other position signal (NoPE otherwise), as in the authors'
model, which has no position embedding. As the authors' code, the biases are a linear map of the layer's input
(``h_attn = nn.Linear(n_embd, n_head)``, weights ``N(0, 0.02)``, bias 0), one map per layer; the weights are
weight-decayed as the model's matrices, the biases not, as the authors' ``configure_optimizers`` does.

Where posexp differs: the authors' attention omits the ``1 / sqrt(d)`` of the scores (their scale is
``sqrt(C / n_embd) = 1``); here the content logits keep the model's ``1 / sqrt(d)`` and the bias is added to them,
as every other bias in posexp is. The form of the bias is the authors' exactly.

posexp passes the biases through the ``transform`` hook, as FoX's gates, since they read the layer's input ``x``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import ContentLogits, PositionalEncoder, layer_copies
from posexp.encoders.fox import forget_bias
from posexp.errors import require


@register("cable")
class Cable(PositionalEncoder):
    """A per-head, per-token non-negative bias from the content; logits fall by the biases between key and query.

    Args:
        d_model: model width ``D``; the biases read the layer's normalised input ``x (B, L, D)``.
        n_heads: attention heads, one bias each.
        init_bias: initial ``b_h`` of every head (default 0, the authors' code: ``softplus(0) = log 2`` per token
            at the start, which the model then learns). Any real number.
    """

    description = "CABLE: context-aware biases, logits - sum of softplus token biases between key and query"
    relative = True  # the bias reads content only, never a position index
    # the authors' configure_optimizers (src/Cable.py) decays every tensor of 2+ dimensions, h_attn's weight too
    weight_decay = True
    # 2: the maps' weights decayed as the authors', encoder.lr_mult on every layer's (1: neither, the first's only)
    revision = 2

    def __init__(self, d_model: int, n_heads: int, init_bias: float = 0.0):
        super().__init__(d_model, n_heads)
        require(isinstance(init_bias, (int, float)) and not isinstance(init_bias, bool)
                and abs(float(init_bias)) < 1e4, "encoder.init_bias",
                f"must be a real number, the token bias's initial logit (got {init_bias!r})")
        self.proj = nn.Linear(d_model, n_heads)  # the authors' h_attn: w_h, b_h of every head
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.constant_(self.proj.bias, float(init_bias))
        self.init_bias = float(init_bias)
        self.other_layers = nn.ModuleList()  # the biases of layers 2 .. n_layers (for_layers)

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        return layer_copies(self, self.other_layers, n_layers,
                            lambda: Cable(self.d_model, self.n_heads, self.init_bias))

    def token_bias(self, x: Tensor) -> Tensor:
        """``-softplus(w_h . x_t + b_h)`` (CABLE's per-token bias, negated), ``(B, H, L)``, for ``x (B, L, D)``."""
        logit = self.proj(x)
        # at least fp32, so bf16 rounding does not accumulate over the cumulative sum
        return -F.softplus(logit.to(torch.promote_types(logit.dtype, torch.float32))).transpose(1, 2)

    def transform(self, x: Tensor, q: Tensor, k: Tensor, pos: Tensor) -> ContentLogits:
        neg_beta = self.token_bias(x)

        def logits(start: int, end: int) -> Tensor:
            return forget_bias(neg_beta, start, end)  # B_i - B_j, the same difference of cumulative sums as FoX

        return logits

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, biases={self.n_heads} per layer"


__all__ = ["Cable"]
