"""A real training run stopped from outside at a random moment, as a user's Ctrl-C, a scheduler's preemption or a
kill -9 would stop it: SIGTERM finishes the step, checkpoints it and says how to resume in one line; SIGKILL leaves
the last checkpoint. Either way ``posexp resume`` ends with the numbers, the logged steps and the weights of a run
never stopped. (A SIGTERM sent while a chosen step runs, in this process, is
tests/integration/training/test_interruptions.py.)"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from helpers import invoke, start_cli
from helpers.resume import RESUMABLE, STEPS, logged_steps, numbers, results


def _last_complete_step(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    lines = metrics.read_text().split("\n")[1:-1]  # header; a last line without newline is not complete
    rows = [line.split(",") for line in lines]
    return max((int(r[0]) for r in rows if len(r) == 6 and r[0].isdigit()), default=0)


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    """Block until ``metrics.csv`` shows ``step`` and a resumable checkpoint exists (no clock involved)."""
    while _last_complete_step(run_dir / "metrics.csv") < step or \
            not (run_dir / "checkpoint" / "resume.json").exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before step {step}: {err[-2000:]}")
        time.sleep(0.01)  # polling only: no assertion depends on how long anything takes


@pytest.mark.slow  # the SIGTERM-mid-step test in tests/integration keeps stop-and-resume in the default suite
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_run_stopped_at_a_random_moment_resumes_to_identical_numbers(stop, full_run, tmp_path):
    seed = random.randrange(2**32)
    target = random.Random(seed).randint(2, STEPS // 2)
    run_dir = tmp_path / "run"
    proc = start_cli("train", *RESUMABLE, "hydra.run.dir=run", cwd=tmp_path)
    _wait_for_step(proc, run_dir, target)
    os.kill(proc.pid, stop)
    _, err = proc.communicate()
    if stop == signal.SIGTERM:  # the step it arrived in finishes and is checkpointed, with its metrics row
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"posexp resume {run_dir}" in lines[0], err
        stopped = _last_complete_step(run_dir / "metrics.csv")
        assert f"at step {stopped} of {STEPS}" in lines[0]
        assert json.loads((run_dir / "checkpoint" / "resume.json").read_text())["step"] == stopped
    else:
        assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "results.json").exists(), f"the run finished before it was stopped (seed {seed})"
    killed_at = json.loads((run_dir / "checkpoint" / "resume.json").read_text())["step"]

    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming {run_dir} at step {killed_at}" in resumed.stdout

    res, ref = results(run_dir), results(full_run)
    assert numbers(res) == numbers(ref), f"stop seed {seed}, checkpoint step {killed_at}"
    assert res["run"]["train"]["final_loss"] == ref["run"]["train"]["final_loss"]
    assert res["run"]["train"]["resumed_at"] == [killed_at]
    assert res["run"]["config_hash"] == ref["run"]["config_hash"]
    assert logged_steps(run_dir) == list(range(1, STEPS + 1))  # every step once: no duplicates, no gaps
    # the final weights are bitwise the same
    from safetensors.torch import load_file

    mine, theirs = (load_file(str(d / "checkpoint" / "model.safetensors")) for d in (run_dir, full_run))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # one step pair left, no temporary files of the stopped writer
    left = sorted(p.name for p in (run_dir / "checkpoint").iterdir())
    assert left == ["meta.json", "model.safetensors", "resume.json", f"step-{STEPS:08d}.safetensors",
                    f"step-{STEPS:08d}.state.pt"]
