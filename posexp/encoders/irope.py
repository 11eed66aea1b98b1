"""iRoPE: local RoPE layers interleaved with global NoPE layers.

Meta's Llama 4 (2025, "iRoPE") and Cohere's Command A (RNoPE-SWA; Yang et al. 2025, "Rope to Nope and Back
Again: A New Hybrid Attention Strategy") build long-context models from two kinds of attention layer:

* RoPE layers that attend only locally, so no rotary distance longer than ``window`` ever reaches them, in
  training or at any evaluation length. The two models differ in how (``encoder.local``):

  - ``sliding`` (the default): each query sees its last ``window`` keys, a sliding window: RNoPE-SWA's
    (Yang et al. 2025, §4; Command A's 4,096-token window);
  - ``chunked``: the sequence is cut into fixed chunks of ``window`` tokens and a query sees only the keys of
    its own chunk (Llama 4's ``attention_chunk_size``, 8,192; transformers' chunked mask keeps key ``j`` for
    query ``i`` when ``j // C == i // C``), so the first query of a chunk sees only itself;

* a global layer without positional encoding every ``k``-th layer (``k = 4``), which attends to every key
  by content alone (NoPE, Kazemnejad et al. 2023).

Llama 4 also sharpens the NoPE layers' attention as the context grows ("attention temperature tuning",
transformers' ``Llama4TextAttention``): the query at position ``p`` is multiplied by::

    tau(p) = log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1        (floor_scale 8192, attn_scale 0.1)

1 for the first ``floor_scale - 1`` positions, then growing with the logarithm of the length, as
Scalable-Softmax's ``s log n`` does (Nakanishi 2025, which Meta cites for it). Here ``floor_scale`` defaults
to ``train_len + 1``, so the temperature is 1 at every position a training sequence has and only a longer
context sharpens the NoPE layers.

Built on ``encoder=mixed``: the layers are a :class:`~posexp.encoders.mixed.Mixed` of ``rope`` layers with
their own ``layer_window`` and NoPE layers, each of those the query temperature above. Layer ``i`` of ``n`` is
NoPE when ``(n - 1 - i) % k == 0``: the last layer is global and every ``k``-th below it, Llama 4's
``(i + 1) % k == 0`` whenever ``k`` divides the depth, and a 2-layer model still gets one global layer.
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.mixed import Mixed
from posexp.encoders.rope import RoPE
from posexp.errors import require

ROPE, NOPE = "rope", "none"
LOCAL_KINDS = ("sliding", "chunked")  # RNoPE-SWA's sliding window; Llama 4's fixed chunks


def irope_layers(n_layers: int, every: int) -> list[str]:
    """Each layer's encoding: ``none`` (global NoPE) for layer ``i`` when ``(n_layers - 1 - i) % every == 0``,
    else ``rope`` (windowed)."""
    return [NOPE if (n_layers - 1 - i) % every == 0 else ROPE for i in range(n_layers)]


def attention_temperature(pos: Tensor, floor_scale: int, attn_scale: float) -> Tensor:
    """Llama 4's query multiplier ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`` at positions ``pos``
    (transformers' ``Llama4TextAttention``, ``attn_temperature_tuning``), float32."""
    return ((pos.float() + 1) / floor_scale).floor().log1p() * attn_scale + 1


class TemperedNoPE(PositionalEncoder):
    """A global layer without position encoding whose queries get Llama 4's attention temperature.

    Not relative unless ``attn_scale = 0``: the temperature reads the query's absolute position (1 up to
    ``floor_scale - 2``).
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "NoPE with Llama 4's query temperature"
    # a NoPE layer has nothing to rescale: in a scaled iRoPE it stays as it is (its temperature included)
    # its NoPE layers and per-layer windows take no position remapping (posexp/encoders/remapping.py)
    supported_scalings = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "rerope")

    def __init__(self, d_model: int, n_heads: int, floor_scale: int, attn_scale: float):
        super().__init__(d_model, n_heads)
        self.name = NOPE
        self.floor_scale, self.attn_scale = int(floor_scale), float(attn_scale)
        self.relative = self.attn_scale == 0  # NoPE itself is; the temperature reads the query's position

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if self.attn_scale == 0:
            return q, k
        tau = attention_temperature(q_pos, self.floor_scale, self.attn_scale)  # (Lq,)
        return q * tau[:, None].to(q.dtype), k

    def with_scaling(self, kind: str, factor: float, train_len: int,
                     factors: Optional[Sequence[float]] = None, start: int = 0) -> "TemperedNoPE":
        return self

    @property
    def label(self) -> str:
        return NOPE


@register("irope")
class IRoPE(Mixed):
    """Local RoPE layers and a global NoPE layer every ``every``-th layer (Llama 4; Yang et al. 2025).

    Args:
        d_model: model width.
        n_heads: attention heads; the head width must be even.
        base: RoPE's base in the windowed layers; > 1.
        every: ``k``, one global NoPE layer in every ``k`` (the last layer is always one); >= 1. 4 in Llama 4
            and Command A.
        window: the keys a RoPE layer's query attends to, itself included (``sliding``), or the chunk size
            (``chunked``); >= 1. Command A's window is 4096, Llama 4's chunk 8192, of longer training contexts;
            the default 64 is half the default ``train_len``.
        local: ``sliding`` (RNoPE-SWA, Yang et al. 2025) or ``chunked`` (Llama 4's chunked attention).
        train_len: the training length in tokens; the yaml sets it to the run's ``train_len``.
        floor_scale: the temperature's step in tokens; None = ``train_len + 1`` (1 at every training position).
            8192 in Llama 4.
        attn_scale: the temperature's slope; 0 turns it off. 0.1 in Llama 4.

    Raises:
        ConfigError: ``every``, ``window``, ``train_len`` or ``floor_scale`` below 1, ``attn_scale < 0``, or
            ``local`` not one of sliding, chunked.
    """

    description = "iRoPE: sliding-window or chunked RoPE layers, a global NoPE layer every k-th (RNoPE-SWA, Llama 4)"

    def __init__(self, d_model: int, n_heads: int, base: float = 10000.0, every: int = 4, window: int = 64,
                 train_len: int = 128, floor_scale: Optional[int] = None, attn_scale: float = 0.1,
                 local: str = "sliding"):
        require(local in LOCAL_KINDS, "encoder.local",
                f"must be one of {', '.join(LOCAL_KINDS)} (sliding: RNoPE-SWA's window; chunked: Llama 4's "
                f"fixed chunks), got {local!r}")
        require(every >= 1, "encoder.every", f"must be >= 1, one global NoPE layer in every k (got {every})")
        require(window >= 1, "encoder.window", f"must be a positive number of keys (got {window})")
        require(train_len >= 1, "encoder.train_len", f"must be a positive number of tokens (got {train_len})")
        require(floor_scale is None or floor_scale >= 1, "encoder.floor_scale",
                f"must be a positive number of tokens, or null for train_len + 1 (got {floor_scale})")
        require(attn_scale >= 0, "encoder.attn_scale", f"must be >= 0; 0 turns the temperature off "
                                                       f"(got {attn_scale:g})")
        # read by _build, which Mixed's __init__ calls for each layer
        self.every, self.window, self.local = int(every), int(window), local
        self.floor_scale = int(train_len) + 1 if floor_scale is None else int(floor_scale)
        self.attn_scale = float(attn_scale)
        super().__init__(d_model, n_heads, layers=irope_layers(self.every, self.every), base=base, train_len=train_len)

    def _build(self, name: str) -> PositionalEncoder:
        if name == NOPE:
            return TemperedNoPE(self.d_model, self.n_heads, self.floor_scale, self.attn_scale)
        enc = super()._build(name)
        enc.layer_window, enc.layer_chunked = self.window, self.local == "chunked"
        return enc

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        pattern = irope_layers(n_layers, self.every)
        if self.pattern != pattern:  # laid out from the top, so the depth decides (no parameters to lose)
            self.pattern = pattern
            self.per_layer = nn.ModuleList(self._build(name) for name in pattern)
        return super().for_layers(n_layers)

    @property
    def label(self) -> str:
        return "irope"

    def with_scaling(self, kind: str, factor: float, train_len: int,
                     factors: Optional[Sequence[float]] = None, start: int = 0) -> "Mixed":
        clone = super().with_scaling(kind, factor, train_len, factors, start)
        for enc in clone.per_layer:  # a wrapping scaled copy (rerope) keeps the layer's window
            if not isinstance(enc, TemperedNoPE):
                enc.layer_window, enc.layer_chunked = self.window, self.local == "chunked"
        return clone

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, every={self.every}, window={self.window} ({self.local}), floor_scale={self.floor_scale}, "
                f"attn_scale={self.attn_scale:g}")


__all__ = ["IRoPE", "TemperedNoPE", "attention_temperature", "irope_layers"]
