"""Attention whose logits are a position remapping's (:mod:`posexp.encoders.remapping`), in query blocks.

q and k arrive rotated at their true positions; since ``R(a) R(b) = R(a + b)`` (RoFormer, Su et al. 2021, Eq. 34:
RoPE is a rotation by ``m * theta_i``), rotating them by ``P(m) - m`` moves them to a piece's remapped positions.
Each block of queries attends through SDPA with the widest piece's q and k over every key; the other pieces add the
difference of their logits on their own columns as an additive mask, so a block holds one ``(block, L)`` mask and
memory grows linearly with the length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from posexp.encoders.remapping import Method

# -- rotating by a position difference ---------------------------------------------------------------

def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_by(x: Tensor, delta: Tensor, inv_freq: Tensor) -> Tensor:
    """``x (B, H, L, D)`` rotated by ``delta * theta_i`` on its first ``2 * len(inv_freq)`` features (pairs as halves,
    the GPT-NeoX / Llama layout), the rest unchanged; ``delta (L,)`` or ``(B, H, L)`` positions. Angles in float64."""
    rot = 2 * inv_freq.numel()
    freqs = delta.double()[..., None] * inv_freq.double()  # (..., L, rot/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, rest = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rotate_half(head) * sin, rest), dim=-1)


def _moved(x: Tensor, at: Optional[Tensor], pos: Tensor, inv_freq: Tensor) -> Tensor:
    """``x``, rotated at ``pos``, moved to ``at`` (None: left where it is)."""
    if at is None:
        return x
    return rotate_by(x, at - pos.double(), inv_freq)


# -- attention -------------------------------------------------------------------------------------------

@dataclass
class Placement:
    """Where q and k were rotated: their true positions ``q_pos (Lq,)``, ``k_pos (Lk,)`` (integers) and the rotary
    frequencies ``inv_freq (rot/2,)`` they were rotated with."""

    q_pos: Tensor
    k_pos: Tensor
    inv_freq: Tensor


def remapped_attention(method: Method, q: Tensor, k: Tensor, v: Tensor, placed: Placement, scale: float,
                       block: int = 256, softcap: Optional[float] = None) -> Tensor:
    """Causal attention whose logits are the remapping's, ``(B, H, Lq, Dv)``.

    Args:
        method: the pieces (:meth:`Remapping.method`).
        q: ``(B, H, Lq, D)`` rotated at ``placed.q_pos``; query ``i`` is key ``Lk - Lq + i`` (a chunk over a key cache).
        k, v: ``(B, H, Lk, D)``, ``k`` rotated at ``placed.k_pos``; heads already repeated to the query heads.
        placed: the true positions and the frequencies q and k were rotated with.
        scale: the logit scale (``1/sqrt(D)`` or the model's own).
        block: queries per block; each block holds ``(B, H, block, Lk)`` logits.
        softcap: logits ``cap * tanh(x / cap)`` before the mask (Gemma 2's ``attn_logit_softcapping``); None = off.
    """
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    off = Lk - Lq
    q_pos, k_pos, inv_freq = placed.q_pos, placed.k_pos, placed.inv_freq
    k_moved: dict[int, Tensor] = {}
    for p in range(method.pieces):
        if method.k_variant(p) not in k_moved:
            k_moved[method.k_variant(p)] = _moved(k, method.k_at(p, k_pos), k_pos, inv_freq)
    if method.pieces == 1:  # one piece (Ms-PoE): move q and k, then causal SDPA
        qm = _moved(q, method.q_at(0, q_pos), q_pos, inv_freq)
        mask = None if Lq == Lk else _causal(Lq, Lk, q.device)
        if softcap is None:
            return F.scaled_dot_product_attention(qm, k_moved[0], v, attn_mask=mask, is_causal=mask is None and Lq > 1,
                                                  scale=scale)
    out = q.new_empty(B, H, Lq, v.shape[-1])
    keys = _Keys(method, k_moved, v, scale, softcap)
    block = method.block(block)
    for a in range(0, Lq, block):
        b = min(Lq, a + block)
        kend = off + b
        m = q_pos[a:b]
        future = torch.arange(kend, device=q.device)[None, :] > torch.arange(off + a, off + b, device=q.device)[:, None]
        region = method.region(m, k_pos[:kend]).masked_fill(future, -1)  # (r, kend): each pair's piece, -1 future
        spans = {p: sp for p in range(method.pieces) if (sp := _span(region, p, future)) is not None}
        moved = {p: _moved(q[:, :, a:b], method.q_at(p, m), m, inv_freq) for p in spans}
        out[:, :, a:b] = keys.attend(moved, region, spans, off + a)
    return out


@dataclass
class _Keys:
    """The keys at each piece's positions (by ``k_variant``), the values, the logit scale and the softcap."""

    method: Method
    moved: dict[int, Tensor]
    v: Tensor
    scale: float
    softcap: Optional[float]

    def logits(self, q: Tensor, p: int, c0: int, c1: int) -> Tensor:
        """Piece ``p``'s logits of queries ``q`` (at its positions) over key columns ``[c0, c1)``, at least fp32."""
        k = self.moved[self.method.k_variant(p)][:, :, c0:c1]
        return (q @ k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * self.scale

    def attend(self, moved: dict[int, Tensor], region: Tensor, spans: dict, first: int) -> Tensor:
        """One query block's output; ``moved``: its queries at each piece's positions, ``region``: each pair's piece
        (-1 in the future), ``first``: the key index of its first query (the future lies from there on)."""
        q0 = next(iter(moved.values()))
        B, H, r, _ = q0.shape
        kend = region.shape[1]
        future = region[:, first:] < 0
        dtype = torch.promote_types(q0.dtype, torch.float32)
        if self.softcap is None:
            # the widest piece attends through SDPA over every key; the others add their logits' difference to it on
            # their own columns, as an additive mask (-inf on the future)
            dom = max(spans, key=lambda p: spans[p][1] - spans[p][0])
            mask = torch.zeros((B, H, r, kend), dtype=dtype, device=q0.device)
            for p, (c0, c1, p0, p1) in spans.items():
                if p != dom:
                    diff = self.logits(moved[p], p, c0, c1) - self.logits(moved[dom], dom, c0, c1)
                    _write(mask, region, p, (c0, c1, p0, p1), diff)
            mask[..., first:].masked_fill_(future, float("-inf"))
            kd = self.moved[self.method.k_variant(dom)]
            return F.scaled_dot_product_attention(moved[dom], kd[:, :, :kend], self.v[:, :, :kend],
                                                  attn_mask=mask.to(q0.dtype), scale=self.scale)
        logits = torch.empty((B, H, r, kend), dtype=dtype, device=q0.device)
        for p, span in spans.items():  # every causal entry is written by its own piece; the future is -inf after
            s = self.logits(moved[p], p, span[0], span[1])
            _write(logits, region, p, span, torch.tanh(s / self.softcap) * self.softcap)
        logits[..., first:].masked_fill_(future, float("-inf"))
        return logits.softmax(-1).to(self.v.dtype) @ self.v[:, :, :kend]


def _write(dest: Tensor, region: Tensor, p: int, span: tuple[int, int, int, int], values: Tensor) -> None:
    """``values`` (piece ``p``'s, over columns ``[c0, c1)``) into ``dest``: copied where every row is ``p``'s (or in
    the future), selected by ``region`` in the mixed band ``[p0, p1)``."""
    c0, c1, p0, p1 = span
    dest[..., c0:p0] = values[..., :p0 - c0]
    dest[..., p1:c1] = values[..., p1 - c0:]
    if p1 > p0:
        band = region[:, p0:p1] == p
        dest[..., p0:p1] = torch.where(band, values[..., p0 - c0:p1 - c0], dest[..., p0:p1])


def _span(region: Tensor, p: int, future: Tensor) -> Optional[tuple[int, int, int, int]]:
    """Piece ``p``'s columns ``[c0, c1)`` in a block's ``region``, and within them the mixed band ``[p0, p1)`` outside
    of which every row is ``p``'s or in the future; None when no entry is ``p``'s."""
    mine = region == p
    cols = mine.any(0).nonzero()
    if cols.numel() == 0:
        return None
    c0, c1 = int(cols[0]), int(cols[-1]) + 1
    pure = (mine | future)[:, c0:c1].all(0).to(torch.int32)
    lead = int(pure.cumprod(0).sum())
    if lead == c1 - c0:
        return c0, c1, c1, c1
    trail = int(pure.flip(0).cumprod(0).sum())
    return c0, c1, c0 + lead, c1 - trail


def _causal(Lq: int, Lk: int, device: torch.device) -> Tensor:
    """Boolean mask ``(Lq, Lk)``, True where query ``i`` (key ``Lk - Lq + i``) may see key ``j``."""
    return torch.arange(Lk, device=device)[None, :] <= torch.arange(Lk - Lq, Lk, device=device)[:, None]


def unrotated(x: Tensor, pos: Tensor, inv_freq: Tensor) -> Tensor:
    """``x`` rotated at ``pos`` moved back to position 0 (its content before RoPE)."""
    return rotate_by(x, -pos.double(), inv_freq)


__all__ = ["Placement", "remapped_attention", "rotate_by", "unrotated"]
