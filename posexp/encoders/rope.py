"""Rotary position embedding (RoPE).

Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
Eq. (34): each pair of query/key features ``(x_i, x_{i+d/2})`` is rotated by the
angle ``m * theta_i`` with ``theta_i = base^(-2i/d)``, so that
``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``m - n``.
Features are paired as halves (the GPT-NeoX layout), a fixed permutation of the
paper's interleaved pairs that the learned projections absorb.

Also here: ReRoPE (Su 2023), an evaluation-time variant that clamps the relative
position at a window ``w`` (:class:`ReRoPEScores`, reached through
``eval.scaling=rerope``), and :class:`RemappedRoPE`, a RoPE read through a position
remapping (``eval.scaling=self_extend|string|dca|ms_poe``, posexp/encoders/remapping.py).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, relative_distance
from posexp.encoders.frequencies import check_schedule, rope_frequencies
from posexp.encoders.remap_attention import Placement, remapped_attention, unrotated
from posexp.encoders.remapping import MS_POE, STRING, MsPoEMethod, Remapping, skip_refusal
from posexp.encoders.scaling import LONGROPE, check_longrope_start, module_copy, rope_scaling
from posexp.errors import ConfigError, require

# eval-time scalings that are formulas in the base of the exponential schedule (posexp/encoders/scaling.py)
BASE_SCALINGS = ("ntk", "dynamic_ntk", "yarn", "llama3", "longrope")


def rotary_dims(head_dim: int, rotary_fraction: float) -> int:
    """The features of a head that rotate: ``rotary_fraction * head_dim`` rounded to the nearest even count."""
    return 2 * math.floor(rotary_fraction * head_dim / 2 + 0.5)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x (..., L, Dh)`` by per-position angles given as ``cos, sin (L, Dh)``."""
    return x * cos + rotate_half(x) * sin


