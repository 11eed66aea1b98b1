"""A finished or interrupted run of a plugin encoder, used again: is its code here, and is it the same code?

``posexp eval``, ``posexp resume`` and ``posexp finetune`` rebuild a run's encoder from code that lives
outside posexp. :func:`check_encoder_source` imports it (from the working folder, else from where the run
found it) and compares the SHA-256 of its source file with the one the run recorded, so that numbers are
never silently added to a run by code other than the code that trained it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from posexp.encoders import load_plugin, source_record
from posexp.encoders.plugins import MODULE_KEY
from posexp.errors import PosexpError
from posexp.runs.provenance import recorded_sources

ALLOW_FLAG = "--allow-changed-encoder"


def _import_root(recorded: dict) -> list[str]:
    """The folder the run imported its module from: its file less one folder per dotted part."""
    file, module = recorded.get("file"), str(recorded.get("module") or "")
    if not file or not module:
        return []
    path = Path(file)
    depth = len(module.split(".")) + (1 if path.name == "__init__.py" else 0)
    return [str(path.parents[depth - 1])] if len(path.parents) >= depth else []


def check_encoder_source(run_dir: Path, encoder: Mapping[str, Any], results: Optional[dict] = None,
                         allow_changed: bool = False, warn: Optional[Callable[[str], None]] = None,
                         allow_option: str = ALLOW_FLAG) -> None:
    """A run trained with plugin encoders (the encoder itself, or a mix's layers) can be rebuilt here from the
    same code.

    Args:
        encoder: the run's ``encoder`` config (its ``module`` names a module plugin's module).
        results: the run's results.json, if read already.
        allow_changed: go on with a changed source, with a warning (the user's ``--allow-changed-encoder``).
        allow_option: how the user asks for ``allow_changed``, for the message: the flag, or from Python a keyword.

    Raises:
        PosexpError: one line: a plugin cannot be imported here, or its source changed since the run was trained.
    """
    name = str(encoder["name"])
    for plugin, recorded in recorded_sources(run_dir, name, results).items():
        module = encoder.get(MODULE_KEY) if plugin == name else None
        _check_one(run_dir, plugin, recorded, module, allow_changed, warn, allow_option)


def _check_one(run_dir: Path, name: str, recorded: dict, module: Optional[str], allow_changed: bool,
               warn: Optional[Callable[[str], None]], allow_option: str = ALLOW_FLAG) -> None:
    """One plugin encoder ``name``: importable here, its source file's and its package's SHA-256 the ones recorded."""
    where = f"{recorded.get('module')}, {recorded.get('file')}" + (
        f", {recorded['distribution']} {recorded.get('version')}" if recorded.get("distribution") else "")
    try:
        if module:
            load_plugin(name, str(module), roots=_import_root(recorded))
        now = source_record(name) or {}
    except PosexpError as e:
        raise PosexpError(f"{run_dir}: trained with the plugin encoder {name!r} ({where}), which cannot be loaded "
                          f"here: {e}") from None
    old, new = recorded.get("sha256"), now.get("sha256")
    old_pkg, new_pkg = recorded.get("package_sha256"), now.get("package_sha256")
    if old is not None and new != old:
        message = (f"{run_dir}: the source of encoder {name!r} changed since the run was trained: {now.get('file')} "
                   f"has sha256 {str(new)[:12]}, the run recorded {old[:12]} ({recorded.get('file')})")
    elif old_pkg is not None and new_pkg != old_pkg:  # the class's file is the same, a helper beside it is not
        message = (f"{run_dir}: a file of encoder {name!r}'s package {str(recorded.get('module')).split('.')[0]} "
                   f"changed since the run was trained (package sha256 {str(new_pkg)[:12]}, the run recorded "
                   f"{old_pkg[:12]})")
    else:
        return
    if not allow_changed:
        raise PosexpError(f"{message}; restore that file, or add {allow_option} to go on with the code as it is now")
    if warn is not None:
        warn(f"{message}; going on with the code as it is now ({allow_option.split()[0]})")
