"""HoPE: high-frequency rotary position encoding, the low frequencies position-free.

Chen et al. 2024, "HoPE: A Novel Positional Encoding Without Long-Term Decay for Enhanced Context Awareness and
Extrapolation", §4–5. Their analysis finds that RoPE's low-frequency components, whose period is longer than the
training context, never complete a turn in training: the model uses them as a near-constant "semantic" signal that
shifts into unseen angles past the training length, and they carry most of RoPE's long-term decay. HoPE keeps the
components that complete at least one period within the training length and makes the rest position-independent::

    theta_i = base^(-2i/d)   where theta_i * train_len >= 2 pi     (high frequency: RoFormer's rotation)
    theta_i = 0              elsewhere                            (position-independent components)

so, unlike p-RoPE's fixed fraction (Barbero et al. 2024, ``encoder=prope``), the cut is set by the training
length: at the default head of 32, base 10,000 and ``train_len`` 128, 6 of the 16 pairs rotate. The kept pairs are RoPE's own
(the same cut FoPE clips its frequencies at, Hua et al. 2024, ``encoder=fope``). No long-term decay: the score's
position-free part does not fall with distance, which is the paper's titular claim.
"""

from __future__ import annotations

import math

from torch import Tensor

from posexp.encoders import register
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.rope import RoPE
from posexp.errors import require


def high_frequencies(head_dim: int, base: float, train_len: int) -> int:
    """How many of RoPE's ``head_dim / 2`` frequencies complete a period in ``train_len`` tokens:
    ``#{i : base^(-2i/d) * train_len >= 2 pi}`` (Chen et al. 2024, §5), the fastest ones."""
    theta = rope_frequencies(head_dim, base).double()
    return int((theta * train_len >= 2 * math.pi).sum())


@register("hope")
class HoPE(RoPE):
    """RoPE keeping the frequencies that complete a period within ``train_len``; the rest position-free.

    The rotation is RoPE's (features paired as halves); the position-independent pairs have ``theta_i = 0`` and
    pass through unrotated. The cut is taken once, from the unscaled schedule and the training length, so an
    evaluation-time scaling rescales the kept pairs only. Relative, as RoPE.

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: the base of the kept frequencies ``theta_i = base^(-2i/d)``; > 1.
        train_len: the training length in tokens; the yaml sets it to the run's ``train_len``.

    Raises:
        ConfigError: ``base <= 1``, an odd head width, ``train_len < 1``, or no frequency completing a period.
    """

    description = "HoPE: RoPE's high frequencies only, the rest position-independent (Chen et al. 2024)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, train_len: int = 128):
        super().__init__(d_model, n_heads, base=base)
        require(train_len >= 1, "encoder.train_len", f"must be a positive number of tokens (got {train_len})")
        self.train_len = int(train_len)
        self.n_kept = high_frequencies(self.head_dim, self.base, self.train_len)
        require(self.n_kept >= 1, "encoder.train_len",
                f"no frequency of base {self.base:g} completes a period in {self.train_len} tokens; "
                f"HoPE would keep none (use a longer train_len)")
        self.inv_freq = self.adjust_frequencies(rope_frequencies(self.rot_dim, self.base)).float()

    def adjust_frequencies(self, theta: Tensor) -> Tensor:
        """``theta`` with the pairs past the ``n_kept`` fastest set to zero (Chen et al. 2024, §5)."""
        theta = theta.clone()
        theta[self.n_kept:] = 0
        return theta

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, train_len={self.train_len} "
                f"({self.n_kept}/{self.head_dim // 2} frequencies)")


__all__ = ["HoPE", "high_frequencies"]
