"""FIRE: functional interpolation for relative positions.

Li et al. 2024 (ICLR; arXiv 2023), "Functional Interpolation for Relative
Positions Improves Long Context Transformers". The logit bias of query
``i`` and key ``j`` is a learned function of their normalised distance::

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1)

* ``f_theta`` is a small MLP, ``1 -> width -> H`` (one output per head);
* ``psi`` is a learned log transform that spends resolution on short distances;
* the division by ``psi(i)`` is the *progressive interpolation*: the input is in
  ``[0, 1]`` for every query at every length (a query past ``L`` maps its
  farthest key, ``j = 0``, to exactly 1), so a long context shows the MLP inputs
  from the range it was trained on instead of distances it never saw;
* the learned threshold ``L`` stops short prefixes (small ``i``) from being
  stretched over the whole range: while ``i < L`` the bias is a fixed function of
  ``i - j`` alone.

The paper proves the form can express T5's buckets, ALiBi and KERPLE; it makes
no claim about the shape at initialisation, so nothing here forces the bias to
decay with distance.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, ScoreMod, bias_score_mod, relative_distance
from posexp.errors import require

# keeps the ratio finite if c or L is driven to 0 (then psi(max(L, 0)) = 0 for the first query)
EPS = 1e-6


@register("fire")
class FIRE(PositionalEncoder):
    """Learned MLP of the progressively normalised log distance (Li et al. 2024).

    The bias also comes as a FlexAttention ``score_mod`` (the normalised distance and the MLP's
    output for the logit's head, computed per logit), which the model uses for fused attention on
    CUDA (:mod:`posexp.model.fused`).

    ``c`` and ``L`` are learned, as in the paper, and enter through ``|c|`` and
    ``|L|`` (the authors' implementation does the same) so any value the optimiser
    reaches is admissible. ``L`` is stored as ``init_threshold * s`` with a learned
    multiplier ``s`` starting at 1, so the optimiser moves it in relative steps.

    Args:
        d_model: model width.
        n_heads: attention heads; the MLP has one output per head.
        mlp_width: hidden units of ``f_theta`` (32 in the paper), >= 1.
        init_c: initial ``c`` of ``psi(x) = log(c x + 1)`` (0.1 in the paper), > 0.
        init_threshold: initial ``L`` (512 in the paper), > 0. Queries before ``L``
            see a purely relative bias; after it, progressive interpolation.
    """

    # Its fused backward captures one gradient table per hidden unit and head (3 x mlp_width + 3 of them): on an
    # H200 (torch 2.11, bf16) Inductor's compile of that kernel had not finished after 8 minutes, so by default
    # FIRE trains on the blocked path on CUDA and evaluates fused (scripts/study_gpu.md)
    fused_training = False
    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions

    description = "FIRE: MLP of log distance normalised by log(max(L, i)), learned c and L (Li et al. 2024)"
    # not relative: past the threshold L the distance is normalised by psi(i), the query's own position

    def __init__(self, d_model: int, n_heads: int, mlp_width: int = 32, init_c: float = 0.1,
                 init_threshold: float = 512.0):
        super().__init__(d_model, n_heads)
        require(mlp_width >= 1, "encoder.mlp_width", f"must be a positive integer (got {mlp_width})")
        require(init_c > 0, "encoder.init_c", f"must be > 0, psi(x) = log(c x + 1) (got {init_c:g})")
        require(init_threshold > 0, "encoder.init_threshold",
                f"must be > 0, the query position L where interpolation starts (got {init_threshold:g})")
        self.init_threshold = float(init_threshold)
        # f_theta: R -> R^H, one hidden ReLU layer (Li et al. 2024); PyTorch's default init
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, n_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.threshold_multiplier = nn.Parameter(torch.tensor(1.0))

    @property
    def threshold(self) -> Tensor:
        """The learned threshold ``L``, a scalar tensor."""
        return (self.threshold_multiplier * self.init_threshold).abs()

    def psi(self, x: Tensor) -> Tensor:
        """``psi(x) = log(|c| x + 1)`` for ``x >= 0``."""
        return torch.log1p(self.c.abs() * x)

    def normalized_distance(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The MLP's input ``psi(i - j) / psi(max(L, i))``, ``(Lq, Lk)``, in ``[0, 1]`` for ``j <= i``."""
        dtype = self.c.dtype
        # future keys get distance 0 (the model masks them): psi of a negative distance could be NaN,
        # and a NaN, even masked, would poison the MLP's weight gradients
        dist = relative_distance(q_pos, k_pos).clamp(min=0).to(dtype)  # (Lq, Lk)
        normaliser = self.psi(torch.maximum(q_pos.to(dtype), self.threshold))  # (Lq,)
        return self.psi(dist) / (normaliser[:, None] + EPS)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        x = self.normalized_distance(q_pos, k_pos)  # (Lq, Lk)
        return self.mlp(x[..., None]).permute(2, 0, 1)  # (Lq, Lk, 1) -> (Lq, Lk, H) -> (H, Lq, Lk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        first, last = self.mlp[0], self.mlp[2]
        n_heads, width = last.out_features, first.out_features
        # FlexAttention's backward (PyTorch 2.11) differentiates a learned tensor the score_mod reads only if it
        # is indexed once per logit and is not 0-d: so every value is a per-head table read once, by the
        # logit's head h, and each hidden unit u has its own tables (clones: gradients flow back to the MLP)
        per_head = lambda t: t.expand(n_heads).clone()  # noqa: E731 - a scalar as an (H,) table
        c, threshold = per_head(self.c.abs()), per_head(self.threshold)
        w1 = [per_head(first.weight[u, 0]) for u in range(width)]  # (H,) each, every entry the same
        b1 = [per_head(first.bias[u]) for u in range(width)]
        w2 = [last.weight[:, u].clone() for u in range(width)]  # (H,)
        b2 = last.bias
        dtype = self.c.dtype

        def bias_at(h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            # normalized_distance and the MLP for head h alone: psi(i - j) / psi(max(L, i)) -> f_theta(x)[h]
            c_h = c[h]
            normaliser = torch.log1p(c_h * torch.maximum(i.to(dtype), threshold[h])) + EPS
            x = torch.log1p(c_h * (i - j).clamp(min=0).to(dtype)) / normaliser
            # the hidden layer unrolled, a sum of scalars: a score_mod's arithmetic must stay elementwise
            # to compile into FlexAttention's kernel
            out = b2[h]
            for u in range(width):
                out = out + torch.relu(x * w1[u][h] + b1[u][h]) * w2[u][h]
            return out

        return bias_score_mod(bias_at, q_pos, k_pos)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mlp_width={self.mlp[0].out_features}"
