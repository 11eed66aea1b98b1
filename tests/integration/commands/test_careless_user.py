"""What a careless or unlucky user meets: a model too large for the machine, a ``data.path`` that is not text,
settings that train but not as meant. Each is one clear line (or a warning on the terminal), never a traceback."""

from __future__ import annotations

import os
import re

import pytest
import torch

from helpers import REPO, TINY_RUN, run_cli
from posexp.config.schema import DataConfig
from posexp.data.corpus import corpus_from_config, load_corpus
from posexp.errors import ConfigError, PosexpError
from posexp.commands.validation import validate
from posexp.commands.edge import typed

GiB = 2**30

# ---------------------------------------------------------------------------- memory


@pytest.mark.parametrize("overrides,key,also", [
    (("model.d_model=65536", "model.n_layers=64"), "model.d_model", "model.n_layers"),
    (("train.batch_size=1000000000",), "train.batch_size", "train_len"),
    # a task's sizes: the OOM killer ended the first (exit 137), numpy raised on the second
    (("task=copy", "task.symbols=100000000"), "task.symbols", "GiB"),
    (("task=copy", "eval.examples=1000000000"), "eval.examples", "eval lengths"),
])
def test_a_model_that_cannot_fit_in_memory_is_refused_before_allocation(compose, overrides, key, also):
    with pytest.raises(ConfigError) as e:
        validate(typed(compose(*overrides, "device=cpu")))
    assert e.value.key == key and also in str(e.value) and "GiB" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("overrides", [(), ("model.d_model=512", "model.n_layers=8")])
def test_configs_that_fit_a_24_gib_machine_are_not_refused(compose, monkeypatch, overrides):
    import posexp.runtime.memory

    monkeypatch.setattr(posexp.runtime.memory, "memory_capacity", lambda device: (24 * GiB, "this machine's RAM"))
    validate(typed(compose(*overrides, "device=cpu")))


def test_evaluating_needs_only_the_weights_to_fit(compose, monkeypatch):
    import posexp.runtime.memory

    monkeypatch.setattr(posexp.runtime.memory, "memory_capacity", lambda device: (1 * GiB, "this machine's RAM"))
    cfg = typed(compose("model.d_model=1024", "model.n_layers=8", "device=cpu"))  # ~100M parameters: 0.4 GiB of fp32
    with pytest.raises(ConfigError):
        validate(cfg)
    validate(cfg, memory="weights")


@pytest.mark.parametrize("target,error,key", [
    ("build_model", RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                                 "memory: you tried to allocate 51539607552 bytes."), "model.d_model"),
    ("build_model", MemoryError(), "model.n_layers"),
    ("train", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "train.batch_size"),
])
def test_running_out_of_memory_unforeseen_is_one_line_naming_what_to_lower(compose, tmp_path, monkeypatch,
                                                                          target, error, key):
    import posexp.commands.train as command

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(command, target, fail)
    with pytest.raises(PosexpError) as e:
        command.run_train(compose(*TINY_RUN, "device=cpu"), tmp_path / "run", [])
    assert "out of memory" in str(e.value) and key in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------- data.path


def test_data_path_that_is_not_a_file_or_folder_says_what_it_is(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_corpus(DataConfig(name="text", path=os.devnull, cache_dir=str(tmp_path / "cache")))
    assert "not a regular file or folder" in str(e.value) and "empty folder" not in str(e.value)


def test_a_symlink_loop_as_data_path_names_data_path(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ConfigError, match=r"data\.path: .*loop cannot be followed"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "loop"), cache_dir=str(tmp_path / "cache")))


def test_empty_file_and_folder_without_text_files_are_named_as_such(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "empty.txt"), cache_dir=str(tmp_path / "cache")))
    (tmp_path / "hidden" / ".git").mkdir(parents=True)
    (tmp_path / "hidden" / ".git" / "notes.txt").write_text("text, but hidden")
    with pytest.raises(ConfigError, match="has no text files"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "hidden"), cache_dir=str(tmp_path / "cache")))


