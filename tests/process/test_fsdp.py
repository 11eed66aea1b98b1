"""Sharded training (``train.parallel=fsdp``, FSDP2) and its checkpoints, which change world size.

On CPU with gloo: one process sharding over a one-rank mesh in the default suite; two processes (torchrun) in the
slow tests, where the loss curves of fsdp, ddp and one process agree for rope, alibi, t5 and fox, and a sharded run
stopped at one world size resumes at the other to the numbers of an uninterrupted run there.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import TINY_RUN, invoke

# float rounding only: the ranks sum a batch's gradients in another order than one process does (the curves
# measured here agree to ~1e-6 nats; the tolerance leaves room for other CPUs' kernels)
CURVE_TOLERANCE = 1e-4
CURVE = ("train.log_every=1", "eval.multiples=[1]", "eval.loss_by_position=false")
ENCODINGS = ("rope", "alibi", "t5", "fox")
STOP = Path(helpers.__file__).with_name("stop_at_step.py")


def _losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}


def _ppl(run_dir: Path) -> list[float]:
    return [r["ppl"] for r in json.loads((run_dir / "results.json").read_text())["rows"]]


def _torchrun(*args: str, cwd: Path, nproc: int = 2, script: tuple[str, ...] = ("-m", "posexp")):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           *script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _close(a: dict[int, float], b: dict[int, float]) -> float:
    assert sorted(a) == sorted(b)
    return max(abs(a[s] - b[s]) for s in a)


def test_unknown_parallel_and_a_curve_under_fsdp_are_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = invoke("train", *TINY_RUN, "train.parallel=zero3")
    assert bad.exit_code == 2 and "train.parallel" in bad.stderr and "ddp, fsdp" in bad.stderr, bad.output
    curve = invoke("train", *TINY_RUN, "train.parallel=fsdp", "eval.during_training.every=5")
    assert curve.exit_code == 2 and "eval.during_training.every" in curve.stderr, curve.output
    assert len([line for line in (bad.stderr + curve.stderr).splitlines() if line.strip()]) == 2
    assert not (tmp_path / "outputs").exists()


def test_one_process_sharding_trains_like_ddp_and_checkpoints_in_shards(tmp_path):
    """A one-rank mesh: T5 (an encoder with parameters, at 10x the learning rate) under FSDP2 and activation
    checkpointing takes the steps a plain run takes; its resumable checkpoint is a DCP folder of safetensors."""
    plain, sharded = tmp_path / "plain", tmp_path / "fsdp"
    for run_dir, extra in ((plain, ()), (sharded, ("train.parallel=fsdp", "train.activation_checkpointing=true"))):
        result = invoke("train", *TINY_RUN, "encoder=t5", *CURVE, *extra, f"hydra.run.dir={run_dir}")
        assert result.exit_code == 0, result.output
    assert _close(_losses(sharded), _losses(plain)) < CURVE_TOLERANCE
    assert _ppl(sharded) == pytest.approx(_ppl(plain), rel=1e-4)
    pointer = json.loads((sharded / "checkpoint" / "resume.json").read_text())
    folder = sharded / "checkpoint" / pointer["weights"]
    assert folder.is_dir() and folder.suffix == ".dcp"
    assert {p.suffix for p in folder.iterdir()} == {".safetensors"}  # no pickle: loading executes no code
    results = json.loads((sharded / "results.json").read_text())
    assert results["run"]["config_hash"] == json.loads((plain / "results.json").read_text())["run"]["config_hash"]


@pytest.mark.slow  # three launches of four runs each, about a minute on 2 cores
def test_fsdp_ddp_and_one_process_take_the_same_loss_curve(tmp_path):
    """rope, alibi, t5 and fox: the loss of every step of fsdp on 2 processes equals ddp's on 2 and one
    process's, within CURVE_TOLERANCE nats."""
    sweep = ("-m", *TINY_RUN, *CURVE, f"encoder={','.join(ENCODINGS)}")
    single = invoke("train", *sweep, f"hydra.sweep.dir={tmp_path / 'one'}")
    assert single.exit_code == 0, single.output
    for parallel in ("ddp", "fsdp"):
        proc = _torchrun("train", *sweep, f"train.parallel={parallel}", f"hydra.sweep.dir={tmp_path / parallel}",
                         cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    for job, name in enumerate(ENCODINGS):
        one, ddp, fsdp = (_losses(tmp_path / kind / str(job)) for kind in ("one", "ddp", "fsdp"))
        assert len(one) == 20, name
        assert _close(fsdp, ddp) < CURVE_TOLERANCE, name
        assert _close(fsdp, one) < CURVE_TOLERANCE, name
        assert _ppl(tmp_path / "fsdp" / str(job)) == pytest.approx(_ppl(tmp_path / "one" / str(job)), rel=1e-4)


@pytest.mark.slow  # four runs, two of them on two processes
@pytest.mark.parametrize("stopped_on, resumed_on", [(2, 1), (1, 2)])
def test_a_sharded_run_resumes_at_another_world_size(tmp_path, stopped_on, resumed_on):
    """Stopped (SIGTERM) at step 8 on one world size, resumed on the other: the numbers of an uninterrupted run
    on the second (steps 1-8 came from the first, so equal up to float rounding)."""
    args = ("train", *TINY_RUN, *CURVE, "encoder=t5", "train.parallel=fsdp")

    def launch(nproc: int, *argv: str, script: tuple[str, ...] = ("-m", "posexp")):
        if nproc == 1:
            return subprocess.run([sys.executable, *script, *argv], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return _torchrun(*argv, cwd=tmp_path, nproc=nproc, script=script)

    stopped = launch(stopped_on, "7", *args, "hydra.run.dir=stopped", script=(str(STOP),))
    assert stopped.returncode != 0 and "SIGTERM at step 8 of 20" in stopped.stderr, stopped.stderr[-3000:]
    assert json.loads((tmp_path / "stopped/checkpoint/resume.json").read_text())["step"] == 8
    resumed = launch(resumed_on, "resume", "stopped")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = launch(resumed_on, *args, "hydra.run.dir=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert _close(_losses(tmp_path / "stopped"), _losses(tmp_path / "whole")) < CURVE_TOLERANCE
    assert _ppl(tmp_path / "stopped") == pytest.approx(_ppl(tmp_path / "whole"), rel=1e-5)
    later = json.loads((tmp_path / "stopped" / "results.json").read_text())["run"]["train"]
    assert later["resumed_at"] == [8] and later["processes"] == resumed_on


@pytest.mark.slow  # a training, an evaluation, a fine-tune and an export
def test_eval_finetune_export_and_load_run_read_a_sharded_run(tmp_path):
    """A sharded run's final weights are consolidated into checkpoint/model.safetensors: every reader of a run
    takes it as it takes a plain one, with the numbers training measured."""
    import posexp

    run = tmp_path / "run"
    assert invoke("train", *TINY_RUN, *CURVE, "train.parallel=fsdp", f"hydra.run.dir={run}").exit_code == 0
    trained = _ppl(run)
    again = invoke("eval", str(run), "eval.multiples=[1]")
    assert again.exit_code == 0, again.output
    assert _ppl(run) == pytest.approx(trained, rel=1e-9)
    loaded = posexp.load_run(run)
    assert sum(p.numel() for p in loaded.model.parameters()) > 0
    child = tmp_path / "child"
    tuned = invoke("finetune", str(run), "train_len=64", "train.steps=4", "train.warmup_steps=1",
                   "train.threads=1", "train.progress=false", "eval.tokens=1024", f"hydra.run.dir={child}")
    assert tuned.exit_code == 0, tuned.output
    assert json.loads((child / "results.json").read_text())["run"]["train"]["steps"] == 4
    exported = invoke("export", str(run), str(tmp_path / "hf"))
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_on_one_gpu_trains_in_bf16_and_resumes_from_its_shards(tmp_path):
    """World size 1 on CUDA (NCCL, a one-rank mesh), bf16 under the mixed-precision policy: trains, writes a DCP
    checkpoint and its consolidated weights, and evaluates. Never run yet: no GPU was lent when it was written."""
    run = tmp_path / "run"
    result = invoke("train", "experiment=smoke", "train.progress=false", "device=cuda", "precision=bf16",
                    "compile=false", "train.parallel=fsdp", "train.activation_checkpointing=true", *CURVE,
                    f"hydra.run.dir={run}")
    assert result.exit_code == 0, result.output
    assert (run / "checkpoint" / "model.safetensors").is_file()
    assert json.loads((run / "results.json").read_text())["run"]["train"]["precision"] == "bfloat16"
    assert all(math.isfinite(v) for v in _losses(run).values())