@register("rope")
class RoPE(PositionalEncoder):
    """Rotary position embedding (Su et al. 2021), relative by construction.

    With every option at its default this is RoFormer's RoPE on the whole head.

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: the base of the frequency schedule ``theta_i = base^(-2i/d)``; > 1.
        freq_schedule: ``exponential`` (``theta_i = base^(-2i/d)``, RoFormer Eq. 15,
            Su 2021 "Transformer升级之路 1" Eq. 30), ``power`` (``theta_i = (i+1)^(-alpha)``,
            Su 2021 Eq. 41) or ``linear`` (``theta_i = 1 - 2i/d``, Su 2021 Eq. 43); ``d``
            is the rotated width. RoFormer §3.4.3 inherits the exponential schedule
            from the sinusoidal encoding for its long-range decay, which is the
            property Su 2021 §2.3 compares the schedules by.
        alpha: the exponent of the ``power`` schedule; > 0. Only read by ``power``.
        rotary_fraction: the fraction of each head's features that rotate, in (0, 1];
            rounded to an even count ``d_rot``, the first ``d_rot`` features rotate
            (paired as halves among themselves, with ``theta_i = base^(-2i/d_rot)``)
            and the rest pass through unrotated, carrying position-free content.
            GPT-NeoX-20B (Black et al. 2022, §2.1.1) rotates 25% of each head.

    Raises:
        ConfigError: ``base <= 1``, an odd head width, an unknown schedule, ``alpha <= 0``,
            or ``rotary_fraction`` outside (0, 1] or too small to rotate one pair.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "RoPE: rotate q and k by position-dependent angles (Su et al. 2021)"
    relative = True  # <R_m q, R_n k> = <q, R_{n-m} k> (see the module docstring)
    # evaluation-time context extension, see posexp/encoders/scaling.py and with_scaling
    supported_scalings = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "rerope", "self_extend", "string",
                          "dca", "ms_poe")
    attention_scaling = 1.0  # YaRN's sqrt(1/t) on q and k; 1 unless scaled
    scaling: Optional[tuple[str, float, int]] = None  # (kind, factor, train_len) on a scaled copy
    longrope_start = 0  # LongRoPE's n^ on a longrope copy: positions below it keep the trained rotation

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, freq_schedule: str = "exponential",
                 alpha: float = 1.0, rotary_fraction: float = 1.0):
        super().__init__(d_model, n_heads)
        # self.name: the registered name, so that hope, prope and resonance refuse as themselves
        require(base > 1, "base", f"must be > 1 for {self.name} (got {base:g})")
        require(self.head_dim % 2 == 0, "model.d_model",
                f"{self.name} rotates pairs of features, so d_model / n_heads must be even "
                f"(got {d_model} / {n_heads} = {self.head_dim})")
        check_schedule(freq_schedule, alpha)
        require(0 < rotary_fraction <= 1, "encoder.rotary_fraction",
                f"must be in (0, 1], the fraction of each head's features that rotate (got {rotary_fraction:g})")
        self.rot_dim = rotary_dims(self.head_dim, rotary_fraction)
        require(self.rot_dim >= 2, "encoder.rotary_fraction",
                f"{rotary_fraction:g} of a head of {self.head_dim} features rounds to no pair to rotate; "
                f"use at least {2 / self.head_dim:g}")
        self._base = float(base)
        self.freq_schedule = freq_schedule
        self.alpha = float(alpha)
        self.rotary_fraction = float(rotary_fraction)
        theta = rope_frequencies(self.rot_dim, self._base, freq_schedule, self.alpha)
        self.register_buffer("inv_freq", theta.float(), persistent=False)

    @property
    def base(self) -> float:
        return self._base

    def adjust_frequencies(self, theta: Tensor) -> Tensor:
        """The frequencies this variant rotates by, from the schedule's (or a scaling's) ``theta (d_rot/2,)``.

        RoPE itself keeps them; a variant that reshapes the spectrum (p-RoPE drops the lowest, Resonance RoPE
        rounds the wavelengths) overrides this, and every evaluation-time scaling then goes through it too.
        """
        return theta

    def scaling_refusal(self, kind: str) -> Optional[str]:
        """Why ``eval.scaling=kind`` does not apply to this configuration, or None if it does."""
        if kind in BASE_SCALINGS and self.freq_schedule != "exponential":
            return (f"{kind!r} rescales the base of the exponential schedule theta_i = base^(-2i/d), but this "
                    f"rope uses encoder.freq_schedule={self.freq_schedule}, which has no base; with it choose "
                    f"one of: linear, rerope (or none)")
        return None

    def with_scaling(self, kind: str, factor: float, train_len: int,
                     factors: Optional[Sequence[float]] = None, start: int = 0, remap=None) -> PositionalEncoder:
        """A copy with frequencies scaled for evaluation past ``train_len`` (formulas in posexp/encoders/scaling.py).

        Args:
            kind: ``linear`` (PI), ``ntk``, ``dynamic_ntk``, ``yarn``, ``llama3``, ``longrope``, or ``rerope``.
            factor: the scaling factor ``s`` (for ``dynamic_ntk`` the factor ``a`` of its formula;
                for ``rerope`` the window ``w`` in tokens).
            train_len: the context length the model was trained at.
            factors: ``longrope``'s per-frequency rescale factors (``eval.longrope_factors``); others ignore it.
            start: ``longrope``'s ``n^`` (``eval.longrope_start``): positions below it keep the trained rotation
                and no temperature (Ding et al. 2024, §3.2); others ignore it.
            remap: for ``self_extend``, ``string``, ``dca`` and ``ms_poe``, the method with all its options
                (:class:`posexp.encoders.remapping.Remapping`; its defaults for ``train_len`` when None).

        Returns:
            A module sharing this one's state; this one is left unchanged.

        Raises:
            ConfigError: a base-rescaling method on a non-exponential schedule; ``longrope`` past factor 1
                without one factor per rotary frequency.
        """
        reason = self.scaling_refusal(kind)
        if reason is not None:
            raise ConfigError("eval.scaling", reason)
        if kind == "rerope" and self.layer_window is None:  # through query blocks, like the other remappings
            require(int(factor) >= 1, "eval.rerope_window", f"must be a positive number of tokens (got {int(factor)})")
            return RemappedRoPE(self, Remapping("rerope", (("rerope_window", int(factor)),)))
        if kind == "rerope":  # a layer attending within its own window (encoder=irope): the explicit-score path
            return ReRoPEScores(self, int(factor))
        if kind in ("self_extend", "string", "dca", "ms_poe"):
            return RemappedRoPE(self, remap if remap is not None else Remapping.of(kind, {}, train_len, train_len))
        clone = module_copy(self)
        clone.scaling = (kind, float(factor), int(train_len))
        if kind == "linear":
            # Position Interpolation, m -> m / s, i.e. theta -> theta / s (Chen et al. 2023, §2.3): any schedule
            theta, clone.attention_scaling = self.inv_freq / float(factor), 1.0
        else:
            theta, clone.attention_scaling = rope_scaling(kind, self.rot_dim, self._base, factor, train_len,
                                                          factors=factors)
        clone.inv_freq = self.adjust_frequencies(theta).to(self.inv_freq)
        clone._dynamic_cache = {}
        clone.relative = kind != "dynamic_ntk"  # its base follows the largest key position, not distances
        start = check_longrope_start(start) if kind == LONGROPE else 0
        if start > 0 and factor > 1:  # at s <= 1 every position is unscaled already
            clone.longrope_start = start
            clone.register_buffer("trained_inv_freq", self.inv_freq, persistent=False)
            clone.relative = False  # a key's rotation depends on which side of n^ it lies, not on distance alone
        return clone

    def frequencies(self, seq_len: int) -> tuple[Tensor, float]:
        """``theta (d_rot/2,)`` and the q/k multiplier for a sequence of ``seq_len`` tokens."""
        if self.scaling is None or self.scaling[0] != "dynamic_ntk":
            return self.inv_freq, self.attention_scaling
        # dynamic NTK: the base follows the length actually read (transformers' `dynamic` rope type)
        if seq_len not in self._dynamic_cache:
            kind, factor, train_len = self.scaling
            theta, _ = rope_scaling(kind, self.rot_dim, self._base, factor, train_len, seq_len=seq_len)
            self._dynamic_cache[seq_len] = self.adjust_frequencies(theta).to(self.inv_freq)
        return self._dynamic_cache[seq_len], 1.0

    def angles(self, pos: Tensor, inv_freq: Optional[Tensor] = None,
               scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``(L, d_rot)`` for positions ``pos (L,)``, both times ``scale``."""
        inv_freq = self.inv_freq if inv_freq is None else inv_freq
        # float32 product of an exact integer and theta_i: exact enough up to ~1e6 positions
        freqs = pos.to(inv_freq.dtype)[:, None] * inv_freq[None, :]  # (L, d_rot/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (L, d_rot)
        if scale != 1.0:
            return emb.cos() * scale, emb.sin() * scale
        return emb.cos(), emb.sin()

    def rotate_features(self, x: Tensor, cos: Tensor, sin: Tensor, scale: float = 1.0) -> Tensor:
        """Rotate the first ``d_rot`` features of ``x (..., L, Dh)``; the rest pass through (times ``scale``)."""
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if self.rot_dim == self.head_dim:
            return apply_rotary(x, cos, sin)
        rot, rest = x[..., :self.rot_dim], x[..., self.rot_dim:]
        if scale != 1.0:
            rest = rest * scale  # YaRN's temperature applies to the whole logit, so to every feature
        return torch.cat((apply_rotary(rot, cos, sin), rest), dim=-1)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        dynamic = self.scaling is not None and self.scaling[0] == "dynamic_ntk" and k_pos.numel() > 0
        seq_len = int(k_pos.max()) + 1 if dynamic else 0  # like transformers: max position + 1
        inv_freq, scale = self.frequencies(seq_len)
        cos_q, sin_q = self.angles(q_pos, inv_freq, scale)
        if k_pos is q_pos:
            cos_k, sin_k = cos_q, sin_q
        else:
            cos_k, sin_k = self.angles(k_pos, inv_freq, scale)
        q_rot, k_rot = self.rotate_features(q, cos_q, sin_q, scale), self.rotate_features(k, cos_k, sin_k, scale)
        if self.longrope_start > 0:
            q_rot, k_rot = self._trained_below_start(q, q_pos, q_rot), self._trained_below_start(k, k_pos, k_rot)
        return q_rot, k_rot

    def _trained_below_start(self, x: Tensor, pos: Tensor, rotated: Tensor) -> Tensor:
        """``rotated`` with the positions below LongRoPE's ``n^`` rotated as trained instead, by ``n * theta_i``
        and without the temperature (Ding et al. 2024, §3.2; the authors' code copies the unscaled cos/sin there)."""
        early = pos < self.longrope_start  # (L,)
        if not bool(early.any()):
            return rotated
        cos, sin = self.angles(pos, self.trained_inv_freq)
        return torch.where(early[:, None], self.rotate_features(x, cos, sin), rotated)  # (..., L, Dh)

    def extra_repr(self) -> str:
        parts = [super().extra_repr()]
        if self.freq_schedule != "exponential":
            parts.append(f"freq_schedule={self.freq_schedule}" + (f", alpha={self.alpha:g}"
                                                                   if self.freq_schedule == "power" else ""))
        if self.rot_dim != self.head_dim:
            parts.append(f"rotary_dims={self.rot_dim}/{self.head_dim}")
        if self.longrope_start:
            parts.append(f"longrope_start={self.longrope_start}")
        return ", ".join(parts)


