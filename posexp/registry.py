"""Names to classes: how posexp finds an encoder, a task, a tracker or an exporter by its name.

One idea for every kind: a class says its name with ``@REGISTRY.register("name")`` in a module of its own, in
the package that holds its kind; the registry imports that package's modules the first time it is asked for a
name, so adding one is adding a file. A class from outside posexp registers the same way in the user's own module,
which a config names in its ``module`` key (:meth:`Registry.from_module`), or comes from an installed package's
entry point in the group ``posexp.KINDs`` (``posexp.tasks``, ``posexp.trackers``, ``posexp.exporters``), read when
the registry is first asked for a name. A built-in name wins over a plugin's. An unknown name is a
:class:`~posexp.errors.ConfigError` on the config key, naming the closest name and every allowed one, never a
default in its place. A component's options are the keyword arguments of its constructor (:func:`options_dataclass`).

A leaf besides :mod:`posexp.errors`: every layer may import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.metadata
import inspect
import logging
import os
import pkgutil
import sys
import traceback
import typing
from pathlib import Path
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Generic, Iterable, Optional, Sequence, TypeVar

from posexp.errors import ConfigError, PosexpError

T = TypeVar("T")
K = TypeVar("K")
MODULE_KEY = "module"  # the config key naming the user's module a class of theirs registers in
log = logging.getLogger("posexp.registry")


def init_raised(cls: type, arguments: Mapping[str, Any], error: Exception) -> str:
    """One line saying what a component's own ``__init__`` raised, called with ``arguments``: what ``posexp check``
    reports and ``posexp train`` stops with, for a plugin's code (a built-in's is posexp's: its traceback)."""
    given = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return f"{cls.__qualname__}({given}) raised {type(error).__name__}: {error}"


