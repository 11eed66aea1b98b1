"""Evaluation-time context extension: stretch a trained encoding to longer contexts without retraining.

Each method maps a scaling factor ``s`` (eval length / train length unless set)
to new rotary frequencies, or to fractional positions for absolute encodings:

==============  ==========================================================  =====================
``eval.scaling`` what changes                                                applies to
==============  ==========================================================  =====================
``linear``      position interpolation: position ``m`` is read as ``m / s``  rope, learned,
                (Chen et al. 2023, §2.3: ``f'(x, m) = f(x, mL/L')``)          sinusoidal
``ntk``         ``base' = base * s^(d/(d-2))`` ("NTK-aware", bloc97 2023;     rope
                Peng et al. 2023, §3.1)
``dynamic_ntk`` the NTK base recomputed from the length ``n`` actually read:  rope
                ``base * (a*n/L - (a-1))^(d/(d-2))`` for ``n > L``, ``a`` the
                factor (emozilla 2023; Peng et al. 2023, §3.3)
``yarn``        NTK-by-parts frequencies + attention temperature               rope
                ``sqrt(1/t) = 0.1 ln s + 1`` (Peng et al. 2023, §3.2, §3.4)
``llama3``      frequency bands: long wavelengths / s, short ones kept, a      rope
                smooth blend between (Meta 2024, Llama 3.1)
``longrope``    per-frequency rescale factors ``theta_i / lambda_i``, given as  rope
                ``eval.longrope_factors`` (one per rotary frequency), and
                the temperature ``sqrt(1 + ln s / ln L)`` (Ding et al. 2024;
                Phi-3's and transformers' ``longrope``); unscaled at ``s <= 1``;
                the first ``n^`` positions (``eval.longrope_start``, default
                0) keep the trained rotation (Ding et al. 2024, §3.2)
``rerope``      the relative position is clamped at a window ``w``             rope
                (``eval.rerope_window``, default ``train_len / 2``): RoPE
                within ``w``, RoPE at distance ``w`` beyond (Su 2023); no
                factor, the same at every length
``self_extend`` ``string``, ``dca``, ``ms_poe``: position remappings, RoPE    rope
                read at other positions piece by piece, each with its
                options under ``eval.`` (:mod:`posexp.encoders.remapping`)
==============  ==========================================================  =====================

``ntk``, ``dynamic_ntk``, ``yarn``, ``llama3`` and ``longrope`` are formulas in the base of the
exponential schedule ``theta_i = base^(-2i/d)``; a rope trained with another
``encoder.freq_schedule`` offers only ``linear`` and ``rerope`` (an encoder may refuse
a method for its configuration through ``scaling_refusal``).

Encoders offer the methods themselves: a class lists ``supported_scalings`` and
implements ``with_scaling(kind, factor, train_len)``, returning a scaled copy
that shares the trained parameters (:func:`module_copy`). This module holds the
formulas and imports nothing of the encoders; which method a run uses, and
whether it applies, is evaluation's policy (:mod:`posexp.encoders.extension`,
whose :func:`~posexp.encoders.extension.scaled_encoder` is the one entry point).

The rotary formulas follow Hugging Face transformers' ``ROPE_INIT_FUNCTIONS``
(``modeling_rope_utils``) number for number; ``tests/unit/encoders/test_scaling.py`` checks it.
"""

from __future__ import annotations

import copy
import math
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from posexp.encoders.frequencies import rope_frequencies
from posexp.errors import ConfigError

NONE = "none"
# the last five are position remappings (posexp/encoders/remapping.py): RoPE read at other positions, no new frequencies
SCALINGS = (NONE, "linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "rerope", "self_extend", "string", "dca",
            "ms_poe")
# the scalings that are new rotary frequencies from (factor, train_len) alone (rope_scaling); longrope also needs its
# per-frequency factors, rerope changes the relative position instead
ROTARY_SCALINGS = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3")
REROPE = "rerope"
LONGROPE = "longrope"

