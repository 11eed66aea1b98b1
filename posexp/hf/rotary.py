"""The rotary position embedding of a transformers model, found in the model and rescaled by posexp's scalings.

Which models have RoPE is read from the model itself, not from a list of architectures: transformers' rotary
modules (``LlamaRotaryEmbedding``, ``GPTNeoXRotaryEmbedding``, ... in v5) hold the inverse frequencies as an
``inv_freq`` buffer, a q/k multiplier ``attention_scaling`` and their ``rope_type``, and turn ``position_ids`` into
the cos/sin every layer applies. A model with none of them (GPT-2's learned table, Bloom's and MPT's ALiBi) has no
rotary scaling to offer. The rotary width is the module's own (``2 * len(inv_freq)``), so partial rotary
(GPT-NeoX's ``rotary_pct``, v5's ``partial_rotary_factor``) is respected.

How each ``eval.scaling`` becomes new frequencies (:func:`scaled_frequencies`):

- ``linear``, ``dynamic_ntk``, ``yarn``, ``llama3`` and ``longrope`` go through transformers' own
  ``ROPE_INIT_FUNCTIONS`` on a copy of the model's config whose rope parameters (v5 ``rope_parameters``; a legacy
  ``rope_scaling`` is read into it by the config class) name the type, the factor and
  ``original_max_position_embeddings`` = the reading's ``train_len``, from the model's ``rope_theta``. They replace
  whatever scaling the checkpoint was published with (a Llama 3.1 checkpoint's own ``llama3`` bands, say): the
  reading asks for one method from the unscaled base. Where the rope parameters differ per layer type (Gemma 3),
  the scaling replaces those of the full-attention types, as a config giving that rope type to them would; the
  sliding-window types (:data:`LOCAL_LAYER_TYPES`) keep their own frequencies.
- ``ntk`` (the static NTK-aware base, bloc97 2023; Peng et al. 2023, §3.1), which transformers has no type for, is
  posexp's formula (:func:`posexp.encoders.scaling.rope_scaling`) at the model's rotary width and base.

The frequencies are computed once per forward call, for a given sequence length, and pinned on a copy of the
rotary module (:func:`pinned_rotary`) whose ``rope_type`` says ``default``, so transformers' per-call updates
(``dynamic_rope_update``) cannot change them between the chunks of one sequence.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from torch import Tensor

from posexp.encoders.scaling import LONGROPE, NONE, longrope_frequencies, module_copy, rope_scaling
from posexp.errors import ConfigError

# eval.scaling -> transformers' rope_type
HF_ROPE_TYPES = {"linear": "linear", "dynamic_ntk": "dynamic", "yarn": "yarn", "llama3": "llama3",
                 LONGROPE: "longrope"}
# scalings posexp computes itself from the model's base
POSEXP_FORMULAS = ("ntk",)
# rope types whose frequencies transformers recomputes from each call's positions
PER_CALL_TYPES = ("dynamic", "longrope")
# Llama 3.1's band edges, as posexp.encoders.scaling uses them (Meta's reference apply_scaling)
LLAMA3_BANDS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
# layer types that attend within a window or chunk (transformers' ``layer_types``): scalings leave them as they are
LOCAL_LAYER_TYPES = ("sliding_attention", "chunked_attention")


@dataclass
class RotarySite:
    """One rotary module of a model and where it hangs (``setattr(parent, name, ...)`` swaps it).

    A module that rotates every layer alike holds ``inv_freq``; one whose rope parameters differ per layer type
    (Gemma 3's ``rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}`` in transformers 5) holds
    ``{layer_type}_inv_freq`` and ``{layer_type}_attention_scaling`` for each type, and is one site per type.
    """

    parent: Any  # nn.Module; Any because transformers' modules carry attributes torch's stubs do not know
    name: str
    module: Any
    layer_type: Optional[str] = None

    @property
    def prefix(self) -> str:
        return f"{self.layer_type}_" if self.layer_type else ""

    @property
    def inv_freq(self) -> Tensor:
        return getattr(self.module, f"{self.prefix}inv_freq")

    @property
    def attention_scaling(self) -> float:
        return float(getattr(self.module, f"{self.prefix}attention_scaling", 1.0))

    @property
    def dim(self) -> int:
        """The rotary width: how many of a head's channels are rotated."""
        return 2 * int(self.inv_freq.numel())

    @property
    def rope_type(self) -> object:
        own = getattr(self.module, "rope_type", "default")
        return own.get(self.layer_type, "default") if self.layer_type and isinstance(own, dict) else own

    @property
    def local(self) -> bool:
        """Whether its layers attend within a sliding window or a chunk: a scaling leaves them as they are, as
        Gemma 3 scales only its full-attention layers (their context is all that grows)."""
        return self.layer_type in LOCAL_LAYER_TYPES


def _per_type_sites(parent: Any, name: str, child: Any) -> list[RotarySite]:
    """One site per layer type of a module whose ``rope_type`` is a dict keyed by layer type, each type holding
    its own ``{layer_type}_inv_freq``; empty if the module is not laid out so."""
    types = getattr(child, "rope_type", None)
    if not isinstance(types, dict) or not types or not hasattr(child, "config"):
        return []
    if not all(isinstance(getattr(child, f"{t}_inv_freq", None), Tensor) for t in types):
        return []
    return [RotarySite(parent, name, child, str(t)) for t in sorted(types)]


def find_rotary(model: Any) -> list[RotarySite]:
    """Every rotary module of ``model``: a module holding an ``inv_freq`` tensor (or one per layer type), a
    ``rope_type`` and the model's ``config`` (transformers' rotary-embedding modules)."""
    sites = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if (isinstance(getattr(child, "inv_freq", None), Tensor) and hasattr(child, "rope_type")
                    and hasattr(child, "config")):
                sites.append(RotarySite(parent, name, child))
            else:
                sites.extend(_per_type_sites(parent, name, child))
    return sites


def unknown_rotary(model: Any) -> list[str]:
    """The class names of rotary modules posexp cannot read: named ``*RotaryEmbedding`` or carrying a
    ``rope_type``, but with neither an ``inv_freq`` nor one per layer type."""
    known = {id(s.module) for s in find_rotary(model)}
    return sorted({type(m).__name__ for m in model.modules() if id(m) not in known
                   and (type(m).__name__.endswith("RotaryEmbedding") or hasattr(m, "rope_type"))})


def rotary_refusal(sites: list[RotarySite], kind: str, model: Any = None) -> Optional[str]:
    """Why ``kind`` does not apply to a model with these rotary modules, or None."""
    if kind == NONE:
        return None
    unknown = unknown_rotary(model) if model is not None and not sites else []
    if unknown:
        return (f"{kind} rescales rotary frequencies, and posexp does not understand this model's rotary layout "
                f"({', '.join(unknown)}: no inv_freq, nor one {{layer_type}}_inv_freq per layer type)")
    if not sites:
        return (f"{kind} rescales rotary frequencies, and this model has no rotary position embedding "
                f"(learned positions or ALiBi)")
    types = getattr(getattr(model, "config", None), "layer_types", None) or ()
    if types and all(s.layer_type is not None for s in sites) and all(t in LOCAL_LAYER_TYPES for t in types):
        # rope parameters per layer type: the scaling would stretch only full-attention layers, and there are none
        return (f"{kind} rescales the frequencies of full-attention layers, and every layer of this model attends "
                f"within a window")
    return None


def rope_parameters(config: Any, layer_type: Optional[str] = None) -> dict:
    """The model's rope parameters (v5 ``rope_parameters``), those of ``layer_type`` where they are per type."""
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None:
        params = params.get(layer_type) or {}
    return dict(params) if isinstance(params, dict) else {}


def rope_theta(config: Any, layer_type: Optional[str] = None) -> float:
    """The model's RoPE base (of ``layer_type``'s rope parameters where given): v5 ``rope_parameters["rope_theta"]``,
    else a legacy ``rope_theta`` attribute."""
    params = rope_parameters(config, layer_type)
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", getattr(config, "default_theta", 10000.0)))


def per_layer_type(config: Any) -> Optional[dict[str, dict]]:
    """The rope parameters per layer type (``{"full_attention": {...}, "sliding_attention": {...}}``), or None for a
    model whose layers share one set."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) or v is None for v in params.values()):
        return {str(k): dict(v or {}) for k, v in params.items()}
    return None


def rope_record(config: Any) -> dict:
    """What ``run.pretrained`` records of a rotary model: ``rope_theta`` (of the layers a scaling stretches, the
    full-attention ones where the parameters are per layer type) and its ``rope_parameters``, per layer type where
    the model gives them so."""
    per_type = per_layer_type(config)
    if per_type is None:
        return {"rope_theta": rope_theta(config), "rope_parameters": rope_parameters(config) or None}
    scaled = [t for t in per_type if t not in LOCAL_LAYER_TYPES] or sorted(per_type)
    return {"rope_theta": rope_theta(config, scaled[0]), "rope_parameters": per_type}


def _rope_config(config: Any, rope_type: str, factor: float, train_len: int, site: RotarySite,
                 factors: Optional[Sequence[float]]) -> object:
    """A copy of ``config`` whose rope parameters (``site``'s layer type's, where they are per type) ask
    transformers for ``rope_type`` from the unscaled base."""
    cfg = copy.deepcopy(config)
    old = rope_parameters(config, site.layer_type)
    params: dict = {"rope_type": rope_type, "rope_theta": rope_theta(config, site.layer_type),
                    "factor": float(factor), "original_max_position_embeddings": int(train_len)}
    if "partial_rotary_factor" in old:
        params["partial_rotary_factor"] = old["partial_rotary_factor"]
    if rope_type == "llama3":
        params.update(LLAMA3_BANDS)
    if rope_type == "longrope":
        params["long_factor"] = [float(f) for f in factors or ()]
        params["short_factor"] = [1.0] * (site.dim // 2)
    if site.layer_type is None:
        cfg.rope_parameters = params
    else:
        cfg.rope_parameters = {**copy.deepcopy(config.rope_parameters), site.layer_type: params}
    if hasattr(cfg, "original_max_position_embeddings"):  # Phi-3 keeps it beside the rope parameters, and wins
        cfg.original_max_position_embeddings = int(train_len)
    if rope_type == "dynamic":  # transformers' dynamic NTK reads the original length from here
        cfg.max_position_embeddings = int(train_len)
    return cfg


def _init(rope_type: str, config: Any, site: RotarySite, seq_len: int) -> tuple[Tensor, float]:
    """transformers' ``ROPE_INIT_FUNCTIONS[rope_type]`` for ``site`` (its layer type's parameters, where per type)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    device = site.inv_freq.device
    extra = {"layer_type": site.layer_type} if site.layer_type is not None else {}
    inv, scale = ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=seq_len, **extra)
    return inv.float().to(device), float(scale)


