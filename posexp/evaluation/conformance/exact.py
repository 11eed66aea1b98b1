"""The contract's exact properties, measured in float64 so that rounding neither hides nor fakes a violation.

* causality: no output at or before position ``t`` depends on the tokens after ``t``, nor on how many follow;
* absolute positions: a block of queries late in a sequence, given its own ``q_pos``, gives the rows the
  whole sequence gives; the model's blocked attention equals one block, at lengths that are and are not
  multiples of the block;
* relative encodings: the logits do not change when every query and key position moves by the same amount;
* fused form: ``score_mod`` evaluated as a plain tensor function equals ``bias`` (fp32, no compile).
"""

from __future__ import annotations

import torch

from posexp.encoders.contract import PositionalEncoder
from posexp.evaluation.conformance.probe import (
    EncoderFactory, Probe, attention_logits, build_model, causal_diff, layer_encoders, relative_diff, tokens)
from posexp.evaluation.conformance.result import NOT_APPLICABLE, Check, within

EXACT = 1e-6  # max abs difference in float64 of outputs that must be equal
FUSED = 1e-5  # score_mod vs bias in fp32, relative to the largest bias
SHIFTS = (13, 1000)  # common shifts of query and key positions for the relative check


def _length(probe: Probe) -> int:
    return probe.train_len + probe.block // 2 + 1  # several blocks, the last one partial


@torch.no_grad()
def check_causality(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, torch.float64)
    L = _length(probe)
    t = L // 2
    idx = tokens(probe, L)
    changed = idx.clone()
    changed[:, t + 1:] = tokens(probe, L - t - 1, seed=1)
    worst = causal_diff(model(idx)[:, :t + 1], model(changed)[:, :t + 1])
    return within("causality", worst, EXACT, f"outputs at positions <= {t} of {L} when the tokens after {t} change")


@torch.no_grad()
def check_prefix(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, torch.float64)
    L = _length(probe)
    idx = tokens(probe, L)
    full = model(idx)
    worst = max(causal_diff(full[:, :t + 1], model(idx[:, :t + 1])) for t in (probe.block // 2, L // 2))
    return within("prefix", worst, EXACT, f"outputs of the first t + 1 of {L} tokens vs those tokens alone, "
                                          f"t = {probe.block // 2}, {L // 2}: no output reads how many tokens follow")


def _hook_offsets(enc: PositionalEncoder, probe: Probe, L: int) -> float:
    """Late query blocks with their own ``q_pos`` against the same rows of the whole sequence."""
    gen = torch.Generator().manual_seed(probe.seed)
    head = probe.d_model // probe.n_heads
    q, k = (torch.randn(probe.batch, probe.n_heads, L, head, generator=gen, dtype=torch.float64) for _ in "qk")
    pos = torch.arange(L)
    whole = attention_logits(enc, q, k, pos, pos)
    worst = 0.0
    for start, end in ((L - probe.block, L), (L // 2, L // 2 + probe.block)):
        block = attention_logits(enc, q[:, :, start:end], k[:, :, :end], pos[start:end], pos[:end])
        worst = max(worst, causal_diff(block, whole[:, :, start:end, :end]))
    return worst


@torch.no_grad()
def check_offsets(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, torch.float64)
    encoder = model.encoder
    lengths = (4 * probe.block, 4 * probe.block + probe.block // 2 + 1)
    blocked = 0.0
    for L in lengths:
        idx = tokens(probe, L)
        model.shape.attn_block_size = probe.block
        split = model(idx)
        model.shape.attn_block_size = L
        blocked = max(blocked, causal_diff(split, model(idx)))
    hooks = max([_hook_offsets(e, probe, probe.train_len) for e in layer_encoders(encoder, probe)] or [0.0])
    embedded = 0.0
    if encoder.uses_embed:
        L = probe.train_len
        x = torch.randn(probe.batch, L, probe.d_model, dtype=torch.float64)
        pos = torch.arange(L)
        late = slice(L - probe.block, L)
        embedded = causal_diff(encoder.embed(x[:, late], pos[late]), encoder.embed(x, pos)[:, late])
    return within("absolute positions", max(blocked, hooks, embedded), EXACT,
                  f"blocks of {probe.block} vs one block at L={lengths[0]}, {lengths[1]}: {blocked:.1e}; "
                  f"late query blocks through the hooks: {hooks:.1e}; embed of a late slice: {embedded:.1e}")


def _shifted_logits(encoder: PositionalEncoder, probe: Probe, shift: int) -> list[torch.Tensor]:
    """Each layer's logits for one random input at positions ``shift .. shift + L - 1`` (embed included)."""
    gen = torch.Generator().manual_seed(probe.seed)
    L, D, H = probe.train_len, probe.d_model, probe.n_heads
    x = torch.randn(probe.batch, L, D, generator=gen, dtype=torch.float64)
    w_q, w_k = (torch.randn(D, D, generator=gen, dtype=torch.float64) / D ** 0.5 for _ in "qk")
    pos = torch.arange(L) + shift
    if encoder.uses_embed:
        x = encoder.embed(x, pos)
    q, k = ((x @ w).view(probe.batch, L, H, D // H).transpose(1, 2) for w in (w_q, w_k))
    return [attention_logits(e, q, k, pos, pos) for e in layer_encoders(encoder, probe)]


@torch.no_grad()
def check_relative(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoder = build_model(make_encoder, probe, torch.float64).encoder
    if not encoder.relative:
        return Check("relative", NOT_APPLICABLE, None, "", "not declared relative (relative = False)")
    shifts = [s for s in SHIFTS if encoder.supports(s + probe.train_len)]
    base = _shifted_logits(encoder, probe, 0)
    worst = max([causal_diff(a, b) for s in shifts for a, b in zip(base, _shifted_logits(encoder, probe, s))],
                default=0.0)
    return within("relative", worst, EXACT, f"logits of positions 0..{probe.train_len - 1} vs the same shifted by "
                                            f"{', '.join(map(str, shifts))}, every layer's encoding, embed included")


@torch.no_grad()
def check_fused(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoder = build_model(make_encoder, probe).encoder
    fused = [e for e in layer_encoders(encoder, probe) if e.uses_score_mod and e.uses_bias]
    if not fused:
        return Check("fused = plain", NOT_APPLICABLE, None, "", "no score_mod: the model always takes bias()")
    L = min(probe.lengths[-1], encoder.max_length or probe.lengths[-1])
    pos = torch.arange(L)
    worst = 0.0
    for enc in fused:
        for q_pos, k_pos in ((pos[:probe.train_len], pos[:probe.train_len]), (pos[L - probe.block:], pos)):
            plain = enc.bias(q_pos, k_pos).float()
            score_mod = enc.score_mod(q_pos, k_pos)
            h = torch.arange(plain.shape[0])[:, None, None]
            q_idx, kv_idx = torch.arange(len(q_pos))[None, :, None], torch.arange(len(k_pos))[None, None, :]
            eager = score_mod(torch.zeros(()), torch.zeros((), dtype=torch.long), h, q_idx, kv_idx)
            eager = eager.expand_as(plain).float()
            causal = k_pos[None, :] <= q_pos[:, None]
            worst = max(worst, relative_diff(eager[:, causal], plain[:, causal]))
    return within("fused = plain", worst, FUSED,
                  f"score_mod applied eagerly vs bias(), causal entries, fp32, relative to max |bias|, "
                  f"{probe.train_len} tokens and a late block of {probe.block} at {L}: {worst:.1e}")


__all__ = ["check_causality", "check_fused", "check_offsets", "check_prefix", "check_relative"]