class ReRoPEScores(PositionalEncoder):
    """ReRoPE (Su 2023, "Transformer升级之路 12: 无限外推的ReRoPE?"): RoPE whose relative position stops at ``w``.

    The attention logit of query ``m`` and key ``n`` is RoPE's at the relative
    position ``min(m - n, w)``::

        a(m, n) = <R_m q, R_n k>   if m - n <= w     (RoPE unchanged inside the window)
                  <R_w q, k>       otherwise         (every distant key as if at distance w)

    so no distance the model never saw in training reaches the rotation, at any
    length (Su's "infinite extrapolation"), while nearby tokens keep exact
    positions. A clamped relative position is not a rotation of q and k
    separately, so this runs on the explicit score path: it leaves ``rotate``
    alone and its ``scores`` hook returns the ReRoPE logits minus the plain
    ``q . k / sqrt(Dh)`` that the model's attention adds itself, two score
    matrices per query block (the cost Su notes). Evaluation-time only: built by
    :meth:`RoPE.with_scaling` for ``eval.scaling=rerope``, sharing the trained
    state of the RoPE it wraps.

    Args:
        rope: the trained rotary encoder.
        window: ``w``, in tokens; >= 1.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "ReRoPE: RoPE with the relative position clamped at a window (Su 2023)"
    relative = True  # RoPE at min(m - n, w)

    def __init__(self, rope: RoPE, window: int):
        super().__init__(rope.d_model, rope.n_heads)
        require(window >= 1, "eval.rerope_window", f"must be a positive number of tokens (got {window})")
        self.name = rope.name
        self.rope = rope
        self.window = int(window)

    @property
    def base(self) -> float:
        return self.rope.base

    def supports(self, length: int) -> bool:
        return self.rope.supports(length)

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        rope = self.rope
        # at least float32 even under autocast: the result is a difference of two logits
        dtype = torch.promote_types(q.dtype, torch.float32)
        q32, k32 = q.to(dtype), k.to(dtype)
        cos_q, sin_q = rope.angles(q_pos)
        cos_k, sin_k = rope.angles(k_pos)
        q_rot = rope.rotate_features(q32, cos_q, sin_q)  # R_m q
        k_rot = rope.rotate_features(k32, cos_k, sin_k)  # R_n k
        near = q_rot @ k_rot.transpose(-1, -2)  # (B, H, Lq, Lk), RoPE's <R_m q, R_n k>
        # <R_w q, R_0 k> = <R_w q, k>: RoPE at relative position w, for every pair (Su 2023)
        cos_w, sin_w = rope.angles(torch.full((1,), self.window, dtype=q_pos.dtype, device=q_pos.device))
        far = rope.rotate_features(q32, cos_w, sin_w) @ k32.transpose(-1, -2)  # (B, H, Lq, Lk)
        inside = relative_distance(q_pos, k_pos) <= self.window  # (Lq, Lk)
        logits = torch.where(inside, near, far)
        # the attention adds q . k / sqrt(Dh) to these scores itself
        return (logits - q32 @ k32.transpose(-1, -2)) / math.sqrt(self.head_dim)

    def extra_repr(self) -> str:
        return f"{self.rope.extra_repr()}, rerope_window={self.window}"


class RemappedRoPE(PositionalEncoder):
    """A trained RoPE read through a position remapping at evaluation (``eval.scaling=self_extend|string|dca|ms_poe``).

    ``rotate`` is the RoPE's own (q and k at their true positions); ``attend`` moves them to the remapped ones and
    attends (:func:`remapped_attention`). Shares the RoPE's state; built by ``RoPE.with_scaling``.

    Args:
        rope: the trained rotary encoder (any frequency schedule or rotary fraction).
        remapping: the method and all its options.
    """

    context_parallel = False  # a remapped piece reads absolute chunk or group boundaries, or the whole input

    def __init__(self, rope: RoPE, remapping: Remapping):
        super().__init__(rope.d_model, rope.n_heads)
        self.name = rope.name
        self.rope = rope
        self.remapping = remapping
        self.relative = remapping.kind in (STRING, MS_POE)  # the others read chunk or group boundaries
        self.description = f"{rope.name} read through {remapping.kind}"

    @property
    def base(self) -> Optional[float]:
        return self.rope.base

    def supports(self, length: int) -> bool:
        return self.rope.supports(length)

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        """Ms-PoE leaves its first ``skip_layers`` layers as trained; every other method remaps every layer."""
        skip = int(self.remapping["skip_layers"]) if self.remapping.kind == MS_POE else 0
        skip = min(skip, n_layers)
        return [self.rope] * skip + [self] * (n_layers - skip)

    def depth_refusal(self, n_layers: int) -> Optional[str]:
        """Why a model of ``n_layers`` layers would read as trained (Ms-PoE skipping every layer), or None."""
        return skip_refusal(self.remapping, n_layers)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope.rotate(q, k, q_pos, k_pos)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, block_size: int) -> Tensor:
        inv_freq = self.rope.inv_freq
        method = self.remapping.method()
        scale = 1.0 / math.sqrt(q.shape[-1])
        if isinstance(method, MsPoEMethod):
            method.rank_heads(unrotated(q, pos, inv_freq), unrotated(k, pos, inv_freq), scale)
        return remapped_attention(method, q, k, v, Placement(pos, pos, inv_freq), scale, block=block_size)

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v:g}" for k, v in self.remapping.options)
        return f"{self.rope.extra_repr()}, {self.remapping.kind}: {opts}"

