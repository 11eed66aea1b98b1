"""Position remappings (:mod:`posexp.encoders.remapping`) inside a transformers model, through its attention interface.

transformers' attention modules rotate q and k at their true positions, update the key cache, then call the
function registered for ``config._attn_implementation`` in ``AttentionInterface``. posexp registers one such
function per implementation it stands in for (``posexp_remap_sdpa``, ``posexp_remap_eager``; the mask function of
the original, in ``AttentionMaskInterface``, under the same name). Within a reading the model's implementation is
switched to it; each forward call passes a :class:`RemapCall` through the model's keyword arguments (transformers
hands them on to the attention function), and the function moves q and k to the remapped positions
(``R(a) R(b) = R(a + b)``) and attends (:func:`~posexp.encoders.remapping.remapped_attention`). A layer it does not
remap (a sliding-window or chunked layer type, as Gemma 3's local layers; Ms-PoE's first layers) is handed to the
original implementation unchanged. No model class is copied or patched.

What a model must have (:func:`remap_refusal` says which is missing, in one line): rotary modules posexp reads
(:mod:`posexp.hf.rotary`), frequencies fixed per model (not a dynamic or LongRoPE checkpoint, whose frequencies
change with each call's length), attention through transformers' attention interface with ``sdpa`` or ``eager``, and
the half-split rotary layout, checked against the model's own ``apply_rotary_pos_emb`` (partial rotary included).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from posexp.encoders.remap_attention import Placement, remapped_attention, rotate_by, unrotated
from posexp.encoders.remapping import Method, MsPoEMethod, Remapping
from posexp.hf.rotary import LOCAL_LAYER_TYPES, PER_CALL_TYPES, RotarySite

NAME = "posexp_remap_"  # + the implementation stood in for
ORIGINALS = ("sdpa", "eager")
QUERY_BLOCK = 256  # queries per block of logits inside a forward call


@dataclass
class RemapCall:
    """What one forward call of a window needs: the remapping, every key's true position, the rotary site of each
    layer (None: the layer is left as it is) and, for Ms-PoE, each layer's ranked method."""

    remap: Remapping
    k_pos: Tensor
    sites: list[Optional[RotarySite]]
    methods: dict[int, Method] = field(default_factory=dict)

    def method(self, layer: int) -> Method:
        if layer not in self.methods:
            self.methods[layer] = self.remap.method()
        return self.methods[layer]


def _delegate(original: str, module: Any) -> Callable:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if original == "eager":
        return getattr(sys.modules[type(module).__module__], "eager_attention_forward")
    return ALL_ATTENTION_FUNCTIONS[original]


def _attention(original: str) -> Callable:
    def attend(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
               scaling: Optional[float] = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
        call: Optional[RemapCall] = kwargs.pop("posexp_remap", None)
        layer = int(getattr(module, "layer_idx", 0))
        site = None if call is None else call.sites[layer]
        if call is None or site is None or kwargs.get("sliding_window") is not None:
            return _delegate(original, module)(module, query, key, value, attention_mask, scaling=scaling,
                                               dropout=dropout, **kwargs)
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)  # repeat_kv
        q_pos = kwargs["position_ids"][0].to(query.device)
        placed = Placement(q_pos, call.k_pos[:key.shape[2]].to(query.device), site.inv_freq)
        scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        method = call.method(layer)
        if isinstance(method, MsPoEMethod) and method.ratio is None:  # ranked once per window, on its first call
            method.rank_heads(unrotated(query, placed.q_pos, site.inv_freq),
                              unrotated(key, placed.k_pos, site.inv_freq), scale)
        out = remapped_attention(method, query, key, value, placed, scale, block=QUERY_BLOCK,
                                 softcap=kwargs.get("softcap"))
        return out.transpose(1, 2).contiguous(), None

    return attend


