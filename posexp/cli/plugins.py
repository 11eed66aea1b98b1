"""Encoders from the user's own config folders, found on the command line before Hydra starts.

``posexp train --config-dir conf encoder=logrope`` and ``posexp train hydra.searchpath=[file://conf]
encoder=logrope`` both reach ``conf/encoder/logrope.yaml``, whose ``module:`` key names the Python module
that defines the encoder (``module: my_encoders.logrope``). :func:`load_folder_plugins` imports those
modules first, so that each encoder's schema (from its ``__init__``) is in Hydra's ConfigStore as a
built-in's is.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posexp.cli.hydra_flags import CommandLine
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


def user_config_dirs(line: Optional[CommandLine]) -> List[Path]:
    """The user's config folders a Hydra command line names: ``--config-dir`` / ``-cd``, ``hydra.searchpath``.

    Raises:
        PosexpError: a named folder does not exist.
    """
    if line is None:
        return []  # Hydra's argparse reports it
    named = [("--config-dir", line.config_dir)] if line.config_dir else []
    for arg in line.overrides:
        if arg.lstrip("+").startswith(SEARCHPATH + "="):
            named += [(SEARCHPATH, str(v)) for v in _values(arg)]
    dirs = []
    for key, text in named:
        folder = _folder(text)
        if folder is not None and not folder.is_dir():
            raise PosexpError(f"{key}: no such folder {folder} (the folder that holds your encoder/NAME.yaml)")
        if folder is not None and folder not in dirs:
            dirs.append(folder)
    return dirs


def _values(arg: str) -> list:
    """What an override sets: its value, a list's items or a sweep's choices; nothing for an override Hydra's parser
    refuses (the override check names it)."""
    try:
        value = OverridesParser.create().parse_override(arg).value()
    except HydraException:
        return []
    return list(getattr(value, "list", None) or (value if isinstance(value, list) else [value]))


def _schema_named(raw: DictConfig) -> Optional[str]:
    """The encoder schema a yaml's defaults list names (``/schema/encoder/NAME@_here_``), if any."""
    for entry in raw.get("defaults") or []:
        text = str(entry)
        if "schema/encoder/" in text:
            return text.split("schema/encoder/", 1)[1].split("@", 1)[0]
    return None


def _load_yaml(path: Path, roots: Sequence[Path]) -> Optional[str]:
    """Import the module the encoder yaml ``path`` names; returns the encoder's name when it is a plugin's.

    Raises:
        PosexpError: naming the yaml: it is unreadable, lacks its schema line, its module cannot be imported or
            defines no such encoder, or it uses the schema of an encoder that does not exist and names no module.
    """
    from posexp.encoders import load_plugin, registry
    from posexp.encoders.plugins import MODULE_KEY

    try:
        raw = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException) as e:
        raise PosexpError(f"{path}: not a readable yaml file ({str(e).splitlines()[0]})") from None
    if isinstance(raw, ListConfig):
        return None  # Hydra says what is wrong with it, if it is ever chosen
    name = str(raw.get("name") or path.stem)
    module = raw.get(MODULE_KEY)
    if module is None:
        schema = _schema_named(raw)
        if schema is not None and schema not in registry():
            raise PosexpError(f"{path}: uses the schema of encoder {schema!r}, which is not a built-in or "
                              f"an installed plugin; name the module that defines it: {MODULE_KEY}: "
                              "PACKAGE.MODULE (e.g. my_encoders.logrope)")
        return None
    if _schema_named(raw) is None:
        raise PosexpError(f"{path}: no schema line (the options, typed, from the class's __init__); add "
                          f"`- /schema/encoder/{name}@_here_` under `defaults:`, before `- _self_` (as "
                          "scripts/plugin_example/conf/encoder/logrope.yaml has it)")
    try:
        load_plugin(name, str(module), roots=roots)
    except PosexpError as e:
        raise PosexpError(f"{path}: {e}") from None
    return name


def load_folder_plugins(dirs: Sequence[Path]) -> List[str]:
    """Import the module each ``DIR/encoder/*.yaml`` names in its ``module`` key; returns the encoders loaded.

    A module is imported from the working folder, else from beside the config folder (its parent, as in
    ``project/conf`` and ``project/my_encoders``) or from inside it, whatever folder posexp was started in.
    A yaml that cannot be used is recorded as broken, with why (:func:`posexp.encoders.broken`): the others
    load as if it were not there, and choosing it says why in one line.
    """
    from posexp.encoders import broken, mark_broken

    loaded = []
    for folder in dirs:
        for path in sorted((folder / "encoder").glob("*.yaml")):
            try:
                name = _load_yaml(path, (folder.parent, folder))
            except PosexpError as e:
                if path.stem not in broken():  # else its class's registration said why, and better
                    mark_broken(path.stem, str(e).splitlines()[0])
                continue
            if name is not None:
                loaded.append(name)
    return loaded


def refuse_broken(line: Optional[CommandLine]) -> None:
    """Stop a command line that chooses a broken plugin encoder (``encoder=NAME``, or among a sweep's choices),
    naming why in one line.

    Raises:
        PosexpError: the first broken encoder chosen, and why.
    """
    from posexp.encoders import broken

    unusable = broken()
    if not unusable:
        return
    for arg in (line.overrides if line is not None else ()):
        if arg.split("=", 1)[0].lstrip("+~") != "encoder":
            continue
        for choice in map(str, _values(arg)):
            if choice in unusable:
                raise PosexpError(f"encoder={choice}: the plugin encoder cannot be used: {unusable[choice]}")
