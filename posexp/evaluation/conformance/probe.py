"""The small random model and the measurements every conformance check shares.

Nothing here trains: the checks hold an encoding to its contract in a randomly initialised GPT
(:class:`posexp.model.gpt.GPT`) whose encoder parameters are also randomised, so that an encoding
whose parameters start at zero (T5's table, CoPE's embeddings) still moves the logits it claims to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from posexp.encoders.contract import PositionalEncoder
from posexp.model.gpt import GPT, ModelShape

EncoderFactory = Callable[[int, int], PositionalEncoder]  # (d_model, n_heads) -> a fresh encoder


@dataclass(frozen=True)
class Probe:
    """The shape of the probe model and the lengths the checks read.

    Attributes:
        train_len: the nominal training length (posexp train's default); the length check runs at 1x, 4x and 16x
            it, and so reaches the longest length a default run evaluates.
        block: ``model.attn_block_size`` of the exactness checks: queries per block on the bias / scores paths.
        long_block: the block of the length and memory checks, which read 16x ``train_len`` tokens.
        encoder_noise: std of the Gaussian noise added to every encoder parameter.
        exact_dtype: the dtype of the exact checks: ``float64``, or ``float32`` for an encoder that computes in it
            (:func:`casts`), held to a bound float32 can meet.
    """

    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    vocab_size: int = 64
    train_len: int = 128  # configs/config.yaml
    block: int = 16
    long_block: int = 64
    batch: int = 2
    seed: int = 0
    encoder_noise: float = 0.2
    exact_dtype: str = "float64"

    @property
    def lengths(self) -> tuple[int, int, int]:
        return self.train_len, 4 * self.train_len, 16 * self.train_len


def build_model(make_encoder: EncoderFactory, probe: Probe, dtype: torch.dtype = torch.float32,
                block: Optional[int] = None, shape: Optional[ModelShape] = None) -> GPT:
    """A seeded GPT around a fresh encoder, in eval mode on the blocked (unfused) path.

    The weights use PyTorch's default init (``model.init=pytorch``): attention logits of order 1, so a
    positional effect shows in the outputs instead of drowning in GPT-2's near-uniform attention.
    """
    torch.manual_seed(probe.seed)
    shape = shape or ModelShape(d_model=probe.d_model, n_heads=probe.n_heads, n_layers=probe.n_layers,
                                vocab_size=probe.vocab_size, attn_block_size=block or probe.block, init="pytorch")
    model = GPT(shape, make_encoder(shape.d_model, shape.n_heads))
    noise = torch.Generator().manual_seed(probe.seed + 1)
    with torch.no_grad():
        for p in model.encoder.parameters():
            p.add_(probe.encoder_noise * torch.randn(p.shape, generator=noise, dtype=p.dtype))
    model.fused_attention = False
    return model.eval().to(dtype)


def encodable(encoder: PositionalEncoder, length: int) -> int:
    """``length``, or the encoder's ``max_length`` where that is shorter: a check reads no position the encoder
    refuses (learned's yaml ends its table at ``train_len``)."""
    return min(length, encoder.max_length or length)


def tokens(probe: Probe, length: int, batch: Optional[int] = None, seed: int = 0) -> Tensor:
    """Random token ids ``(batch, length)`` from a generator of their own (the model's RNG is left alone)."""
    gen = torch.Generator().manual_seed(probe.seed + 100 + seed)
    return torch.randint(probe.vocab_size, (batch or probe.batch, length), generator=gen)


def layer_encoders(encoder: PositionalEncoder, probe: Probe) -> list[PositionalEncoder]:
    """The distinct encoders the model's layers attend with (one, unless the encoding mixes per layer)."""
    return list({id(e): e for e in encoder.for_layers(probe.n_layers)}.values())


def attention_logits(enc: PositionalEncoder, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
                     x: Optional[Tensor] = None) -> Tensor:
    """Pre-softmax logits ``(B, H, Lq, Lk)`` through every attention hook ``enc`` uses, as the model forms them;
    ``transform``'s too when given the layer input ``x (B, L, D)`` of a whole sequence (``q``, ``k`` its own).

    Entries where the key is in the query's future are 0: the model masks them, whatever a hook puts there.
    """
    if enc.uses_rotate:
        q, k = enc.rotate(q, k, q_pos, k_pos)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if enc.uses_bias:
        bias = enc.bias(q_pos, k_pos)
        if bias is not None:
            logits = logits + bias.to(logits.dtype)
    if enc.uses_scores:
        logits = logits + enc.scores(q, k, q_pos, k_pos).to(logits.dtype)
    if enc.uses_transform and x is not None:
        logits = logits + enc.transform(x, q, k, k_pos)(0, k.shape[-2]).to(logits.dtype)
    future = k_pos[None, :] > q_pos[:, None]
    return logits.masked_fill(future, 0.0)


def causal_diff(a: Tensor, b: Tensor) -> float:
    """``max |a - b|`` (0 for empty tensors), in float64."""
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def relative_diff(ours: Tensor, reference: Tensor) -> float:
    """``max |ours - reference| / max |reference|``: an error on the scale of the values compared."""
    scale = float(reference.double().abs().max()) or 1.0
    return causal_diff(ours, reference) / scale


class LargestTensor(TorchDispatchMode):
    """Records the largest storage, in bytes, that any operation run under it returns.

    A view counts as the storage it looks into, so an ``expand`` costs nothing and a slice of a big tensor
    costs the big tensor: what is held in memory, not what is indexed.
    """

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def finite(*tensors: Optional[Tensor]) -> bool:
    return all(t is None or bool(torch.isfinite(t).all()) for t in tensors)


class _Dtypes(TorchDispatchMode):
    """Records the floating dtypes of every tensor the operations run under it return."""

    def __init__(self):
        super().__init__()
        self.seen: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, Tensor) and t.is_floating_point():
                self.seen.add(t.dtype)
        return out


def casts(make_encoder: EncoderFactory, probe: Probe) -> bool:
    """Whether the encoder computes in a lower precision than it is given: its hooks, fed float64 inputs with
    float64 parameters, make float32 (or half) tensors (``torch.log1p(d).float()``, ``arange(...).float()``),
    whether or not they then fail on mixing the two."""
    encoder = build_model(make_encoder, probe, torch.float64).encoder
    gen = torch.Generator().manual_seed(probe.seed)
    L, head = probe.train_len, probe.d_model // probe.n_heads
    q, k = (torch.randn(probe.batch, probe.n_heads, L, head, generator=gen, dtype=torch.float64) for _ in "qk")
    x = torch.randn(probe.batch, L, probe.d_model, generator=gen, dtype=torch.float64)
    pos = torch.arange(L)
    with torch.no_grad(), _Dtypes() as mode:
        try:
            if encoder.uses_embed:
                encoder.embed(x, pos)
            for enc in layer_encoders(encoder, probe):
                attention_logits(enc, q, k, pos, pos)
        except Exception:  # noqa: BLE001 - a hook that fails on mixed dtypes has shown what it computes in
            pass
    return bool(mode.seen - {torch.float64})
