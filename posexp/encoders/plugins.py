"""Encodings from outside the package: a module the user's config names, or an installed package's entry point.

Two ways in, both ending in the one registry of :mod:`posexp.encoders`:

- a module of the user's own project (``my_encoders/logrope.py``), named by the encoder's yaml in the
  user's config folder (``conf/encoder/logrope.yaml`` holding ``module: my_encoders.logrope``). It is
  imported with the folder posexp was started in on ``sys.path``, as ``python -m`` has it;
- an installed distribution that declares an entry point in the group ``posexp.encoders``
  (``logrope = "my_encoders.logrope:LogRoPE"``), the convention of pytest and Hydra plugins. Entry points
  are read from the installed metadata when the registry is first asked for, never at import time.

:func:`source_record` is what a run keeps of a plugin's code (module, file, distribution and version,
SHA-256 of the file), so that a cached training or an evaluation notices when the code changed.

Imports nothing of posexp but the encoder contract and the registry.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import types
import logging
from typing import Dict, List, Optional, Sequence, Type

from posexp.encoders.contract import PositionalEncoder
from posexp.registry import code_record, source_file

ENTRY_POINT_GROUP = "posexp.encoders"
# how a user names the module of an encoder of their own, in the encoder's yaml
MODULE_KEY = "module"
HOW_TO = ("an encoder of your own: put NAME.yaml with `module: PACKAGE.MODULE` in CONF/encoder/ and pass "
          "--config-dir CONF (or hydra.searchpath=[file://CONF]), or install a package with a "
          f"'{ENTRY_POINT_GROUP}' entry point (see scripts/plugin_example)")

log = logging.getLogger("posexp.encoders")
# the distribution (name, version) each entry-point class came from
_DISTRIBUTIONS: Dict[type, tuple] = {}


def is_builtin(cls: type) -> bool:
    """A class of posexp's own ``posexp/encoders/`` (not a plugin)."""
    return cls.__module__.startswith("posexp.encoders.")


def encoder_classes(module: types.ModuleType) -> List[Type[PositionalEncoder]]:
    """The :class:`PositionalEncoder` subclasses ``module`` defines itself (not those it imports)."""
    return [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, PositionalEncoder)
            and c.__module__ == module.__name__]


def _claimants(eps: Sequence[importlib.metadata.EntryPoint]) -> str:
    return " and ".join(f"{ep.value} ({_dist(ep)[0]})" for ep in eps)


def _dist(ep: importlib.metadata.EntryPoint) -> tuple:
    dist = getattr(ep, "dist", None)
    return (dist.metadata["Name"], dist.version) if dist is not None else ("unknown distribution", None)


def entry_points() -> Dict[str, List[importlib.metadata.EntryPoint]]:
    """The ``posexp.encoders`` entry points of the installed distributions, by name (one each, unless two
    distributions claim one name); the same distribution found twice on ``sys.path`` counts once."""
    found: Dict[str, List[importlib.metadata.EntryPoint]] = {}
    # every distribution's own entry points: importlib.metadata.entry_points() keeps one per name
    eps = [ep for dist in importlib.metadata.distributions() for ep in dist.entry_points
           if ep.group == ENTRY_POINT_GROUP]
    for ep in eps:
        same = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same):
            same.append(ep)
    return found


def entry_point_classes(builtins: Sequence[str], broken: Dict[str, str]) -> Dict[str, Type[PositionalEncoder]]:
    """Load the installed plugins' classes, by entry-point name; a name of ``builtins`` is skipped (the
    built-in wins), with a warning. One that cannot be used (two distributions claim its name, it fails to
    load, it is no encoder) goes to ``broken`` with why, in one line; the others load as if it were not there.
    """
    out = {}
    for name, eps in sorted(entry_points().items()):
        if name in builtins:
            log.warning("the installed plugin encoder %r (%s) is shadowed by posexp's built-in %r, which wins; "
                        "rename its entry point", name, _claimants(eps), name)
            continue
        if len(eps) > 1:
            broken[name] = (f"two installed plugins claim the encoder name {name!r}: {_claimants(eps)}; uninstall "
                            "one or rename its entry point")
            continue
        ep = eps[0]
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - the plugin's code: name it and what it raised
            broken[name] = (f"the installed plugin encoder {name!r} ({_claimants(eps)}) cannot be loaded: "
                            f"{type(e).__name__}: {e}".splitlines()[0])
            continue
        if not (inspect.isclass(cls) and issubclass(cls, PositionalEncoder)):
            broken[name] = f"the installed plugin encoder {name!r} ({ep.value}) is not a PositionalEncoder subclass"
            continue
        _DISTRIBUTIONS[cls] = _dist(ep)
        out[name] = cls
    return out


def from_distribution(cls: type) -> bool:
    """An installed plugin's class (found through its entry point)."""
    return cls in _DISTRIBUTIONS


def source_record(cls: type) -> Optional[dict]:
    """What a run records of a plugin's code; None for a built-in (posexp's version and commit say it).

    Returns:
        what a run records of any class of the user's (:func:`posexp.registry.code_record`: module, class, file,
        SHA-256), and for a plugin from an installed distribution its ``distribution`` and ``version``.
    """
    if is_builtin(cls):
        return None
    record = code_record(cls)
    if cls in _DISTRIBUTIONS:
        record["distribution"], record["version"] = _DISTRIBUTIONS[cls]
    return record


def origin(cls: type) -> str:
    """Where an encoder came from, for ``posexp list``: built-in, a distribution, or a module's file."""
    if is_builtin(cls):
        return "built-in"
    if cls in _DISTRIBUTIONS:
        dist, version = _DISTRIBUTIONS[cls]
        return f"{dist} {version} (entry point {cls.__module__}:{cls.__qualname__})"
    path = source_file(cls)
    return f"{cls.__module__} ({path})" if path else cls.__module__
