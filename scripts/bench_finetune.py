"""Wall time of a 200-step ``posexp finetune`` of the default run to 512 tokens (target: <= 2 minutes, 2 cores).

    python scripts/bench_finetune.py                          # trains the default run first (~3 min), then times
    python scripts/bench_finetune.py --parent outputs/DATE/TIME --threads 2 --scaling yarn

The fine-tune runs as a user runs it (``posexp finetune`` in a fresh interpreter) with
``configs/train/finetune.yaml``'s recipe and ``configs/finetune.yaml``'s evaluation (512, 1024, 2048).
Prints the command's wall time, the training and evaluation parts from its results.json, and the
machine's load average: on a shared machine the other processes' load is part of the number.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def posexp(*args: str) -> float:
    """Run ``posexp ARGS``; returns its wall time in seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "posexp", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parent", type=Path, help="a finished default run (trained at 128); default: train one")
    ap.add_argument("--threads", type=int, default=2, help="train.threads of the fine-tune (default 2)")
    ap.add_argument("--scaling", default="linear", help="the fine-tune's scaling (default linear)")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="posexp-bench-finetune-"))
    parent = args.parent
    if parent is None:
        parent = work / "parent"
        print(f"training the default run in {parent} ({posexp('train', 'train.progress=false', f'hydra.run.dir={parent}'):.0f} s)")
    child = work / "child"
    load_before = os.getloadavg()
    wall = posexp("finetune", str(parent), "train_len=512", f"scaling={args.scaling}", f"train.steps={args.steps}",
                  f"train.threads={args.threads}", "train.progress=false", f"hydra.run.dir={child}")
    run = json.loads((child / "results.json").read_text())
    train_s = run["run"]["train"]["wall_s"]
    eval_s = sum(r.get("eval_s") or 0 for r in run["rows"])
    print(f"posexp finetune {parent} train_len=512 scaling={args.scaling} train.steps={args.steps} "
          f"train.threads={args.threads}")
    print(f"  wall {wall:.0f} s (target <= 120 s): training {train_s:.0f} s "
          f"({run['run']['train']['tokens_per_s']:,.0f} tokens/s), evaluation {eval_s:.0f} s, the rest start-up")
    print(f"  load average before / after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
