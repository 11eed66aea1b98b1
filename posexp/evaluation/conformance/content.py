"""The contract of the content hooks, ``transform`` and ``normalise``, at the hook itself, in float64.

The model-level causality and prefix checks (:mod:`posexp.evaluation.conformance.exact`) already run every
hook; these name the hook when it is the one at fault, and hold it to what the model relies on:

* transform: the logits of query ``i`` read the content of tokens ``0 .. i`` only: changing the layer's input,
  ``q`` and ``k`` after ``t`` leaves every logit of queries ``<= t`` as it was, and the first ``t + 1`` tokens
  alone give the same logits (prefix invariance: no logit reads how many tokens follow);
* normalise: a masked key (``-inf``: the future, or older than a window) gets weight exactly 0, every weight
  is finite and non-negative, and a query block over keys ``0 .. end - 1`` gives the rows the whole sequence
  gives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posexp.evaluation.conformance.exact import EXACT
from posexp.evaluation.conformance.probe import EncoderFactory, Probe, build_model, causal_diff, layer_encoders
from posexp.evaluation.conformance.result import FAIL, NOT_APPLICABLE, Check, within


def _inputs(probe: Probe, L: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """A random layer input ``x (B, L, D)`` and ``q``, ``k`` ``(B, H, L, Dh)`` in float64."""
    gen = torch.Generator().manual_seed(probe.seed + seed)
    B, H, D = probe.batch, probe.n_heads, probe.d_model
    x = torch.randn(B, L, D, generator=gen, dtype=torch.float64)
    q, k = (torch.randn(B, H, L, D // H, generator=gen, dtype=torch.float64) for _ in "qk")
    return x, q, k


def _causal_part(logits: Tensor) -> Tensor:
    """Logits ``(..., Lq, Lk)`` of a block starting at row 0 with the future keys zeroed."""
    future = torch.ones(logits.shape[-2:], dtype=torch.bool).triu(1)
    return logits.masked_fill(future, 0.0)


@torch.no_grad()
def check_transform(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoders = [e for e in layer_encoders(build_model(make_encoder, probe, torch.float64).encoder, probe)
                if e.uses_transform]
    if not encoders:
        return Check("transform: causal, prefix", NOT_APPLICABLE, None, "", "no transform hook")
    L = probe.train_len + probe.block // 2 + 1
    t = L // 2
    pos = torch.arange(L)
    worst_future = worst_prefix = 0.0
    for enc in encoders:
        x, q, k = _inputs(probe, L, seed=0)
        whole = _causal_part(enc.transform(x, q, k, pos)(0, L))[..., :t + 1, :t + 1]
        x2, q2, k2 = (a.clone() for a in (x, q, k))
        for a, b in zip((x2, q2, k2), _inputs(probe, L, seed=1)):
            a[..., t + 1:, :] = b[..., t + 1:, :]  # the tokens after t: x (B, L, D), q and k (B, H, L, Dh)
        changed = _causal_part(enc.transform(x2, q2, k2, pos)(0, L))[..., :t + 1, :t + 1]
        prefix = _causal_part(enc.transform(x[:, :t + 1], q[..., :t + 1, :], k[..., :t + 1, :],
                                            pos[:t + 1])(0, t + 1))
        worst_future = max(worst_future, causal_diff(whole, changed))
        worst_prefix = max(worst_prefix, causal_diff(whole, prefix))
    return within("transform: causal, prefix", max(worst_future, worst_prefix), EXACT,
                  f"logits of queries <= {t} of {L}: when x, q, k after {t} change {worst_future:.1e}; "
                  f"from the first {t + 1} tokens alone {worst_prefix:.1e}")


@torch.no_grad()
def check_normalise(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoders = [e for e in layer_encoders(build_model(make_encoder, probe, torch.float64).encoder, probe)
                if e.uses_normalise]
    if not encoders:
        return Check("normalise: masks, blocks", NOT_APPLICABLE, None, "", "no normalise hook: softmax")
    L, window = probe.train_len, probe.block
    pos = torch.arange(L)
    gen = torch.Generator().manual_seed(probe.seed)
    logits = 3 * torch.randn(probe.batch, probe.n_heads, L, L, generator=gen, dtype=torch.float64)
    distance = pos[:, None] - pos[None, :]
    masked = (distance < 0) | (distance >= window)  # the future, and keys older than a window
    logits = logits.masked_fill(masked, float("-inf"))
    worst_mask = worst_block = 0.0
    problems = []
    for enc in encoders:
        weights = enc.normalise(logits, pos, pos)
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            problems.append(f"{enc.name}: weights not finite and non-negative")
            continue
        worst_mask = max(worst_mask, float(weights[..., masked].abs().max()))
        start, end = L // 2, L // 2 + probe.block // 2
        block = enc.normalise(logits[..., start:end, :end], pos[start:end], pos[:end])
        worst_block = max(worst_block, causal_diff(block, weights[..., start:end, :end]))
    if problems:
        return Check("normalise: masks, blocks", FAIL, None, f"<= {EXACT:.0e}", "; ".join(problems))
    return within("normalise: masks, blocks", max(worst_mask, worst_block), EXACT,
                  f"largest weight on a masked key (future, or older than a window of {window}): "
                  f"{worst_mask:.1e}; a query block over keys 0..end vs the whole rows: {worst_block:.1e}")


__all__ = ["check_normalise", "check_transform"]
