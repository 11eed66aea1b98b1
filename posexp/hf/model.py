"""A Hugging Face transformers causal LM as evaluation sees a model (:class:`~posexp.model.interface.EvaluableLM`).

One forward pass of a long sequence runs in chunks of queries over one pass of keys: a ``DynamicCache`` holds each
layer's keys and values, and each chunk's queries attend to every earlier key, so the result is the one
uncached forward would give. The vocabulary projection and the cross-entropy happen per chunk too, so a 16K-token
window never holds its ``16K x vocab`` logits at once. After an out-of-memory error :meth:`HFLanguageModel.shrink`
halves the chunk.

Positions: the window's ``pos`` are the model's ``position_ids`` (a learned table reads them, RoPE rotates by
them). A model whose forward takes no positions (Bloom's and MPT's ALiBi, relative by construction) reads
consecutive tokens only.

Scalings: see :mod:`posexp.hf.rotary`; position remappings (``rerope``, ``self_extend``, ``string``, ``dca``,
``ms_poe``) go through transformers' attention interface, :mod:`posexp.hf.remap` (Ms-PoE reads a window in one
call: its heads are ranked on the whole input). **Dynamic NTK.** transformers recomputes the dynamic base from the largest
position of each forward call, so with a key cache the early keys keep the base they were rotated with while later
chunks use a larger one (the inconsistent rotation bases reported against transformers' dynamic scaling). posexp
measures one defined behaviour instead, independent of the chunk size: the base for the window's length
(``Reading.length``; the call's last position + 1 outside a reading), computed once and used for every query and
key of the window, which is what one uncached forward of the whole window does. A checkpoint published with a
dynamic or LongRoPE rope type is read the same way under ``eval.scaling=none``.

Window baselines (``Reading.window``, with sinks) are a 4-D additive attention mask given to the model, which
transformers' eager and SDPA attention apply as they are. Whether a model honours such a mask is checked once on a
few tokens (with a window of one key, each position's logits must not depend on the tokens before it); where it
does not (Bloom builds its ALiBi from a 2-D mask, MPT recasts the mask, flash attention takes none, a model with
sliding-window layers keeps a cache of its own), the window's rows are refused with the reason.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.encoders.extension import REMAPPINGS
from posexp.encoders.remapping import REROPE, Remapping, skip_refusal
from posexp.encoders.scaling import LONGROPE, NONE, check_known, check_longrope_start
from posexp.errors import ConfigError, PosexpError
from posexp.hf.remap import RemapCall, Switched, layer_sites, remap_refusal
from posexp.hf.rotary import find_rotary, kept_below, pinned_swaps, rotary_refusal, scaled_frequencies
from posexp.model.interface import Reading
from posexp.model.window import AttentionWindow

DEFAULT_CHUNK = 1024  # queries per forward call
MIN_CHUNK = 16


class HFLanguageModel:
    """A transformers ``*ForCausalLM`` read through posexp's model seam.

    Args:
        model: the causal LM (``AutoModelForCausalLM``), on its device(s) and dtype.
        name: how rows and messages name it (the Hub name or folder it was loaded from).
        chunk: queries per forward call of a long sequence.
    """

    def __init__(self, model: Any, name: str, chunk: int = DEFAULT_CHUNK):
        self.model: Any = model  # a transformers PreTrainedModel
        self.name = str(name)
        self.chunk = int(chunk)
        self._how = Reading()
        self._rotary = find_rotary(model)
        forward = inspect.signature(model.forward).parameters
        self._takes_positions = "position_ids" in forward
        self._cache_kwarg = "cache" if "cache" in forward else "past_key_values"
        self._window_problem: Optional[str] = None
        self._window_checked = False
        self._frequencies: dict[tuple, list[tuple[Tensor, float]]] = {}
        self.bos: Optional[int] = None  # token_losses: each window's first input (hf.bos); None = as given

    # -- what the model is ------------------------------------------------------------------------

    @property
    def label(self) -> str:
        return self.name

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def has_rope(self) -> bool:
        """Whether the model rotates queries and keys (it has transformers' rotary modules)."""
        return bool(self._rotary)

    @property
    def max_length(self) -> Optional[int]:
        """The size of a learned position table (GPT-2's ``n_positions``) or of the ALiBi table a config fixes
        (MPT's ``max_seq_len``); None for a RoPE model or an unbounded ALiBi one."""
        table = self._position_table()
        if table is not None:
            return table
        if not self._rotary and getattr(self.config, "max_seq_len", None):
            return int(self.config.max_seq_len)
        return None

    @property
    def context_length(self) -> Optional[int]:
        """The context the model was pretrained at, the ``train_len`` its scalings stretch from: the rope
        parameters' ``original_max_position_embeddings`` for a checkpoint published already extended (Llama 3.1's
        8192 under its ``llama3`` bands), else the config's ``max_position_embeddings`` (or MPT's
        ``max_seq_len``); None when the config names none."""
        params = getattr(self.config, "rope_parameters", None) or {}
        original = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
        n = original or getattr(self.config, "max_position_embeddings", None) or getattr(self.config,
                                                                                        "max_seq_len", None)
        return int(n) if n else None

    def _position_table(self) -> Optional[int]:
        """The rows of a learned position embedding: an embedding other than the tokens' with about as many rows
        as the config's ``max_position_embeddings`` (OPT's table keeps 2 rows of offset)."""
        n = getattr(self.config, "max_position_embeddings", None)
        if not n or self._rotary:
            return None
        tokens = self.model.get_input_embeddings()
        for module in self.model.modules():
            if isinstance(module, nn.Embedding) and module is not tokens and n <= module.num_embeddings <= n + 2:
                return int(n)
        return None

    def eval(self) -> "HFLanguageModel":
        self.model.eval()
        return self

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    # -- how it reads a length --------------------------------------------------------------------

    def check_scaling(self, kind: str) -> Optional[str]:
        """None when ``kind`` applies; why not (no RoPE, a rotary layout posexp cannot read or remap) otherwise.

        Raises:
            ConfigError: ``kind`` is not one of posexp's scalings.
        """
        check_known(kind)
        if kind in REMAPPINGS:  # through the attention interface (posexp/hf/remap.py)
            if not self._rotary:
                return str(rotary_refusal(self._rotary, kind, self.model)).replace("rescales rotary frequencies",
                                                                                  "remaps rotary positions")
            return remap_refusal(self.model, self._rotary, kind)
        return rotary_refusal(self._rotary, kind, self.model)

    def length_refusal(self, how: Reading, length: int) -> Optional[str]:
        """Why ``length`` tokens cannot be read as ``how`` says: more than the position table holds, or a window
        the model's attention does not honour."""
        limit = self.max_length
        if limit is not None and length > limit:
            return f"{self.name} has {limit} positions; it cannot read {length} tokens"
        if how.window is not None:
            return self.window_refusal()
        remap = how.remap if how.scaling in REMAPPINGS and self._rotary else None
        if remap is not None and remap.kind == "ms_poe":
            return skip_refusal(remap, int(self.config.num_hidden_layers))
        return None

    def window_refusal(self) -> Optional[str]:
        """Why the model cannot attend within a window given as a 4-D mask, or None (checked once)."""
        if not self._window_checked:
            self._window_problem = self._check_window()
            self._window_checked = True
        return self._window_problem

    @contextlib.contextmanager
    def reading(self, how: Reading) -> Iterator[None]:
        """Read as ``how`` says within the block; the chunk size and the reading are restored on leaving it.

        Raises:
            ConfigError: a scaling this model does not offer, or its options wrong (LongRoPE's factors).
        """
        reason = self.check_scaling(how.scaling)
        if reason is not None:
            raise ConfigError("eval.scaling", f"{how.scaling} does not apply to {self.name}: {reason}")
        saved_how, saved_chunk = self._how, self.chunk
        self._how = how
        try:
            if how.scaling not in (NONE, *REMAPPINGS) and how.length:
                self._site_frequencies(how.length)  # a wrong eval.longrope_factors fails here, not mid-run
                self._longrope_start()
            yield
        finally:
            self._how, self.chunk = saved_how, saved_chunk

    def shrink(self) -> Optional[str]:
        """Halve the query chunk; None once it is :data:`MIN_CHUNK`."""
        if self.chunk <= MIN_CHUNK:
            return None
        self.chunk = max(MIN_CHUNK, self.chunk // 2)
        return f"query chunks of {self.chunk}"

    def memory_settings(self) -> dict:
        return {"query_chunk": self.chunk}

    # -- forward ----------------------------------------------------------------------------------

    def logits(self, idx: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        """Logits ``(B, L, vocab)`` of ``idx (B, L)`` at positions ``pos (L,)``, in the model's dtype."""
        out: list[Tensor] = []
        self._chunks(idx, pos, lambda logits, start, end: out.append(logits.to(self.device)))
        return torch.cat(out, dim=1)

    def token_losses(self, idx: Tensor, targets: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        """Cross-entropy in nats of each target, ``(B, L)`` fp32, computed chunk by chunk; with :attr:`bos` set,
        each window's first input is that token (as the tokenizer would start a text; the targets are unchanged)."""
        if self.bos is not None:
            idx = idx.clone()
            idx[:, 0] = self.bos
        losses = torch.empty(targets.shape, dtype=torch.float32, device=self.device)
        targets = targets.to(self.device)

        def each(logits: Tensor, start: int, end: int) -> None:
            t = targets[:, start:end].to(logits.device)  # the last device of a model spread by device_map
            losses[:, start:end] = F.cross_entropy(logits.float().flatten(0, 1), t.flatten(),
                                                   reduction="none").view_as(t).to(losses.device)

        self._chunks(idx, pos, each)
        return losses

    @torch.no_grad()
    def _chunks(self, idx: Tensor, pos: Optional[Tensor], each: Callable[[Tensor, int, int], None]) -> None:
        """One forward pass of ``idx`` in chunks of queries over a key cache; ``each(logits, start, end)``."""
        from transformers import DynamicCache

        idx = idx.to(self.device)
        B, L = idx.shape
        pos = self._positions(pos, L)
        window = self._how.window
        if window is not None:
            problem = self.window_refusal()
            if problem is not None:
                raise PosexpError(f"{self.name}: eval.window does not apply: {problem}")
        cache = DynamicCache(config=self.config)
        seq_len = self._how.length or int(pos.max().item()) + 1
        remap = self._remapping()
        chunk = L if remap is not None and remap.kind == "ms_poe" else self.chunk  # its heads rank on the whole input
        with self._rotated_for(seq_len), Switched(self.model) if remap is not None else contextlib.nullcontext():
            call = None if remap is None else RemapCall(remap, pos, layer_sites(self.model, self._rotary, remap))
            for start in range(0, L, chunk):
                end = min(L, start + chunk)
                kwargs: dict = {"input_ids": idx[:, start:end], self._cache_kwarg: cache, "use_cache": True}
                if call is not None:
                    kwargs["posexp_remap"] = call
                if self._takes_positions:
                    kwargs["position_ids"] = pos[start:end].unsqueeze(0).expand(B, -1)
                if window is not None:
                    kwargs["attention_mask"] = window_mask(window, start, end, B, self._dtype(), self.device)
                each(self.model(**kwargs).logits, start, end)  # (B, end - start, vocab)

    def _remapping(self) -> Optional[Remapping]:
        """The reading's position remapping with all its options (ReRoPE: its window, the reading's factor)."""
        how = self._how
        if how.scaling == REROPE:
            return Remapping(REROPE, (("rerope_window", int(how.factor)),))
        if how.scaling not in REMAPPINGS:
            return None
        return how.remap or Remapping.of(how.scaling, {}, how.train_len, how.length)  # its defaults

    def _positions(self, pos: Optional[Tensor], L: int) -> Tensor:
        if pos is None:
            return torch.arange(L, device=self.device)
        pos = pos.to(self.device)
        if not self._takes_positions and not bool((pos[1:] - pos[:-1] == 1).all()):
            raise PosexpError(f"{self.name} takes no position ids (its positions are implicit, consecutive): it "
                              f"cannot read tokens at other positions")
        return pos

    def _dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    # -- rotary frequencies -----------------------------------------------------------------------

    def _site_frequencies(self, seq_len: int, scaling: Optional[str] = None) -> list[tuple[Tensor, float]]:
        how = self._how
        scaling = how.scaling if scaling is None else scaling
        key = (scaling, how.factor, how.train_len, how.longrope_factors, seq_len)
        if key not in self._frequencies:
            self._frequencies[key] = [scaled_frequencies(s, scaling, how.factor, how.train_len, seq_len,
                                                         how.longrope_factors) for s in self._rotary]
        return self._frequencies[key]

    def _longrope_start(self) -> int:
        """LongRoPE's ``n^`` of this reading: 0 unless ``longrope`` stretches past the training length."""
        how = self._how
        return check_longrope_start(how.longrope_start) if how.scaling == LONGROPE and how.factor > 1 else 0

    def _pins(self) -> bool:
        """Whether this reading pins rotary frequencies (a scaling, or a checkpoint's own per-call rope type)."""
        own = self._how.scaling not in (NONE, *REMAPPINGS)
        return own or any(s.rope_type in ("dynamic", "longrope") for s in self._rotary)

    @contextlib.contextmanager
    def _rotated_for(self, seq_len: int) -> Iterator[None]:
        """Within the block every rotary module rotates by the reading's frequencies for ``seq_len``."""
        if not self._rotary or not self._pins():
            yield
            return
        swaps = pinned_swaps(self._rotary, self._site_frequencies(seq_len))
        start = self._longrope_start()
        if start:  # LongRoPE's n^ (Ding et al. 2024, §3.2): the first positions rotate as the model reads unscaled
            trained = pinned_swaps(self._rotary, self._site_frequencies(seq_len, NONE))
            swaps = [(parent, name, kept_below(pinned, t[2], start), original)
                     for (parent, name, pinned, original), t in zip(swaps, trained)]
        for parent, name, pinned, _ in swaps:
            setattr(parent, name, pinned)
        try:
            yield
        finally:
            for parent, name, _, original in swaps:
                setattr(parent, name, original)

    # -- windows ----------------------------------------------------------------------------------

    def _check_window(self) -> Optional[str]:
        """Whether a window of one key, given as a 4-D mask, makes each position's logits independent of the
        tokens before it (and changes them from full attention)."""
        from transformers import DynamicCache

        if any(DynamicCache(config=self.config).is_sliding):
            return "the model has sliding-window layers whose key cache is its own"
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        g = torch.Generator().manual_seed(0)
        a = torch.randint(0, vocab, (1, 6), generator=g).to(self.device)
        b = a.clone()
        b[0, :5] = torch.randint(0, vocab, (5,), generator=g).to(self.device)
        probe = HFLanguageModel(self.model, self.name, chunk=self.chunk)
        try:
            full_a, full_b = probe.logits(a)[0, -1], probe.logits(b)[0, -1]
            probe._how, probe._window_checked = Reading(window=AttentionWindow(1)), True
            win_a, win_b = probe.logits(a)[0, -1], probe.logits(b)[0, -1]
        except Exception as exc:  # noqa: BLE001 - a model that cannot take a 4-D mask fails in its own way
            return f"its attention takes no 4-D attention mask ({type(exc).__name__})"
        scale = float(full_a.abs().max()) + 1e-6
        if not torch.allclose(win_a, win_b, atol=1e-4 * scale) or torch.allclose(full_a, full_b, atol=1e-4 * scale):
            return (f"its attention ({getattr(self.config, '_attn_implementation', '?')}) does not apply a 4-D "
                    f"attention mask as given")
        return None


def window_mask(window: AttentionWindow, start: int, end: int, batch: int, dtype: torch.dtype,
                device: torch.device) -> Tensor:
    """The additive mask ``(B, 1, end - start, end)`` of queries ``start .. end-1`` over keys ``0 .. end-1``: 0
    where a query sees a key (causally, within the window or a sink), the dtype's lowest value elsewhere."""
    q = torch.arange(start, end, device=device)[:, None]
    k = torch.arange(end, device=device)[None, :]
    hidden = (k > q) | window.hidden(q, k)
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill(hidden, torch.finfo(dtype).min)
    return mask[None, None].expand(batch, 1, -1, -1)


__all__ = ["DEFAULT_CHUNK", "HFLanguageModel", "MIN_CHUNK", "window_mask"]
