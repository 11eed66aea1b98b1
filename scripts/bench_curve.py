"""Training-time overhead of eval.during_training at its default budget (target: <= 10% of training time).

    python scripts/bench_curve.py                              # the default run without, then with every=25
    python scripts/bench_curve.py --every 50 --encoder alibi --threads 1 --steps 200

Trains the same run twice, as a user runs it (``posexp train`` in a fresh interpreter): without the curve,
then with ``eval.during_training.every=N`` at the default budget (``configs/eval/default.yaml``: 4 lengths,
1x-8x, 4,096 tokens each). A run records the curve's seconds apart from training's (results.json
``train.curve_s``; ``train.wall_s`` is training alone), so the overhead is read within one run, under the
same load: curve seconds over training seconds. The two runs' training plus curve time is printed beside it,
with the machine's load average (on a shared machine the other processes' load is part of every number), and
the check that both runs end with the same perplexities.
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

TARGET = 0.10  # the curve may add at most this share to training time


def train(run_dir: Path, *overrides: str) -> dict:
    """``posexp train OVERRIDES`` into ``run_dir``; its results.json, with the command's wall time."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "posexp", "train", "train.progress=false", *overrides,
                    f"hydra.run.dir={run_dir}"], check=True, stdout=subprocess.DEVNULL)
    results = json.loads((run_dir / "results.json").read_text())
    results["command_s"] = time.perf_counter() - start
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=25, help="eval.during_training.every (default 25: 20 points)")
    ap.add_argument("--encoder", default="rope", help="the encoder (default rope)")
    ap.add_argument("--threads", type=int, default=2, help="train.threads (default 2)")
    ap.add_argument("--steps", type=int, default=500, help="train.steps (default 500, the default run)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="posexp-bench-curve-"))
    common = (f"encoder={args.encoder}", f"train.threads={args.threads}", f"train.steps={args.steps}",
              "precision=fp32")
    load_before = os.getloadavg()
    plain = train(work / "plain", *common)
    curved = train(work / "curve", *common, f"eval.during_training.every={args.every}")
    points = len({line.split(",")[0] for line in (work / "curve" / "curve.csv").read_text().splitlines()[1:]})
    train_plain, train_curved = plain["run"]["train"]["wall_s"], curved["run"]["train"]["wall_s"]
    curve_s = curved["run"]["train"]["curve_s"]
    step_s = train_curved / args.steps
    same = [r["ppl"] for r in plain["rows"]] == [r["ppl"] for r in curved["rows"]]
    print(f"posexp train {' '.join(common)} [eval.during_training.every={args.every}]")
    print(f"  without the curve: training {train_plain:.1f} s ({plain['run']['train']['tokens_per_s']:,.0f} tokens/s)")
    print(f"  with the curve:    training {train_curved:.1f} s + curve {curve_s:.1f} s over {points} points "
          f"({curve_s / points:.2f} s a point = {curve_s / points / step_s:.1f} training steps)")
    overhead = curve_s / train_curved
    print(f"  overhead: {100 * overhead:.1f}% of training time within the curve run (target <= {100 * TARGET:.0f}%: "
          f"{'met' if overhead <= TARGET else 'MISSED'}); across the two runs "
          f"{100 * ((train_curved + curve_s) / train_plain - 1):+.1f}%")
    print(f"  every N steps that costs {100 * TARGET:.0f}%: N = {curve_s / points / step_s / TARGET:.0f}")
    print(f"  final perplexities identical with and without the curve: {'yes' if same else 'NO'}")
    print(f"  load average before / after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
