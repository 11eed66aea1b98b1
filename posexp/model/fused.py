"""Fused attention with a positional bias: FlexAttention and the encoders' ``score_mod`` hook.

FlexAttention (PyTorch >= 2.5; Dong et al. 2024, "Flex Attention: A Programming Model
for Generating Optimized Attention Kernels") compiles attention with a ``score_mod``
applied to every logit inside one fused kernel, forward and backward, and skips the
key blocks a block-sparse mask rules out: the causal half is never computed and
nothing ``heads x L x L`` is ever in memory. An encoder whose bias is a function of
(head, query position, key position) provides such a ``score_mod``
(:meth:`posexp.encoders.contract.PositionalEncoder.score_mod`); the model then attends
through :func:`flex_attend` where it runs fused, and through the blocked
scaled-dot-product path (a float mask per query block) everywhere else.

Where it runs fused: CUDA, compiled. On a CPU, FlexAttention has no backward, and its
compiled forward was measured slower than the blocked path: ALiBi, default model (d_model
128, 2 layers), one window of 4,096 tokens, one thread, 3 interleaved rounds: 7,000-7,700
tokens/s against 8,400-8,500, after 82 s of compiling for that one length. So CPU training
and evaluation keep the blocked path (:func:`fused_by_default`). Called
outside ``torch.compile`` on a CPU (what the CPU tests do), FlexAttention runs its
unfused reference implementation: slow, exact, forward only.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:
    from posexp.model.window import AttentionWindow

__all__ = ["causal_block_mask", "flex_attend", "flex_available", "fused_by_default"]


@functools.lru_cache(maxsize=None)
def flex_available() -> bool:
    """Whether this torch has FlexAttention (``torch.nn.attention.flex_attention``, PyTorch >= 2.5)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def fused_by_default(device: torch.device) -> bool:
    """Whether the model attends through FlexAttention on ``device`` unless told otherwise: on CUDA, where it is
    a fused kernel forward and backward; not on a CPU or MPS (see the module docstring)."""
    return device.type == "cuda" and flex_available()


# distinct compiles of FlexAttention one process may hold: one per encoder's score_mod code, dtype, grad mode and
# (after the second length) dynamic shape. Dynamo's default of 8 is reached by a process that evaluates several
# runs, or by a test session; past it dynamo runs flex_attention eagerly, FlexAttention's dense reference that
# materialises every logit (B x H x L x L) and synchronises with the host, with no more than a log line.
FLEX_RECOMPILE_LIMIT = 256


def _recompile_limits():
    """Dynamo's settings for one call of the compiled kernel: room for :data:`FLEX_RECOMPILE_LIMIT` compiles, and
    an error rather than the silent dense fallback should even that be reached."""
    config = torch._dynamo.config
    limits: dict[str, Any] = {}
    for name in ("recompile_limit", "cache_size_limit"):  # its name since PyTorch 2.6, and before
        if hasattr(config, name):
            limits[name] = max(int(getattr(config, name)), FLEX_RECOMPILE_LIMIT)
            break
    if hasattr(config, "fail_on_recompile_limit_hit"):
        limits["fail_on_recompile_limit_hit"] = True
    return config.patch(limits)


@functools.lru_cache(maxsize=None)
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    # compiled once per process; after a second length dynamo compiles a kernel for any length, so evaluation
    # lengths and a sequence-length curriculum do not exhaust its recompile limit (then: the unfused fallback)
    return torch.compile(flex_attention)


def causal_block_mask(q_len: int, kv_len: int, offset: int, device: torch.device,
                      window: Optional["AttentionWindow"] = None):
    """The block-sparse causal mask of queries ``offset .. offset + q_len - 1`` over keys ``0 .. kv_len - 1``
    (query row ``i`` sees keys ``<= offset + i``), as FlexAttention's ``BlockMask``; with ``window``
    (a :class:`posexp.model.window.AttentionWindow`), only the keys of its window and its sinks, so the
    kernel skips the key blocks older than the window."""
    from torch.nn.attention.flex_attention import create_block_mask

    if window is not None:
        return create_block_mask(window.mask_mod(offset), None, None, q_len, kv_len, device=device)

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx + offset >= kv_idx

    return create_block_mask(causal, None, None, q_len, kv_len, device=device)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, score_mod: Callable, block_mask=None, offset: int = 0,
                compiled: Optional[bool] = None, kernel_options: Optional[dict] = None) -> Tensor:
    """Causal attention ``(B, H, Lq, Dh)`` of queries ``q`` (rows ``offset ..`` of the sequence) over keys ``k``
    and values ``v`` (rows ``0 ..``), every logit passed through ``score_mod``.

    Args:
        block_mask: :func:`causal_block_mask` of these shapes, if already built (layers share one).
        compiled: the fused kernel (default: on CUDA) or FlexAttention's unfused reference (CPU, no gradient).
        kernel_options: FlexAttention's tile sizes and stages for the fused kernel (an encoder's
            ``flex_kernel_options``); None lets Inductor choose.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if block_mask is None:
        block_mask = causal_block_mask(q.shape[-2], k.shape[-2], offset, q.device)
    compiled = q.device.type == "cuda" if compiled is None else compiled
    if compiled:
        options: Any = None if kernel_options is None else dict(kernel_options)  # FlexAttention's TypedDict
        if torch.compiler.is_compiling():  # inside a compiled step, which compiles it into its own graph
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
        with _recompile_limits():
            return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
    with warnings.catch_warnings():  # the unfused reference is asked for here, not fallen into
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
