"""Positional encodings, one file each, behind one registry.

Use them in your own models::

    from posexp.encoders import create
    enc = create("rope", d_model=256, n_heads=4, base=10000)
    q, k = enc.rotate(q, k, pos, pos)

Adding an encoding is one file here that decorates its class with
``@register("name")`` and one ``configs/encoder/<name>.yaml``. The options a
user may set are the keyword arguments of the class's ``__init__`` after
``d_model`` and ``n_heads``; their type hints become the config schema.
Every encoder also takes ``lr_mult`` (see :class:`PositionalEncoder`), the
learning-rate multiplier of its own parameters.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing
from typing import Any, Callable, Dict, Type

from posexp.encoders.contract import PositionalEncoder, relative_distance
from posexp.errors import ConfigError

_REGISTRY: Dict[str, Type[PositionalEncoder]] = {}
_NOT_OPTIONS = {"self", "d_model", "n_heads"}
_NOT_ENCODERS = {"base", "frequencies"}  # modules of this package that hold no encoder


def register(name: str) -> Callable[[Type[PositionalEncoder]], Type[PositionalEncoder]]:
    """Class decorator: make an encoder available as ``encoder=<name>`` and ``create(name)``."""

    def wrap(cls: Type[PositionalEncoder]) -> Type[PositionalEncoder]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise RuntimeError(f"two encoders registered as {name!r}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name not in _NOT_ENCODERS:
            importlib.import_module(f"{__name__}.{info.name}")


def registry() -> Dict[str, Type[PositionalEncoder]]:
    """Every registered encoder by name, sorted."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def _option_params(cls: Type[PositionalEncoder]) -> list[inspect.Parameter]:
    sig = inspect.signature(cls.__init__)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for n, p in sig.parameters.items() if n not in _NOT_OPTIONS and p.kind in kinds]


def options_schema(cls: Type[PositionalEncoder]) -> type:
    """A dataclass of the encoder's options (from its ``__init__``), for Hydra's ConfigStore."""
    hints = typing.get_type_hints(cls.__init__)
    fields: list[tuple[str, Any, Any]] = [("name", str, dataclasses.field(default=cls.name))]
    for p in _option_params(cls):
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"{cls.__name__}.__init__: option {p.name!r} needs a default")
        default = p.default
        if isinstance(default, (list, dict)):
            field = dataclasses.field(default_factory=lambda d=default: type(d)(d))
        else:
            field = dataclasses.field(default=default)
        fields.append((p.name, hints.get(p.name, Any), field))
    fields.append(("lr_mult", float, dataclasses.field(default=float(cls.lr_mult))))
    return dataclasses.make_dataclass(f"{cls.__name__}Options", fields)


def option_names(name: str) -> list[str]:
    """The encoder's own options (its ``__init__`` keywords), without the common ``lr_mult``."""
    return [p.name for p in _option_params(get(name))]


def get(name: str) -> Type[PositionalEncoder]:
    reg = registry()
    if name not in reg:
        raise ConfigError("encoder", f"unknown encoder {name!r}; choose one of: {', '.join(reg)}")
    return reg[name]


def create(name: str, d_model: int, n_heads: int, **options: Any) -> PositionalEncoder:
    """Build the encoder ``name`` for a model of width ``d_model`` with ``n_heads`` heads.

    Args:
        name: a registered encoder (``posexp list`` shows them).
        d_model: model width.
        n_heads: attention heads.
        **options: the encoder's options, as in ``configs/encoder/<name>.yaml``.

    Raises:
        ConfigError: unknown name, unknown option, or a value out of range.
    """
    cls = get(name)
    allowed = option_names(name)
    lr_mult = options.pop("lr_mult", None)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"encoder.{unknown[0]}",
            f"not an option of encoder {name!r}; its options are: {', '.join(allowed + ['lr_mult'])}",
        )
    encoder = cls(d_model=d_model, n_heads=n_heads, **options)
    if lr_mult is not None:
        if not (isinstance(lr_mult, (int, float)) and not isinstance(lr_mult, bool) and lr_mult > 0):
            raise ConfigError("encoder.lr_mult", f"must be a number > 0, the factor on train.lr for the "
                                                 f"encoder's own parameters (got {lr_mult!r})")
        encoder.lr_mult = float(lr_mult)
    return encoder


__all__ = ["PositionalEncoder", "create", "get", "options_schema", "register", "registry", "relative_distance"]