def scaled_frequencies(site: RotarySite, kind: str, factor: float, train_len: int, seq_len: int,
                       factors: Optional[Sequence[float]] = None) -> tuple[Tensor, float]:
    """The inverse frequencies (float32, the module's device) and q/k multiplier of ``kind`` for a sequence of
    ``seq_len`` positions, at ``site``'s rotary width and the model's base.

    ``none`` gives the module's own frequencies; for a checkpoint published with a per-call rope type (dynamic,
    longrope) those are computed for ``seq_len`` by transformers, as one uncached forward of ``seq_len`` tokens
    would. A sliding-window layer type (:attr:`RotarySite.local`) keeps its own frequencies under every scaling.

    Raises:
        ConfigError: ``eval.longrope_factors`` missing or of the wrong count for this model's rotary width.
    """
    module = site.module
    if kind == NONE or site.local:
        if site.rope_type in PER_CALL_TYPES:
            return _init(str(site.rope_type), module.config, site, seq_len)
        return site.inv_freq, site.attention_scaling
    theta = rope_theta(module.config, site.layer_type)
    if kind in POSEXP_FORMULAS:
        inv, scale = rope_scaling(kind, site.dim, theta, factor, train_len)
        return inv.float().to(site.inv_freq.device), scale
    if kind == LONGROPE:  # posexp's check and message for the factors, before transformers broadcasts them
        longrope_frequencies(site.dim, theta, factors, max(factor, 2.0))
    if kind not in HF_ROPE_TYPES:
        raise ConfigError("eval.scaling", f"{kind} is not a rotary scaling of a pretrained model; choose one of: "
                                          f"{', '.join((NONE, *HF_ROPE_TYPES, *POSEXP_FORMULAS))}")
    rope_type = HF_ROPE_TYPES[kind]
    return _init(rope_type, _rope_config(module.config, rope_type, factor, train_len, site, factors), site, seq_len)


