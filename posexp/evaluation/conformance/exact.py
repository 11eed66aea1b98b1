"""The contract's exact properties, measured in float64 so that rounding neither hides nor fakes a violation (in
float32, to a bound it can meet, for an encoder that computes in float32: :func:`~posexp.evaluation.conformance.
run_checks` says when).

* causality: no output at or before position ``t`` depends on the tokens after ``t``, nor on how many follow;
* absolute positions: a block of queries late in a sequence, given its own ``q_pos``, gives the rows the
  whole sequence gives; the model's blocked attention equals one block, at lengths that are and are not
  multiples of the block;
* relative encodings: the logits do not change when every query and key position moves by the same amount;
* fused form: ``score_mod`` evaluated as a plain tensor function equals ``bias`` (fp32, no compile);
* fused backward: every learned tensor a ``score_mod`` reads is one FlexAttention's backward can differentiate:
  not 0-d, and indexed once per logit (PyTorch 2.11 refuses both, fused and in its dense reference; on a CPU
  nothing else would show it before a GPU run fails).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from posexp.encoders.contract import PositionalEncoder
from posexp.evaluation.conformance.probe import (
    EncoderFactory, Probe, attention_logits, build_model, causal_diff, encodable, layer_encoders, relative_diff,
    tokens)
from posexp.evaluation.conformance.result import FAIL, NOT_APPLICABLE, PASS, Check, within

EXACT = 1e-6  # max abs difference in float64 of outputs that must be equal
# the same in float32, for an encoder that computes in it: 24 bits of mantissa, so outputs of order 10 summed in
# another order (blocks, a shorter row) differ by ~1e-6; a leak moves them by 1e-3 and more
EXACT_FLOAT32 = 1e-4
FUSED = 1e-5  # score_mod vs bias in fp32, relative to the largest bias
SHIFTS = (13, 1000)  # common shifts of query and key positions for the relative check


def _dtype(probe: Probe) -> torch.dtype:
    return getattr(torch, probe.exact_dtype)


def _bound(probe: Probe) -> float:
    return EXACT if probe.exact_dtype == "float64" else EXACT_FLOAT32


def _length(probe: Probe, encoder: PositionalEncoder) -> int:
    return encodable(encoder, probe.train_len + probe.block // 2 + 1)  # several blocks, the last one partial


@torch.no_grad()
def check_causality(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, _dtype(probe))
    L = _length(probe, model.encoder)
    t = L // 2
    idx = tokens(probe, L)
    changed = idx.clone()
    changed[:, t + 1:] = tokens(probe, L - t - 1, seed=1)
    worst = causal_diff(model(idx)[:, :t + 1], model(changed)[:, :t + 1])
    return within("causality", worst, _bound(probe),
                  f"outputs at positions <= {t} of {L} when the tokens after {t} change")


@torch.no_grad()
def check_prefix(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, _dtype(probe))
    L = _length(probe, model.encoder)
    idx = tokens(probe, L)
    full = model(idx)
    worst = max(causal_diff(full[:, :t + 1], model(idx[:, :t + 1])) for t in (probe.block // 2, L // 2))
    return within("prefix", worst, _bound(probe), f"outputs of the first t + 1 of {L} tokens vs those tokens alone, "
                                                  f"t = {probe.block // 2}, {L // 2}: no output reads how many tokens "
                                                  "follow")


def _hook_offsets(enc: PositionalEncoder, probe: Probe, L: int) -> float:
    """Late query blocks with their own ``q_pos`` against the same rows of the whole sequence."""
    gen = torch.Generator().manual_seed(probe.seed)
    head = probe.d_model // probe.n_heads
    q, k = (torch.randn(probe.batch, probe.n_heads, L, head, generator=gen, dtype=_dtype(probe)) for _ in "qk")
    pos = torch.arange(L)
    whole = attention_logits(enc, q, k, pos, pos)
    content = None
    if enc.uses_transform:  # the transform's block of queries start..end against the same rows of the whole
        x = torch.randn(probe.batch, L, probe.d_model, generator=gen, dtype=torch.float64)
        content = enc.transform(x, q, k, pos)
        whole = whole + content(0, L).masked_fill(pos[None, :] > pos[:, None], 0.0)
    worst = 0.0
    for start, end in ((L - probe.block, L), (L // 2, L // 2 + probe.block)):
        block = attention_logits(enc, q[:, :, start:end], k[:, :, :end], pos[start:end], pos[:end])
        if content is not None:
            block = block + content(start, end).masked_fill(pos[None, :end] > pos[start:end, None], 0.0)
        worst = max(worst, causal_diff(block, whole[:, :, start:end, :end]))
    return worst


@torch.no_grad()
def check_offsets(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, _dtype(probe))
    encoder = model.encoder
    lengths = tuple(encodable(encoder, L) for L in (4 * probe.block, 4 * probe.block + probe.block // 2 + 1))
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
        x = torch.randn(probe.batch, L, probe.d_model, dtype=_dtype(probe))
        pos = torch.arange(L)
        late = slice(L - probe.block, L)
        embedded = causal_diff(encoder.embed(x[:, late], pos[late]), encoder.embed(x, pos)[:, late])
    return within("absolute positions", max(blocked, hooks, embedded), _bound(probe),
                  f"blocks of {probe.block} vs one block at L={lengths[0]}, {lengths[1]}: {blocked:.1e}; "
                  f"late query blocks through the hooks: {hooks:.1e}; embed of a late slice: {embedded:.1e}")


def _shifted_logits(encoder: PositionalEncoder, probe: Probe, shift: int) -> list[torch.Tensor]:
    """Each layer's logits for one random input at positions ``shift .. shift + L - 1`` (embed and transform
    included)."""
    gen = torch.Generator().manual_seed(probe.seed)
    L, D, H = probe.train_len, probe.d_model, probe.n_heads
    x = torch.randn(probe.batch, L, D, generator=gen, dtype=_dtype(probe))
    w_q, w_k = (torch.randn(D, D, generator=gen, dtype=_dtype(probe)) / D ** 0.5 for _ in "qk")
    pos = torch.arange(L) + shift
    if encoder.uses_embed:
        x = encoder.embed(x, pos)
    q, k = ((x @ w).view(probe.batch, L, H, D // H).transpose(1, 2) for w in (w_q, w_k))
    return [attention_logits(e, q, k, pos, pos, x) for e in layer_encoders(encoder, probe)]


@torch.no_grad()
def check_relative(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoder = build_model(make_encoder, probe, _dtype(probe)).encoder
    if not encoder.relative:
        return Check("relative", NOT_APPLICABLE, None, "", "not declared relative (relative = False)")
    shifts = [s for s in SHIFTS if encoder.supports(s + probe.train_len)]
    base = _shifted_logits(encoder, probe, 0)
    worst = max([causal_diff(a, b) for s in shifts for a, b in zip(base, _shifted_logits(encoder, probe, s))],
                default=0.0)
    return within("relative", worst, _bound(probe),
                  f"logits of positions 0..{probe.train_len - 1} vs the same shifted by "
                  f"{', '.join(map(str, shifts))}, every layer's encoding, embed included")


@torch.no_grad()
def check_fused(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoder = build_model(make_encoder, probe).encoder
    fused = [e for e in layer_encoders(encoder, probe) if e.uses_score_mod and e.uses_bias]
    if not fused:
        return Check("fused = plain", NOT_APPLICABLE, None, "", "no score_mod: the model always takes bias()")
    L = encodable(encoder, probe.lengths[-1])
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


def _captured(score_mod: Callable) -> list[Tensor]:
    """The tensors ``score_mod`` closes over, through nested closures, bound methods, partials, lists, tuples,
    dicts and modules (their parameters and buffers): what FlexAttention lifts into its kernel as buffers."""
    found: list[Tensor] = []
    stack: list[Any] = [score_mod]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Tensor):
            found.append(obj)
        elif isinstance(obj, nn.Module):
            stack.extend([*obj.parameters(), *obj.buffers()])
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif callable(obj):
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    stack.append(cell.cell_contents)
                except ValueError:  # a cell not filled yet
                    pass
            stack.extend(getattr(obj, attr) for attr in ("__self__", "__func__", "func", "args", "keywords")
                         if hasattr(obj, attr) and not isinstance(obj, type))
    return found


class _Reads(TorchFunctionMode):
    """Counts how often each watched tensor is indexed (``t[...]``) while the mode is on."""

    def __init__(self, watched: list[Tensor]):
        super().__init__()
        self.watched = {id(t) for t in watched}
        self.counts: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is Tensor.__getitem__ and args and id(args[0]) in self.watched:
            self.counts[id(args[0])] += 1
        return func(*args, **(kwargs or {}))


def _unfusable(score_mod: Callable, n_heads: int, q_len: int, k_len: int) -> list[str]:
    """What FlexAttention's backward could not differentiate among the learned tensors ``score_mod`` reads."""
    learned = [t for t in _captured(score_mod) if t.requires_grad]
    found = [f"a 0-d learned tensor ({t.item():.3g}): read a per-head copy indexed by h instead"
             for t in learned if t.dim() == 0]
    with torch.no_grad(), _Reads(learned) as reads:  # one logit: the last head, the last query, the first key
        score_mod(torch.zeros(()), torch.zeros((), dtype=torch.long), torch.tensor(n_heads - 1),
                  torch.tensor(q_len - 1), torch.tensor(0))
    found += [f"a learned tensor of shape {tuple(t.shape)} indexed {reads.counts[id(t)]} times for one logit: "
              f"read a clone for each further lookup" for t in learned if reads.counts[id(t)] > 1]
    return found


def check_fused_backward(make_encoder: EncoderFactory, probe: Probe) -> Check:
    encoder = build_model(make_encoder, probe).encoder
    fused = [e for e in layer_encoders(encoder, probe) if e.uses_score_mod]
    if not fused:
        return Check("fused backward", NOT_APPLICABLE, None, "", "no score_mod")
    pos = torch.arange(probe.train_len)  # score_mods built with gradients on, as in training
    problems = list(dict.fromkeys(p for enc in fused for p in _unfusable(enc.score_mod(pos, pos), enc.n_heads,
                                                                          len(pos), len(pos))))
    if not problems:
        return Check("fused backward", PASS, 0.0, "0 tensors",
                     "every learned tensor score_mod reads is indexed once per logit and is not 0-d")
    return Check("fused backward", FAIL, float(len(problems)), "0 tensors",
                 "FlexAttention's backward cannot differentiate " + "; ".join(problems))


__all__ = ["check_causality", "check_fused", "check_fused_backward", "check_offsets", "check_prefix",
           "check_relative"]
