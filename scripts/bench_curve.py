"""Training-time overhead of eval.during_training at its default budget (target: <= 10% of training time).

    python scripts/bench_curve.py                              # the default run twice without, twice with every=25
    python scripts/bench_curve.py --every 50 --encoder alibi --threads 1 --steps 200 --repeats 1

Trains the same run as a user runs it (``posexp train`` in a fresh interpreter), without the curve and with
``eval.during_training.every=N`` at the default budget (``configs/eval/default.yaml``: 4 lengths, 1x-8x,
4,096 tokens each), alternately. A run records the curve's seconds apart from training's (results.json
``train.curve_s``; ``train.wall_s`` is training alone), so the overhead is read within one run, under the
same load: curve seconds over training seconds. The comparison across runs is printed beside it, with the
machine's load average (on a shared machine the other processes' load is part of every number, and swings
it), and the check that every run ends with the same perplexities.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def pairs(work: Path, repeats: int, common: tuple[str, ...], every: int) -> tuple[list[dict], list[dict]]:
    """``repeats`` runs without and with the curve, in the order ABBA... so that a load that rises or falls
    while the benchmark runs weighs on both alike."""
    plain, curved = [], []
    for i in range(repeats):
        for with_curve in ((False, True) if i % 2 == 0 else (True, False)):
            if with_curve:
                curved.append(train(work / f"curve{i}", *common, f"eval.during_training.every={every}"))
            else:
                plain.append(train(work / f"plain{i}", *common))
    return plain, curved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=25, help="eval.during_training.every (default 25: 20 points)")
    ap.add_argument("--encoder", default="rope", help="the encoder (default rope)")
    ap.add_argument("--threads", type=int, default=2, help="train.threads (default 2)")
    ap.add_argument("--steps", type=int, default=500, help="train.steps (default 500, the default run)")
    ap.add_argument("--repeats", type=int, default=2, help="runs without and with the curve, each (default 2)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="posexp-bench-curve-"))
    common = (f"encoder={args.encoder}", f"train.threads={args.threads}", f"train.steps={args.steps}",
              "precision=fp32")
    load_before = os.getloadavg()
    plain, curved = pairs(work, args.repeats, common, args.every)
    points = len({line.split(",")[0] for line in (work / "curve0" / "curve.csv").read_text().splitlines()[1:]})
    train_plain = statistics.median(r["run"]["train"]["wall_s"] for r in plain)
    train_curved = statistics.median(r["run"]["train"]["wall_s"] for r in curved)
    curve_s = statistics.median(r["run"]["train"]["curve_s"] for r in curved)
    within = statistics.median(r["run"]["train"]["curve_s"] / r["run"]["train"]["wall_s"] for r in curved)
    point_steps = curve_s / points / (train_curved / args.steps)
    same = all([r["ppl"] for r in p["rows"]] == [r["ppl"] for r in plain[0]["rows"]] for p in plain + curved)
    print(f"`posexp train {' '.join(common)}` [`eval.during_training.every={args.every}`], {args.repeats} runs each, "
          "medians:\n")
    print(f"- without the curve: training {train_plain:.1f} s")
    print(f"- with the curve: training {train_curved:.1f} s + curve {curve_s:.1f} s over {points} points "
          f"({curve_s / points:.2f} s a point = {point_steps:.1f} training steps)")
    print(f"- overhead: {100 * within:.1f}% of training time within a curve run (target <= {100 * TARGET:.0f}%: "
          f"{'met' if within <= TARGET else 'MISSED'}); across runs "
          f"{100 * ((train_curved + curve_s) / train_plain - 1):+.1f}% (the machine's other load included)")
    print(f"- every N steps that costs {100 * TARGET:.0f}%: N = {point_steps / TARGET:.0f}")
    print(f"- final perplexities identical with and without the curve: {'yes' if same else 'NO'}")
    print(f"- load average before / after: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