# YaRN's ramp bounds in rotations per training context (Peng et al. 2023, §3.2: alpha = 1, beta = 32)
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
# Llama 3.1's band edges in wavelengths per training context
LLAMA3_LOW_FREQ_FACTOR = 1.0
LLAMA3_HIGH_FREQ_FACTOR = 4.0


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base: ``base * s^(d/(d-2))`` (bloc97 2023; Peng et al. 2023, §3.1).

    The lowest frequency then covers ``s`` times the trained range while the
    highest is almost unchanged.
    """
    return base * factor ** (dim / (dim - 2))


def dynamic_ntk_base(base: float, factor: float, dim: int, seq_len: int, train_len: int) -> float:
    """Dynamic NTK base for a sequence of ``seq_len`` tokens (emozilla 2023; Peng et al. 2023, §3.3).

    ``base * (a * n / L - (a - 1))^(d/(d-2))`` with ``n = max(seq_len, L)``, ``L`` the
    training length and ``a`` the factor: no change up to ``L``, and the NTK base of
    ``s = n / L`` when ``a = 1``. This is transformers' ``dynamic`` rope type.
    """
    n = max(seq_len, train_len)
    return base * (factor * n / train_len - (factor - 1)) ** (dim / (dim - 2))


def yarn_attention_scaling(factor: float) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 ln(s) + 1`` (Peng et al. 2023, §3.4), 1 for ``s <= 1``.

    q and k are both multiplied by it, so the logits are divided by ``t``.
    """
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_frequencies(dim: int, base: float, factor: float, train_len: int,
                     beta_fast: float = YARN_BETA_FAST, beta_slow: float = YARN_BETA_SLOW) -> Tensor:
    """NTK-by-parts frequencies (Peng et al. 2023, §3.2), float64.

    ``h(theta_d) = (1 - gamma) theta_d / s + gamma theta_d``: dimensions that turn
    more than ``beta`` times over the training context keep their frequency,
    those that turn less than ``alpha`` times are interpolated like PI. As in the
    authors' code and transformers, ``gamma`` ramps linearly in the dimension
    index between the dimensions where ``r = beta`` and ``r = alpha``, rounded
    outward (floor / ceil), rather than linearly in ``r`` as the paper writes it.
    """
    theta = rope_frequencies(dim, base)

    def dim_at(rotations: float) -> float:
        # the (fractional) dimension index whose wavelength fits `rotations` times in train_len
        return dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_at(beta_fast)), 0)
    high = min(math.ceil(dim_at(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # as in the reference code: avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # gamma: 1 = keep (extrapolate), 0 = interpolate
    return theta / factor * (1 - keep) + theta * keep


def llama3_frequencies(dim: int, base: float, factor: float, train_len: int,
                       low_freq_factor: float = LLAMA3_LOW_FREQ_FACTOR,
                       high_freq_factor: float = LLAMA3_HIGH_FREQ_FACTOR) -> Tensor:
    """Llama 3.1 frequency-band scaling, float64.

    Wavelengths longer than ``train_len / low_freq_factor`` are divided by ``s``
    (interpolated), shorter than ``train_len / high_freq_factor`` are kept, and
    the band between blends the two with
    ``smooth = (train_len / wavelength - low) / (high - low)``
    (Meta's reference ``apply_scaling``; transformers' ``llama3`` rope type).
    """
    theta = rope_frequencies(dim, base)
    wavelen = 2 * math.pi / theta
    low_wavelen = train_len / low_freq_factor
    high_wavelen = train_len / high_freq_factor
    smooth = (train_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * theta / factor + smooth * theta
    out = torch.where(wavelen > low_wavelen, theta / factor, theta)
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, out)


def longrope_attention_scaling(factor: float, train_len: int) -> float:
    """LongRoPE's q/k multiplier ``sqrt(1 + ln(s) / ln(L))``, 1 for ``s <= 1`` (Ding et al. 2024, as Phi-3 and
    transformers' ``longrope`` type apply it)."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(train_len))


def longrope_frequencies(dim: int, base: float, factors: Optional[Sequence[float]], factor: float) -> Tensor:
    """LongRoPE's rescaled frequencies ``theta_i / lambda_i`` (Ding et al. 2024, §2.2: one interpolation factor
    ``lambda_i`` per RoPE dimension, found by their evolutionary search), float64; the unscaled ``theta_i`` for
    ``s <= 1`` (transformers' short factors, taken as 1). The paper's other searched setting, the first
    ``n^`` positions left unscaled, is a per-position choice the encoders make (:func:`check_longrope_start`).

    Raises:
        ConfigError: ``factors`` missing, not ``dim / 2`` of them, or not all > 0, for ``s > 1``.
    """
    theta = rope_frequencies(dim, base)
    if factor <= 1:
        return theta
    n = dim // 2
    if factors is None or len(factors) != n or not all(float(f) > 0 for f in factors):
        given = None if factors is None else list(factors)
        raise ConfigError("eval.longrope_factors", f"longrope needs one rescale factor > 0 per rotary frequency, "
                                                   f"{n} of them, e.g. eval.longrope_factors=[1.0,1.2,...] "
                                                   f"(got {given})")
    return theta / torch.tensor([float(f) for f in factors], dtype=torch.float64)


def check_longrope_start(start: object, key: str = "eval.longrope_start") -> int:
    """LongRoPE's ``n^`` (Ding et al. 2024, §3.2): the first ``n^`` positions keep the trained rotation
    ``n * theta_i`` (and no temperature), the rest turn at ``n * theta_i / lambda_i``. In the paper's words,
    ``I(lambda_i, n^) = 1`` for ``n < n^`` and ``1 / lambda_i`` otherwise; the authors' code
    (``LlamaLongRoPEScaledStartTokenRotaryEmbedding``) copies the unscaled cos/sin, without the temperature, into
    the first ``n^`` rows. 0 (the default) scales every position, as transformers' ``longrope`` type does.

    Raises:
        ConfigError: not a whole number >= 0.
    """
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ConfigError(key, f"must be a whole number of positions >= 0, the first positions LongRoPE leaves "
                               f"unscaled (n^; 0 = none), e.g. {key}=4 (got {start!r})")
    return int(start)


def rope_scaling(kind: str, dim: int, base: float, factor: float, train_len: int,
                 seq_len: Optional[int] = None, factors: Optional[Sequence[float]] = None) -> tuple[Tensor, float]:
    """Frequencies ``theta (dim/2,)`` float64 and the q/k multiplier for a rotary scaling.

    Args:
        kind: one of :data:`ROTARY_SCALINGS`, or ``none``.
        dim: rotary dimension (the head width).
        base: the trained base.
        factor: ``s``; for ``dynamic_ntk`` the factor ``a`` of its formula.
        train_len: the training context length (``original_max_position_embeddings``).
        seq_len: tokens in the sequence; only ``dynamic_ntk`` uses it.
        factors: LongRoPE's per-frequency rescale factors ``lambda_i``; only ``longrope`` uses them.

    Returns:
        ``(theta, attention_scaling)``; rotate by ``m * theta`` and multiply q and k by the scaling.
    """
    if kind == NONE:
        return rope_frequencies(dim, base), 1.0
    if kind == "linear":
        # Position Interpolation: m -> m / s, i.e. theta -> theta / s (Chen et al. 2023, §2.3)
        return rope_frequencies(dim, base) / factor, 1.0
    if kind == "ntk":
        return rope_frequencies(dim, ntk_base(base, factor, dim)), 1.0
    if kind == "dynamic_ntk":
        n = train_len if seq_len is None else seq_len
        return rope_frequencies(dim, dynamic_ntk_base(base, factor, dim, n, train_len)), 1.0
    if kind == "yarn":
        return yarn_frequencies(dim, base, factor, train_len), yarn_attention_scaling(factor)
    if kind == "llama3":
        return llama3_frequencies(dim, base, factor, train_len), 1.0
    if kind == LONGROPE:
        return longrope_frequencies(dim, base, factors, factor), longrope_attention_scaling(factor, train_len)
    check_known(kind)
    raise ConfigError("eval.scaling", f"{kind!r} is not a rotary frequency scaling")


def check_known(kind: str) -> None:
    """``eval.scaling`` is one of :data:`SCALINGS`.

    Raises:
        ConfigError: on ``eval.scaling``, naming the allowed values.
    """
    if kind not in SCALINGS:
        raise ConfigError("eval.scaling", f"unknown scaling {kind!r}; choose one of: {', '.join(SCALINGS)}")


# -- what encoders share ---------------------------------------------------------------

def supported_scalings(encoder_or_cls) -> tuple[str, ...]:
    """The context-extension methods an encoder offers (``supported_scalings``; none by default)."""
    return tuple(getattr(encoder_or_cls, "supported_scalings", ()))


def module_copy(module: nn.Module) -> nn.Module:
    """A shallow copy that shares parameters and buffers but owns its registries.

    ``copy.copy`` alone would share the ``_buffers`` dict, so registering a scaled
    buffer on the copy would silently change the original.
    """
    clone = copy.copy(module)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    clone._modules = dict(module._modules)
    return clone


__all__ = ["LONGROPE", "NONE", "REROPE", "ROTARY_SCALINGS", "SCALINGS", "check_longrope_start", "dynamic_ntk_base",
           "llama3_frequencies",
           "longrope_attention_scaling", "longrope_frequencies", "module_copy", "ntk_base", "rope_frequencies",
           "rope_scaling", "supported_scalings", "yarn_attention_scaling", "yarn_frequencies"]
