"""p-RoPE: rotary position embedding without its lowest frequencies.

Barbero et al. 2024, "Round and round we go! What makes Rotary Positional Encodings useful?", §6
(p-RoPE). Their analysis of Gemma finds that the lowest RoPE frequencies rotate so slowly over a
training context that the model uses them as position-free "semantic" channels, and that those
channels are the ones that drift when the context grows. p-RoPE keeps the fraction ``p`` of the
rotary frequencies that turn fastest and sets the rest to zero::

    theta_i = base^(-2i/d)   for i <  floor(p * d/2)      (RoFormer's schedule over the whole head)
    theta_i = 0              for i >= floor(p * d/2)      (no rotation: NoPE channels)

The count is floored, as in the paper's pseudocode and Gemma's code (``int(rope_proportion * head_dim // 2)``):
at ``d = 20, p = 0.75`` p-RoPE keeps 7 of the 10 frequencies, not 8.

so ``p = 1`` is RoPE and ``p = 0`` would be NoPE. Unlike ``rope``'s ``rotary_fraction`` (GPT-NeoX's
partial rotary, which squeezes the whole schedule ``base^(-2i/d_rot)`` into fewer features), the kept
frequencies are RoPE's own fastest ones and only the slowest are dropped. Compare HoPE (Chen et al.
2024, "HoPE: A Novel Positional Encoding Without Long-Term Decay"), which removes the low frequencies
for the same reason.
"""

from __future__ import annotations

from torch import Tensor

from posexp.encoders import register
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.rope import RoPE
from posexp.errors import require


def kept_frequencies(head_dim: int, p: float) -> int:
    """How many of a head's ``head_dim / 2`` rotary frequencies p-RoPE keeps: ``floor(p * head_dim / 2)``
    (Barbero et al. 2024, §6 pseudocode; Gemma's ``int(rope_proportion * head_dim // 2)``)."""
    return int(p * head_dim // 2)


@register("prope")
class PRoPE(RoPE):
    """RoPE keeping only the fraction ``p`` of its highest frequencies (Barbero et al. 2024, §6).

    The rotation is RoPE's (features paired as halves); the dropped pairs have ``theta_i = 0`` and pass
    through unrotated, so they carry no position. Evaluation-time scalings apply to the kept frequencies
    and leave the dropped ones at zero. Relative: a rotation by ``(m - n) theta_i`` as in RoPE, with
    ``theta_i = 0`` for the dropped pairs.

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: the base of the kept frequencies ``theta_i = base^(-2i/d)``; > 1.
        p: the fraction of the ``d/2`` frequencies kept, in (0, 1]; default 0.75, one of the fractions the
            paper trains Gemma with (§6). ``p = 1`` is RoPE.

    Raises:
        ConfigError: ``base <= 1``, an odd head width, or ``p`` outside (0, 1] or too small to keep one.
    """

    description = "p-RoPE: RoPE without its lowest frequencies, kept as NoPE channels (Barbero et al. 2024)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, p: float = 0.75):
        super().__init__(d_model, n_heads, base=base)
        require(0 < p <= 1, "encoder.p", f"must be in (0, 1], the fraction of RoPE's frequencies kept (got {p:g})")
        self.p = float(p)
        self.n_kept = kept_frequencies(self.head_dim, self.p)
        require(self.n_kept >= 1, "encoder.p", f"{p:g} of a head's {self.head_dim // 2} frequencies floors to "
                                               f"none; use at least {1 / (self.head_dim // 2):g}")
        self.inv_freq = self.adjust_frequencies(rope_frequencies(self.rot_dim, self.base)).float()

    def adjust_frequencies(self, theta: Tensor) -> Tensor:
        """``theta`` with the lowest ``d/2 - n_kept`` frequencies set to zero (Barbero et al. 2024, §6)."""
        theta = theta.clone()
        theta[self.n_kept:] = 0
        return theta

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.p:g} ({self.n_kept}/{self.head_dim // 2} frequencies)"
