"""The context-parallel contract: does a shard of the sequence compute the encoding alone?

Context parallelism splits a sequence into shards, one per device; each device keeps its shard of queries and
receives the other shards' keys and values in turn (a ring), computing the attention of its queries on each key
shard from that shard alone, then merging the partial results by their log-sum-exp (Liu et al. 2023, "Ring
Attention with Blockwise Transformers", §3; Milakov & Gimelshein 2018 for the online-softmax merge; torch's
``context_parallel`` does the same). An encoding fits when the logits of a query block over a key block follow
from those blocks and their absolute positions (``q_pos``, ``k_pos``) alone.

The check computes exactly that, in float64, through the encoder's own hooks: the sequence in ``SHARDS``
shards, each query shard against each key shard at or before it (``embed``, ``rotate``, ``bias`` and ``scores``
given the two shards' positions; ``transform`` given the two shards' tokens alone; ``normalise`` on each key
shard, its weights summed, since a ring has nothing else to merge a normaliser's output with), merged by
log-sum-exp, against the attention of the whole sequence.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from posexp.encoders.contract import PositionalEncoder
from posexp.evaluation.conformance.exact import _bound, _dtype
from posexp.evaluation.conformance.probe import EncoderFactory, Probe, attention_logits, build_model, layer_encoders
from posexp.evaluation.conformance.result import FAIL, PASS, Check

SHARDS = 4
NAME = "context parallel"


def _logits(enc: PositionalEncoder, q: Tensor, k: Tensor, x: Tensor, pos: Tensor, rows: Tensor,
            cols: Tensor) -> Tensor:
    """Logits of queries ``rows`` over keys ``cols`` from those tokens alone, ``-inf`` on future keys."""
    logits = attention_logits(enc, q[:, :, rows], k[:, :, cols], pos[rows], pos[cols])
    if enc.uses_transform:  # the transform sees the key shard then the query shard, nothing between
        seen = torch.unique(torch.cat([cols, rows]))  # sorted: the keys' shard comes first
        content = enc.transform(x[:, seen], q[:, :, seen], k[:, :, seen], pos[seen])(0, len(seen))
        where = {int(i): n for n, i in enumerate(seen)}
        r = torch.tensor([where[int(i)] for i in rows])
        c = torch.tensor([where[int(i)] for i in cols])
        logits = logits + content[:, :, r][:, :, :, c].to(logits.dtype)
    future = pos[cols][None, :] > pos[rows][:, None]
    return logits.masked_fill(future, float("-inf"))


def _attend(enc: PositionalEncoder, logits: Tensor, rows: Tensor, cols: Tensor, pos: Tensor,
            v: Tensor) -> tuple[Tensor, Optional[Tensor]]:
    """A block's output, and its log-sum-exp to merge it by (None for a normaliser: summed as it is)."""
    if enc.uses_normalise:
        return enc.normalise(logits, pos[rows], pos[cols]) @ v[:, :, cols], None
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, H, Lq, 1)
    return torch.softmax(logits, dim=-1) @ v[:, :, cols], lse


def sharded_difference(enc: PositionalEncoder, probe: Probe, L: int) -> float:
    """``max |attention by shards - attention of the whole|`` for one layer's encoder over ``L`` tokens."""
    gen = torch.Generator().manual_seed(probe.seed)
    dtype, head = _dtype(probe), probe.d_model // probe.n_heads
    x = torch.randn(probe.batch, L, probe.d_model, generator=gen, dtype=dtype)
    q, k, v = (torch.randn(probe.batch, probe.n_heads, L, head, generator=gen, dtype=dtype) for _ in "qkv")
    pos = torch.arange(L)
    every = torch.arange(L)
    whole, _ = _attend(enc, _logits(enc, q, k, x, pos, every, every), every, every, pos, v)
    worst = 0.0
    shards = torch.arange(L).chunk(SHARDS)
    for i, rows in enumerate(shards):
        parts = [_attend(enc, _logits(enc, q, k, x, pos, rows, cols), rows, cols, pos, v) for cols in shards[:i + 1]]
        if enc.uses_normalise:
            out = sum(o for o, _ in parts)
        else:
            lses = torch.cat([lse for _, lse in parts], dim=-1)
            total = torch.logsumexp(lses, dim=-1, keepdim=True)
            out = sum(o * torch.exp(lse - total) for o, lse in parts)
        worst = max(worst, float((out - whole[:, :, rows]).abs().max()))
    return worst


def _embedded_difference(enc: PositionalEncoder, probe: Probe, L: int) -> float:
    """``embed`` of each shard with its own positions against the same rows of the whole sequence's."""
    if not enc.uses_embed:
        return 0.0
    x = torch.randn(probe.batch, L, probe.d_model, generator=torch.Generator().manual_seed(probe.seed),
                    dtype=_dtype(probe))
    pos = torch.arange(L)
    whole = enc.embed(x, pos)
    return max(float((enc.embed(x[:, rows], pos[rows]) - whole[:, rows]).abs().max())
               for rows in torch.arange(L).chunk(SHARDS))


@torch.no_grad()
def check_context_parallel(make_encoder: EncoderFactory, probe: Probe) -> Check:
    """Shards against the whole: a declared ``context_parallel = True`` that differs fails; a declared False
    passes either way (refusing is always safe), saying whether the shards happened to agree."""
    encoder = build_model(make_encoder, probe, _dtype(probe)).encoder
    L = probe.train_len // SHARDS * SHARDS
    worst = max([sharded_difference(e, probe, L) for e in layer_encoders(encoder, probe)]
                + [_embedded_difference(encoder, probe, L)])
    bound, agree = _bound(probe), None
    agree = worst <= bound  # False for NaN
    how = f"{SHARDS} shards of {L // SHARDS} tokens, merged by log-sum-exp, vs the whole {L}: {worst:.1e}"
    if encoder.context_parallel:
        return Check(NAME, PASS if agree else FAIL, worst, f"<= {bound:.0e}",
                     f"declared shardable (context_parallel = True); {how}")
    verdict = ("the shards agree: it could declare context_parallel = True" if agree
               else "the shards differ, as declared")
    return Check(NAME, PASS, worst, f"<= {bound:.0e} if declared",
                 f"declared whole-sequence (context_parallel = False), which train.context_parallel refuses; "
                 f"{how}: {verdict}")
