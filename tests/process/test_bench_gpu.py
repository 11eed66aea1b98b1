"""``scripts/bench.py --gpu``: the GPU benchmark's code paths run on a CPU (``--dry-run``), so the one command
a GPU session runs is known to parse, build every posexp model, train, evaluate and write its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
