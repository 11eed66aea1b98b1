"""Sinusoidal absolute position encoding.

Vaswani et al. 2017, "Attention Is All You Need", §3.5: position ``k`` is the
vector ``p_{k,2i} = sin(k / base^(2i/d))``, ``p_{k,2i+1} = cos(k / base^(2i/d))``
with ``base = 10000``, added to the token embedding. Each (sin, cos) pair turns
at its own frequency, so ``p_{k+s}`` is a fixed rotation of ``p_k`` for every
``k`` (the paper's stated reason for the choice) and ``<p_m, p_n>`` depends only
on ``m - n``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.frequencies import FREQ_SCHEDULES, check_schedule, frequency_schedule
from posexp.encoders.scaling import module_copy
from posexp.errors import require

LAYOUTS = ("interleaved", "halves")


def sinusoidal_table(pos: Tensor, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32, *,
                     inv_freq: Optional[Tensor] = None, layout: str = "interleaved") -> Tensor:
    """The encodings ``(L, d_model)`` of integer positions ``pos (L,)`` (Vaswani et al. 2017, §3.5).

    Args:
        pos: absolute positions, any integers (no length limit).
        d_model: encoding width; even.
        base: the wavelength scale, 10000 in the paper.
        dtype: dtype of the result; the angles are always formed in float64.
        inv_freq: ``theta (d_model/2,)`` to use instead of ``base^(-2i/d_model)``
            (another schedule, or learned frequencies; gradients flow through it).
        layout: ``interleaved`` (the paper's ``sin, cos, sin, cos, ...``) or ``halves``
            (``sin`` of every frequency, then ``cos`` of every frequency).

    Returns:
        ``interleaved``: ``table[l, 2i] = sin(pos[l] * w_i)`` and ``table[l, 2i+1] = cos(pos[l] * w_i)``
        with ``w_i = base^(-2i/d_model)``; ``halves``: ``table[l, i] = sin(pos[l] * w_i)`` and
        ``table[l, d/2 + i] = cos(pos[l] * w_i)``.
    """
    if inv_freq is None:
        # w_i = 1 / base^(2i/d) (Vaswani et al. 2017, §3.5)
        inv_freq = frequency_schedule(d_model, base).to(pos.device)
    # float64 angles: in float32 pos * w_0 loses ~pos * 6e-8 rad, already 0.06 rad at pos 1e6
    angles = pos.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]  # (L, d/2)
    if layout == "halves":
        # a fixed permutation of the paper's features (Su 2021 §2.3: any order of the dimensions is as good)
        return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype)  # (L, d)
    # interleave so that sin lands on even features and cos on odd ones, as in the paper
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(dtype)  # (L, d)


@register("sinusoidal")
class Sinusoidal(PositionalEncoder):
    """Fixed sinusoidal position vectors added to the token embeddings (Vaswani et al. 2017).

    The table is computed for the positions asked for, so every length is supported.
    As in the paper (§3.4) the token embeddings are multiplied by ``sqrt(d_model)``
    before the encodings are added; without it, unit-amplitude encodings drown
    embeddings initialised at std 0.02 and the model trains visibly worse even at
    its training length.

    With every option at its default this is exactly the paper's encoding. The
    options explore what Su 2021 ("Transformer升级之路 1", §2.3) leaves open: the
    derivation fixes the form ``(cos m theta_i, sin m theta_i)`` and hence
    ``<p_m, p_n> = sum_i cos((m - n) theta_i)`` (his Eq. 31), but not the
    ``theta_i``, which may follow another schedule or even be trained.

    Args:
        d_model: model width; even, since features come in (sin, cos) pairs.
        n_heads: attention heads (unused).
        base: the wavelength scale of the exponential schedule; wavelengths run from
            ``2*pi`` to ``2*pi*base``; > 1.
        freq_schedule: ``exponential`` (``theta_i = base^(-2i/d)``, Vaswani et al. 2017
            §3.5, Su 2021 Eq. 30), ``power`` (``theta_i = (i+1)^(-alpha)``, Su 2021 Eq. 41)
            or ``linear`` (``theta_i = 1 - 2i/d``, Su 2021 Eq. 43); see
            :mod:`posexp.encoders.frequencies`.
        alpha: the exponent of the ``power`` schedule; > 0. Only read by ``power``.
        layout: ``interleaved`` (the paper's ``sin, cos`` pairs) or ``halves``
            (all sines, then all cosines: the same features in a fixed permutation,
            which Su 2021 §2.3 notes is an equally valid encoding because the
            network's neurons are unordered).
        learnable_scale: multiply the encoding by a learned scalar ``g`` (initialised
            to 1), ``x * sqrt(d) + g * PE``: the "scaled sinusoidal" embedding of
            Hua et al. 2022 ("Transformer Quality in Linear Time", FLASH), letting
            the model choose how loud positions are relative to tokens.
        learnable_freqs: train the ``theta_i`` themselves, initialised from the
            schedule (Su 2021 §2.3 lists trainable ``theta_i`` among the choices). The
            encoding stays a sum of ``cos((m-n) theta_i)``, so still relative in
            ``<p_m, p_n>``; only the frequencies move.
        learnable_base: train ``log(base)`` of the exponential schedule, one parameter,
            ``theta_i = exp(-(2i/d) log base)``; only with ``freq_schedule=exponential``
            and not together with ``learnable_freqs`` (which already trains every ``theta_i``).

    Raises:
        ConfigError: an unknown schedule or layout, ``alpha <= 0``, or
            ``learnable_base`` with a non-exponential schedule or with ``learnable_freqs``.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Sinusoidal: fixed sin/cos position vectors added to the embeddings (Vaswani et al. 2017)"
    # evaluation-time context extension: position interpolation (posexp/encoders/scaling.py)
    supported_scalings = ("linear",)
    position_scale = 1.0  # positions are multiplied by this; 1 / s on a scaled copy

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, freq_schedule: str = "exponential",
                 alpha: float = 1.0, layout: str = "interleaved", learnable_scale: bool = False,
                 learnable_freqs: bool = False, learnable_base: bool = False):
        super().__init__(d_model, n_heads)
        require(base > 1, "base", f"must be > 1 for sinusoidal (got {base:g})")
        require(d_model % 2 == 0, "model.d_model",
                f"sinusoidal encodes (sin, cos) pairs, so d_model must be even (got {d_model})")
        check_schedule(freq_schedule, alpha)
        require(layout in LAYOUTS, "encoder.layout", f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
        require(not learnable_base or freq_schedule == "exponential", "encoder.learnable_base",
                f"learns the base of the exponential schedule base^(-2i/d), so it needs "
                f"encoder.freq_schedule=exponential (got {freq_schedule}; the allowed schedules are "
                f"{', '.join(FREQ_SCHEDULES)}, and only exponential has a base)")
        require(not (learnable_base and learnable_freqs), "encoder.learnable_base",
                "cannot be combined with encoder.learnable_freqs=true, which already learns every frequency; "
                "set one of them to false")
        self._base = float(base)
        self.freq_schedule = freq_schedule
        self.alpha = float(alpha)
        self.layout = layout
        self.embed_scale = d_model**0.5
        # fixed frequencies are recomputed in float64 at each call (cheap, and immune to a module cast)
        theta = frequency_schedule(d_model, self._base, freq_schedule, self.alpha)  # (d/2,)
        self.freqs = nn.Parameter(theta.float()) if learnable_freqs else None
        # log(base) rather than base: positive by construction, and a step changes every wavelength by the same ratio
        self.log_base = nn.Parameter(torch.tensor(math.log(self._base))) if learnable_base else None
        self.scale = nn.Parameter(torch.ones(())) if learnable_scale else None

    @property
    def base(self) -> float:
        if self.log_base is not None:
            return float(self.log_base.detach().exp())
        return self._base

    def frequencies(self) -> Tensor:
        """``theta (d/2,)``: the schedule, the learned frequencies, or ``base^(-2i/d)`` of the learned base."""
        if self.freqs is not None:
            return self.freqs
        if self.log_base is None:
            return frequency_schedule(self.d_model, self._base, self.freq_schedule, self.alpha)
        i = torch.arange(self.d_model // 2, dtype=torch.float64, device=self.log_base.device)
        return torch.exp(-2 * i / self.d_model * self.log_base.double())  # base^(-2i/d), differentiable in log(base)

    def with_scaling(self, kind: str, factor: float, train_len: int) -> "Sinusoidal":
        """A copy that reads position ``m`` as ``m / factor`` (position interpolation, Chen et al. 2023, §2.3).

        Args:
            kind: ``linear``, the only method for absolute sinusoids.
            factor: ``s``; positions ``0 .. s*train_len`` map into the trained ``0 .. train_len``.
            train_len: the training context length (unused: the table is defined at any position).
        """
        clone = module_copy(self)
        clone.position_scale = 1.0 / float(factor)
        return clone

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        if self.position_scale != 1.0:
            pos = pos.to(torch.float64) * self.position_scale  # fractional positions; the table takes them
        theta = self.frequencies().to(pos.device)
        pe = sinusoidal_table(pos, self.d_model, dtype=x.dtype, inv_freq=theta, layout=self.layout)  # (L, D)
        if self.scale is not None:
            pe = self.scale.to(x.dtype) * pe  # g * PE (Hua et al. 2022, scaled sinusoidal)
        # x * sqrt(d_model) + PE (Vaswani et al. 2017, §3.4 and §3.5)
        return x * self.embed_scale + pe

    def extra_repr(self) -> str:
        parts = [super().extra_repr()]
        if self.freq_schedule != "exponential":
            parts.append(f"freq_schedule={self.freq_schedule}" + (f", alpha={self.alpha:g}"
                                                                   if self.freq_schedule == "power" else ""))
        if self.layout != "interleaved":
            parts.append(f"layout={self.layout}")
        learned = [n for n, p in (("scale", self.scale), ("freqs", self.freqs), ("base", self.log_base))
                   if isinstance(p, nn.Parameter)]
        if learned:
            parts.append(f"learnable={'+'.join(learned)}")
        return ", ".join(parts)
