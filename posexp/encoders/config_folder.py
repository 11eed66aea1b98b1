"""Encoders a user's config folder names: ``CONF/encoder/NAME.yaml`` holding ``module: PACKAGE.MODULE``, the
first of the two ways in of :mod:`posexp.encoders.plugins`. Each such module is imported into the one registry
(:func:`posexp.encoders.load_plugin`), so that the encoder's schema (from its ``__init__``) is in Hydra's
ConfigStore as a built-in's is; a yaml that cannot be used is recorded as broken, with why.

Reading the folder belongs to the registry, not to the command line: ``posexp train --config-dir``,
``posexp check --config-dir`` and ``posexp list --config-dir`` load it alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from omegaconf import ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posexp.encoders import broken, load_plugin, mark_broken, registry
from posexp.encoders.plugins import MODULE_KEY
from posexp.errors import PosexpError


def load_config_folder(folder: Path) -> List[str]:
    """Import the module each ``folder/encoder/*.yaml`` names in its ``module`` key; returns the encoders loaded.

    A module is imported from the working folder, else from beside the config folder (its parent, as in
    ``project/conf`` and ``project/my_encoders``) or from inside it, whatever folder posexp was started in.
    A yaml that cannot be used is recorded as broken, with why (:func:`posexp.encoders.broken`): the others
    load as if it were not there, and choosing it says why in one line.
    """
    loaded = []
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


def _load_yaml(path: Path, roots: Sequence[Path]) -> Optional[str]:
    """Import the module the encoder yaml ``path`` names; returns the encoder's name when it is a plugin's.

    Raises:
        PosexpError: naming the yaml: it is unreadable, lacks its schema line, its module cannot be imported or
            defines no such encoder, or it uses the schema of an encoder that does not exist and names no module.
    """
    try:
        raw = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException) as e:
        raise PosexpError(f"{path}: not a readable yaml file ({str(e).splitlines()[0]})") from None
    if isinstance(raw, ListConfig):
        return None  # Hydra says what is wrong with it, if it is ever chosen
    name, module = str(raw.get("name") or path.stem), raw.get(MODULE_KEY)
    # the encoder schema its defaults list names (/schema/encoder/NAME@_here_)
    schema = next((str(e).split("schema/encoder/", 1)[1].split("@", 1)[0] for e in raw.get("defaults") or []
                   if "schema/encoder/" in str(e)), None)
    if module is None:
        if schema is not None and schema not in registry():
            raise PosexpError(f"{path}: uses the schema of encoder {schema!r}, which is not a built-in or "
                              f"an installed plugin; name the module that defines it: {MODULE_KEY}: "
                              "PACKAGE.MODULE (e.g. my_encoders.logrope)")
        return None
    if schema is None:
        raise PosexpError(f"{path}: no schema line (the options, typed, from the class's __init__); add "
                          f"`- /schema/encoder/{name}@_here_` under `defaults:`, before `- _self_` (as "
                          "scripts/plugin_example/conf/encoder/logrope.yaml has it)")
    try:
        load_plugin(name, str(module), roots=roots)
    except PosexpError as e:
        raise PosexpError(f"{path}: {e}") from None
    return name
