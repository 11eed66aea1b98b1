"""The evaluation-time scalings an encoding offers (:mod:`posexp.encoders.scaling`): factor 1 changes nothing,
and rotary frequencies equal Hugging Face transformers' own (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``).

transformers is an optional dependency (the ``test`` extra): without it the comparison is "not applicable".
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.extension import REMAPPINGS
from posexp.encoders.scaling import REROPE, supported_scalings
from posexp.evaluation.conformance.probe import EncoderFactory, Probe, build_model, relative_diff, tokens
from posexp.evaluation.conformance.result import NOT_APPLICABLE, Check, within

IDENTITY = 1e-5  # relative difference of the logits at factor 1
MATCH = 1e-5  # relative difference of each frequency from transformers' (both fp32 in the end)
FACTOR = 4.0
# eval.scaling -> transformers' rope_type, and the factor / length that type is read with
_HF_TYPES = {"linear": "linear", "ntk": "dynamic", "dynamic_ntk": "dynamic", "yarn": "yarn", "llama3": "llama3"}


def transformers_rope(kind: str, dim: int, base: float, train_len: int, factor: float,
                      seq_len: Optional[int] = None, **extra) -> tuple[Tensor, float]:
    """transformers' inverse frequencies ``(dim/2,)`` and attention scaling of a Llama config with rotary width
    ``dim``, for its rope type ``kind`` (``linear``, ``dynamic``, ``yarn``, ``llama3``).

    Raises:
        ImportError: transformers (>= 5) is not installed.
    """
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": kind, "factor": factor, "rope_theta": base, **extra}
    max_pos = train_len if kind in ("linear", "dynamic") else int(train_len * max(factor, 1.0))
    cfg = transformers.LlamaConfig(hidden_size=dim * 2, num_attention_heads=2, head_dim=dim,
                                   max_position_embeddings=max_pos, rope_parameters=params)
    inv_freq, attention = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=seq_len)
    return inv_freq, float(attention)


def transformers_scaling(kind: str, dim: int, base: float, train_len: int, factor: float) -> tuple[Tensor, float]:
    """transformers' frequencies for posexp's ``eval.scaling=kind`` read at ``factor * train_len`` tokens."""
    seq_len = int(factor * train_len)
    if kind == "ntk":  # the static NTK-aware base is transformers' dynamic type at factor 1 read at s * L tokens
        return transformers_rope("dynamic", dim, base, train_len, 1.0, seq_len=seq_len)
    extra: dict[str, float] = {"original_max_position_embeddings": train_len} if kind in ("yarn", "llama3") else {}
    if kind == "llama3":
        extra.update(low_freq_factor=1.0, high_freq_factor=4.0)
    return transformers_rope(_HF_TYPES[kind], dim, base, train_len, factor, seq_len=seq_len, **extra)


def _elementwise(ours: Tensor, reference: Tensor) -> float:
    """``max |ours / reference - 1|``: every frequency to the same relative precision, the slowest included."""
    return float(((ours.double() - reference.double()).abs() / reference.double().abs()).max())


def _offered(encoder: PositionalEncoder) -> list[str]:
    refusal = getattr(encoder, "scaling_refusal", lambda kind: None)
    return [k for k in supported_scalings(encoder) if refusal(k) is None]


@torch.no_grad()
def check_scaling_identity(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe)
    kinds = [k for k in _offered(model.encoder) if k not in REMAPPINGS[1:]]  # remappings have no factor 1
    if not kinds:
        return Check("scalings: factor 1", NOT_APPLICABLE, None, "", "offers no evaluation-time scaling")
    idx = tokens(probe, probe.train_len)
    plain, encoder = model(idx), model.encoder
    worst = 0.0
    for kind in kinds:
        # ReRoPE's factor is its window: one as long as the sequence clamps nothing
        factor = float(probe.train_len) if kind == REROPE else 1.0
        model.encoder = encoder.with_scaling(kind, factor, probe.train_len)
        worst = max(worst, relative_diff(model(idx), plain))
        model.encoder = encoder
    return within("scalings: factor 1", worst, IDENTITY,
                  f"{', '.join(kinds)} at factor 1 (rerope: window {probe.train_len}) vs unscaled, logits at "
                  f"{probe.train_len} tokens")


def check_scaling_reference(make_encoder: EncoderFactory, probe: Probe) -> Check:
    name = "scalings: = transformers"
    encoder = build_model(make_encoder, probe).encoder
    kinds = [k for k in _offered(encoder) if k in _HF_TYPES]
    rotary = all(hasattr(encoder, a) for a in ("frequencies", "rot_dim", "inv_freq"))
    if not kinds or not rotary:
        return Check(name, NOT_APPLICABLE, None, "", "no rotary frequencies with a transformers rope type")
    if _elementwise(encoder.inv_freq, rope_frequencies(encoder.rot_dim, encoder.base)) > MATCH:
        return Check(name, NOT_APPLICABLE, None, "", "its unscaled frequencies are not base^(-2i/d), which "
                                                     "transformers' scalings start from")
    worst, train_len = 0.0, probe.train_len
    for kind in kinds:
        scaled = encoder.with_scaling(kind, FACTOR, train_len)
        theta, attention = scaled.frequencies(int(FACTOR * train_len))
        try:
            theirs, their_attention = transformers_scaling(kind, encoder.rot_dim, encoder.base, train_len, FACTOR)
        except ImportError:
            return Check(name, NOT_APPLICABLE, None, "", "transformers is not installed (pip install transformers)")
        worst = max(worst, _elementwise(theta, theirs), abs(attention - their_attention))
    return within(name, worst, MATCH, f"{', '.join(kinds)} at factor {FACTOR:g} from {train_len} tokens: "
                                      f"frequencies and attention scaling vs transformers' ROPE_INIT_FUNCTIONS")


__all__ = ["check_scaling_identity", "check_scaling_reference", "transformers_rope", "transformers_scaling"]
