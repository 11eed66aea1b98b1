"""FoPE: Fourier position embedding.

Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization" (ICML 2025), §4. The paper reads RoPE as a non-uniform discrete Fourier transform in
which each feature pair should carry one frequency, and finds two ways that breaks in a trained model:

* **Spectrum damage**: linear layers and activations mix frequencies, so a pair in fact carries a
  series of them. FoPE makes that explicit: pair ``d`` is a Fourier series over the kept frequencies,
  its own (``theta_d``) dominant and the others with small random coefficients::

      cos_d(m) = sum_k C[h, k, d] cos(m theta_k),   sin_d(m) = sum_k S[h, k, d] sin(m theta_k)
      C = I + A,  S = I + B,   A[h, k, d], B[h, k, d] ~ N(0, 2 sigma^2 / (K (K + H)))   (K kept, H heads)

  and the query / key pair is transformed as RoPE's rotation would be with ``cos_d``, ``sin_d`` in place
  of ``cos(m theta_d)``, ``sin(m theta_d)``. The paper initialises the harmonics' coefficients from
  ``N(0, sigma)`` (§4, Eq. 11-13); its code (``FourierEmbedding.reset_parameters``, ``fourier_init:
  eye_xavier_norm``, the init of every FoPE config the paper ran) draws them with ``xavier_normal_(gain=sigma)``
  on the ``(H, K, K)`` tensor, the dominant ``theta_d`` included, and adds the identity: the spread above, 0.022
  for the paper's 60M model (``H = 8``, ``K = 16``) at its ``sigma = 0.3``. posexp draws them as that code.
* **Undertrained low frequencies**: a frequency whose period ``2 pi / theta`` exceeds the training
  length never completes a turn in training, so the model never learns the phases past it.
  "Clip floor to zero" sets every ``theta_i < 2 pi / train_len`` to zero: those pairs carry no position.

The coefficients are frozen at initialisation, as in the authors' code (``fourier_learnable: false``), separate
for cosines and sines and for each head (``fourier_separate_basis``, ``fourier_separate_head``); they are drawn
from a generator seeded by ``encoder.seed`` and kept in the checkpoint. With ``sigma = 0`` FoPE is RoPE with the
floor clipped, and relative; with ``sigma > 0`` the cross terms ``theta_k != theta_k'`` of a logit depend on
the absolute positions (the paper treats them as the damage made explicit), so it is not.

Where posexp departs from the authors' code (Hua et al.'s ``olmo/model.py``):

* a clipped pair is ``cos = 1, sin = 0``, no rotation, as Eq. 13 (``f = 1`` below the floor) and Appendix B
  ("the zero-frequency sinusoidal function does not affect the original hidden states") say; the code pads
  ``sin`` with 1 as well, which turns such a pair by 45 degrees and scales it by sqrt(2) (their logit terms doubled);
* every kept frequency carries a series (the paper's ``W_F`` of ``M - M_0`` columns); the code keeps at most
  ``head_dim / 4`` series (``output_dim``) and leaves the other kept pairs without position: all of them at
  posexp's default size (``K = 6 <= 8``) and in the paper's 512-token runs (``K = 16 = 64 / 4``), not in its
  1024-token ones (``K = 18``) nor with a long ``train_len`` or a small ``base`` here;
* the coefficients are not divided by their column sums: the code's ``fourier_norm`` is off in every config the
  paper ran (the Appendix's listing divides).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.rope import rotate_half
from posexp.errors import require


def clipped_frequencies(head_dim: int, base: float, train_len: int) -> Tensor:
    """RoPE's ``theta_i = base^(-2i/d)`` with every frequency that completes less than one period in
    ``train_len`` tokens (``theta_i < 2 pi / train_len``) set to zero (Hua et al. 2024, §4), float64."""
    theta = rope_frequencies(head_dim, base)
    return torch.where(theta >= 2 * math.pi / train_len, theta, torch.zeros_like(theta))


@register("fope")
class FoPE(PositionalEncoder):
    """Fourier position embedding (Hua et al. 2024): each rotary pair a Fourier series, the floor clipped.

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: the base of RoPE's schedule ``theta_i = base^(-2i/d)`` the series are built from; > 1.
        train_len: the training length in tokens; frequencies that complete less than one period in it
            are clipped to zero. The yaml sets it to the run's ``train_len``.
        sigma: the gain of the coefficients' Xavier-normal draw (the authors' ``fourier_init_norm_gain``, the
            paper's sigma); >= 0. 0.3 is the paper's choice for its smallest models (§5.5). 0 gives RoPE with the
            floor clipped.
        seed: the seed of the coefficients' generator, so that a config builds the same encoding.

    Raises:
        ConfigError: ``base <= 1``, an odd head width, ``train_len < 1`` or ``sigma < 0``.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    revision = 2  # 2: the coefficients drawn as the authors' code draws them (1: N(0, sigma^2 / K) off the diagonal)
    description = "FoPE: each rotary pair a Fourier series, frequencies below one period per train_len clipped " \
                  "(Hua et al. 2024)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, train_len: int = 128,
                 sigma: float = 0.3, seed: int = 0):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for fope (got {base:g})")
        require(self.head_dim % 2 == 0, "model.d_model",
                f"fope rotates pairs of features, so d_model / n_heads must be even "
                f"(got {d_model} / {n_heads} = {self.head_dim})")
        require(train_len >= 1, "encoder.train_len", f"must be a positive number of tokens (got {train_len})")
        require(sigma >= 0, "encoder.sigma", f"must be >= 0, the spread of the Fourier coefficients (got {sigma:g})")
        self._base, self.train_len, self.sigma = float(base), int(train_len), float(sigma)
        self.relative = self.sigma == 0  # exactly RoPE's rotation (clipped) only without cross terms
        theta = clipped_frequencies(self.head_dim, self._base, self.train_len)
        self.n_kept = int((theta > 0).sum())
        self.register_buffer("inv_freq", theta[:self.n_kept].float(), persistent=False)  # (K,)
        generator = torch.Generator().manual_seed(int(seed))
        K, H = self.n_kept, n_heads

        def coefficients() -> Tensor:
            # (H, K, K): [head, frequency, pair]; the authors' eye_xavier_norm: Xavier's fans of a 3-d tensor are
            # K * K in and H * K out, so the spread is sigma * sqrt(2 / (K (K + H))), the identity added after
            harmonics = torch.empty(H, K, K)
            if K:  # no kept frequency: no series (Xavier's spread is undefined for an empty tensor)
                torch.nn.init.xavier_normal_(harmonics, gain=self.sigma, generator=generator)
            return torch.eye(K) + harmonics

        # frozen, as in the authors' code; buffers, so a checkpoint keeps the series it was trained with
        self.register_buffer("cos_coef", coefficients())
        self.register_buffer("sin_coef", coefficients())

    @property
    def base(self) -> float:
        return self._base

    def series(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``(H, L, Dh)`` for positions ``pos (L,)``: each kept pair's Fourier series,
        the clipped pairs at ``cos = 1, sin = 0`` (no rotation)."""
        angles = pos.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]  # (L, K)
        cos = torch.einsum("lk,hkd->hld", angles.cos(), self.cos_coef)  # (H, L, K)
        sin = torch.einsum("lk,hkd->hld", angles.sin(), self.sin_coef)  # (H, L, K)
        clipped = self.head_dim // 2 - self.n_kept
        if clipped:
            H, L = cos.shape[0], cos.shape[1]
            cos = torch.cat((cos, cos.new_ones(H, L, clipped)), dim=-1)  # (H, L, Dh/2)
            sin = torch.cat((sin, sin.new_zeros(H, L, clipped)), dim=-1)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)  # (H, L, Dh), halves as in rope

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cos_q, sin_q = self.series(q_pos)
        cos_k, sin_k = (cos_q, sin_q) if k_pos is q_pos else self.series(k_pos)
        q = q * cos_q.to(q.dtype) + rotate_half(q) * sin_q.to(q.dtype)
        k = k * cos_k.to(k.dtype) + rotate_half(k) * sin_k.to(k.dtype)
        return q, k

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, train_len={self.train_len}, sigma={self.sigma:g}, "
                f"kept {self.n_kept}/{self.head_dim // 2} frequencies")
