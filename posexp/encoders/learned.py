"""Learned absolute position embeddings.

One trained vector per position, added to the token embedding: Gehring et al.
2017, "Convolutional Sequence to Sequence Learning", §3.1, and GPT-2 (Radford
et al. 2019, "Language Models are Unsupervised Multitask Learners"). Positions
past the table were never seen, so the encoding cannot represent them at all.
"""

from __future__ import annotations

from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.base import PositionalEncoder
from posexp.errors import require


@register("learned")
class Learned(PositionalEncoder):
    """A trained table of ``max_length`` position vectors added to the token embeddings.

    Args:
        d_model: model width.
        n_heads: attention heads (unused).
        max_length: rows in the table, the longest sequence it can encode; > 0.
            The configs set it to the training length, since rows beyond it
            would never receive a gradient.
    """

    description = "Learned: a trained vector per position up to max_length (GPT-2; Gehring et al. 2017)"

    def __init__(self, d_model: int, n_heads: int, max_length: int = 1024):
        super().__init__(d_model, n_heads)
        require(max_length > 0, "encoder.max_length", f"must be a positive integer (got {max_length})")
        self.max_length = int(max_length)
        self.wpe = nn.Embedding(self.max_length, d_model)
        # GPT-2's initialisation; the model leaves encoder parameters to the encoder
        nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        # nn.Embedding would fail with a bare index error; say which limit was hit instead
        if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= self.max_length):
            raise ValueError(
                f"learned position embeddings cover positions 0..{self.max_length - 1}, "
                f"got positions {int(pos.min())}..{int(pos.max())}; check supports(length) first"
            )
        return x + self.wpe(pos).to(x.dtype)
