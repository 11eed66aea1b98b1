"""Positional encodings, one file each, behind one registry.

Use them in your own models::

    from posexp.encoders import create
    enc = create("rope", d_model=256, n_heads=4, base=10000)
    q, k = enc.rotate(q, k, pos, pos)

Adding an encoding is one file here that decorates its class with
``@register("name")`` and one ``configs/encoder/<name>.yaml``; an encoding from
outside the package (a module of the user's project, or an installed package's
entry point) enters the same registry through :mod:`posexp.encoders.plugins`.
The options a user may set are the keyword arguments of the class's ``__init__``
after ``d_model`` and ``n_heads``; their type hints become the config schema.
Every encoder also takes ``lr_mult`` (see :class:`PositionalEncoder`), the
learning-rate multiplier of its own parameters. A built-in name wins over a plugin's.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import typing
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Type

from posexp.encoders import plugins
from posexp.encoders.contract import PositionalEncoder, hook_problem, relative_distance
from posexp.errors import ConfigError
from posexp.registry import Registry, did_you_mean, import_user_module, shadowed

# plugin encoders that cannot be used, by name: why, in one line (the others work as if it were not there)
_BROKEN: Dict[str, str] = {}
# the encoder names each plugin module's import registered, wherever their classes are defined
_BY_MODULE: Dict[str, set] = {}
_NOT_OPTIONS = {"self", "d_model", "n_heads"}
_NOT_ENCODERS = {"base", "frequencies", "plugins"}  # modules of this package that hold no encoder
# found as tasks and trackers are (posexp.registry): the built-ins by importing this package's modules
_REGISTRY: Registry[PositionalEncoder] = Registry("encoder", "encoder", __name__, skip=_NOT_ENCODERS,
                                                  entry_points=False)  # plugins.py reads theirs, with its rules
_loaded = {"entry_points": False}
log = logging.getLogger("posexp.encoders")


def register(name: str) -> Callable[[Type[PositionalEncoder]], Type[PositionalEncoder]]:
    """Class decorator: make an encoder available as ``encoder=<name>`` and ``create(name)``.

    A plugin (a class outside ``posexp/encoders/``) that takes a built-in name is left out, with a warning.

    Raises:
        ConfigError: two plugins register one name.
    """

    def wrap(cls: Type[PositionalEncoder]) -> Type[PositionalEncoder]:
        builtin = plugins.is_builtin(cls)
        if not builtin:
            _REGISTRY.load()  # so that a built-in name is taken before a plugin asks for it
        other = _REGISTRY.registered(name)
        if other is not None and other is not cls:
            if builtin:
                raise RuntimeError(f"two encoders registered as {name!r}")
            if plugins.is_builtin(other):
                log.warning("the plugin encoder %r (%s) is shadowed by posexp's built-in %r, which wins; "
                            "register it under another name", name, plugins.origin(cls), name)
                return cls
            raise ConfigError("encoder", f"two plugins claim the encoder name {name!r}: {plugins.origin(other)} "
                                         f"and {plugins.origin(cls)}; rename one")
        cls.name = name
        problem = None if builtin else schema_problem(cls) or hook_problem(cls)
        if problem is not None:  # listed as broken, with why; the other encoders go on
            _BROKEN[name] = f"{plugins.origin(cls)}: {problem}"
            return cls
        _BROKEN.pop(name, None)
        _REGISTRY.add(name, cls)
        return cls

    return wrap


def registry() -> Dict[str, Type[PositionalEncoder]]:
    """Every registered encoder by name, sorted: the built-ins, the installed plugins (entry points in the
    group ``posexp.encoders``, loaded on the first call) and the plugin modules imported so far."""
    _REGISTRY.load()
    if not _loaded["entry_points"]:
        _loaded["entry_points"] = True
        builtins = [n for n, c in _REGISTRY.items() if plugins.is_builtin(c)]
        for name, cls in plugins.entry_point_classes(builtins, _BROKEN).items():
            try:
                register(name)(cls)
            except ConfigError as e:  # a module plugin took the name first
                _BROKEN[name] = str(e)
    return dict(_REGISTRY)


def broken() -> Dict[str, str]:
    """The plugin encoders that cannot be used, by name, each with why in one line: an installed plugin that
    fails to load, a module whose encoder has no schema, a config folder's yaml (:func:`mark_broken`)."""
    registry()
    return dict(sorted(_BROKEN.items()))


def mark_broken(name: str, reason: str) -> None:
    """Record the plugin encoder ``name`` as unusable, for ``reason`` (one line); a registered one is left out
    of the registry."""
    if name in _REGISTRY and plugins.is_builtin(_REGISTRY[name]):
        return
    _REGISTRY.remove(name)
    _BROKEN[name] = reason


def schema_problem(cls: Type[PositionalEncoder]) -> Optional[str]:
    """Why the options of ``cls.__init__`` make no config schema (an option without a default, a type hint that
    does not resolve); None when they do."""
    try:
        options_schema(cls)
    except Exception as e:  # noqa: BLE001 - the plugin's annotations: say what is wrong with them
        return str(e) if isinstance(e, TypeError) else f"{type(e).__name__}: {e}"
    return None


