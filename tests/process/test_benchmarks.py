"""The benchmark scripts as a user runs them: ``scripts/bench.py --gpu``'s code paths on a CPU (``--dry-run``), so the
one command a GPU session runs is known to parse, build every posexp model, train, evaluate and write its JSON; and
``scripts/bench_eval.py``'s memory target, which reads a fresh process's own peak (its RSS over its lifetime)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO

SCRIPTS = REPO / "scripts"


def test_gpu_benchmark_dry_run_on_a_cpu_and_without_a_gpu_says_so(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "--gpu", "--dry-run", "--no-peers",
                           "--families", "rope", "alibi", "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "measure nothing" in proc.stdout
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and result["matmul_peak"]["tflops"] > 0
    train = {(r["family"], r["seq"]): r for r in result["training"]}
    assert set(train) == {(f, n) for f in ("rope", "alibi") for n in (64, 128)}
    assert all("error" not in r and r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in train.values()), train
    evals = {(r["family"], r["length"]): r for r in result["evaluation"]}
    assert set(evals) == {(f, n) for f in ("rope", "alibi") for n in (256, 512)}
    assert all("error" not in r and r["tokens_per_s"] > 0 for r in evals.values()), evals

    if not torch.cuda.is_available():  # the real benchmark, asked for on a machine without CUDA: one line
        proc = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "--gpu"], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode != 0 and "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("encoder", ["alibi", "t5", "rope"])
def test_16k_tokens_fit_the_memory_target(encoder):
    """scripts/bench_eval.py's measurement: one 16,384-token window of the default model under 1.5 GiB."""
    bench = SCRIPTS / "bench_eval.py"
    proc = subprocess.run([sys.executable, str(bench), "--one", encoder, "16384"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["process_peak_mib"] < 1536 and row["eval_peak_mib"] < 1536
