"""Binary position encoding: the bits of the index, projected to the model width.

The third naive design (Kazemnejad 2019, "Transformer Architecture: The Positional Encoding",
kazemnejad.com/blog/transformer_architecture_positional_encoding, the binary option): write position ``n`` in
binary, ``b_k(n) = floor(n / 2^k) mod 2`` for ``k = 0 .. bits-1`` (least
significant bit first), and feed that 0/1 vector to the model. Every feature is
bounded and ``2^bits`` positions get distinct codes, fixing the integer code's
growth and the normalized code's dependence on length.

What it gets wrong, and sinusoids later fix: the code is discrete, so
neighbouring positions can differ in many bits at once (7 = 0111, 8 = 1000), and
neither Hamming nor Euclidean distance between codes follows ``|m - n|``. Bits
that never switch on within the training length (bit ``k`` for
``2^k >= train_len``) keep their initial projection, so longer contexts meet
untrained directions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, check_position_range
from posexp.errors import require


def binary_code(pos: Tensor, bits: int) -> Tensor:
    """The 0/1 bits of each position, least significant first, ``(L, bits)`` float32.

    Args:
        pos: non-negative integer positions ``(L,)``.
        bits: how many bits to keep; positions from ``2^bits`` on would alias.
    """
    powers = 2 ** torch.arange(bits, device=pos.device, dtype=torch.long)  # (bits,)
    return ((pos.long()[:, None] // powers[None, :]) % 2).to(torch.float32)


@register("binary")
class BinaryPosition(PositionalEncoder):
    """Adds ``W b(pos)`` to each token embedding: the position's bits through a learned projection.

    Args:
        d_model: model width.
        n_heads: attention heads (unused).
        bits: bits of the index that are encoded, >= 1. ``2^bits`` positions can be
            told apart, so that is the encoding's ``max_length``; longer sequences
            are reported "not applicable" instead of silently wrapping around.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Binary: the index's bits through a learned projection; 2^bits positions (naive baseline)"

    def __init__(self, d_model: int, n_heads: int, bits: int = 16):
        super().__init__(d_model, n_heads)
        require(bits >= 1, "encoder.bits", f"must be a positive integer, the number of bits of the index (got {bits})")
        require(bits <= 62, "encoder.bits", f"must be <= 62 so that 2^bits fits a 64-bit index (got {bits})")
        self.bits = int(bits)
        self.max_length = 2**self.bits
        self.proj = nn.Linear(self.bits, d_model, bias=False)
        # GPT-2's embedding initialisation, per bit: one set bit adds a token-embedding-sized vector
        nn.init.normal_(self.proj.weight, mean=0.0, std=0.02)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        check_position_range(pos, self.max_length, f"{self.bits} bits encode")
        code = binary_code(pos, self.bits).to(self.proj.weight.dtype)  # (L, bits)
        return x + self.proj(code).to(x.dtype)  # (B, L, D)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, bits={self.bits}"
