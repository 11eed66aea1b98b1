"""The user's own config folders, found on the command line before Hydra starts.

``posexp train --config-dir conf encoder=logrope`` and ``posexp train hydra.searchpath=[file://conf]
encoder=logrope`` both reach ``conf/encoder/logrope.yaml``, whose ``module:`` key names the Python module
that defines the encoder (``module: my_encoders.logrope``): :func:`load_folder_plugins` has the registry import
those modules first (:mod:`posexp.encoders.config_folder`), so that each encoder's schema is in Hydra's
ConfigStore as a built-in's is.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

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


def load_folder_plugins(dirs: Sequence[Path]) -> List[str]:
    """The encoders the user's config folders ``dirs`` name, imported (:func:`posexp.encoders.config_folder.
    load_config_folder`); returns their names."""
    from posexp.encoders.config_folder import load_config_folder

    return [name for folder in dirs for name in load_config_folder(folder)]

