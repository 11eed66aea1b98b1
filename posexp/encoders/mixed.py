"""A different positional encoding in each layer.

Nothing forces every layer of a Transformer to see positions the same way.
Meta's Llama 4 (2025, "iRoPE") interleaves attention layers without any
positional encoding among RoPE layers, one in four, so that some layers attend
by content alone at any distance; Kazemnejad et al. 2023 show that a causal
model can learn positions with no encoding at all (NoPE). ``encoder=mixed``
builds such models from the registered encodings::

    posexp train encoder=mixed encoder.layers=[rope,rope,rope,none] model.n_layers=8   # NoPE every fourth layer
    posexp train encoder=mixed encoder.layers=[alibi,rope] model.n_layers=6
    posexp train encoder=mixed encoder.layers=[rope,none] encoder.options={rope:{rotary_fraction:0.5}}

Layer ``i`` uses ``layers[i mod len(layers)]``: the list is a pattern repeated
over the depth, and every layer gets its own module (its own parameters, if the
encoding has any).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence

from torch import nn

from posexp.encoders import create, option_names, register, registry
from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.scaling import module_copy, supported_scalings
from posexp.errors import ConfigError, require

ATTENTION_HOOKS = ("rotate", "bias", "scores")
RUN_KEYS = ("base", "train_len")  # the mix's own options, passed on to each layer's options of the same name


def record_run_options(encoder: Mapping[str, Any], run_options: Callable[[str], Mapping[str, Any]]) -> dict:
    """A new ``mixed`` encoder's config recording, for each layer, the options ``encoder=NAME`` alone takes from the
    run (``run_options(NAME)``, its yaml's: cope's ``npos_max: ${train_len}``) beyond the :data:`RUN_KEYS` the mix
    passes on itself, which the layer would otherwise get at its class's default: each layer is built as the
    encoder alone is. Options given in ``encoder.options`` stay, and a value equal to the class's default is left
    out: a mix of before, without them, builds as it did and keeps its hash where it built the same. Another
    encoder's config is returned as it is."""
    out = copy.deepcopy(dict(encoder))
    if out.get("name") != "mixed":
        return out
    for name in dict.fromkeys(str(n) for n in out.get("layers") or []):
        defaults = inspect.signature(registry()[name].__init__).parameters
        taken = {k: v for k, v in run_options(name).items()
                 if k not in RUN_KEYS and not (k in defaults and defaults[k].default == v)}
        given = (out.get("options") or {}).get(name) or {}
        if set(taken) - set(given):
            out["options"] = {**(out.get("options") or {}), name: {**taken, **given}}
    return out


def _acts_in_attention(enc: PositionalEncoder) -> bool:
    return enc.uses_rotate or enc.uses_bias or enc.uses_scores


def _mixable() -> list[str]:
    """Registered encodings that act inside attention (or not at all), so can be one layer's encoding."""
    return [name for name, cls in registry().items()
            if not issubclass(cls, Mixed) and cls.embed is PositionalEncoder.embed]


