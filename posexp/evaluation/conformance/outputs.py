"""What each hook returns, held to the contract's table (:mod:`posexp.encoders.contract`) before a model uses it.

The model broadcasts what a hook gives it, so a hook that returns the wrong layout can run in the probe and fail
only later: ``scores`` laid out ``(H, B, Lq, Lk)`` reads the same as ``(B, H, Lq, Lk)`` when the batch and the
heads are both 2, and a bias built on the CPU runs until the model is on a GPU. Each hook in use is called as the
model calls it, with a batch unlike the number of heads and a late block of queries (``Lq < Lk``), and what it
returns must have the contract's shape (a size 1 in place of the heads or the batch where the model broadcasts
it; ``rotate``'s head width may change, alike for ``q`` and ``k``), the input's dtype where the model feeds it on
unchanged (``embed``, ``rotate``, ``normalise``; a floating dtype for the logit terms it casts), the input's device (the CPU's and, where the machine has one, CUDA's), and
finite values where the model reads them (the logit terms of the keys a query sees).
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor

from posexp.encoders.contract import PositionalEncoder
from posexp.evaluation.conformance.probe import EncoderFactory, Probe, build_model, encodable, layer_encoders
from posexp.evaluation.conformance.result import FAIL, PASS, Check

NAME = "hook outputs"


def _devices() -> list[torch.device]:
    """Where the hooks are called: the CPU, and CUDA where there is one (a tensor made without ``device=`` shows)."""
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def _problem(hook: str, out: object, shape: Sequence[int], dtype: Optional[torch.dtype], device: torch.device,
             seen: Optional[Tensor] = None, broadcast: Sequence[int] = ()) -> Optional[str]:
    """Why ``out``, what ``hook`` returned, is not what the model needs; None when it is.

    Args:
        shape: the contract's shape (``broadcast``: the dimensions that may be 1 instead).
        dtype: the dtype it must have; None: any floating dtype (the model casts it).
        seen: where it must be finite, a mask broadcasting to ``shape`` (None: everywhere).
    """
    if not isinstance(out, Tensor):
        return f"{hook} returned {type(out).__name__}, not a tensor"
    wanted = "(" + ", ".join(str(n) for n in shape) + ")"
    if out.dim() != len(shape) or any(n != want and not (i in broadcast and n == 1)
                                      for i, (n, want) in enumerate(zip(out.shape, shape))):
        return f"{hook} returned shape {tuple(out.shape)}, the contract's is {wanted}"
    if dtype is not None and out.dtype != dtype:
        return f"{hook} returned {out.dtype} for {dtype} inputs"
    if not out.is_floating_point():
        return f"{hook} returned {out.dtype}, not a floating dtype (a logit term is added, not a mask)"
    if out.device.type != device.type:
        return f"{hook} returned a tensor on {out.device} for inputs on {device}"
    finite = torch.isfinite(out.detach())
    if not bool((finite if seen is None else finite | ~seen).all()):
        return f"{hook} returned NaN/inf" + (" where a query sees the key" if seen is not None else "")
    return None


def _keys(encoder: PositionalEncoder, probe: Probe) -> int:
    """The keys the hooks are called over: a few blocks, within the encoder's ``max_length``."""
    return encodable(encoder, 2 * probe.block + 3)


def _problems(encoder: PositionalEncoder, probe: Probe, device: torch.device) -> Iterator[Optional[str]]:
    """What is wrong with each hook ``encoder`` uses, one entry per hook call (None: nothing)."""
    B, H, D = probe.batch + 1, probe.n_heads, probe.d_model  # B != H: a layout mixing them up shows
    L = _keys(encoder, probe)
    Lq = min(probe.block, L)
    gen = torch.Generator().manual_seed(probe.seed)
    x = torch.randn(B, L, D, generator=gen).to(device)
    q, k = (torch.randn(B, H, L, D // H, generator=gen).to(device) for _ in "qk")
    pos = torch.arange(L, device=device)
    q_pos, qb = pos[L - Lq:], q[:, :, L - Lq:]
    seen = k.new_ones(Lq, L, dtype=torch.bool).tril(L - Lq)  # (Lq, L): the keys each late query attends to
    if encoder.uses_embed:
        yield _problem("embed", encoder.embed(x, pos), (B, L, D), x.dtype, device)
    for enc in layer_encoders(encoder, probe):
        if enc.uses_rotate:
            rotated = enc.rotate(qb, k, q_pos, pos)
            if not isinstance(rotated, tuple) or len(rotated) != 2:
                yield f"rotate returned {type(rotated).__name__}, not the pair (q, k)"
            else:  # the head width may change (PoPE's doubles it), the same for q and k
                width = rotated[0].shape[-1] if isinstance(rotated[0], Tensor) and rotated[0].dim() else D // H
                yield _problem("rotate's q", rotated[0], (*qb.shape[:-1], width), q.dtype, device)
                yield _problem("rotate's k", rotated[1], (*k.shape[:-1], width), k.dtype, device)
        if enc.uses_bias:
            bias = enc.bias(q_pos, pos)
            if bias is not None:
                yield _problem("bias", bias, (H, Lq, L), None, device, seen, broadcast=(0,))
        if enc.uses_scores:
            scores = enc.scores(qb, k, q_pos, pos)
            if scores is not None:
                yield _problem("scores", scores, (B, H, Lq, L), None, device, seen, broadcast=(0, 1))
        if enc.uses_transform:
            logits_of = enc.transform(x, q, k, pos)
            if not callable(logits_of):
                yield f"transform returned {type(logits_of).__name__}, not the function logits(start, end)"
            else:
                yield _problem("transform's logits", logits_of(L - Lq, L), (B, H, Lq, L), None, device, seen,
                               broadcast=(0, 1))
        if enc.uses_normalise:
            logits = (qb @ k.transpose(-1, -2)).masked_fill(~seen, float("-inf"))
            yield _problem("normalise", enc.normalise(logits, q_pos, pos), logits.shape, logits.dtype, device)


@torch.no_grad()
def check_outputs(make_encoder: EncoderFactory, probe: Probe) -> Check:
    devices = _devices()
    found = []
    for device in devices:
        encoder = build_model(make_encoder, probe).encoder.to(device)
        found += [problem for problem in _problems(encoder, probe, device) if problem is not None]
    where, keys = " and ".join(d.type for d in devices), _keys(encoder, probe)
    detail = (f"each hook in use called as the model calls it (batch {probe.batch + 1}, {probe.n_heads} heads, "
              f"{min(probe.block, keys)} late queries over {keys} keys) on {where}: the contract's shape, dtype "
              "and device, finite where read")
    if found:
        return Check(NAME, FAIL, None, "", "; ".join(dict.fromkeys(found)))
    return Check(NAME, PASS, None, "", detail)


def broken_outputs(make_encoder: EncoderFactory, probe: Optional[Probe] = None) -> Optional[str]:
    """What is wrong with what the hooks of the encoder ``make_encoder`` builds return (:func:`check_outputs`), as one
    line; None when nothing is, or when the encoder cannot be built or called here (that error is said where it
    happens)."""
    try:
        result = check_outputs(make_encoder, probe or Probe())
    except Exception:  # noqa: BLE001 - only a broken return is told here; what the encoder raises is said elsewhere
        return None
    return result.detail if result.status == FAIL else None


__all__ = ["broken_outputs", "check_outputs"]