def construct(build: Callable[[], T], plugin: Callable[[], Optional[type]], arguments: Mapping[str, Any],
              key: str) -> T:
    """``build()``, which calls a component's ``__init__`` with ``arguments``: what a plugin's own code raises there
    is one :class:`ConfigError` on ``key`` (``encoder=NAME``, :func:`init_raised`); posexp's own refusals, and a
    built-in's errors (posexp's code: its traceback), pass through. ``plugin()``: the class when it is a plugin's,
    else None, asked only after an error (a plugin's class is known once ``build`` has imported its module)."""
    try:
        return build()
    except PosexpError:
        raise
    except Exception as e:
        cls = plugin()
        if cls is None:
            raise
        raise ConfigError(key, init_raised(cls, arguments, e)) from None


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """``did you mean PREFIXclosest? `` (with its trailing space) for the choice closest to ``word``; "" for none
    close enough: the hint every error about an unknown name or key gives."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {prefix}{close[0]}? " if close else ""


def option_params(func: Callable, skip: Iterable[str] = ()) -> list[inspect.Parameter]:
    """The options a component declares: the keyword arguments of ``func`` (its ``__init__``, or a tracker's
    ``start``) but ``self``/``cls`` and ``skip``, in their order."""
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    left_out = {"self", "cls", *skip}
    return [p for n, p in inspect.signature(func).parameters.items() if n not in left_out and p.kind in kinds]


def options_dataclass(name: str, func: Callable, skip: Iterable[str] = (),
                      first: Sequence[tuple[str, Any, Any]] = (), bases: tuple[type, ...] = ()) -> type:
    """A dataclass of ``first`` (name, type, default) then :func:`option_params` of ``func``, each typed by its hint
    and defaulting to its default: a component's config schema, for Hydra's ConfigStore, as an encoder's is.

    Raises:
        TypeError: an option without a default.
    """
    hints = typing.get_type_hints(func)
    fields: list[tuple[str, Any, Any]] = [(n, t, dataclasses.field(default=d)) for n, t, d in first]
    for p in option_params(func, skip):
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"{func.__qualname__}: option {p.name!r} needs a default (and a type hint): its value when "
                            f"a config sets none, e.g. {p.name}: int = 3")
        default: Any = p.default
        if isinstance(default, (list, dict)):
            fields.append((p.name, hints.get(p.name, Any), dataclasses.field(default_factory=default.copy)))
        else:
            fields.append((p.name, hints.get(p.name, Any), dataclasses.field(default=default)))
    return dataclasses.make_dataclass(name, fields, bases=bases)


def import_user_module(module: str, key: str, roots: Iterable[str | os.PathLike] = ()) -> object:
    """Import the user's module ``module`` (an encoder's, task's or tracker's, named by ``key``: ``task.module``),
    with the working folder (then ``roots``) on ``sys.path``.

    Raises:
        ConfigError: (``key``) the module cannot be found or fails while importing, with what to do.
    """
    roots = list(roots)
    for folder in (os.getcwd(), *map(str, roots)):
        if folder not in sys.path:
            sys.path.append(folder)  # after the installed packages: a user's copy.py shadows nothing
    try:
        return importlib.import_module(module)
    except PosexpError:
        raise  # the registry's own word on what the module registered
    except ModuleNotFoundError as e:
        if e.name is None or not module.startswith(e.name):
            raise ConfigError(key, f"importing {module} failed: {e}") from None
        top = module.split(".")[0]
        why = shadowed(top, roots)
        if why is not None:
            raise ConfigError(key, why) from None
        if e.name != top:  # the package is here, the module's file is not
            package, _, missing = e.name.rpartition(".")
            raise ConfigError(key, f"no module {e.name!r}: the package {package} has no {missing}.py "
                                   f"(nor {missing}/)") from None
        where = ", ".join(dict.fromkeys([os.getcwd(), *map(str, roots)]))
        raise ConfigError(key, f"no module {module!r} in {where}: start posexp in the folder that holds {top}/ (or "
                               f"{top}.py), keep it beside your config folder, or install its package") from None
    except Exception as e:  # noqa: BLE001 - the user's code: say which module and what it raised
        raise ConfigError(key, f"importing {module} failed: {type(e).__name__}: {e}".splitlines()[0]) from None


def shadowed(top: str, roots: Sequence[str | os.PathLike]) -> Optional[str]:
    """Why the user's package ``top`` is not the one imported: another of that name (the standard library's
    ``encodings``, an installed package) comes first on ``sys.path``; None when it is not shadowed."""
    found = sys.modules.get(top)
    where = getattr(found, "__file__", None) or next(iter(getattr(found, "__path__", []) or []), None)
    if found is None or where is None:
        return None
    for folder in (Path.cwd(), *map(Path, roots)):
        mine = folder / top if (folder / top).is_dir() else folder / f"{top}.py"
        if mine.exists() and Path(mine).resolve() not in (Path(where).resolve(), Path(where).resolve().parent):
            return (f"your {mine.name}{'/' if mine.is_dir() else ''} ({mine}) is shadowed by another module of that "
                    f"name, {where}, which Python imports first; rename your package (e.g. my_{top}) and the module: "
                    "key of its yaml")
    return None


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
    ``my_encoders.logrope``): the helper modules a class imports change what it does as much as its own file
    does. None for a module outside any package (its own file's SHA-256 is all there is to go by)."""
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


def code_record(cls: type) -> dict:
    """What a run records of the code of a class of the user's (a plugin encoder, task or tracker), to import it
    again from where the run found it (:func:`import_roots`) and to notice when it changed: ``module``,
    ``class``, ``file`` (absolute), ``sha256`` of that file, and ``package_sha256`` of its package's files
    (:func:`package_sha256`, where it is in one)."""
    path = source_file(cls)
    record = {"module": cls.__module__, "class": cls.__qualname__, "file": str(path) if path else None,
              "sha256": file_sha256(path)}
    package = package_sha256(cls)
    if package is not None:
        record["package_sha256"] = package
    return record


def import_roots(record: Mapping[str, Any]) -> list[str]:
    """The folder a run imported a recorded module from (:func:`code_record`): its file less one folder per
    dotted part; [] when the record names no file."""
    file, module = record.get("file"), str(record.get("module") or "")
    if not file or not module:
        return []
    path = Path(file)
    depth = len(module.split(".")) + (1 if path.name == "__init__.py" else 0)
    return [str(path.parents[depth - 1])] if len(path.parents) >= depth else []


def raised_in(error: BaseException, records: Mapping[K, Mapping[str, Any]]) -> Optional[tuple[K, str]]:
    """Which code of the user's raised ``error``: the key of the record (:func:`code_record`) whose file holds the
    innermost frame of the traceback that is in such a file (else in a file of its package: a helper it calls), with
    that frame's function (``Slipped.rotate``); None when no frame is the user's code (posexp's own error)."""
    files, packages = {}, {}
    for key, record in records.items():
        roots, module = import_roots(record), str(record.get("module") or "")
        if record.get("file"):
            files[key] = Path(str(record["file"])).resolve()
        if roots and "." in module:
            packages[key] = (Path(roots[0]) / module.split(".")[0]).resolve()
    mine: Optional[tuple[K, str]] = None
    helper: Optional[tuple[K, str]] = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        path, code = Path(frame.f_code.co_filename).resolve(), frame.f_code
        function = getattr(code, "co_qualname", code.co_name)  # Python 3.11 on: Class.method
        mine = next(((key, function) for key, file in files.items() if path == file), mine)
        helper = next(((key, function) for key, folder in packages.items() if folder in path.parents), helper)
    return mine or helper


