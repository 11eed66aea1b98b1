"""A conformance kit for positional encodings: ``posexp check ENCODER``.

Holds any encoding, built-in or plugin, to the encoder contract (:mod:`posexp.encoders.contract`) in a small
random GPT on a CPU, with no training, in seconds. Each check returns a :class:`Check`: pass, fail or n/a, the
number it measured and the bound it held it to; or an error, where nothing could be measured (out of memory).

===========================  ==========================================================================
check                        what it holds the encoding to
===========================  ==========================================================================
hook outputs                 each hook's return has the contract's shape, the input's dtype and device, and is
                             finite where the model reads it
causality                    no output at or before ``t`` depends on the tokens after ``t``
prefix                       nor on how many tokens follow: the first ``t + 1`` outputs are the prefix's own
absolute positions           query blocks with their own ``q_pos`` give the rows of the whole sequence
context parallel             an encoding declaring ``context_parallel = True``: attention over shards of the
                             sequence, each from its own tokens and positions, merged as a ring does, equals the whole
relative                     an encoding declaring ``relative = True``: logits invariant under a common shift
transform: causal, prefix    the content logits of query ``i`` read tokens ``0 .. i`` only, nor how many follow
normalise: masks, blocks     a replacement of softmax gives masked keys weight 0, and blocks the whole's rows
fused = plain                ``score_mod``, applied as a tensor function, equals ``bias``
fused backward               each learned tensor ``score_mod`` reads is indexed once per logit and is not 0-d
length                       runs at 16x the nominal training length (posexp train's default 128, so 2,048
                             tokens; ``posexp check ENC train_len=N``: 16N) or refuses past its ``max_length``;
                             no NaN/inf in outputs or gradients
memory linear in length      the largest tensor of a forward pass grows linearly with the length
scalings: factor 1           each evaluation-time scaling it offers is the identity at factor 1
scalings: = transformers     rotary scalings equal transformers' ``ROPE_INIT_FUNCTIONS``
determinism                  two seeded runs are bitwise equal
bf16                         bf16 autocast runs, finite, close to fp32
speed vs rope                forward + backward time at the default model shape
===========================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Optional

import torch

from posexp.evaluation.conformance.content import check_normalise, check_transform
from posexp.evaluation.conformance.exact import (
    check_causality, check_fused, check_fused_backward, check_offsets, check_prefix, check_relative)
from posexp.evaluation.conformance.numerics import (
    check_bf16, check_determinism, check_length, check_memory, check_speed)
from posexp.evaluation.conformance.outputs import check_outputs
from posexp.evaluation.conformance.probe import EncoderFactory, Probe, casts
from posexp.evaluation.conformance.result import ERROR, FAIL, NOT_APPLICABLE, PASS, Check
from posexp.evaluation.conformance.sharded import check_context_parallel
from posexp.evaluation.conformance.scalings import check_scaling_identity, check_scaling_reference

CHECKS: dict[str, Callable[[EncoderFactory, Probe], Check]] = {
    "hook outputs": check_outputs,
    "causality": check_causality,
    "prefix": check_prefix,
    "absolute positions": check_offsets,
    "context parallel": check_context_parallel,
    "relative": check_relative,
    "transform: causal, prefix": check_transform,
    "normalise: masks, blocks": check_normalise,
    "fused = plain": check_fused,
    "fused backward": check_fused_backward,
    "length": check_length,
    "memory linear in length": check_memory,
    "scalings: factor 1": check_scaling_identity,
    "scalings: = transformers": check_scaling_reference,
    "determinism": check_determinism,
    "bf16": check_bf16,
    "speed vs rope": check_speed,
}


# properties exact in float64: an encoder computing in float32 is held to them in float32 (exact.EXACT_FLOAT32)
EXACT_CHECKS = ("causality", "prefix", "absolute positions", "context parallel", "relative")
# checks that measure a cost, not a property: whatever stops them is an error of the measurement
MEASUREMENTS = ("memory linear in length", "speed vs rope")
_NO_MEMORY = ("out of memory", "can't allocate memory", "DefaultCPUAllocator")


def unmeasured(name: str, error: Exception) -> bool:
    """Whether ``error`` stopped a measurement rather than showing a broken contract: memory ran out, or a
    measurement of cost crashed."""
    return (name in MEASUREMENTS or isinstance(error, MemoryError)
            or (isinstance(error, RuntimeError) and any(text in str(error) for text in _NO_MEMORY)))


def _run_one(name: str, make_encoder: EncoderFactory, probe: Probe) -> Check:
    """One check; what its code raises is a finding (a broken hook fails), or an error where it stopped a
    measurement (:func:`unmeasured`)."""
    try:
        return CHECKS[name](make_encoder, probe)
    except Exception as e:  # noqa: BLE001 (the encoder's code, whatever it raises, is what is under test)
        if unmeasured(name, e):
            return Check(name, ERROR, None, "", f"not measured: raised {type(e).__name__}: {e}")
        return Check(name, FAIL, None, "", f"raised {type(e).__name__}: {e}")


def _in_float32(name: str, make_encoder: EncoderFactory, probe: Probe) -> Check:
    result = _run_one(name, make_encoder, replace(probe, exact_dtype="float32"))
    return replace(result, detail=f"in float32, which the encoder computes in: {result.detail}")


def run_checks(make_encoder: EncoderFactory, probe: Optional[Probe] = None, names: Optional[Iterable[str]] = None,
               on_check: Optional[Callable[[Check], None]] = None) -> list[Check]:
    """Every check of :data:`CHECKS` on the encoder ``make_encoder(d_model, n_heads)`` builds.

    A check whose code raises fails with the exception's message: a broken hook is a finding, not a crash;
    one that ran out of memory, or a measurement of cost that crashed, is an ``error``. An exact check that
    fails in float64 for an encoder that computes in float32 (:func:`~posexp.evaluation.conformance.probe.casts`)
    is measured again in float32, to the bound float32 can meet: the dtype idiom is not a violation.

    Args:
        make_encoder: builds a fresh encoder for a model of the given width and heads.
        probe: the probe model's shape and lengths (default :class:`Probe`).
        names: the checks to run, keys of :data:`CHECKS` (default: all, in that order).
        on_check: called with each result as it is measured (for progress).
    """
    probe = probe or Probe()
    results = []
    threads = torch.get_num_threads()
    # the probe's tensors are tiny: one thread computes them as fast as several, and does not slow to a crawl
    # on a busy machine, where several threads of one small operation wait for each other
    torch.set_num_threads(1)
    in_float32: Optional[bool] = None
    try:
        for name in CHECKS if names is None else names:
            result = _run_one(name, make_encoder, probe)
            if name in EXACT_CHECKS and result.status == FAIL and probe.exact_dtype == "float64":
                in_float32 = casts(make_encoder, probe) if in_float32 is None else in_float32
                result = _in_float32(name, make_encoder, probe) if in_float32 else result
            results.append(result)
            if on_check is not None:
                on_check(result)
    finally:
        torch.set_num_threads(threads)
    return results


__all__ = ["CHECKS", "ERROR", "EXACT_CHECKS", "FAIL", "NOT_APPLICABLE", "PASS", "Check", "Probe", "run_checks"]
