"""A finished or interrupted run of a user's own code (a plugin encoder, a task of their own), used again: is its
code here, and is it the same code?

``posexp eval``, ``posexp resume`` and ``posexp finetune`` rebuild a run's encoder and task from code that lives
outside posexp. :func:`check_plugin_sources` imports it (from the working folder, else from where the run
found it) and compares the SHA-256 of its source file with the one the run recorded, so that numbers are
never silently added to a run by code other than the code that trained it. What that code raises while a run
trains, is evaluated or analysed is said in one line, its traceback in the run's log (:func:`plugin_failed`,
:func:`plugin_failures`), and so is what a plugin encoder's hook returned against the contract, where posexp's
code failed on it.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from posexp.encoders import create, load_plugin, source_record
from posexp.encoders.plugins import MODULE_KEY
from posexp.errors import PluginFailed, PosexpError
from posexp.registry import code_record, import_roots, raised_in
from posexp.runs.provenance import LOG_FORMAT, by_plugin, recorded_sources
from posexp.tasks import task_class

ALLOW_FLAG = "--allow-changed-encoder"


def check_plugin_sources(run_dir: Path, config: Mapping[str, Any], results: Optional[dict] = None,
                         allow_changed: bool = False, warn: Optional[Callable[[str], None]] = None,
                         allow_option: str = ALLOW_FLAG) -> None:
    """A run trained with plugin encoders (the encoder itself, or a mix's layers) or a task of the user's can be
    rebuilt here from the same code.

    Args:
        config: the run's config: its ``encoder`` and ``task`` (a ``module`` key names the user's module).
        results: the run's results.json, if read already.
        allow_changed: go on with a changed source, with a warning (the user's ``--allow-changed-encoder``).
        allow_option: how the user asks for ``allow_changed``, for the message: the flag, or from Python a keyword.

    Raises:
        PosexpError: one line: a plugin cannot be imported here, or its source changed since the run was trained.
    """
    encoder, task = config["encoder"], config.get("task") or {}  # a run of before tasks has none
    name = str(encoder["name"])
    for (kind, plugin), recorded in by_plugin(recorded_sources(run_dir, results), name, str(task.get("name"))).items():
        if kind == "task":
            now = partial(_task_now, task, recorded)
        else:
            now = partial(_encoder_now, plugin, encoder.get(MODULE_KEY) if plugin == name else None, recorded)
        _check_one(run_dir, f"{kind} {plugin!r}", recorded, now, allow_changed, warn, allow_option)


def _encoder_now(name: str, module: Optional[str], recorded: dict) -> dict:
    """The record of the plugin encoder ``name``'s code as it is here, its ``module`` imported from the working folder,
    else from where the run found it."""
    if module:
        load_plugin(name, str(module), roots=import_roots(recorded))
    return source_record(name) or {}


def _task_now(task: Mapping[str, Any], recorded: dict) -> dict:
    """The record of the code of the user's task of a ``task`` config as it is here (imported as
    :func:`_encoder_now` imports an encoder)."""
    return code_record(task_class(task, import_roots(recorded)))


def _check_one(run_dir: Path, what: str, recorded: dict, load: Callable[[], dict], allow_changed: bool,
               warn: Optional[Callable[[str], None]], allow_option: str = ALLOW_FLAG) -> None:
    """One plugin (``what``: ``encoder 'NAME'``, ``task 'NAME'``): importable here (``load`` imports it and says
    what its code is now), its source file's and its package's SHA-256 the ones recorded."""
    where = f"{recorded.get('module')}, {recorded.get('file')}" + (
        f", {recorded['distribution']} {recorded.get('version')}" if recorded.get("distribution") else "")
    try:
        now = load()
    except PosexpError as e:
        raise PosexpError(f"{run_dir}: trained with the plugin {what} ({where}), which cannot be loaded "
                          f"here: {e}") from None
    old, new = recorded.get("sha256"), now.get("sha256")
    old_pkg, new_pkg = recorded.get("package_sha256"), now.get("package_sha256")
    if old is not None and new != old:
        message = (f"{run_dir}: the source of {what} changed since the run was trained: {now.get('file')} "
                   f"has sha256 {str(new)[:12]}, the run recorded {old[:12]} ({recorded.get('file')})")
    elif old_pkg is not None and new_pkg != old_pkg:  # the class's file is the same, a helper beside it is not
        message = (f"{run_dir}: a file of the package {str(recorded.get('module')).split('.')[0]} of {what} "
                   f"changed since the run was trained (package sha256 {str(new_pkg)[:12]}, the run recorded "
                   f"{old_pkg[:12]})")
    else:
        return
    if not allow_changed:
        raise PosexpError(f"{message}; restore that file, or add {allow_option} to go on with the code as it is now")
    if warn is not None:
        warn(f"{message}; going on with the code as it is now ({allow_option.split()[0]})")


def plugin_failed(error: BaseException, plugins: Mapping[str, dict], config: Mapping[str, Any], stopped: str,
                  log_file: Path) -> Optional[PluginFailed]:
    """The one line for ``error`` when the user's own code raised it (a plugin encoder's hook, a task's generator):
    the component, its function, what it raised, ``stopped`` (what that stopped) and ``log_file``, which holds the
    traceback; None when posexp's own code raised it.

    Args:
        plugins: the records of the run's plugin code (:func:`posexp.runs.provenance.source_fields`, ``task_source``).
        config: the run's config: its ``encoder`` and ``task`` names.
    """
    task = config.get("task") or {}
    records = by_plugin(plugins, str(config["encoder"]["name"]), str(task.get("name")))
    raised = raised_in(error, records)
    if raised is None:
        return _broken_hooks([name for kind, name in records if kind == "encoder"], config["encoder"], stopped,
                             log_file)
    (kind, name), function = raised
    what = f"{type(error).__name__}: {error}".splitlines()[0]
    return PluginFailed(f"{kind}={name}: {function} raised {what}; {stopped}, the traceback is in {log_file}")


def _broken_hooks(names: list[str], encoder: Mapping[str, Any], stopped: str, log_file: Path) -> Optional[PluginFailed]:
    """The one line for an error posexp's code raised on what a plugin encoder's hook returned (a wrong shape or
    dtype, NaN): the hook, what it returned and what the contract wants, as ``posexp check``'s hook outputs check
    finds it; None when the hooks of the ``encoder`` config (whose plugin encoders, or plugin layers, are ``names``)
    return what the model needs, or there are none."""
    if not names:
        return None
    from posexp.evaluation.conformance.outputs import broken_outputs

    options = {key: value for key, value in encoder.items() if key != "name"}
    problem = broken_outputs(lambda d_model, n_heads: create(str(encoder["name"]), d_model=d_model, n_heads=n_heads,
                                                              **options))
    if problem is None:
        return None
    name = names[0] if len(names) == 1 else str(encoder["name"])
    return PluginFailed(f"encoder={name}: {problem} ({_check_command(name)} says more); {stopped}, the traceback is "
                        f"in {log_file}")


def _check_command(name: str) -> str:
    """``posexp check NAME``, with the config folder this Hydra job found the encoder's yaml in."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        for source in HydraConfig.get().runtime.config_sources:
            if source.schema == "file" and source.provider != "main" and \
                    (Path(source.path) / "encoder" / f"{name}.yaml").is_file():
                return f"posexp check --config-dir {source.path} {name}"
    return f"posexp check {name}"


@contextlib.contextmanager
def plugin_failures(plugins: Mapping[str, dict], config: Mapping[str, Any], stopped: str,
                    log_file: Path) -> Iterator[None]:
    """What the user's own code raises in the block, in one line (:func:`plugin_failed`), its traceback appended to
    ``log_file``; posexp's own errors, and what posexp's code raised, pass through. For the commands that use a run's
    plugins without training it (``posexp eval``, ``posexp analyze``)."""
    try:
        yield
    except PosexpError:
        raise
    except Exception as e:
        failed = plugin_failed(e, plugins, config, stopped, log_file)
        if failed is None:
            raise
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.handle(logging.getLogger(__name__).makeRecord(
            __name__, logging.ERROR, __file__, 0, "%s", (failed,), (type(e), e, e.__traceback__)))
        handler.close()
        raise failed from None
