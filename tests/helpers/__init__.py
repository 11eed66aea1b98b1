"""What the tests share besides fixtures: how a test starts ``posexp`` (in a fresh interpreter or in this
process), the tiny run every training test pins, and small drivers of posexp's internals. Test modules import
these by name (``from helpers import ...``); fixtures stay in the conftest.py files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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
    from typer.testing import CliRunner

    from posexp.cli.app import app

    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
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
