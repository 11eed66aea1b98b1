"""Data-parallel training under torchrun: the same global batch, the same losses, one writer; and torch's
context parallelism, each sequence split over two GPUs, the same losses as one process."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posexp.runtime.device import World, world
from posexp.training.distributed import shard, worker_overrides
from posexp.errors import ConfigError, PosexpError
from posexp.commands.train import run_train

from helpers import TINY_RUN, invoke

TINY = ("train.steps=20", "train.log_every=1", "eval.multiples=[1]",
        "eval.loss_by_position=false")


def test_each_rank_trains_on_its_slice_of_the_same_global_batch():
    for size in (1, 2, 4):
        rows = [r for rank in range(size) for r in range(32)[shard(32, World(rank=rank, size=size))]]
        assert rows == list(range(32))  # every window once, in the order one process would see them
    with pytest.raises(ConfigError, match="divisible by the number of processes") as err:
        shard(6, World(rank=0, size=4))
    assert err.value.key == "train.batch_size"


def test_world_comes_from_the_torchrun_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert world() == World(rank=0, size=1, local_rank=0) and world().is_main and not world().distributed
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert world() == World(rank=3, size=4, local_rank=1) and not world().is_main
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(PosexpError, match="RANK=4 WORLD_SIZE=4"):
        world()


def test_only_rank_0_lets_hydra_write(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with worker_overrides() as extra:
        assert extra == []
    monkeypatch.setenv("RANK", "1")
    with worker_overrides() as extra:
        assert {"hydra.output_subdir=null", "hydra/job_logging=disabled"} <= set(extra)
        scratch = Path(extra[0].split("=", 1)[1])
        assert scratch.is_dir() and all(o.endswith(str(scratch)) for o in extra[:2])  # run and sweep folders
    assert not scratch.exists()


def _losses(metrics: Path) -> dict[int, float]:
    with open(metrics, newline="") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}


@pytest.mark.slow  # an end-to-end run of several seconds; the default suite stays near 10 minutes
def test_two_processes_train_like_one(tiny, tmp_path):
    """torchrun with 2 CPU processes (gloo) and one process on the same global batch: the same loss curve."""
    one = run_train(tiny(*TINY), tmp_path / "one", list(TINY))
    work = tmp_path / "ddp"
    work.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "posexp", "train", *TINY_RUN, *TINY], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(p.relative_to(work) for p in work.rglob("*") if p.is_file())
    run_dirs = {Path(*p.parts[:3]) for p in written}  # outputs/DATE/TIME
    assert len(run_dirs) == 1, written  # the ranks agreed on one run folder; rank 1 left nothing behind
    run_dir = work / run_dirs.pop()
    assert [p.name for p in written].count("metrics.csv") == 1 and [p.name for p in written].count("results.json") == 1
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "train.log").is_file()
    assert proc.stdout.count("wrote ") == 1 and "× 2 processes" in proc.stdout  # rank 0 alone prints

    single, ddp = _losses(tmp_path / "one" / "metrics.csv"), _losses(run_dir / "metrics.csv")
    assert sorted(ddp) == list(range(1, 21))
    assert abs(ddp[20] - single[20]) < 1e-3
    assert max(abs(ddp[s] - single[s]) for s in ddp) < 1e-3
    results = json.loads((run_dir / "results.json").read_text())
    assert results["run"]["train"]["processes"] == 2 and results["run"]["train"]["tokens"] == one["run"]["train"]["tokens"]
    assert results["rows"][0]["loss"] == pytest.approx(one["rows"][0]["loss"], abs=1e-3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_rope_trains_with_each_sequence_split_over_two_gpus(tmp_path):
    """torch's context_parallel on 2 GPUs: the same loss curve as one process, up to float rounding (never run: no GPU yet)."""
    args = ("experiment=smoke", "train.progress=false", "device=cuda", "precision=fp32", "compile=false",
            "train_len=64", "train.log_every=1", "eval.multiples=[1]")
    one = invoke("train", *args, f"hydra.run.dir={tmp_path / 'one'}")
    assert one.exit_code == 0, one.output
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "posexp", "train", *args, "train.context_parallel=2", f"hydra.run.dir={tmp_path / 'cp'}"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]

    def losses(run: Path) -> list[float]:
        with open(run / "metrics.csv", newline="") as f:
            return [float(r["loss"]) for r in csv.DictReader(f)]

    assert max(abs(a - b) for a, b in zip(losses(tmp_path / "cp"), losses(tmp_path / "one"))) < 1e-3
