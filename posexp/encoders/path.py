"""PaTH: position encoding through accumulated, data-dependent Householder transformations.

Yang, Shen, Wen, Tan, Mishra, Ren, Panda and Kim 2025, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations", §3. Each token ``t`` defines a Householder-like matrix from its content,

* ``H_t = I - beta_t w_t w_t^T``, with ``w_t`` a unit vector and ``beta_t = 2 sigmoid(.)`` in ``(0, 2)``, both
  read from the token's input: ``H_t`` scales ``w_t`` by ``1 - beta_t`` in ``(-1, 1)`` (negative eigenvalues
  allowed, as the paper argues for) and keeps its orthogonal complement; at ``beta_t = 2`` it is a reflection,
  an orthogonal matrix,
* ``logit_ij = q_i^T (prod_{j < t <= i} H_t) k_j / sqrt(d)``, the product ordered ``H_i H_{i-1} ... H_{j+1}``,

so RoPE's fixed rotation by ``i - j`` becomes a product of transforms of the tokens between key and query.
The authors' reference (flash-linear-attention's ``naive_path_attn``) transforms a query by ``H_i``, then
``H_{i-1}``, ... as it walks back over the keys; so does :func:`path_logits`, every query of a block at once,
one step of distance at a time: ``O(L^2 d)`` work in ``L`` small steps, with nothing ``L x L`` but the block's
own logits. The paper's UT-transform kernel is not implemented: this encoder has no fused form (a CPU-sized
reference; ``posexp check path`` measures it about 7x slower than RoPE at the default shape).

One simplification of the paper's layer: ``w`` is a full linear map of the input (the paper's is low rank,
followed by a short convolution over three tokens). Every layer has its own maps, as in the paper. posexp passes
the logits through the ``transform`` hook, since ``H_t`` reads the content.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import ContentLogits, PositionalEncoder, layer_copies


def path_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, start: int) -> Tensor:
    """``q_i^T H_i H_{i-1} ... H_{j+1} k_j`` for queries ``start .. start + Lq - 1`` and keys ``0 .. Lk - 1``
    (Yang et al. 2025, §3), unscaled, ``(B, H, Lq, Lk)``; entries of future keys (``j > i``) are finite filler.

    Args:
        q: the block's queries ``(B, H, Lq, Dh)``, rows ``start ..`` of the sequence.
        k: keys ``(B, H, Lk, Dh)``, rows ``0 .. Lk - 1``, with ``Lk = start + Lq``.
        w: unit Householder directions ``(B, H, Lk, Dh)`` of the same tokens as ``k``.
        beta: their strengths ``(B, H, Lk)``; 0 gives plain dot products (NoPE).
    """
    Lq, Lk = q.shape[-2], k.shape[-2]
    logits = _PathByDistance.apply(q, k, w, beta, start)  # (B, H, Lq, Lk) indexed by distance i - j
    rows = torch.arange(start, start + Lq, device=q.device)
    distance = (rows[:, None] - torch.arange(Lk, device=q.device)[None, :]).clamp(0, Lk - 1)  # (Lq, Lk)
    return logits.gather(-1, distance.expand(*logits.shape[:-1], Lk))


def _padded(k: Tensor, w: Tensor, beta: Tensor, pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """``k``, ``w``, ``beta`` after ``pad`` tokens of zeros (``k = 0``: a filler logit; ``w = 0``: ``H = I``), so
    that distance ``d`` of every query of a block is one contiguous slice: query ``r`` meets key ``start + r - d``."""
    return F.pad(k, (0, 0, pad, 0)), F.pad(w, (0, 0, pad, 0)), F.pad(beta, (pad, 0))


class _PathByDistance(torch.autograd.Function):
    """The logits of a query block by distance ``d = i - j``, walking each query back over the keys as the
    authors' reference does: ``v <- H_j v`` after meeting key ``j``. The backward walks the same steps in
    reverse by hand (``H_j`` is symmetric), about 1.5x faster on a CPU than autograd's graph of ``Lk`` small
    steps, whose per-operation cost dominates at posexp's sizes."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, w: Tensor, beta: Tensor, start: int) -> Tensor:
        Lq, Lk = q.shape[-2], k.shape[-2]
        pad = Lq - 1
        kp, wp, bp = _padded(k, w, beta, pad)
        v, states, by_distance = q, [], []
        for d in range(Lk):
            lo, hi = pad + start - d, pad + start + Lq - d
            states.append(v)
            by_distance.append((v * kp[..., lo:hi, :]).sum(-1))  # q_i^T (H_i ... H_{j+1}) k_j with j = i - d
            if d + 1 < Lk:
                w_d = wp[..., lo:hi, :]
                v = v - (bp[..., lo:hi] * (v * w_d).sum(-1)).unsqueeze(-1) * w_d  # H_j v, before key j - 1
        # the walked queries are kept for a backward only: at evaluation nothing Lk x Lq x Dh is held
        kept = torch.stack(states) if any(ctx.needs_input_grad[:4]) else q.new_empty(0)
        ctx.save_for_backward(kp, wp, bp, kept)
        ctx.start = start
        return torch.stack(by_distance, dim=-1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        kp, wp, bp, states = ctx.saved_tensors
        start, Lk, Lq = ctx.start, states.shape[0], states.shape[-2]
        pad = Lq - 1
        g_k, g_w, g_beta = torch.zeros_like(kp), torch.zeros_like(wp), torch.zeros_like(bp)
        g_v = torch.zeros_like(states[0])
        for d in reversed(range(Lk)):
            lo, hi = pad + start - d, pad + start + Lq - d
            v = states[d]
            if d + 1 < Lk:  # through v' = v - beta (v . w) w
                w_d, b_d = wp[..., lo:hi, :], bp[..., lo:hi]
                g_dot_w, v_dot_w = (g_v * w_d).sum(-1), (v * w_d).sum(-1)
                g_beta[..., lo:hi] -= v_dot_w * g_dot_w
                g_w[..., lo:hi, :] -= b_d.unsqueeze(-1) * (g_dot_w.unsqueeze(-1) * v + v_dot_w.unsqueeze(-1) * g_v)
                g_v = g_v - (b_d * g_dot_w).unsqueeze(-1) * w_d
            g_logit = grad[..., d].unsqueeze(-1)  # through logit = v . k
            g_k[..., lo:hi, :] += g_logit * v
            g_v = g_v + g_logit * kp[..., lo:hi, :]
        return g_v, g_k[..., pad:, :], g_w[..., pad:, :], g_beta[..., pad:], None


@register("path")
class PaTH(PositionalEncoder):
    """Keys and queries meet through the product of the Householder transforms of the tokens between them.

    As in the authors' layer, ``beta_t = 2 sigmoid(W_beta x_t + b)`` and ``w_t = W_w x_t`` normalised to unit
    length per head, with weights ``N(0, 0.02)`` and ``b = 0`` (every ``beta`` starts at 1).

    Args:
        d_model: model width ``D``; ``w`` and ``beta`` read the layer's normalised input ``x (B, L, D)``.
        n_heads: attention heads, each with its own ``w_t`` and ``beta_t``.
    """

    description = "PaTH: q_i^T (H_i ... H_{j+1}) k_j, H_t = I - beta_t w_t w_t^T from the content (Yang et al. 2025)"
    relative = True  # no position index enters: only the tokens between key and query
    revision = 2  # 2: encoder.lr_mult on every layer's projections (1: on the first layer's only)

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.direction = nn.Linear(d_model, d_model, bias=False)  # w_t of every head
        self.strength = nn.Linear(d_model, n_heads)  # beta_t of every head, before 2 sigmoid
        nn.init.normal_(self.direction.weight, std=0.02)
        nn.init.normal_(self.strength.weight, std=0.02)
        nn.init.zeros_(self.strength.bias)
        self.other_layers = nn.ModuleList()  # the maps of layers 2 .. n_layers (for_layers)

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        return layer_copies(self, self.other_layers, n_layers, lambda: PaTH(self.d_model, self.n_heads))

    def householder(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Unit directions ``w (B, H, L, Dh)`` and strengths ``beta (B, H, L)`` in ``(0, 2)`` of ``x (B, L, D)``."""
        B, L, _ = x.shape
        w = F.normalize(self.direction(x).view(B, L, self.n_heads, self.head_dim).transpose(1, 2), dim=-1)
        beta = 2 * torch.sigmoid(self.strength(x)).transpose(1, 2)
        return w, beta

    def transform(self, x: Tensor, q: Tensor, k: Tensor, pos: Tensor) -> ContentLogits:
        w, beta = self.householder(x)
        scale = 1 / math.sqrt(q.shape[-1])  # the model's q . k / sqrt(Dh)

        def logits(start: int, end: int) -> Tensor:
            qb, kb = q[..., start:end, :], k[..., :end, :]
            path = path_logits(qb, kb, w[..., :end, :].to(q.dtype), beta[..., :end].to(q.dtype), start)
            return (path - qb @ kb.transpose(-1, -2)) * scale  # the model adds q . k / sqrt(Dh) itself

        return logits


__all__ = ["PaTH", "path_logits"]
