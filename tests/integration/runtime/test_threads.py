"""train.threads=auto: a run computes with the cores free to it, says so in its first line, and computes the same."""

from __future__ import annotations

import json
import re

import pytest
import torch

from helpers import SMOKE, invoke
from posexp.runtime import threads


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """``machine(cores, running)``: a process allowed ``cores`` cores while ``running`` threads are runnable
    (``procs_running`` of /proc/stat), this process's own one among them."""
    def _machine(cores: int, running: int) -> None:
        stat = tmp_path / "stat"
        stat.write_text(f"cpu  1 2 3 4\nprocs_running {running}\nprocs_blocked 0\n")
        monkeypatch.setattr(threads, "PROC_STAT", stat)
        monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
        monkeypatch.setattr(threads, "_own_running", lambda: 1)
        monkeypatch.setattr(threads, "SAMPLE_GAP_S", 0.0)

    threads.pin(None)
    yield _machine
    threads.pin(None)


@pytest.mark.parametrize("cores,running,expected,why", [
    (2, 1, 2, "2 cores allowed, none busy"),
    (2, 2, 1, "2 cores allowed, 1 busy with other processes"),  # the case: one other job on 2 cores
    (2, 9, 1, "2 cores allowed, 2 busy"),  # never 0
    (16, 5, 12, "16 cores allowed, 4 busy"),
])
def test_auto_takes_the_cores_other_processes_leave(machine, cores, running, expected, why):
    machine(cores, running)
    chosen = threads.choose("auto")
    assert chosen.count == expected and why in chosen.reason


def test_without_proc_auto_takes_the_allowed_cores_and_says_why(machine, tmp_path, monkeypatch):
    machine(4, 1)
    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "missing")
    chosen = threads.choose("auto")
    assert chosen.count == 4 and "no /proc/stat" in chosen.reason


def test_a_number_is_taken_as_given_and_a_launcher_share_wins_over_auto(machine):
    machine(2, 1)
    assert threads.choose(3).count == 3 and threads.choose(None) is None
    threads.pin(1, "JoblibLauncher's share of the cores")
    assert threads.choose("auto") == threads.Threads(1, "JoblibLauncher's share of the cores")
    assert threads.choose(2).count == 2
    assert threads.apply(2).count == 2 and torch.get_num_threads() == 2


def test_auto_is_the_default_and_leaves_the_run_hash_alone(compose):
    from posexp.commands.edge import typed
    from posexp.config.identity import config_hash

    auto = typed(compose())
    assert auto.train.threads == "auto"
    assert config_hash(auto) == config_hash(typed(compose("train.threads=1")))


def test_the_first_line_says_how_many_threads_and_why(tmp_path):
    result = invoke("train", *SMOKE, "precision=fp32", "train.steps=4", "train.warmup_steps=1", "eval.tokens=256",
                    "eval.multiples=[1]", "eval.loss_by_position=false", "hydra.run.dir=run", cwd=tmp_path)
    assert result.exit_code == 0, result.output[-2000:]
    first = " ".join(result.stdout.split("\n\n")[0].split())
    said = re.search(r"(\d+) threads? \(auto: (\d+) cores allowed, [^)]*\)", first)
    assert said, first
    logged = (tmp_path / "run" / "train.log").read_text().splitlines()[0]
    assert f"[posexp.threads][INFO] - {said.group(0)}" in " ".join(logged.split())  # train.log's first line too
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())["run"]["train"]["threads"]
    assert recorded == int(said.group(1)) <= int(said.group(2))


@pytest.mark.parametrize("value", ["abc", "0", "1.5", "true"])
def test_anything_but_auto_or_a_positive_number_is_one_line(tmp_path, value):
    result = invoke("train", *SMOKE, f"train.threads={value}", cwd=tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "train.threads: must be auto (the cores free to this process) or a positive integer" in result.stderr