class Registry(Mapping[str, type[T]], Generic[T]):
    """The classes of one kind by name, sorted; a read-only mapping that loads its package on first use.

    Args:
        kind: what a name names, in the user's words (``encoder``, ``task``, ``tracker``).
        key: the config key that takes the name, for errors (``encoder``, ``task``, ``logger``).
        package: the package whose modules register the classes.
        skip: modules of ``package`` that register nothing (helpers, the base class).
        entry_points: read installed plugins from the entry-point group ``posexp.KINDs`` (the encoders read theirs
            with their own rules, :mod:`posexp.encoders.plugins`).
        nested: each chosen name has its options under a key of its own (``logger.NAME.KEY``), not under ``key``.
    """

    def __init__(self, kind: str, key: str, package: str, skip: Iterable[str] = (), entry_points: bool = True,
                 nested: bool = False):
        self.kind, self.key, self.package, self.skip, self.nested = kind, key, package, frozenset(skip), nested
        self.group = f"posexp.{kind}s" if entry_points else None
        self._classes: dict[str, type[T]] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: the class becomes ``name`` (its ``name`` attribute is set too).

        Raises:
            RuntimeError: two classes of the package take one name.
        """

        def wrap(cls: type[T]) -> type[T]:
            other = self._classes.get(name)
            # the same class of a module imported anew (dropped from sys.modules) takes its place
            same = other is not None and (other.__module__, other.__qualname__) == (cls.__module__, cls.__qualname__)
            if other is not None and other is not cls and not same:
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
        if self.group is not None:
            self._load_entry_points(self.group)

    def _load_entry_points(self, group: str) -> None:
        """The installed plugins of ``group``: each entry point names a class (registered as the entry point's
        name) or a module that registers its own. One that fails to load is left out with a warning, and so is
        one that takes a built-in's name (the built-in wins)."""
        for ep in importlib.metadata.entry_points(group=group):
            known = self._classes.get(ep.name)
            if inspect.isclass(known) and self.own(known):
                log.warning("the installed plugin %s %r (%s) is shadowed by posexp's built-in %r, which wins; rename "
                            "its entry point", self.kind, ep.name, ep.value, ep.name)
                continue
            try:
                loaded = ep.load()
            except Exception as e:  # noqa: BLE001 - the plugin's code: name it and what it raised, and go on
                log.warning("the installed plugin %s %r (%s) cannot be loaded: %s: %s", self.kind, ep.name, ep.value,
                            type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                continue
            if inspect.isclass(loaded) and ep.name not in self._classes:
                setattr(loaded, "name", ep.name)
                self.add(ep.name, typing.cast("type[T]", loaded))

    def from_module(self, name: str, module: str, roots: Iterable[str] = ()) -> type[T]:
        """The class ``name`` of the user's module ``module`` (a config's ``module`` key), imported with the working
        folder (then ``roots``) on ``sys.path``, as ``python -m`` has it; the module registers its class as posexp's
        own modules do.

        Raises:
            ConfigError: on ``KEY.module`` (``logger.NAME.module``): the module cannot be imported, or registers no
                ``name``.
        """
        key = f"{self.key}.{name}.{MODULE_KEY}" if self.nested else f"{self.key}.{MODULE_KEY}"
        self.load()  # posexp's own first: a module that takes a built-in name is told so
        import_user_module(module, key, roots)
        cls = self._classes.get(name)
        if cls is None or not (cls.__module__ == module or cls.__module__.startswith(module + ".")):
            raise ConfigError(key, f"module {module} registers no {self.kind} {name!r}; decorate its class with "
                                   f"@{self.kind.upper()}S.register({name!r}) (from {self.package})")
        return cls

    def own(self, cls: type) -> bool:
        """Whether ``cls`` is one of posexp's own (defined in the registry's package), not a class of the user's."""
        return cls.__module__.startswith(self.package + ".")

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
