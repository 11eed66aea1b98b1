"""Names to classes: how posexp finds an encoder, a task or a tracker by the name a config gives it.

One idea for every kind: a class says its name with ``@REGISTRY.register("name")`` in a module of its own, in
the package that holds its kind; the registry imports that package's modules the first time it is asked for a
name, so adding one is adding a file. A class from outside posexp registers the same way in the user's own module,
which a config names in its ``module`` key (:meth:`Registry.from_module`). An unknown name is a :class:`~posexp.errors.ConfigError` on the config key,
naming the closest name and every allowed one, never a default in its place.

A leaf besides :mod:`posexp.errors`: every layer may import it.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import sys
from collections.abc import Iterator, Mapping
from typing import Callable, Generic, Iterable, Optional, TypeVar

from posexp.errors import ConfigError, PosexpError

T = TypeVar("T")
MODULE_KEY = "module"  # the config key naming the user's module a class of theirs registers in


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """``did you mean PREFIXclosest? `` (with its trailing space) for the choice closest to ``word``; "" for none
    close enough: the hint every error about an unknown name or key gives."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {prefix}{close[0]}? " if close else ""


class Registry(Mapping[str, type[T]], Generic[T]):
    """The classes of one kind by name, sorted; a read-only mapping that loads its package on first use.

    Args:
        kind: what a name names, in the user's words (``encoder``, ``task``, ``tracker``).
        key: the config key that takes the name, for errors (``encoder``, ``task``, ``logger``).
        package: the package whose modules register the classes.
        skip: modules of ``package`` that register nothing (helpers, the base class).
    """

    def __init__(self, kind: str, key: str, package: str, skip: Iterable[str] = ()):
        self.kind, self.key, self.package, self.skip = kind, key, package, frozenset(skip)
        self._classes: dict[str, type[T]] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: the class becomes ``name`` (its ``name`` attribute is set too).

        Raises:
            RuntimeError: two classes of the package take one name.
        """

        def wrap(cls: type[T]) -> type[T]:
            other = self._classes.get(name)
            if other is not None and other is not cls:
                raise RuntimeError(f"two {self.kind}s registered as {name!r}: {other.__qualname__} and "
                                   f"{cls.__qualname__}")
            setattr(cls, "name", name)
            self.add(name, cls)
            return cls

        return wrap

    def registered(self, name: str) -> Optional[type[T]]:
        """The class registered as ``name`` so far, without importing the package: what a module being imported may
        ask (a full :meth:`load` from inside one would import its siblings while it is half-initialised)."""
        return self._classes.get(name)

    def add(self, name: str, cls: type[T]) -> None:
        """Store ``cls`` as ``name`` as it is (for a kind whose own rules decide, as the encoders' plugins)."""
        self._classes[name] = cls

    def remove(self, name: str) -> None:
        self._classes.pop(name, None)

    def reset_to(self, classes: Mapping[str, type[T]]) -> None:
        """Hold exactly ``classes`` (a ``dict(registry)`` saved earlier): a test that registered its own puts the
        registry back."""
        self._classes = dict(classes)

    def load(self) -> None:
        """Import every module of the package once, so that each registers its classes."""
        if self._loaded:
            return
        self._loaded = True  # first: a module being imported asks the registry about its own name
        for info in pkgutil.iter_modules(importlib.import_module(self.package).__path__):
            if not info.name.startswith("_") and info.name not in self.skip:
                importlib.import_module(f"{self.package}.{info.name}")

    def from_module(self, name: str, module: str, roots: Iterable[str] = ()) -> type[T]:
        """The class ``name`` of the user's module ``module`` (a config's ``module`` key), imported with the working
        folder (then ``roots``) on ``sys.path``, as ``python -m`` has it; the module registers its class as posexp's
        own modules do.

        Raises:
            ConfigError: on ``KEY.module``: the module cannot be imported, or registers no ``name``.
        """
        key = f"{self.key}.{MODULE_KEY}"
        for folder in (os.getcwd(), *roots):
            if folder not in sys.path:
                sys.path.append(folder)  # after the installed packages: a user's copy.py shadows nothing
        self.load()  # posexp's own first: a module that takes a built-in name is told so
        try:
            importlib.import_module(module)
        except PosexpError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: say which module and what it raised
            raise ConfigError(key, f"importing {module} failed: {type(e).__name__}: {e}".splitlines()[0]) from None
        cls = self._classes.get(name)
        if cls is None or not (cls.__module__ == module or cls.__module__.startswith(module + ".")):
            raise ConfigError(key, f"module {module} registers no {self.kind} {name!r}; decorate its class with "
                                   f"@{self.kind.upper()}S.register({name!r}) (from {self.package})")
        return cls

    def lookup(self, name: str, also: Iterable[str] = ()) -> type[T]:
        """The class registered as ``name``.

        Raises:
            ConfigError: on :attr:`key`: no such name (:meth:`unknown`).
        """
        if name not in self:
            raise ConfigError(self.key, self.unknown(name, also))
        return self[name]

    def unknown(self, name: str, also: Iterable[str] = ()) -> str:
        """``unknown task 'copi'; did you mean copy? choose one of: lm, addition, copy, ...``: ``also`` are values
        the key takes besides the registered names (``task=lm``), listed first."""
        allowed = [*also, *self]
        return f"unknown {self.kind} {name!r}; {did_you_mean(name, allowed)}choose one of: {', '.join(allowed)}"

    def __getitem__(self, name: str) -> type[T]:
        self.load()
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        self.load()
        return len(self._classes)
