"""Encoders from the user's own config folders, found on the command line before Hydra starts.

``posexp train --config-dir conf encoder=logrope`` and ``posexp train hydra.searchpath=[file://conf]
encoder=logrope`` both reach ``conf/encoder/logrope.yaml``, whose ``module:`` key names the Python module
that defines the encoder (``module: my_encoders.logrope``). :func:`load_folder_plugins` imports those
modules first, so that each encoder's schema (from its ``__init__``) is in Hydra's ConfigStore as a
built-in's is, and :func:`initialize_configs` composes with the user's folders as Hydra will, so that
posexp's own checks of a command line see the user's options too.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posexp.cli.hydra_adapter import parse_command_line, start_hydra
from posexp.config.schema import config_dir
from posexp.errors import PosexpError

# posexp.encoders (the registry, HOW_TO, MODULE_KEY) imports torch (posexp/cli/app.py says what that costs at
# start-up): imported where an encoder is looked up, so that `posexp --help` and `posexp report` start without it.

SEARCHPATH = "hydra.searchpath"
# keys a user might guess for an encoder of their own (and encoder.MODULE_KEY); none exists, the message names the
# way that does
GUESSED_KEYS = ("plugins", "encoder._target_", "encoders")


def guess_hint(key: str) -> Optional[str]:
    """How to use an encoder of one's own, for an override whose key is one a user would guess for it."""
    from posexp.encoders.plugins import HOW_TO, MODULE_KEY

    if key.lstrip("+") in (*GUESSED_KEYS, f"encoder.{MODULE_KEY}"):
        return f"posexp builds no encoder from a command-line key; {HOW_TO}"
    return None


def _folder(text: str) -> Optional[Path]:
    """A search path entry as a folder: ``file://conf`` or ``conf`` (Hydra reads both as files); None for
    ``pkg://`` (configs inside a package, not a folder of the user's)."""
    if text.startswith("pkg://"):
        return None
    return Path(text.removeprefix("file://")).expanduser().resolve()


def user_config_dirs(args: Sequence[str]) -> List[Path]:
    """The user's config folders a Hydra command line names: ``--config-dir`` / ``-cd``, ``hydra.searchpath``.

    Raises:
        PosexpError: a named folder does not exist.
    """
    ns = parse_command_line(args)
    if ns is None:
        return []  # Hydra's argparse reports it
    named = [("--config-dir", ns.config_dir)] if ns.config_dir else []
    for arg in ns.overrides:
        if not arg.lstrip("+").startswith(SEARCHPATH + "="):
            continue
        try:
            value = OverridesParser.create().parse_override(arg).value()
        except HydraException:
            continue  # the override check names the syntax error
        named += [(SEARCHPATH, str(v)) for v in (value if isinstance(value, list) else [value])]
    dirs = []
    for key, text in named:
        folder = _folder(text)
        if folder is not None and not folder.is_dir():
            raise PosexpError(f"{key}: no such folder {folder} (the folder that holds your encoder/NAME.yaml)")
        if folder is not None and folder not in dirs:
            dirs.append(folder)
    return dirs


def _schema_named(raw: DictConfig) -> Optional[str]:
    """The encoder schema a yaml's defaults list names (``/schema/encoder/NAME@_here_``), if any."""
    for entry in raw.get("defaults") or []:
        text = str(entry)
        if "schema/encoder/" in text:
            return text.split("schema/encoder/", 1)[1].split("@", 1)[0]
    return None


def load_folder_plugins(dirs: Sequence[Path]) -> List[str]:
    """Import the module each ``DIR/encoder/*.yaml`` names in its ``module`` key; returns the encoders loaded.

    Raises:
        PosexpError: naming the yaml: its module cannot be imported or defines no such encoder, or it uses
            the schema of an encoder that does not exist and names no module.
    """
    from posexp.encoders import load_plugin, registry
    from posexp.encoders.plugins import MODULE_KEY

    loaded = []
    for folder in dirs:
        for path in sorted((folder / "encoder").glob("*.yaml")):
            try:
                raw = OmegaConf.load(path)
            except (OSError, OmegaConfBaseException) as e:
                raise PosexpError(f"{path}: not a readable yaml file ({str(e).splitlines()[0]})") from None
            if isinstance(raw, ListConfig):
                continue  # Hydra says what is wrong with it, if it is ever chosen
            name = str(raw.get("name") or path.stem)
            module = raw.get(MODULE_KEY)
            if module is None:
                schema = _schema_named(raw)
                if schema is not None and schema not in registry():
                    raise PosexpError(f"{path}: uses the schema of encoder {schema!r}, which is not a built-in or "
                                      f"an installed plugin; name the module that defines it: {MODULE_KEY}: "
                                      "PACKAGE.MODULE (e.g. my_encoders.logrope)")
                continue
            try:
                load_plugin(name, str(module))
            except PosexpError as e:
                raise PosexpError(f"{path}: {e}") from None
            loaded.append(name)
    return loaded


@contextlib.contextmanager
def initialize_configs(dirs: Sequence[Path] = ()) -> Iterator[None]:
    """Hydra initialised on posexp's configs with the user's folders ``dirs`` before them, as
    ``--config-dir`` places its folder; inside, ``compose`` and the config loader see both."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        if dirs:
            GlobalHydra.instance().clear()  # initialize_config_dir's exit restores what was there before
            start_hydra(str(config_dir()), [str(d) for d in dirs])
        yield
