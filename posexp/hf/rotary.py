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
  reading asks for one method from the unscaled base.
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

from posexp.encoders.scaling import LONGROPE, NONE, REROPE, longrope_frequencies, module_copy, rope_scaling
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

REROPE_REASON = ("rerope clamps the relative position at a window, which needs two attention passes per layer (one "
                 "rotated, one at the clamped distance) inside transformers' attention modules; posexp applies it "
                 "to its own models only")


@dataclass
class RotarySite:
    """One rotary module of a model and where it hangs (``setattr(parent, name, ...)`` swaps it)."""

    parent: Any  # nn.Module; Any because transformers' modules carry attributes torch's stubs do not know
    name: str
    module: Any

    @property
    def dim(self) -> int:
        """The rotary width: how many of a head's channels are rotated."""
        return 2 * int(self.module.inv_freq.numel())

    @property
    def rope_type(self) -> object:
        return getattr(self.module, "rope_type", "default")


def find_rotary(model: Any) -> list[RotarySite]:
    """Every rotary module of ``model``: a module holding an ``inv_freq`` tensor, a ``rope_type`` and the model's
    ``config`` (transformers' rotary-embedding modules)."""
    sites = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if (isinstance(getattr(child, "inv_freq", None), Tensor) and hasattr(child, "rope_type")
                    and hasattr(child, "config")):
                sites.append(RotarySite(parent, name, child))
    return sites


def rotary_refusal(sites: list[RotarySite], kind: str) -> Optional[str]:
    """Why ``kind`` does not apply to a model with these rotary modules, or None."""
    if kind == NONE:
        return None
    if not sites:
        return (f"{kind} rescales rotary frequencies, and this model has no rotary position embedding "
                f"(learned positions or ALiBi)")
    if kind == REROPE:
        return REROPE_REASON
    if any(not isinstance(s.rope_type, str) for s in sites):
        return f"{kind} needs one rope type per rotary module; this model gives its layer types rope parameters each"
    return None


def rope_theta(config: Any) -> float:
    """The model's RoPE base: v5 ``rope_parameters["rope_theta"]``, else a legacy ``rope_theta`` attribute."""
    params = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", getattr(config, "default_theta", 10000.0)))


def _rope_config(config: Any, rope_type: str, factor: float, train_len: int, dim: int,
                 factors: Optional[Sequence[float]]) -> object:
    """A copy of ``config`` whose rope parameters ask transformers for ``rope_type`` from the unscaled base."""
    cfg = copy.deepcopy(config)
    old = dict(getattr(config, "rope_parameters", None) or {})
    params: dict = {"rope_type": rope_type, "rope_theta": rope_theta(config), "factor": float(factor),
                    "original_max_position_embeddings": int(train_len)}
    if "partial_rotary_factor" in old:
        params["partial_rotary_factor"] = old["partial_rotary_factor"]
    if rope_type == "llama3":
        params.update(LLAMA3_BANDS)
    if rope_type == "longrope":
        params["long_factor"] = [float(f) for f in factors]
        params["short_factor"] = [1.0] * (dim // 2)
    cfg.rope_parameters = params
    if hasattr(cfg, "original_max_position_embeddings"):  # Phi-3 keeps it beside the rope parameters, and wins
        cfg.original_max_position_embeddings = int(train_len)
    if rope_type == "dynamic":  # transformers' dynamic NTK reads the original length from here
        cfg.max_position_embeddings = int(train_len)
    return cfg


def scaled_frequencies(site: RotarySite, kind: str, factor: float, train_len: int, seq_len: int,
                       factors: Optional[Sequence[float]] = None) -> tuple[Tensor, float]:
    """The inverse frequencies (float32, the module's device) and q/k multiplier of ``kind`` for a sequence of
    ``seq_len`` positions, at ``site``'s rotary width and the model's base.

    ``none`` gives the module's own frequencies; for a checkpoint published with a per-call rope type (dynamic,
    longrope) those are computed for ``seq_len`` by transformers, as one uncached forward of ``seq_len`` tokens
    would.

    Raises:
        ConfigError: ``eval.longrope_factors`` missing or of the wrong count for this model's rotary width.
    """
    module, device = site.module, site.module.inv_freq.device
    if kind == NONE:
        if site.rope_type in PER_CALL_TYPES:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
            inv, scale = ROPE_INIT_FUNCTIONS[str(site.rope_type)](module.config, device, seq_len=seq_len)
            return inv.float().to(device), float(scale)
        return module.inv_freq, float(getattr(module, "attention_scaling", 1.0))
    if kind in POSEXP_FORMULAS:
        theta, scale = rope_scaling(kind, site.dim, rope_theta(module.config), factor, train_len)
        return theta.float().to(device), scale
    if kind == LONGROPE:  # posexp's check and message for the factors, before transformers broadcasts them
        longrope_frequencies(site.dim, rope_theta(module.config), factors, max(factor, 2.0))
    if kind not in HF_ROPE_TYPES:
        raise ConfigError("eval.scaling", f"{kind} is not a rotary scaling of a pretrained model; choose one of: "
                                          f"{', '.join((NONE, *HF_ROPE_TYPES, *POSEXP_FORMULAS))}")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rope_type = HF_ROPE_TYPES[kind]
    cfg = _rope_config(module.config, rope_type, factor, train_len, site.dim, factors)
    inv, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, device, seq_len=seq_len)
    return inv.float().to(device), float(scale)


def pinned_rotary(site: RotarySite, inv_freq: Tensor, attention_scaling: float) -> Any:
    """A copy of the rotary module that rotates by ``inv_freq`` and multiplies q and k by ``attention_scaling``
    whatever positions it is given; it shares nothing it changes with the original."""
    pinned: Any = module_copy(site.module)
    pinned.register_buffer("inv_freq", inv_freq, persistent=False)
    pinned.attention_scaling = attention_scaling
    pinned.rope_type = "default"  # transformers' dynamic_rope_update then leaves inv_freq alone
    return pinned


__all__ = ["HF_ROPE_TYPES", "POSEXP_FORMULAS", "REROPE_REASON", "RotarySite", "find_rotary", "pinned_rotary",
           "rope_theta", "rotary_refusal", "scaled_frequencies"]