def pinned_rotary(site: RotarySite, inv_freq: Tensor, attention_scaling: float) -> Any:
    """A copy of the rotary module that rotates by ``inv_freq`` and multiplies q and k by ``attention_scaling``
    whatever positions it is given; it shares nothing it changes with the original."""
    return pinned_module(site.module, [(site, inv_freq, attention_scaling)])


def pinned_module(module: Any, pins: Sequence[tuple[RotarySite, Tensor, float]]) -> Any:
    """A copy of ``module`` whose sites (each of its layer types, or the module itself) rotate by their pinned
    frequencies whatever positions they are given; it shares nothing it changes with the original."""
    pinned: Any = module_copy(module)
    for site, inv_freq, attention_scaling in pins:
        pinned.register_buffer(f"{site.prefix}inv_freq", inv_freq, persistent=False)
        setattr(pinned, f"{site.prefix}attention_scaling", attention_scaling)
    # transformers' dynamic_rope_update then leaves the frequencies alone
    types = getattr(module, "rope_type", None)
    pinned.rope_type = {t: "default" for t in types} if isinstance(types, dict) else "default"
    return pinned


def kept_below(pinned: Any, trained: Any, start: int) -> Any:
    """``pinned`` whose cos/sin at positions below ``start`` are ``trained``'s: LongRoPE's ``n^`` (Ding et al. 2024,
    §3.2), as the authors' code copies the unscaled cos/sin (no temperature) into the first ``n^`` rows. Both are
    pinned copies of one rotary module, called with the same arguments (``x, position_ids``, a layer type)."""
    import torch

    scaled_forward, trained_forward = pinned.forward, trained.forward

    def forward(x: Tensor, position_ids: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        cos, sin = scaled_forward(x, position_ids, *args, **kwargs)  # (B, L, dim)
        cos0, sin0 = trained_forward(x, position_ids, *args, **kwargs)
        early = (position_ids < start).unsqueeze(-1).to(cos.device)  # (B, L, 1)
        return torch.where(early, cos0, cos), torch.where(early, sin0, sin)

    pinned.forward = forward
    return pinned


def pinned_swaps(sites: Sequence[RotarySite], frequencies: Sequence[tuple[Tensor, float]]) -> list[tuple]:
    """``(parent, name, pinned, original)`` for each rotary module: the sites' frequencies pinned on one copy per
    module (a module with rope parameters per layer type is several sites)."""
    grouped: dict[int, list] = {}
    for site, (inv, scale) in zip(sites, frequencies):
        grouped.setdefault(id(site.module), [site]).append((site, inv, scale))
    return [(first.parent, first.name, pinned_module(first.module, pins), first.module)
            for first, *pins in grouped.values()]


__all__ = ["HF_ROPE_TYPES", "LOCAL_LAYER_TYPES", "POSEXP_FORMULAS", "RotarySite", "find_rotary", "kept_below",
           "per_layer_type", "pinned_module", "pinned_rotary", "pinned_swaps", "rope_parameters", "rope_record", "rope_theta",
           "rotary_refusal", "scaled_frequencies", "unknown_rotary"]
