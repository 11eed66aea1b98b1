"""Normalized position encoding: the index divided by the sequence length.

The second naive design (Kazemnejad 2019, "Transformer Architecture: The Positional Encoding",
kazemnejad.com/blog/transformer_architecture_positional_encoding, the [0, 1] range option): to bound the integer
code, map positions into ``[0, 1]``, ``p_n = n / (L - 1)`` for a sequence of ``L``
tokens, so three tokens read ``[0, 0.5, 1]`` and four read ``[0, 0.33, 0.67, 1]``.
As with :mod:`posexp.encoders.integer` the scalar is placed along a learned direction.

Its flaw is the point of including it: the code of a position depends on the
length of the sequence it sits in, so one step between neighbours means
``1/(L-1)`` of the range, a different amount for every ``L``. A model trained at
one length reads positions wrongly at every other length, including shorter ones.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder


@register("normalized")
class NormalizedPosition(PositionalEncoder):
    """Adds ``pos / (L - 1) * w`` to each token embedding, ``L = len(pos)`` of the current forward.

    Args:
        d_model: model width.
        n_heads: attention heads (unused).
    """

    description = "Normalized: index / (L - 1) in [0, 1] times a learned direction; depends on L (naive baseline)"

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.direction = nn.Parameter(torch.empty(d_model))
        # GPT-2's embedding initialisation: the last position starts at the scale of a token embedding
        nn.init.normal_(self.direction, mean=0.0, std=0.02)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        L = pos.shape[0]
        # n / (L - 1); a single token has nothing to be normalised against and reads 0
        span = max(L - 1, 1)
        code = pos.to(x.dtype)[:, None] / span * self.direction.to(x.dtype)[None, :]  # (L, D)
        return x + code