def test_the_readme_data_path_example_is_an_override_hydra_accepts(monkeypatch, tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from posexp.cli.arguments import expand_home

    line = next(x for x in (REPO / "README.md").read_text().splitlines() if x.startswith("posexp train data=text"))
    monkeypatch.setenv("HOME", str(tmp_path))
    args = expand_home(os.path.expandvars(line.split("#")[0]).split()[2:])  # as the shell passes them, as posexp
    OverridesParser.create().parse_overrides(args)
    assert f"data.path='{tmp_path}/corpus/'" in args


def test_a_hydra_quoted_home_path_is_expanded(compose, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text to train on. " * 200)
    cfg = typed(compose("data=text", "data.path='~/corpus'", f"data.cache_dir={tmp_path / 'cache'}"))
    assert corpus_from_config(cfg).train.size > 0


def test_a_bare_home_path_on_the_command_line_is_expanded_as_a_shell_would(monkeypatch, tmp_path):
    from posexp.cli.arguments import expand_home

    monkeypatch.setenv("HOME", str(tmp_path))
    assert expand_home(["data.path=~/corpus", "+data.cache_dir=~", "encoder=rope", "-m"]) == [
        f"data.path='{tmp_path}/corpus'", f"+data.cache_dir='{tmp_path}'", "encoder=rope", "-m"]
    assert expand_home(["data.path=~/a,~/b"]) == [f"data.path='{tmp_path}/a','{tmp_path}/b'"]
    assert expand_home(["data.path='~/corpus'", "~model.dropout"]) == ["data.path='~/corpus'", "~model.dropout"]


def test_posexp_train_takes_the_readme_style_home_path(monkeypatch, tmp_path):
    home = tmp_path / "home"
    (home / "corpus").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # run_cli passes the environment on
    r = run_cli("train", *TINY_RUN, "data=text", "data.path=~/corpus", "--cfg", "job", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"path: {home}/corpus" in r.stdout


# ---------------------------------------------------------------------------- warnings on the terminal


def test_an_unwritable_token_cache_is_said_once_and_the_corpus_still_loads(tmp_path, caplog):
    text = tmp_path / "a.txt"
    text.write_text("some text to train on. " * 200)
    (tmp_path / "a_file").write_text("")
    said: list[str] = []
    corpus = load_corpus(DataConfig(name="text", path=str(text), cache_dir=str(tmp_path / "a_file" / "tokens")),
                         warn=said.append)
    assert corpus.train.size > 0
    assert len(said) == 1 and "cannot be written" in said[0] and "data.cache_dir" in said[0]
    assert any("cannot be written" in r.getMessage() for r in caplog.records)


def test_warmup_longer_than_the_run_and_an_unwritable_cache_dir_are_warned_on_the_terminal(tmp_path):
    (tmp_path / "a_file").write_text("")
    cache_dir = tmp_path / "a_file" / "cache"
    run = tmp_path / "run"
    r = run_cli("train", *TINY_RUN, "train.warmup_steps=20", "cache=true", f"cache_dir={cache_dir}",
                f"hydra.run.dir={run}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (run / "results.json").is_file()
    warnings = [x for x in r.stdout.splitlines() if x.startswith("warning:")]
    warmup = [x for x in warnings if "train.warmup_steps=20" in x]
    cache = [x for x in warnings if f"cache_dir {cache_dir}" in x and "cannot be written" in x]
    assert len(warmup) == 1 and "train.steps=20" in warmup[0]
    assert len(cache) == 1, r.stdout  # said once: not again when the finished training would be stored
    log = (run / "train.log").read_text()
    assert re.search(r"WARNING\] - train\.warmup_steps=20", log) and "cannot be written" in log
    assert "Traceback" not in r.stdout + r.stderr


def test_an_address_space_cap_is_the_memory_a_run_has(compose, monkeypatch):
    """Under ``ulimit -v`` (6 GiB) train.batch_size=5000 started and died mid-run: the cap, less what the process
    already maps, is the memory it has."""
    import resource

    import posexp.runtime.memory as memory

    caps = {resource.RLIMIT_AS: (6 * GiB, resource.RLIM_INFINITY)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: caps.get(which, (resource.RLIM_INFINITY,) * 2))
    monkeypatch.setattr(memory, "_proc_status_kb", lambda field: 2 * GiB // 1024 if field == "VmSize" else None)
    available, where = memory.memory_capacity(torch.device("cpu"))
    assert available <= 4 * GiB and "ulimit -v" in where
    with pytest.raises(ConfigError) as e:
        validate(typed(compose("train.batch_size=5000", "device=cpu")))
    assert e.value.key == "train.batch_size" and "ulimit -v" in str(e.value)
    validate(typed(compose("device=cpu")))  # the default run fits


def test_evaluating_a_task_at_an_impossible_length_is_refused_naming_the_lengths(compose, monkeypatch):
    """``posexp eval`` of a task run at eval.lengths=[10000000] raised numpy's _ArrayMemoryError (9.54 GiB)."""
    import posexp.runtime.memory

    monkeypatch.setattr(posexp.runtime.memory, "memory_capacity", lambda device: (24 * GiB, "this machine's RAM"))
    cfg = typed(compose("task=copy", "eval.lengths=[10000000]", "device=cpu"))
    with pytest.raises(ConfigError) as e:
        validate(cfg, memory="weights")
    assert e.value.key == "eval.lengths" and "10,000,000" in str(e.value) and "GiB" in str(e.value)
    validate(typed(compose("task=copy", "eval.lengths=[64]", "device=cpu")), memory="weights")


def test_a_task_alphabet_whose_logits_cannot_fit_names_task_symbols(compose, monkeypatch):
    """task.symbols=10,000,000 (1.28e9 parameters) was refused naming train.batch_size on a machine whose memory
    holds the weights (40 GiB): it is the alphabet that makes every token's logits too large."""
    import posexp.runtime.memory

    monkeypatch.setattr(posexp.runtime.memory, "memory_capacity", lambda device: (40 * GiB, "this machine's RAM"))
    with pytest.raises(ConfigError) as e:
        validate(typed(compose("task=copy", "task.symbols=10000000", "device=cpu")))
    assert e.value.key == "task.symbols" and "logits" in str(e.value)
