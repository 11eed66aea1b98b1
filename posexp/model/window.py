"""Window baselines: attention restricted to the last ``K`` keys, optionally plus ``S`` attention sinks.

``eval.window=K``
    Query ``i`` attends to keys ``i - K + 1 .. i`` (itself included), for every encoding and
    on every attention path. A model evaluated this way reads, per layer, no further back than
    ``K`` tokens, so its perplexity past the training length is flat by construction: the
    baseline an encoding must beat before one says it *uses* a longer context (Press et al.
    2022 discuss the sliding window). The window is per layer, as in sliding-window attention:
    through a stack of ``n_layers`` layers a token can still reach ``n_layers * (K - 1)``
    tokens back, one window per layer.

``eval.sinks=S`` (needs ``eval.window``)
    The first ``S`` tokens of the sequence stay visible to every query besides its window:
    the attention sinks of StreamingLLM (Xiao et al. 2024, "Efficient Streaming Language
    Models with Attention Sinks", §3.2), which keep the initial tokens' keys because a
    window that drops them collapses. One difference from that paper: tokens keep their own
    positions, where StreamingLLM re-assigns positions within its cache, so here the distance
    from a query to a sink grows with the query's index.

Only evaluation sets these two; training never does. Neither key set, the model attends as it
always did, bit for bit. An encoding may also give its layers a window of their own, in training
and evaluation alike (``layer_window`` of the encoder contract, e.g. ``encoder=irope``'s sliding-window
RoPE layers); :func:`layer_window` says which applies when both do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from posexp.errors import require

__all__ = ["AttentionWindow", "check_window", "layer_window", "visible_keys", "window_fields", "window_of"]


@dataclass(frozen=True)
class AttentionWindow:
    """Which keys a query sees: its last ``size`` keys (itself included) and the first ``sinks`` keys.

    Args:
        size: ``K``, the keys ``i - K + 1 .. i`` of query ``i``; at least 1.
        sinks: ``S``, the keys ``0 .. S - 1`` visible to every later query (Xiao et al. 2024, §3.2).
        chunk: ``C``, or None: query ``i`` sees only the keys of its own fixed chunk ``floor(i / C)`` too
            (chunked attention, Llama 4's ``attention_chunk_size``: transformers' chunked mask keeps key ``j``
            for query ``i`` when ``j // C == i // C``). Only an encoding's own layers set it.
    """

    size: int
    sinks: int = 0
    chunk: Optional[int] = None

    def hidden(self, q_idx: Tensor, k_idx: Tensor) -> Tensor:
        """True where a query (index in the sequence) may not see a key that causality alone would allow:
        older than the window (or in an earlier chunk) and not a sink. Broadcasts ``q_idx`` against ``k_idx``."""
        outside = q_idx - k_idx >= self.size
        if self.chunk is not None:
            outside = outside | (q_idx // self.chunk != k_idx // self.chunk)
        return outside & (k_idx >= self.sinks)

    def mask_mod(self, offset: int = 0) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
        """FlexAttention's ``mask_mod``: causal and within the window (or a sink), for queries starting at row
        ``offset`` of the sequence."""
        size, sinks, chunk = self.size, self.sinks, self.chunk

        def windowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            q = q_idx + offset
            inside = q - kv_idx < size
            if chunk is not None:
                inside = inside & (q // chunk == kv_idx // chunk)
            return (q >= kv_idx) & (inside | (kv_idx < sinks))

        return windowed


def layer_window(window: Optional[AttentionWindow], own: Optional[int],
                 chunked: bool = False) -> Optional[AttentionWindow]:
    """The window of a layer whose encoding attends within its own ``own`` last keys (an architecture's sliding
    window, :attr:`posexp.encoders.contract.PositionalEncoder.layer_window`) under the evaluation's ``window``.

    The narrower one wins: the layer's own window, or ``eval.window`` (with its sinks) where that is narrower.
    Without a window of its own, a layer attends as ``eval.window`` says. With ``chunked``, ``own`` is a fixed
    chunk (Llama 4's chunked attention) and a narrower ``eval.window`` applies within it.
    """
    if own is None:
        return window
    if chunked:
        if window is None or own <= window.size:
            return AttentionWindow(int(own), chunk=int(own))
        return AttentionWindow(window.size, window.sinks, chunk=int(own))
    if window is None or own <= window.size:
        return AttentionWindow(int(own))
    return window


def visible_keys(q_idx: Tensor, window: Optional[AttentionWindow]) -> Tensor:
    """How many keys each query row ``q_idx`` (0-based in the sequence) attends to: ``q_idx + 1`` causally, at
    most the window's ``size`` plus the sinks older than it."""
    n = q_idx + 1
    if window is None:
        return n
    start = (n - window.size).clamp(min=0)  # the oldest key of the window, or of the chunk where that is later
    if window.chunk is not None:
        start = torch.maximum(start, q_idx - q_idx % window.chunk)
    return n - start + start.clamp(max=window.sinks)


def check_window(window: Any, sinks: Any) -> None:
    """``eval.window`` a positive integer or null; ``eval.sinks`` a positive integer, only with a window.

    Raises:
        ConfigError: naming the key and what it may be.
    """
    if window is not None:
        require(isinstance(window, int) and not isinstance(window, bool) and window > 0, "eval.window",
                f"must be a positive integer number of keys, e.g. eval.window=128, or null (got {window!r})")
    if sinks is not None:
        require(isinstance(sinks, int) and not isinstance(sinks, bool) and sinks > 0, "eval.sinks",
                f"must be a positive integer number of tokens, e.g. eval.sinks=4, or null (got {sinks!r})")
        require(window is not None, "eval.sinks",
                "keeps the first tokens visible besides a window; set eval.window=K too (or drop eval.sinks)")


def window_of(window: Optional[int], sinks: Optional[int]) -> Optional[AttentionWindow]:
    """The :class:`AttentionWindow` of ``eval.window`` / ``eval.sinks`` (checked), None when no window is set."""
    check_window(window, sinks)
    return None if window is None else AttentionWindow(int(window), int(sinks or 0))


def window_fields(window: Optional[AttentionWindow]) -> dict:
    """What a row of a windowed evaluation records (``window``, ``sinks``); nothing for a plain one, so the
    rows of an evaluation without a window are what they always were."""
    if window is None:
        return {}
    return {"window": window.size, "sinks": window.sinks or None}
