"""Integer position encoding: the raw token index as a feature.

The first naive design every survey of position encodings starts from (Kazemnejad 2019, "Transformer
Architecture: The Positional Encoding", kazemnejad.com/blog/transformer_architecture_positional_encoding, the
integer option; Su 2021, "让研究人员绞尽脑汁的Transformer位置编码", kexue.fm/archives/8130): give each token one
more feature that holds its index, ``0, 1, 2, ...``. Inside a fixed model width that feature is a direction ``w``
of the residual stream, so token ``n`` receives ``x_n + n * w``.

It shows why the field moved on: the code is unbounded, so positions past the
training length put values into the residual stream that the model never saw,
and even within it the last positions dwarf the token embeddings.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder


@register("integer")
class IntegerPosition(PositionalEncoder):
    """Adds ``pos * w`` to each token embedding, with ``w`` a learned direction.

    ``w`` is learned rather than fixed (a fixed axis would be the textbook
    "extra feature"): it gives the encoding its best chance, since training can
    pick the scale at which the index is least harmful. It still cannot bound
    the code: at ``16 x`` the training length the feature is 16 times larger
    than anything seen in training.

    Args:
        d_model: model width.
        n_heads: attention heads (unused).
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Integer: the raw index times a learned direction, pos * w; unbounded (naive baseline)"

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        # GPT-2's embedding initialisation: position 1 starts at the scale of a token embedding
        self.direction = nn.Parameter(torch.empty(d_model))
        nn.init.normal_(self.direction, mean=0.0, std=0.02)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        # x_n + n * w: the index itself is the feature
        code = pos.to(x.dtype)[:, None] * self.direction.to(x.dtype)[None, :]  # (L, D)
        return x + code
