"""Shared fixtures: a private token cache, tiny configs composed from the real configs/, a tiny pretrained model."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import TINY_RUN, invoke
from helpers.resume import RESUMABLE


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


# A pretrained model as `posexp eval hf:FOLDER` takes one (helpers.hf_tiny), for its tests in this process and in a
# process of its own; built once per test module.

@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    """A folder of code files, the text the model's tokenizer learns and the model is evaluated on."""
    from helpers.hf_tiny import write_code_corpus

    return write_code_corpus(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, corpus_dir) -> Path:
    """A random 2-layer Llama with a 64-token context, saved with its tokenizer as a Hub model folder is."""
    from helpers.hf_tiny import save_llama

    return save_llama(tmp_path_factory.mktemp("tiny-llama"), corpus_dir)


@pytest.fixture(scope="module")
def pretrained_run(llama_dir, corpus_dir, tmp_path_factory) -> Path:
    """The run folder of ``posexp eval hf:LLAMA_DIR`` on the corpus' text."""
    from helpers.hf_tiny import text_data

    out = tmp_path_factory.mktemp("pretrained") / "run"
    result = invoke("eval", f"hf:{llama_dir}", *text_data(corpus_dir), f"hydra.run.dir={out}")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """The uninterrupted run (:data:`helpers.resume.RESUMABLE`) every stopped and resumed run must match."""
    run_dir = tmp_path_factory.mktemp("full") / "run"
    result = invoke("train", *RESUMABLE, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    return run_dir