@register("mixed")
class Mixed(PositionalEncoder):
    """One positional encoding per layer, repeating a pattern of registered encodings.

    Only encodings that act inside attention (``rotate``, ``bias``, ``scores``, and the
    content hooks ``transform`` and ``normalise``) or not at all (``none``) can be mixed: an ``embed`` encoding (sinusoidal, learned,
    integer, ...) adds its vectors to the token embeddings once, before the first
    layer, so it has no per-layer form, and a mix refuses it.

    Args:
        d_model: model width.
        n_heads: attention heads.
        layers: the encodings by name, layer ``i`` using ``layers[i mod len(layers)]``;
            at most ``model.n_layers`` names. Default ``[rope, none]``: RoPE and NoPE
            alternating.
        base: passed to every encoding in the mix that has a ``base``.
        train_len: the training length in tokens, passed to every encoding in the mix that has a ``train_len``
            (hope, fope: the frequencies completing a period in it); the yaml sets it to the run's ``train_len``.
        options: further options per encoding name, e.g. ``{rope: {rotary_fraction: 0.5}}``;
            they apply to every layer using that encoding. None = each encoding's defaults. A new run records
            here what each layer's encoding alone would record from the run: its code revision
            (``fox: {revision: 2}``) and the options its own yaml takes from the run (``cope: {npos_max: 128}``).

    Raises:
        ConfigError: an empty list, an unknown or embed-type name, ``mixed`` inside a
            mix, options for an encoding the list does not use, or a bad option of one.
    """

    description = "Mixed: a different attention-side encoding per layer, e.g. RoPE with NoPE in every fourth layer"
    # offered when every position-dependent layer offers it (checked per configuration in scaling_refusal)
    supported_scalings = ("linear", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope", "rerope")

    def __init__(self, d_model: int, n_heads: int, layers: List[str] = ["rope", "none"],  # noqa: B006 (never mutated)
                 base: float = 10000.0, options: Any = None, train_len: int = 128):
        super().__init__(d_model, n_heads)
        names = [str(n) for n in layers]
        mixable = _mixable()
        require(len(names) > 0, "encoder.layers",
                f"must name at least one encoding, e.g. encoder.layers=[rope,rope,rope,none]; "
                f"choose from: {', '.join(mixable)}")
        for name in names:
            require(name in registry(), "encoder.layers",
                    f"unknown encoder {name!r}; choose from: {', '.join(mixable)}")
            # a mix inside a mix (mixed, irope) would lay out layers the model never asks it for
            require(not issubclass(registry()[name], Mixed), "encoder.layers",
                    f"a mix cannot contain {name!r}; choose from: {', '.join(mixable)}")
        options = {} if options is None else options
        require(isinstance(options, Mapping) and all(v is None or isinstance(v, Mapping) for v in options.values()),
                "encoder.options", f"must map encoding names to their options, e.g. "
                                   f"encoder.options={{rope:{{rotary_fraction:0.5}}}} (got {options!r})")
        options = {str(k): dict(v or {}) for k, v in options.items()}
        unused = sorted(set(options) - set(names))
        require(not unused, "encoder.options",
                f"has options for {', '.join(unused)}, which encoder.layers does not use (it uses: "
                f"{', '.join(dict.fromkeys(names))})")
        self.pattern = names
        self._base = float(base)
        self._train_len = int(train_len)
        self._options = options
        self.per_layer = nn.ModuleList(self._build(name) for name in names)

    def _build(self, name: str) -> PositionalEncoder:
        run = dict(zip(RUN_KEYS, (self._base, self._train_len)))  # what each encoding's own yaml takes from the run
        opts: Dict[str, Any] = {k: v for k, v in run.items() if k in option_names(name)}
        opts.update(self._options.get(name, {}))
        try:
            enc = create(name, d_model=self.d_model, n_heads=self.n_heads, **opts)
        except ConfigError as e:
            # name the option where the user wrote it: encoder.options.<name>.<option>
            key = e.key
            if key.startswith("encoder."):
                key = f"encoder.options.{name}.{key[len('encoder.'):]}"
            message = str(e)[len(e.key) + 2:]
            raise ConfigError(key, f"{message} (in the mix, for {name!r})") from None
        require(not enc.uses_embed, "encoder.layers",
                f"{name!r} adds its vectors to the token embeddings once, at the input, so it has no per-layer "
                f"form and cannot be one layer's encoding; a mix takes encodings that act inside attention: "
                f"{', '.join(_mixable())} (for {name} in the whole model use encoder={name})")
        return enc

    @property
    def base(self) -> float:
        return self._base

    def for_layers(self, n_layers: int) -> list[PositionalEncoder]:
        require(len(self.pattern) <= n_layers, "encoder.layers",
                f"names {len(self.pattern)} encodings but model.n_layers={n_layers}; give at most one per layer "
                f"(a shorter list repeats over the depth)")
        while len(self.per_layer) < n_layers:
            self.per_layer.append(self._build(self.pattern[len(self.per_layer) % len(self.pattern)]))
        require(len(self.per_layer) == n_layers, "model.n_layers",
                f"this mixed encoder was built for {len(self.per_layer)} layers, not {n_layers}")
        return list(self.per_layer)

    @property
    def label(self) -> str:
        return f"mixed[{','.join(e.label for e in self.per_layer)}]"

    # a mix uses a hook when one of its layers does (the evaluator asks, e.g. to shrink query blocks)
    @property
    def uses_rotate(self) -> bool:
        return any(e.uses_rotate for e in self.per_layer)

    @property
    def uses_bias(self) -> bool:
        return any(e.uses_bias for e in self.per_layer)

    @property
    def uses_scores(self) -> bool:
        return any(e.uses_scores for e in self.per_layer)

    @property
    def uses_attend(self) -> bool:  # a rope layer read through a position remapping (rerope)
        return any(e.uses_attend for e in self.per_layer)

    @property
    def uses_transform(self) -> bool:
        return any(e.uses_transform for e in self.per_layer)

    @property
    def uses_normalise(self) -> bool:
        return any(e.uses_normalise for e in self.per_layer)

    def supports(self, length: int) -> bool:
        return all(e.supports(length) for e in self.per_layer)

    @property
    def relative(self) -> bool:  # type: ignore[override]
        """Relative when every layer's encoding is."""
        return all(e.relative for e in self.per_layer)

    @property
    def context_parallel(self) -> bool:  # type: ignore[override]
        """A shard computes the mix alone when it computes every layer's encoding alone."""
        return all(e.context_parallel for e in self.per_layer)

    def scaling_refusal(self, kind: str) -> Optional[str]:
        """A scaling applies to a mix when every layer that depends on position offers it."""
        for i, enc in enumerate(self.per_layer):
            if not _acts_in_attention(enc):
                continue  # no position index (none, or content alone: fox, path, stickbreaking): nothing to scale
            offered = supported_scalings(enc)
            if kind not in offered:
                return (f"{kind!r} does not apply to layer {i} of the mix ({enc.name}, which offers "
                        f"{', '.join(offered) or 'none'}); every layer that uses positions must offer it")
            reason = getattr(enc, "scaling_refusal", lambda k: None)(kind)
            if reason is not None:
                return f"layer {i} of the mix: {reason}"
        return None

    def with_scaling(self, kind: str, factor: float, train_len: int,
                     factors: Optional[Sequence[float]] = None, start: int = 0) -> "Mixed":
        """A copy whose position-dependent layers are scaled copies (each with its own ``with_scaling``;
        ``factors`` and ``start``, LongRoPE's, passed on to each)."""
        reason = self.scaling_refusal(kind)
        if reason is not None:
            raise ConfigError("eval.scaling", reason)
        clone = module_copy(self)
        extra: dict = {} if factors is None else {"factors": factors}
        if start:
            extra["start"] = start
        clone.per_layer = nn.ModuleList(e.with_scaling(kind, factor, train_len, **extra) if _acts_in_attention(e)
                                        else e for e in self.per_layer)
        return clone

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, layers={[e.label for e in self.per_layer]}"
