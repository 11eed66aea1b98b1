"""Shared fixtures: a private token cache, tiny configs composed from the real configs/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    # Tests never touch the user's ~/.cache/posexp; the stdlib corpus is built once per session. The environment
    # is put back as the session found it when the session ends.
    cache = tmp_path_factory.mktemp("posexp-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POSEXP_CACHE", str(cache))
        yield cache


@pytest.fixture
def compose():
    """Compose the shipped config with overrides, as ``posexp train`` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from posexp.config.schema import config_dir
    from posexp.commands.validation import register_configs

    register_configs()

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))

    return _compose


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


@pytest.fixture(scope="session")
def trained(tmp_path_factory, _private_cache, _session_threads) -> Path:
    """One tiny run (:data:`TINY_RUN`, rope) trained once for the whole session, through ``posexp train``; tests
    work on copies of it (``shutil.copytree``), never in it. The session's thread count is read before it trains
    (``train.threads=1`` sets torch's) and put back after."""
    import torch

    run_dir = tmp_path_factory.mktemp("trained") / "run"
    result = invoke("train", *TINY_RUN, f"hydra.run.dir={run_dir}")
    torch.set_num_threads(_session_threads)
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture(scope="session")
def _session_threads() -> int:
    import torch

    return torch.get_num_threads()


@pytest.fixture(autouse=True)
def _torch_threads(_session_threads):
    """Torch's thread count put back after each test: a run in this process (``train.threads``, a sweep job's share
    of the cores) sets it for the rest of the process, and fp32 sums depend on it."""
    yield
    import torch

    torch.set_num_threads(_session_threads)


@pytest.fixture
def tiny(compose, tmp_path, monkeypatch, _private_cache):
    """``tiny(*overrides)``: the smoke experiment composed as ``posexp train`` would, pinned by :data:`TINY_RUN`,
    with the session's private token cache (``POSEXP_CACHE``) and a sweep cache (``cache_dir``) under the test's
    ``tmp_path``. Overrides given come last and win."""
    monkeypatch.setenv("POSEXP_CACHE", str(_private_cache))  # the session's token cache, whatever ran before

    def _tiny(*overrides: str):
        return compose(*TINY_RUN, f"cache_dir={tmp_path / 'sweep-cache'}", *overrides)

    return _tiny


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
