"""Memory a run needs, checked before anything is allocated: a model, batch or task too large for the machine is
refused in one line naming the key to lower, never a traceback."""

from __future__ import annotations

import pytest
import torch

from helpers import TINY_RUN
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
