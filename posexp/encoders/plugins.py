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

Imports nothing of posexp but the encoder contract and the errors.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import types
import logging
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Type

from posexp.encoders.contract import PositionalEncoder

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


def source_file(cls: type) -> Optional[Path]:
    """The file that defines ``cls``; None where there is none (a class made at run time)."""
    try:
        return Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        return None


def file_sha256(path: Optional[Path]) -> Optional[str]:
    """SHA-256 of a file's bytes; None if it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None
    except OSError:
        return None


def package_sha256(cls: type) -> Optional[str]:
    """SHA-256 over every ``.py`` file of the top-level package ``cls``'s module belongs to (``my_encoders/`` for
    ``my_encoders.logrope``): the helper modules the encoder imports change its training as much as its own
    file does. None for a module outside any package (its own file's SHA-256 is all there is to go by)."""
    top = cls.__module__.split(".")[0]
    package = sys.modules.get(top)
    folders = [Path(p) for p in getattr(package, "__path__", None) or []] if top != cls.__module__ else []
    if not folders:
        return None
    digest = hashlib.sha256()
    for folder in folders:
        for file in sorted(f for f in folder.rglob("*.py") if "__pycache__" not in f.parts):
            digest.update(f"{file.relative_to(folder)}\0{file_sha256(file) or 'unreadable'}\n".encode())
    return digest.hexdigest()


def source_record(cls: type) -> Optional[dict]:
    """What a run records of a plugin's code; None for a built-in (posexp's version and commit say it).

    Returns:
        ``module``, ``class``, ``file`` (absolute), ``sha256`` of that file, ``package_sha256`` of its package's
        files (:func:`package_sha256`, where it is in one), and for a plugin from an installed distribution its
        ``distribution`` and ``version``.
    """
    if is_builtin(cls):
        return None
    path = source_file(cls)
    record = {"module": cls.__module__, "class": cls.__qualname__, "file": str(path) if path else None,
              "sha256": file_sha256(path)}
    package = package_sha256(cls)
    if package is not None:
        record["package_sha256"] = package
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