def register() -> None:
    """Register posexp's attention functions and their masks with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask, sdpa_mask

    for original in ORIGINALS:
        if NAME + original in ALL_MASK_ATTENTION_FUNCTIONS:
            continue
        AttentionInterface.register(NAME + original, _attention(original))
        AttentionMaskInterface.register(NAME + original, sdpa_mask if original == "sdpa" else eager_mask)


def layer_sites(model: Any, sites: list[RotarySite], remap: Remapping) -> list[Optional[RotarySite]]:
    """The rotary site of each decoder layer, None where the layer is left as it is: a sliding-window or chunked
    layer type (``config.layer_types``), or one of Ms-PoE's first ``skip_layers``."""
    config = model.config
    types = list(getattr(config, "layer_types", None) or [None] * int(config.num_hidden_layers))
    skip = int(remap["skip_layers"]) if remap.kind == "ms_poe" and remap.options else 0
    by_type = {s.layer_type: s for s in sites}
    out: list[Optional[RotarySite]] = []
    for i, t in enumerate(types):
        site = by_type.get(t) if None not in by_type else sites[0]
        local = t in LOCAL_LAYER_TYPES or (site is not None and site.local)
        out.append(None if i < skip or local else site)
    return out


def remap_refusal(model: Any, sites: list[RotarySite], kind: str) -> Optional[str]:
    """Why ``kind`` cannot remap this model's positions (one line), or None."""
    if not sites:
        return f"{kind} remaps rotary positions, and this model has no rotary position embedding (learned " \
               f"positions or ALiBi)"
    per_call = sorted({str(s.rope_type) for s in sites if s.rope_type in PER_CALL_TYPES})
    if per_call:
        return (f"{kind} moves q and k by position differences at fixed frequencies, and this model's rope type "
                f"{', '.join(per_call)} changes its frequencies with each call's length")
    if not getattr(model, "_supports_attention_backend", False):
        return f"{kind} needs transformers' attention interface, which {type(model).__name__} does not go through"
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ORIGINALS and not str(impl).startswith(NAME):
        return f"{kind} stands in for sdpa or eager attention; this model was loaded with {impl}"
    if len({id(s.module) for s in sites if s.layer_type is None}) > 1:
        return f"{kind} reads one rotary module per model (or per layer type), and this model has several"
    remapped = [s for s in layer_sites(model, sites, Remapping(kind)) if s is not None]
    if not remapped:
        return f"{kind} remaps full-attention layers, and every layer of this model attends within a window"
    return _layout_problem(model, remapped[0], kind)


def _layout_problem(model: Any, site: RotarySite, kind: str) -> Optional[str]:
    """Whether the model's own ``apply_rotary_pos_emb`` at positions ``p`` is posexp's half-split rotation at ``p``
    (partial rotary: its first rotated features), on random vectors."""
    apply = getattr(sys.modules[type(model).__module__], "apply_rotary_pos_emb", None)
    reason = (f"{kind} rotates q and k by position differences in the half-split layout, and this model's rotary "
              f"layout is another")
    if apply is None:
        return reason + " (no apply_rotary_pos_emb beside its model class)"
    config = model.config
    head = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 3, head, generator=g, dtype=torch.float64)
    pos = torch.tensor([0.0, 5.0, 11.0], dtype=torch.float64)
    freqs = pos[:, None] * site.inv_freq.double().cpu()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[None]  # (1, 3, rot)
    try:
        theirs, _ = apply(x, x, emb.cos(), emb.sin())
    except Exception as exc:  # noqa: BLE001 - a layout it cannot take fails in the model's own way
        return reason + f" ({type(exc).__name__} in its apply_rotary_pos_emb)"
    ours = rotate_by(x, pos, site.inv_freq.cpu())
    if theirs.shape != ours.shape or not torch.allclose(theirs, ours, atol=1e-9):
        return reason
    return None


@dataclass
class Switched:
    """The model's attention implementation switched to posexp's within a ``with`` block."""

    model: Any
    original: str = ""

    def __enter__(self) -> "Switched":
        register()
        self.original = str(self.model.config._attn_implementation)
        self.model.set_attn_implementation(NAME + self.original)
        return self

    def __exit__(self, *exc: object) -> None:
        self.model.set_attn_implementation(self.original)


__all__ = ["NAME", "QUERY_BLOCK", "RemapCall", "Switched", "layer_sites", "register", "remap_refusal"]
