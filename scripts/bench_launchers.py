"""Wall time of one sweep with Hydra's basic launcher (one run after another) and with joblib (parallel).

    python scripts/bench_launchers.py                     # 4 runs, joblib with 2 jobs at once
    python scripts/bench_launchers.py --runs 4 --n-jobs 2 --steps 400 --repeats 2 --json bench.json

Both sweeps are the same command, ``posexp train -m experiment=smoke seed=0,1,...``
with ``train.steps`` raised so that training, not interpreter start-up, dominates
each run; the joblib one adds ``hydra/launcher=joblib hydra.launcher.n_jobs=N``.
The basic launcher runs the jobs one after another in one process on all cores
(and once more with ``train.threads=1``, to tell the gain of running runs side by
side from the gain of fewer threads per run); joblib runs N at once, each on
floor(cores / N) torch threads (posexp/commands/sweeps.py).
Repeats alternate the two launchers, so a load change on a shared machine hits
both. Also reported: each run's training throughput (results.json), which shows
how much of the difference is parallelism and how much is start-up.
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

from posexp.runs.atomic import atomic_write_json


def sweep(launcher: list[str], runs: int, steps: int, workdir: Path) -> dict:
    """Run one sweep in a fresh interpreter; wall seconds and the runs' training throughput."""
    out = workdir / f"sweep-{time.time_ns()}"
    cmd = [sys.executable, "-m", "posexp", "train", "-m", *launcher, "experiment=smoke", "train.progress=false",
           f"train.steps={steps}", "eval.loss_by_position=false", f"seed={','.join(map(str, range(runs)))}",
           f"hydra.sweep.dir={out}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    rows = [json.loads(p.read_text())["run"]["train"] for p in sorted(out.glob("*/results.json"))]
    return {"wall_s": wall, "runs": len(rows), "train_wall_s": [r["wall_s"] for r in rows],
            "tokens_per_s": [r["tokens_per_s"] for r in rows], "threads": [r["threads"] for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs in the sweep (seeds 0..runs-1)")
    ap.add_argument("--n-jobs", type=int, default=2, help="joblib: runs at once")
    ap.add_argument("--steps", type=int, default=400, help="training steps per run (experiment=smoke: 20)")
    ap.add_argument("--repeats", type=int, default=1, help="times each sweep is run, alternating")
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    args = ap.parse_args()

    # "basic 1 thread" separates the two effects: parallel runs vs fewer threads per run
    launchers = {"basic": [], "basic-1-thread": ["train.threads=1"],
                 "joblib": ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}"]}
    results: dict[str, list[dict]] = {name: [] for name in launchers}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="posexp-bench-launchers-") as tmp:
        for _ in range(args.repeats):
            for name, extra in launchers.items():
                results[name].append(sweep(extra, args.runs, args.steps, Path(tmp)))
                print(f"{name:>6}: {results[name][-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]

    print(f"\n{args.runs} runs of experiment=smoke train.steps={args.steps} on {os.cpu_count()} cores "
          f"(load average {load_before:.1f} before, {load_after:.1f} after)")
    print(f"{'launcher':<28}{'sweep wall s':>14}{'train tokens/s per run':>26}{'threads':>9}")
    for name, reps in results.items():
        walls = [r["wall_s"] for r in reps]
        tps = [t for r in reps for t in r["tokens_per_s"]]
        label = {"basic": "basic (serial)", "basic-1-thread": "basic, train.threads=1"}.get(
            name, f"joblib n_jobs={args.n_jobs}")
        spread = f" ±{statistics.stdev(walls):.1f}" if len(walls) > 1 else ""
        print(f"{label:<28}{statistics.median(walls):>10.1f}{spread:<4}{statistics.median(tps):>26,.0f}"
              f"{reps[0]['threads'][0]:>9}")
    speedup = statistics.median(r["wall_s"] for r in results["basic"]) / \
        statistics.median(r["wall_s"] for r in results["joblib"])
    vs_one = statistics.median(r["wall_s"] for r in results["basic-1-thread"]) / \
        statistics.median(r["wall_s"] for r in results["joblib"])
    print(f"joblib speed-up: {speedup:.2f}x over basic, {vs_one:.2f}x over basic with 1 thread (median wall time)")
    if args.json:
        atomic_write_json(args.json, {"args": {k: str(v) for k, v in vars(args).items()},
                                      "load_average": [load_before, load_after], "results": results,
                                      "speedup": speedup, "speedup_vs_1_thread": vs_one})


if __name__ == "__main__":
    main()
