"""Which evaluation-time context extension a run uses, and whether its encoder offers it.

The formulas live with the encoders (:mod:`posexp.encoders.scaling`); this is
the policy evaluation applies on top of them: the factor ``s`` a length gets,
ReRoPE's default window, the check that an encoding offers a method (with a
message naming the encoders that do), and :func:`scaled_encoder`, the one entry
point through which the evaluator gets a scaled copy of a trained encoder.
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch import nn

from posexp.encoders import get, registry
from posexp.encoders.remapping import REMAPPINGS
from posexp.encoders.scaling import (LONGROPE, NONE, REROPE, SCALINGS, check_known, check_longrope_start,
                                     supported_scalings)
from posexp.errors import ConfigError


def encoders_supporting(kind: str) -> list[str]:
    """Names of registered encoders that offer ``kind``."""
    return [name for name, cls in registry().items() if kind in supported_scalings(cls)]


def default_rerope_window(train_len: int) -> int:
    """ReRoPE's window when ``eval.rerope_window`` is unset: half the training length (at least 1)."""
    return max(1, int(train_len) // 2)


def check_scaling(kind: str, encoder_name: str, encoder_cls=None) -> None:
    """Raise :class:`ConfigError` for an unknown scaling or one the encoding does not offer.

    ``encoder_cls`` may also be an encoder instance, whose ``scaling_refusal(kind)``
    (if it has one) can refuse a method its configuration does not support.
    """
    check_known(kind)
    if kind == NONE:
        return
    if encoder_cls is None:
        encoder_cls = get(encoder_name)
    offered = supported_scalings(encoder_cls)
    if kind not in offered:
        users = encoders_supporting(kind)
        mine = f"; encoder {encoder_name!r} offers: {', '.join(offered)}" if offered else \
            f"; encoder {encoder_name!r} offers none (use eval.scaling=none)"
        raise ConfigError("eval.scaling",
                          f"{kind!r} does not apply to encoder {encoder_name!r}: it applies to "
                          f"{', '.join(users) or 'no registered encoder'}{mine}")
    refusal = getattr(encoder_cls, "scaling_refusal", None)
    if refusal is not None and not isinstance(encoder_cls, type):
        reason = refusal(kind)
        if reason is not None:
            raise ConfigError("eval.scaling", reason)


# what a fine-tune can train with: every frequency or position scaling (LongRoPE with its factors given as
# longrope_factors, Ding et al. 2024 fine-tune with them); ReRoPE's clamped distances are evaluation-time only
# (Su 2023 proposes it without training), and so are the other position remappings (posexp/encoders/remapping.py)
FINETUNE_SCALINGS = tuple(k for k in SCALINGS if k not in REMAPPINGS)


def finetune_scaling_refusal(kind: str, encoder: nn.Module) -> Optional[str]:
    """Why ``posexp finetune ... scaling=kind`` cannot train ``encoder``, or None when it can.

    The methods are the encoder's evaluation-time ones (:func:`check_scaling`), so a fine-tune trains with
    exactly the frequencies or positions that ``eval.scaling`` reads; ``none`` suits every encoding.
    """
    if kind in REMAPPINGS:
        return (f"{kind} is an evaluation-time position remapping with nothing to train; evaluate with posexp eval "
                f"RUN eval.scaling={kind}, or fine-tune with one of: {', '.join(FINETUNE_SCALINGS)}")
    if kind not in FINETUNE_SCALINGS:
        return f"unknown scaling {kind!r} for fine-tuning; choose one of: {', '.join(FINETUNE_SCALINGS)}"
    if kind == NONE:
        return None
    name = getattr(encoder, "name", type(encoder).__name__)
    offered = [k for k in supported_scalings(encoder) if k in FINETUNE_SCALINGS]
    if kind not in offered:
        users = encoders_supporting(kind)
        return (f"{kind!r} does not apply to encoder {name!r}, which fine-tunes with scaling="
                f"{', '.join([NONE, *offered])}; {kind} applies to {', '.join(users) or 'no registered encoder'}")
    refusal = getattr(encoder, "scaling_refusal", None)
    reason = refusal(kind) if refusal is not None else None
    return reason.replace("rerope (or none)", "none") if reason else None


def default_factor(length: int, train_len: int) -> float:
    """``s = eval length / train length``, never below 1 (nothing to extend at or under the training length)."""
    return max(1.0, length / train_len)


def scaled_encoder(encoder: nn.Module, kind: str, factor: float, train_len: int,
                   longrope_factors: Optional[Sequence[float]] = None, longrope_start: int = 0,
                   remap=None) -> nn.Module:
    """The encoder itself for ``none``, else its ``with_scaling`` copy (``longrope`` given its per-frequency
    factors, ``eval.longrope_factors``, and its ``n^``, ``eval.longrope_start``, passed on only when set; a position
    remapping its options, ``remap``).

    Raises:
        ConfigError: the encoding does not offer ``kind``; ``longrope`` without its factors past factor 1.
    """
    check_scaling(kind, getattr(encoder, "name", type(encoder).__name__), encoder)
    if kind == NONE:
        return encoder
    extra: dict = {"factors": longrope_factors} if kind == LONGROPE else {}
    if kind == LONGROPE and longrope_start:
        extra["start"] = check_longrope_start(longrope_start)
    if kind in REMAPPINGS[1:]:
        extra = {"remap": remap}
    return encoder.with_scaling(kind, float(factor), int(train_len), **extra)  # checked above


__all__ = ["FINETUNE_SCALINGS", "NONE", "REMAPPINGS", "REROPE", "SCALINGS", "check_scaling", "default_factor",
           "default_rerope_window", "encoders_supporting", "finetune_scaling_refusal", "scaled_encoder"]
