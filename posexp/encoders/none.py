"""NoPE: no positional encoding at all.

A causal decoder can still infer position from the causal mask alone
(Haviv et al. 2022, "Transformer Language Models without Positional Encodings
Still Learn Positional Information"; Kazemnejad et al. 2023, "The Impact of
Positional Encoding on Length Generalization in Transformers").
"""

from __future__ import annotations

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder


@register("none")
class NoPE(PositionalEncoder):
    """No positional information: attention sees only content and the causal mask."""

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "NoPE: no position signal; order comes only from the causal mask (Kazemnejad et al. 2023)"
    relative = True  # vacuously: no position enters at all

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
