"""FoX: forgetting attention, softmax attention with a forget gate.

Lin, Nikishin, He and Courville 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate"
(ICLR 2025), §2. Each head computes a scalar forget gate from the content of each token,

* forget gate:  ``f_t = sigmoid(w_h . x_t + b_h)``
* decay bias:   ``D_ij = sum_{l = j+1}^{i} log f_l = c_i - c_j`` with ``c_t = sum_{l <= t} log f_l``
* attention:    ``softmax(q_i . k_j / sqrt(d) + D_ij)``

so a key's logit decays by every gate between it and the query: ``D <= 0``, 0 on the diagonal, non-increasing
with distance but at a rate the content sets, and position enters only through this decay (the paper's FoX uses
no RoPE: NoPE otherwise). The authors' code forms the same difference of cumulative sums,
``log_lambda = cumsum(log_fgate)``, ``bias = log_lambda[:, None] - log_lambda[None, :]``; its optimizer decays the
gate's weights as every other matrix of the model and not its biases, and so does posexp's trainer.

posexp passes the gate through the ``transform`` hook, since it reads the layer's input ``x``, not positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import ContentLogits, PositionalEncoder, layer_copies
from posexp.errors import require


def forget_bias(log_f: Tensor, start: int, end: int) -> Tensor:
    """``D_ij = sum_{l=j+1}^{i} log f_l`` for queries ``start .. end - 1`` and keys ``0 .. end - 1``
    (Lin et al. 2025, §2), ``(B, H, end - start, end)``.

    Args:
        log_f: log forget gates ``(B, H, L)``, each ``<= 0``.

    Returns:
        ``c_i - c_j`` with ``c`` the cumulative sum of ``log_f``; on and below the diagonal the sum of the gates
        strictly after ``j`` up to ``i``. Future keys (``j > i``) hold positive values the model masks.
    """
    c = log_f[..., :end].cumsum(-1)  # (B, H, end): c_t = sum_{l <= t} log f_l, reads nothing past end - 1
    return c[..., start:end, None] - c[..., None, :]


@register("fox")
class ForgettingAttention(PositionalEncoder):
    """A per-head forget gate from the content; the attention logits decay by the gates' cumulative log.

    As in the authors' code, the gate is a linear map of the layer's input with weights ``N(0, 0.02)`` and a
    bias starting at 0 (every gate starts near ``sigmoid(0) = 1/2``, a decay the model then learns: the paper
    finds heads that keep long memories and heads that forget fast). Every layer has its own gate, as in the
    paper: this encoder serves the first layer and builds one copy per further layer (:meth:`for_layers`).

    Args:
        d_model: model width ``D``; the gate reads the layer's normalised input ``x (B, L, D)``.
        n_heads: attention heads, one gate each.
        init_bias: initial ``b_h`` of every head, so the initial gate is ``sigmoid(init_bias)`` (default 0, the
            authors' code; e.g. 3 starts at ``f ~ 0.95``, a decay of ``e^-0.05`` per token). Any real number.
    """

    description = "FoX: forgetting attention, logits + sum of log sigmoid forget gates from the content (Lin et al. 2025)"
    relative = True  # the bias reads content only, never a position index
    # the authors' group_parameters (forgetting_transformer/utils.py) decays every nn.Linear weight, fgate_proj's
    # too, and no bias (train.bias_weight_decay: false)
    weight_decay = True
    # 2: the gates' weights decayed as the authors', encoder.lr_mult on every layer's (1: neither, the first's only)
    revision = 2

    def __init__(self, d_model: int, n_heads: int, init_bias: float = 0.0):
        super().__init__(d_model, n_heads)
        require(isinstance(init_bias, (int, float)) and not isinstance(init_bias, bool)
                and abs(float(init_bias)) < 1e4, "encoder.init_bias",
                f"must be a real number, the forget gate's initial logit (got {init_bias!r})")
        self.gate = nn.Linear(d_model, n_heads)  # w_h, b_h of every head
        nn.init.normal_(self.gate.weight, std=0.02)
        nn.init.constant_(self.gate.bias, float(init_bias))
        self.init_bias = float(init_bias)
        self.other_layers = nn.ModuleList()  # the gates of layers 2 .. n_layers (for_layers)

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        return layer_copies(self, self.other_layers, n_layers,
                            lambda: ForgettingAttention(self.d_model, self.n_heads, self.init_bias))

    def log_forget(self, x: Tensor) -> Tensor:
        """``log f_t = log sigmoid(w_h . x_t + b_h)`` (Lin et al. 2025, §2), ``(B, H, L)``, for ``x (B, L, D)``."""
        logit = self.gate(x)
        # at least fp32 (as the authors' code), so bf16 rounding does not accumulate over the cumulative sum
        return F.logsigmoid(logit.to(torch.promote_types(logit.dtype, torch.float32))).transpose(1, 2)

    def transform(self, x: Tensor, q: Tensor, k: Tensor, pos: Tensor) -> ContentLogits:
        log_f = self.log_forget(x)

        def logits(start: int, end: int) -> Tensor:
            return forget_bias(log_f, start, end)

        return logits

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gates={self.n_heads} per layer"


__all__ = ["ForgettingAttention", "forget_bias"]