def load_plugin(name: str, module: str, roots: Sequence[str | Path] = ()) -> Type[PositionalEncoder]:
    """The encoder ``name`` of the user's module ``module``, imported if it was not (``encoder.module``).

    A module that registers no encoder of that name but defines exactly one encoder class has it
    registered as ``name``.

    Args:
        roots: folders to import from besides the working folder (where a run's plugin was trained).

    Raises:
        ConfigError: the module cannot be imported, or holds no encoder to call ``name``.
    """
    registry()
    before = dict(_REGISTRY)
    mod = import_user_module(module, "encoder.module", roots)
    mine = _BY_MODULE.setdefault(module, set())
    mine.update(n for n, c in _REGISTRY.items() if before.get(n) is not c)
    if name in _BROKEN and name not in _REGISTRY:
        raise ConfigError("encoder.module", f"the plugin encoder {name!r} cannot be used: {_BROKEN[name]}")
    cls = _REGISTRY.get(name)
    # registered by this import (now or before), by the module or one of its submodules, or a class it holds
    if cls is not None and (name in mine or cls.__module__ == module or cls.__module__.startswith(module + ".")
                            or any(c is cls for c in vars(mod).values())):
        return cls
    found = plugins.encoder_classes(mod)
    if cls is None or not plugins.is_builtin(cls):
        if len(found) == 1:
            return register(name)(found[0])  # another plugin's name: register says which two claim it
    else:
        raise ConfigError("encoder.module", f"{name!r} is posexp's built-in encoder, which wins over {module}'s; "
                                            f"give your encoder another name")
    why = shadowed(module.split(".")[0], roots)  # a json.py of the user's, the standard json imported
    if why is not None:
        raise ConfigError("encoder.module", why)
    registered = sorted(mine | {n for n, c in _REGISTRY.items() if c.__module__ == module})
    raise ConfigError("encoder.module", f"module {module} registers no encoder {name!r} (it registers: "
                                        f"{', '.join(registered) or 'none'}); decorate its class with "
                                        f"@register({name!r}) from posexp.encoders")


def source_record(name: str) -> Optional[dict]:
    """What a run records of a plugin encoder's code (:func:`posexp.encoders.plugins.source_record`); None for
    a built-in."""
    return plugins.source_record(get(name))


def plugin_sources(encoder: Mapping[str, Any]) -> Dict[str, dict]:
    """The source record of every plugin encoder an ``encoder`` config builds, by registry name: the encoder
    itself, or each distinct layer of a ``mixed`` one; {} when all of them are built-in."""
    names = [str(encoder["name"])]
    if names[0] == "mixed":
        names = list(dict.fromkeys(str(layer) for layer in (encoder.get("layers") or [])))
    return {name: record for name in names if name in registry() and (record := source_record(name)) is not None}


def _parts(encoder: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Each encoder an ``encoder`` config builds, with the options that record its revision: the encoder and its
    config, or each distinct layer of a ``mixed`` one and its ``encoder.options`` entry."""
    name = str(encoder.get("name"))
    if name != "mixed":
        return [(name, encoder)]
    options = encoder.get("options") or {}
    return [(layer, options.get(layer) or {}) for layer in dict.fromkeys(str(n) for n in encoder.get("layers") or [])]


class RevisionGap(typing.NamedTuple):
    """A built-in encoder a run's config builds whose revision (:attr:`PositionalEncoder.revision`) is not this
    posexp's: ``recorded`` by the run (1 where it records none), ``current`` here."""

    name: str
    recorded: Any
    current: int

    def __str__(self) -> str:
        return f"{self.name} revision {self.recorded}, revision {self.current} here"


def revision_gap(encoder: Mapping[str, Any]) -> Optional[RevisionGap]:
    """How a run's ``encoder`` config and this posexp's code differ in the revision of a built-in encoder it
    builds (a run of before the encoder's first revision records none: 1), as ``"fox revision 1, revision 2 here"``
    in text; None when they agree, or for a plugin (its source is checked instead). A ``mixed`` encoder's layers
    record theirs in ``encoder.options`` (:func:`recorded_revisions`)."""
    for name, options in _parts(encoder):
        cls = registry().get(name)
        if cls is None or options.get(plugins.MODULE_KEY) or not plugins.is_builtin(cls):
            continue
        recorded = options.get("revision", 1)
        if recorded != cls.revision:
            return RevisionGap(name, recorded, cls.revision)
    return None


def recorded_revisions(encoder: Mapping[str, Any]) -> dict:
    """``encoder``, a config of a run that trains with this posexp's code (a new one, a fine-tune), recording the
    revision of each built-in encoder it builds whose code was revised, as that encoder alone records it:
    ``encoder.revision``, and for a ``mixed`` encoder ``encoder.options.NAME.revision`` of each such layer, so the
    mix's hash and cache key are not those of a mix of the same layers trained with their earlier code. A config
    building no revised encoder is returned as it was (a mix of rope and none keeps its hash)."""
    out = copy.deepcopy(dict(encoder))
    for name, _ in _parts(out):
        cls = registry().get(name)
        if cls is None or cls.revision == 1 or not plugins.is_builtin(cls) or out.get(plugins.MODULE_KEY):
            continue
        if name == out.get("name"):
            out["revision"] = cls.revision
        else:
            out["options"] = options = dict(out.get("options") or {})
            options[name] = {**(options.get(name) or {}), "revision": cls.revision}
    return out


def origin(name: str) -> str:
    """Where the encoder ``name`` came from: built-in, an installed distribution, or a module's file."""
    return plugins.origin(get(name))


def _option_params(cls: Type[PositionalEncoder]) -> list[inspect.Parameter]:
    sig = inspect.signature(cls.__init__)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for n, p in sig.parameters.items() if n not in _NOT_OPTIONS and p.kind in kinds]


