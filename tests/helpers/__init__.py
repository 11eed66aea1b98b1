"""What the tests share besides fixtures: how a test starts ``posexp`` (in a fresh interpreter or in this
process), the tiny run every training test pins, and small drivers of posexp's internals. Test modules import
these by name (``from helpers import ...``); fixtures stay in the conftest.py files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``posexp ARGS`` in a fresh interpreter, as a user would."""
    env = dict(os.environ)
    env.setdefault("POSEXP_CACHE", os.environ.get("POSEXP_CACHE", ""))
    env["COLUMNS"] = "200"  # Rich tables unwrapped, so assertions can read them
    return subprocess.run([sys.executable, "-m", "posexp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """``posexp ARGS`` started in a fresh interpreter and left running (its output piped), for a test that
    signals it, waits on it or runs another command beside it."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "posexp", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def invoke(*args: str, columns: int = 200, cwd: Path | None = None):
    """``posexp ARGS`` in this process (Typer's runner): the same commands without an interpreter's start-up.

    Args:
        columns: the terminal width Rich lays its tables out for (wide by default, so assertions can read them;
            80 is what a pipe gets).
        cwd: the folder the command runs in (a relative run folder, Hydra's ``outputs/``); the test's own
            working folder is back afterwards.
    """
    from typer.main import get_command

    from posexp.cli.app import app

    return _in_process(get_command(app), args, columns, cwd)


class _Command:
    """The installed ``posexp`` command's ``main()``, as the runner calls a command: what :func:`invoke` runs
    plus what ``main()`` adds around the app (its streams, logging that drops a line it cannot write, a path the
    system refuses said in one line). Python's logging setting is put back afterwards."""

    name = "posexp"

    def main(self, args, prog_name: str, **_):
        import logging

        from posexp.cli import main

        argv, raise_exceptions = sys.argv, logging.raiseExceptions
        sys.argv = [prog_name, *args]
        try:
            main()
        finally:
            sys.argv, logging.raiseExceptions = argv, raise_exceptions


def invoke_main(*args: str, columns: int | str = 200, cwd: Path | None = None, encoding: str = "utf-8"):
    """``posexp ARGS`` through the installed command's ``main()`` in this process (see :func:`invoke`): what a user
    typing the command gets (its exit status, its one-line errors), without an interpreter's start-up.

    Args:
        columns: as for :func:`invoke`; any string a terminal may set (``"0"``, ``"wide"``) too.
        encoding: the encoding of the command's output streams, as ``PYTHONIOENCODING`` sets a terminal's.
    """
    return _in_process(_Command(), args, columns, cwd, encoding)


def _in_process(command, args, columns: int | str, cwd: Path | None, encoding: str = "utf-8"):
    from click.testing import CliRunner

    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner(charset=encoding).invoke(command, list(args), env={"COLUMNS": str(columns)})
    finally:
        os.chdir(old)


# The smoke experiment as shipped, precision=auto and all: for tests of those defaults. A test that trains starts
# from TINY_RUN.
SMOKE = ("experiment=smoke", "train.progress=false")

# What every tiny run a test starts pins, on the command line or composed by `tiny`, so that a test gives the same
# numbers alone, in any order and on any CPU: fp32 (no precision=auto probe, whose timed forward passes would reach
# a test's spies and whose choice depends on the CPU) and one thread; `tiny` adds a sweep cache in the test's own
# folder, and every test gets torch's thread count back afterwards (_torch_threads).
TINY_RUN = (*SMOKE, "precision=fp32", "train.threads=1")


def no_figure(*args, **kwargs) -> None:
    """Draws nothing: what a test puts in place of posexp.plots' ``plot_*`` functions where a report's text is
    tested, not its figures (and drawing them would be slow)."""
    return None


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` (a file or a folder) immutable for the block, as ``chattr +i`` makes it: nobody, root included, may
    write, rename, delete it or (a folder) create in it. Skips the test where the flag cannot be set (it needs root
    and a file system that has it)."""
    import array
    import fcntl

    import pytest

    get_flags, set_flags, immutable_flag = 0x80086601, 0x40086602, 0x10  # FS_IOC_GETFLAGS, FS_IOC_SETFLAGS
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        flags = array.array("i", [0])
        try:
            fcntl.ioctl(fd, get_flags, flags, True)
            fcntl.ioctl(fd, set_flags, array.array("i", [flags[0] | immutable_flag]))
        except OSError:
            pytest.skip("chattr +i needs root and a file system that has the flag")
        try:
            yield
        finally:
            fcntl.ioctl(fd, set_flags, flags)
    finally:
        os.close(fd)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only to this very process for the block: its permission bits for a user, immutable for
    root (whom permission bits do not bind)."""
    if os.geteuid() == 0:
        with immutable(folder):
            yield
        return
    folder.chmod(0o555)
    try:
        yield
    finally:
        folder.chmod(0o755)


def sigterm_at_step(monkeypatch, owner: type, method: str, step: int):
    """Patch ``owner.method(self, step, ...)`` (a batch sampler's) to send this process SIGTERM when asked for
    ``step`` (0-based), then do its work: the signal arrives while that training step runs. Returns the
    original method, for a test that puts it back before resuming."""
    original = getattr(owner, method)

    def then_signal(self, at, *args):
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, at, *args)

    monkeypatch.setattr(owner, method, then_signal)
    return original


def evaluate_at(model, val, lengths, train_len, *, device=None, dtype=None, positions=None, log=None, progress=None,
                position_plan=None, window=None, **settings):
    """posexp's perplexity evaluation of ``model`` at ``lengths``, the eval group's keys given as keywords
    (``tokens``, ``batch_tokens``, ``protocol``, ``stride``, ``scaling`` ...) and ``window`` as an AttentionWindow."""
    import torch

    from posexp.config.schema import EvalConfig
    from posexp.evaluation.perplexity import EvalHooks, evaluate

    if window is not None:
        settings.update(window=window.size, sinks=window.sinks or None)
    return evaluate(model, val, EvalConfig(lengths=list(lengths), **settings), train_len, device or torch.device("cpu"),
                    position_plan=position_plan, dtype=dtype or torch.float32,
                    hooks=EvalHooks(positions=positions, log=log, progress=progress))
