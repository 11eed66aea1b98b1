"""The encoder contract: the places a positional encoding can touch attention.

An encoder overrides only the hooks it needs; the model asks which hooks an
encoder overrides (``uses_embed`` ...) and never which encoder it holds.

Shapes (``B`` batch, ``H`` heads, ``L`` sequence, ``D`` model width, ``Dh`` head width):

=============  ================================================  ===============================
hook           arguments                                         returns
=============  ================================================  ===============================
``embed``      ``x (B, L, D)``, ``pos (L,)`` long                ``(B, L, D)``
``rotate``     ``q (B, H, Lq, Dh)``, ``k (B, H, Lk, Dh)``,        ``(q, k)``
               ``q_pos (Lq,)``, ``k_pos (Lk,)``
``bias``       ``q_pos (Lq,)``, ``k_pos (Lk,)``                  ``(H, Lq, Lk)`` or None
``scores``     ``q``, ``k``, ``q_pos``, ``k_pos``                ``(B, H, Lq, Lk)``
``transform``  ``x (B, L, D)``, ``q``, ``k`` ``(B, H, L, Dh)``,   ``logits(start, end)`` returning
               ``pos (L,)``                                      ``(B, H, end - start, end)``
``normalise``  ``logits (B, H, Lq, Lk)``, ``q_pos``, ``k_pos``   weights ``(B, H, Lq, Lk)``
=============  ================================================  ===============================

Positions are absolute token indices, so a block of queries late in a long
sequence passes its own ``q_pos``.

Two hooks for encodings that read the content, not only positions:

* ``transform(x, q, k, pos)``: a content-dependent transform of attention. Called once per layer and
  forward with the layer's normalised input ``x`` and its ``q``, ``k`` (after ``rotate``) for the whole
  sequence at positions ``pos``; returns a function ``logits(start, end)`` giving the additive logit terms
  ``(B, H, end - start, end)`` of queries ``start .. end - 1`` over keys ``0 .. end - 1`` (on the scale of
  the model's ``q . k / sqrt(Dh)``), which the model adds as it adds ``bias`` and ``scores``. The terms of
  query ``i`` may read the content of tokens ``0 .. i`` only (``posexp check``'s causality and prefix
  checks hold it to that); entries of future keys are masked and may hold anything finite. FoX's forget
  gates (``fox``) and PaTH's Householder products (``path``) are such transforms.
* ``normalise(logits, q_pos, k_pos)``: replaces softmax. ``logits`` are the finished logits of a block of
  queries, ``-inf`` where a key is masked (the future, or outside ``eval.window``); returns the attention
  weights the model multiplies the values by. A masked key must get weight 0. Stick-breaking attention
  (``stickbreaking``) is such a normaliser.

An encoder using either attends on the explicit, blocked path, never through fused kernels.

One hook for evaluation-time position remappings (:mod:`posexp.encoders.remapping`):

* ``attend(q, k, v, pos, block_size)``: the attention output ``(B, H, L, Dh)`` in place of the model's own, from
  ``q``, ``k`` (after ``rotate``), ``v`` of the whole sequence at positions ``pos``, causal, in query blocks of
  ``block_size`` (so that memory stays linear in ``L``). Self-Extend, STRING, Dual Chunk Attention and Ms-PoE read
  RoPE at remapped positions this way.

One optional companion of ``bias``, for fused attention kernels: an encoder whose
bias of query ``i`` and key ``j`` in head ``h`` is a function of ``(h, q_pos[i],
k_pos[j])`` alone may also give it as a FlexAttention ``score_mod``
(:meth:`PositionalEncoder.score_mod`, usually through :func:`bias_score_mod`).
``score_mod(q_pos, k_pos)`` returns ``f(score, b, h, q_idx, kv_idx) -> score +
bias``, where ``q_idx`` / ``kv_idx`` index ``q_pos`` / ``k_pos``; built only of
elementwise operations and lookups into tensors, it is both a FlexAttention
``score_mod`` (evaluated inside the fused kernel, with nothing ``Lq x Lk`` in
memory) and a plain tensor function: called with broadcastable index grids
``h (H, 1, 1)``, ``q_idx (1, Lq, 1)``, ``kv_idx (1, 1, Lk)`` and ``score = 0`` it
gives ``bias(q_pos, k_pos)`` on every causal entry (``k_pos <= q_pos``); future
keys are masked, and may hold anything finite. The model uses it where
FlexAttention runs fused (CUDA) and ``bias`` everywhere else.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from posexp.errors import ConfigError

# A FlexAttention score_mod: (score, batch, head, q_idx, kv_idx) -> score
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
# What ``transform`` returns: (start, end) -> additive logits (B, H, end - start, end) of that query block
ContentLogits = Callable[[int, int], Tensor]


class PositionalEncoder(nn.Module):
    """Base class of every positional encoding.

    Args:
        d_model: model width ``D``.
        n_heads: number of attention heads ``H``.

    Attributes:
        name: the registry name (``configs/encoder/<name>.yaml``).
        max_length: the longest sequence the encoding can represent, or None
            for any length. The evaluator marks longer lengths "not applicable".
        relative: True for an encoding whose attention logits depend on positions only through
            ``q_pos - k_pos`` (and on content), so that moving every query and key by the same
            amount changes nothing; ``posexp check`` holds an encoding that declares it to that.
        context_parallel: True for an encoding that a shard of the sequence can compute alone, given the absolute
            positions of its queries and of a shard of keys (``q_pos``, ``k_pos``): rotary and distance biases.
            False (the default, the safe answer for an encoding that does not say) where a query's logits read a
            prefix over the keys between it and the key (CoPE's gate counts, FoX's forget gates, stick-breaking,
            PaTH), or the whole sequence's length. ``train.context_parallel`` refuses the False ones; ``posexp
            check`` verifies a True one by attention over shards against the whole (context parallelism's ring
            of key shards merged by log-sum-exp, Liu et al. 2023, "Ring Attention", §3).
        base: the base frequency actually used, or None for encodings without one.
        lr_mult: the trainer gives the encoder's own parameters ``lr_mult * train.lr``
            (option ``encoder.lr_mult`` of every encoder). 1 unless an encoding needs
            its parameters to travel further than AdamW takes them in a short run
            (T5's logit biases, see ``t5.py``).
        weight_decay: True for an encoding whose authors' optimizer weight-decays its own matrices as the model's
            (FoX's forget gates, CABLE's bias maps: ``nn.Linear`` weights in both codes): the trainer gives its
            parameters of two or more dimensions ``train.weight_decay``, its vectors none. False (the default):
            none of its parameters is decayed.
        revision: the revision of the encoder's code, bumped where a fix changes what it computes from the same
            options (its initial parameters, how the trainer treats them). A revision above 1 is an option of the
            encoder's schema (``encoder.revision``), so every new run records it and its config hash and cache
            key differ from those of the runs trained before the fix, which have no such key.
        layer_window: the layers using this encoder attend only to their last ``layer_window``
            keys (itself included), in training and evaluation; None (the default) = the whole
            causal past. An architecture's sliding window (``encoder=irope``), where
            ``eval.window`` is an evaluation baseline; the narrower of the two applies.
        layer_chunked: with ``layer_window``, the layers attend within fixed chunks of that many keys (query ``i``
            sees key ``j`` when ``j // C == i // C``: Llama 4's chunked attention, ``encoder.local=chunked``)
            instead of a sliding window; False (the default) = the sliding window.
    """

    name: str = "base"
    description: str = ""
    max_length: Optional[int] = None
    relative: bool = False
    # whether a shard of the sequence computes the encoding alone from absolute positions (see the docstring);
    # False unless declared: train.context_parallel refuses the encoding, posexp check verifies a True
    context_parallel: bool = False
    lr_mult: float = 1.0
    weight_decay: bool = False
    revision: int = 1
    # the layers that use this encoder attend to their last `layer_window` keys only (sliding-window attention,
    # in training and evaluation alike, as `encoder=irope`'s RoPE layers); None = the whole causal past
    layer_window: Optional[int] = None
    # with layer_window: a fixed chunk of that many keys instead of a sliding window (Llama 4's chunked attention)
    layer_chunked: bool = False

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads

    @property
    def base(self) -> Optional[float]:
        return None

    # -- hooks; a subclass overrides the ones it needs ---------------------------------
    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Optional[Tensor]:
        return None

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Optional[Tensor]:
        return None

    def transform(self, x: Tensor, q: Tensor, k: Tensor, pos: Tensor) -> ContentLogits:
        """The additive logits of a content-dependent transform, per query block (see the module docstring)."""
        raise NotImplementedError  # never called: the model asks uses_transform first

    def normalise(self, logits: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Attention weights from finished logits, in place of softmax (see the module docstring)."""
        return logits.softmax(-1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, block_size: int) -> Tensor:
        """The causal attention output ``(B, H, L, Dh)`` in place of the model's (see the module docstring)."""
        raise NotImplementedError  # never called: the model asks uses_attend first

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Optional[ScoreMod]:
        """``bias`` as a FlexAttention ``score_mod`` over indices into ``q_pos`` / ``k_pos`` (see the module
        docstring), or None: this encoder's bias has no fused form and the model takes ``bias``.

        A learned tensor the ``score_mod`` reads must be indexed once per logit (Inductor's backward refuses a
        tensor that requires grad indexed twice: clone it for the second read) and must not be 0-d (index a
        per-head copy by ``h``)."""
        return None

    # FlexAttention's ``kernel_options`` for this encoder's fused kernel, or None for Inductor's own choice: an
    # encoder whose lookups make the default tiles overflow a GPU's shared memory names smaller ones here
    flex_kernel_options: Optional[dict] = None
    # whether the model trains through the fused kernel by default (while gradients flow; evaluation always may):
    # False keeps the blocked path for training where the fused backward is known not to compile in useful time.
    # An explicit ``model.fused_attention = True`` still takes the fused path.
    fused_training: bool = True

    # -- which hooks are in use (decided by overriding, never by name) -------------------
    def _overrides(self, hook: str) -> bool:
        return getattr(type(self), hook) is not getattr(PositionalEncoder, hook)

    @property
    def uses_embed(self) -> bool:
        return self._overrides("embed")

    @property
    def uses_rotate(self) -> bool:
        return self._overrides("rotate")

    @property
    def uses_bias(self) -> bool:
        return self._overrides("bias")

    @property
    def uses_scores(self) -> bool:
        return self._overrides("scores")

    @property
    def uses_score_mod(self) -> bool:
        return self._overrides("score_mod")

    @property
    def uses_transform(self) -> bool:
        return self._overrides("transform")

    @property
    def uses_normalise(self) -> bool:
        return self._overrides("normalise")

    @property
    def uses_attend(self) -> bool:
        return self._overrides("attend")

    @property
    def explicit_attention(self) -> bool:
        """Whether attention must be formed explicitly, block by block (a transform or a normaliser of its own),
        rather than by causal SDPA or a fused kernel."""
        return self.uses_transform or self.uses_normalise

    # -- which encoder each layer uses ----------------------------------------------------
    def for_layers(self, n_layers: int) -> list["PositionalEncoder"]:
        """The encoder each of the model's ``n_layers`` blocks uses in its attention hooks (all but ``embed``).

        One encoding shared by every layer (this encoder) unless a subclass mixes
        encodings across layers (``encoder=mixed``). ``embed`` is applied once, at
        the input, by the encoder the model holds.

        Raises:
            ConfigError: the encoder cannot serve ``n_layers`` layers.
        """
        return [self] * n_layers

    @property
    def label(self) -> str:
        """How results name this encoding: the registry name, or a mixed encoding's per-layer pattern."""
        return self.name

    def extended(self, kind: str, factor: float, train_len: int, new_len: int,
                 factors: Optional[Sequence[float]] = None, start: int = 0) -> "PositionalEncoder":
        """The encoder a fine-tune at ``new_len`` tokens trains, from this one trained at ``train_len``.

        ``none`` (direct fine-tuning) keeps the encoding as it is. Any other method is the encoder's own
        evaluation-time ``with_scaling`` copy, which shares this encoder's parameters (``start``: LongRoPE's
        ``n^``, passed on only when set): training and evaluation read positions through one implementation
        (position interpolation, Chen et al. 2023, and the rotary formulas of ``posexp/encoders/scaling.py``).

        Raises:
            ConfigError: ``none`` for an encoding that cannot represent ``new_len`` positions.
        """
        if kind != "none":  # the scaling encoders' own; LongRoPE's per-frequency factors (and n^) where given
            extra: dict = {"start": start} if start else {}
            return self.with_scaling(kind, factor, train_len, *([factors] if factors is not None else []), **extra)
        if not self.supports(new_len):
            raise ConfigError("train_len", f"encoder {self.name!r} represents positions 0..{self.max_length - 1}, "
                                           f"fewer than train_len={new_len}, and scaling=none keeps it as it is")
        return self

    def supports(self, length: int) -> bool:
        """Whether a sequence of ``length`` tokens can be encoded at all."""
        return self.max_length is None or length <= self.max_length

    def extra_repr(self) -> str:
        base = self.base
        parts = [f"d_model={self.d_model}", f"n_heads={self.n_heads}"]
        if base is not None:
            parts.append(f"base={base:g}")
        if self.max_length is not None:
            parts.append(f"max_length={self.max_length}")
        return ", ".join(parts)


HOOKS = ("embed", "rotate", "bias", "scores", "transform", "normalise", "attend", "score_mod")


def hook_problem(cls: type) -> Optional[str]:
    """Why a hook ``cls`` overrides cannot be called as the model calls it, with the contract's arguments by position
    (``Odd.rotate(self, q, k) does not take the contract's arguments (q, k, q_pos, k_pos)``); None when each can."""
    for hook in HOOKS:
        mine, contract = inspect.getattr_static(cls, hook), inspect.getattr_static(PositionalEncoder, hook)
        if mine is contract:
            continue
        arguments = [p for p in inspect.signature(contract).parameters if p != "self"]
        function = mine.__func__ if isinstance(mine, (staticmethod, classmethod)) else mine
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):  # not a function of Python's (a builtin, a callable object): left to run
            continue
        try:
            signature.bind(*([] if isinstance(mine, staticmethod) else [None]), *arguments)
        except TypeError:
            return (f"{cls.__qualname__}.{hook}{signature} does not take the contract's arguments "
                    f"({', '.join(arguments)})")
    return None


def layer_copies(encoder: PositionalEncoder, copies: nn.ModuleList, n_layers: int,
                 make: Callable[[], PositionalEncoder]) -> list[PositionalEncoder]:
    """``encoder`` for the first layer and a fresh ``make()`` for each further one, kept in ``copies`` (a module list
    of ``encoder``, so the copies train and are saved with it): a :meth:`PositionalEncoder.for_layers` for an
    encoding whose paper gives every attention layer its own parameters (FoX's forget gate, PaTH's projections).

    Raises:
        ConfigError: the copies were built for another number of layers.
    """
    while len(copies) < n_layers - 1:
        copies.append(make())
    for copy in copies:  # encoder.lr_mult is every layer's (create sets it on the first)
        copy.lr_mult = encoder.lr_mult
    if len(copies) != n_layers - 1:
        raise ConfigError("model.n_layers", f"this {encoder.name} encoder was built for {len(copies) + 1} layers, "
                                            f"not {n_layers}")
    return [encoder, *copies]


def check_position_range(pos: Tensor, max_length: int, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` (the encoding's limit, "learned position embeddings cover") when a
    position of ``pos`` lies outside ``0 .. max_length - 1``, instead of an index error deep in an embedding.

    Eager calls only: while ``torch.compile`` traces a step, the check would cost a graph break and a host
    synchronisation every step (reading the positions' extremes), so it is left out there; every command checks
    ``supports(length)`` before the first forward.
    """
    if torch.compiler.is_compiling() or not pos.numel():
        return
    lo, hi = torch.stack(torch.aminmax(pos)).tolist()  # one read from the device
    if lo < 0 or hi >= max_length:
        raise ValueError(f"{what} positions 0..{max_length - 1}, got positions {lo}..{hi}; "
                         "check supports(length) first")


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """``q_pos[:, None] - k_pos[None, :]``: how far back each key is, ``(Lq, Lk)``."""
    return q_pos[:, None] - k_pos[None, :]


def bias_score_mod(bias_at: Callable[[Tensor, Tensor, Tensor], Tensor], q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
    """The ``score_mod`` adding ``bias_at(h, i, j)``, the bias of head ``h`` for query position ``i`` and key
    position ``j`` (broadcastable tensors, elementwise), at ``i = q_pos[q_idx]``, ``j = k_pos[kv_idx]``."""

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + bias_at(h, q_pos[q_idx], k_pos[kv_idx]).to(score.dtype)

    return score_mod


__all__ = ["ContentLogits", "PositionalEncoder", "ScoreMod", "bias_score_mod", "check_position_range", "layer_copies", "relative_distance"]