def options_schema(cls: Type[PositionalEncoder]) -> type:
    """A dataclass of the encoder's options (from its ``__init__``), for Hydra's ConfigStore."""
    hints = typing.get_type_hints(cls.__init__)
    fields: list[tuple[str, Any, Any]] = [("name", str, dataclasses.field(default=cls.name))]
    if not plugins.is_builtin(cls):  # the module to import it from, recorded in every run's config
        fields.append((plugins.MODULE_KEY, str, dataclasses.field(default=cls.__module__)))
    for p in _option_params(cls):
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"{cls.__name__}.__init__: option {p.name!r} needs a default (and a type hint): its "
                            f"value when a config sets none, e.g. {p.name}: float = 1.0")
        default = p.default
        if isinstance(default, (list, dict)):
            field = dataclasses.field(default_factory=lambda d=default: type(d)(d))
        else:
            field = dataclasses.field(default=default)
        fields.append((p.name, hints.get(p.name, Any), field))
    fields.append(("lr_mult", float, dataclasses.field(default=float(cls.lr_mult))))
    if cls.revision > 1:  # recorded by every new run of a revised encoder, absent from the runs of before
        fields.append(("revision", int, dataclasses.field(default=int(cls.revision))))
    return dataclasses.make_dataclass(f"{cls.__name__}Options", fields)


def option_names(name: str) -> list[str]:
    """The encoder's own options (its ``__init__`` keywords), without the common ``lr_mult``."""
    return [p.name for p in _option_params(get(name))]


def get(name: str) -> Type[PositionalEncoder]:
    """The class of the encoder ``name``.

    Raises:
        ConfigError: no such encoder, naming the close ones and how to add one's own.
    """
    reg = registry()
    if name not in reg and name in _BROKEN:
        raise ConfigError("encoder", f"the plugin encoder {name!r} cannot be used: {_BROKEN[name]}")
    if name not in reg:
        raise ConfigError("encoder", f"{_REGISTRY.unknown(name)}; {plugins.HOW_TO}")
    return reg[name]


def create(name: str, d_model: int, n_heads: int, **options: Any) -> PositionalEncoder:
    """Build the encoder ``name`` for a model of width ``d_model`` with ``n_heads`` heads.

    Args:
        name: a registered encoder (``posexp list`` shows them).
        d_model: model width.
        n_heads: attention heads.
        **options: the encoder's options, as in ``configs/encoder/<name>.yaml``; ``module``: the user's
            module that defines a plugin encoder, imported first.

    Raises:
        ConfigError: unknown name, unknown option, or a value out of range.
    """
    module = options.pop(plugins.MODULE_KEY, None)
    cls = load_plugin(name, module) if module else get(name)
    allowed = option_names(name)
    lr_mult = options.pop("lr_mult", None)
    revision = options.pop("revision", cls.revision)  # a run of before the encoder's revisions has none
    if revision != cls.revision:
        raise ConfigError("encoder.revision", f"is the revision of {name}'s code, {cls.revision} in this posexp, "
                                              f"not an option (got {revision!r})")
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        hint = did_you_mean(unknown[0], allowed + ["lr_mult"], "encoder.")
        raise ConfigError(
            f"encoder.{unknown[0]}",
            f"not an option of encoder {name!r}; {hint}its options are: {', '.join(allowed + ['lr_mult'])}",
        )
    encoder = cls(d_model=d_model, n_heads=n_heads, **options)
    if lr_mult is not None:
        if not (isinstance(lr_mult, (int, float)) and not isinstance(lr_mult, bool) and lr_mult > 0):
            raise ConfigError("encoder.lr_mult", f"must be a number > 0, the factor on train.lr for the "
                                                 f"encoder's own parameters (got {lr_mult!r})")
        encoder.lr_mult = float(lr_mult)
    return encoder


__all__ = ["PositionalEncoder", "broken", "create", "get", "load_plugin", "mark_broken", "options_schema", "origin",
           "recorded_revisions", "register", "registry", "relative_distance", "revision_gap", "source_record"]
