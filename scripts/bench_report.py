"""How long ``posexp report`` takes over many runs.

    python scripts/bench_report.py                    # 100 runs, --by encoder,base, 3 repeats
    python scripts/bench_report.py --runs 300 --repeats 5
    python scripts/bench_report.py --keep /tmp/fake   # leave the fabricated runs there

Fabricates run folders in a temporary folder, shaped like the ones ``posexp train``
writes with the default settings (results.json with the full ``run`` record and
one row per length at 1x..16x of a 128-token training length, loss_by_position.csv
with every position of every window length, metrics.csv, .hydra/config.yaml and
overrides.yaml): 10 encodings x 2 bases x 5 seeds for 100 runs, written by the
functions a run writes its folder with (``posexp.runs``), the config from the schemas'
defaults and its ``config_hash``. The perplexities and the corpus are made up (the
corpus is named ``fabricated``); the point is the time to read, group, tabulate and
draw them.

Then it times the whole command as a user runs it (a fresh ``posexp report``
process: Python start, imports, reading, the table, report.md and four figures),
and, for comparison, ``posexp --help`` (start-up and imports alone). "first
output" is when the table's first line arrives; the figures are drawn after it.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from posexp.config.identity import config_hash
from posexp.config.schema import DataConfig, EvalConfig, ModelConfig, TokenizerConfig, TrainConfig
from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import (HYDRA_CONFIG, HYDRA_OVERRIDES, METRICS_CSV, MULTIRUN_YAML, write_loss_by_position_csv,
                                write_results_json)
from posexp.runs.provenance import git_commit, run_label, versions

ENCODERS = ["none", "sinusoidal", "learned", "rope", "alibi", "t5", "kerple", "fire", "xpos", "shaw"]
BASES = [100.0, 10000.0]
TRAIN_LEN = 128
MULTIPLES = [1, 2, 4, 8, 16]
# the fabricated runs' corpus: one name and fingerprint for all, so the report compares them, and never
# mistaken for a real corpus's
CORPUS = {"corpus": "fabricated", "corpus_fingerprint": hashlib.sha256(b"scripts/bench_report.py").hexdigest()[:16],
          "corpus_source": "made up by scripts/bench_report.py", "tokenizer": "byte", "vocab_size": 256}


def _config(encoder: str, base: float, seed: int) -> dict:
    """The default run's config, from the schemas' own defaults, with this run's encoder, base and seed."""
    group = lambda schema: OmegaConf.to_container(OmegaConf.structured(schema))  # noqa: E731
    config = {"encoder": {"name": encoder}, "data": group(DataConfig), "tokenizer": group(TokenizerConfig),
              "model": group(ModelConfig), "train": group(TrainConfig), "eval": group(EvalConfig),
              "base": base, "train_len": TRAIN_LEN, "seed": seed}
    config["train"]["threads"] = 1
    config["eval"]["multiples"] = MULTIPLES
    return config


def _rows(encoder: str, slope: float, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """results.json rows at 1x..16x and loss_by_position.csv rows, the loss rising past train_len by ``slope``."""
    rows, positions = [], []
    for m in MULTIPLES:
        length = m * TRAIN_LEN
        applicable = not (encoder == "learned" and length > TRAIN_LEN)
        loss = 1.6 + slope * math.log2(m) + rng.gauss(0, 0.02)
        ppl = math.exp(loss) if applicable else None
        rows.append({
            "length": length, "multiple": float(m), "protocol": "nonoverlap", "stride": None, "last_k": None,
            "scaling": None, "scaling_factor": None, "applicable": applicable, "ppl": ppl,
            "loss": loss if applicable else None, "loss_se": 0.015 if applicable else None,
            "ppl_low": ppl * 0.97 if applicable else None, "ppl_high": ppl * 1.03 if applicable else None,
            "se_blocks": 65536 // length, "tokens": 65536, "targets": [1, 65536], "windows": 65536 // length,
            "forward_tokens": 65536, "tokens_per_s": 90000.0, "peak_mem_mb": 20.0, "peak_rss_mb": 400.0,
            "mem_measure": "rss high-water mark (VmHWM reset per length)", "batch_windows": 128,
            "attn_block_size": 256, "oom_retries": 0, "eval_s": 0.7,
        })
        if applicable:
            # loss falls with context, then rises past the training length by the run's slope
            positions += [{"protocol": "nonoverlap", "stride": None, "last_k": None, "scaling": None,
                           "scaling_factor": None, "length": length, "position": p, "count": 65536 // length,
                           "loss": 1.2 + 0.8 / (p + 1) + slope * max(0, p - TRAIN_LEN) / length}
                          for p in range(length)]
    return rows, positions


def _run_record(encoder: str, base: float, seed: int, overrides: list[str], config: dict) -> dict:
    """results.json's ``run``: what a finished default run records, with the provenance of this machine."""
    return {
        "label": run_label(overrides), "overrides": overrides, "encoder": encoder,
        "base": base if encoder in ("sinusoidal", "rope", "xpos") else None, "train_len": TRAIN_LEN,
        "seed": seed, "config": config, "config_hash": config_hash(OmegaConf.create(config)), **CORPUS,
        "train_tokens": 10894723, "val_tokens": 1224650, "files": 734, "val_files": 42, "split": "by_file",
        "eval_settings": {"tokens": 65536, "protocol": "nonoverlap"},
        "versions": versions(), "python_version": versions()["python"], "git_commit": git_commit(),
        "status": "completed", "params": 427808,
        "train": {"steps": 500, "tokens": 2048000, "final_loss": 1.6, "wall_s": 150.0, "tokens_per_s": 15000.0,
                  "precision": "float32", "device": "cpu", "threads": 1},
    }


def fabricate(root: Path, n_runs: int) -> None:
    """Write ``n_runs`` run folders (0/, 1/, ...) and a multirun.yaml under ``root``, like a sweep.

    Each is written by the functions a run writes its folder with (``posexp.runs``): results.json,
    loss_by_position.csv, and the file names of the run-folder layout.
    """
    rng = random.Random(0)
    combos = [(e, b) for e in ENCODERS for b in BASES]
    for i in range(n_runs):
        encoder, base = combos[i % len(combos)]
        seed = i // len(combos)
        folder = root / str(i)
        (folder / HYDRA_CONFIG).parent.mkdir(parents=True)
        overrides = [f"encoder={encoder}", f"base={base:g}", f"seed={seed}", "train.threads=1"]
        config = _config(encoder, base, seed)
        rows, positions = _rows(encoder, rng.uniform(0.0, 0.5), rng)
        write_results_json(folder, {"run": _run_record(encoder, base, seed, overrides, config), "rows": rows})
        write_loss_by_position_csv(folder, positions)
        metrics = ["step,tokens,loss,lr,tokens_per_s,elapsed_s"]
        metrics += [f"{s},{s * 4096},{4.5 * math.exp(-s / 150) + 1.5:.6f},0.003,15000.0,{s * 0.27:.3f}"
                    for s in range(25, 551, 25)]
        atomic_write_text(folder / METRICS_CSV, "\n".join(metrics) + "\n")
        atomic_write_text(folder / HYDRA_OVERRIDES, OmegaConf.to_yaml(overrides))
        atomic_write_text(folder / HYDRA_CONFIG, OmegaConf.to_yaml(config))
    atomic_write_text(root / MULTIRUN_YAML, "hydra: {}\n")


def _time(cmd: list[str], repeats: int) -> tuple[list[float], list[float], list[float]]:
    """Wall-clock seconds to the first line on stdout (the table) and to the end, and CPU seconds, per run.

    CPU time (user + system) is what the command itself costs; on a busy machine the
    wall clock also counts waiting for a core, so both are printed.
    """
    firsts, walls, cpus = [], [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first_line = proc.stdout.readline()
        firsts.append(time.perf_counter() - start)
        rest, err = proc.communicate()
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0 or not (first_line + rest).strip():
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
    return firsts, walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--by", default="encoder,base")
    parser.add_argument("--keep", type=Path, help="fabricate the runs here and leave them")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    root = args.keep or Path(tempfile.mkdtemp(prefix="posexp-bench-report-"))
    try:
        if not (root / "multirun.yaml").is_file():
            fabricate(root, args.runs)
        posexp = [sys.executable, "-m", "posexp"]
        startup = _time([*posexp, "--help"], args.repeats)
        report = _time([*posexp, "report", str(root), "--by", args.by, "--out", str(root / "report")],
                       args.repeats)
        plain = _time([*posexp, "report", str(root), "--format", "csv", "--out", str(root / "report_plain")],
                      args.repeats)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)

    def fmt(times: tuple[list[float], list[float], list[float]]) -> str:
        firsts, walls, cpus = times
        return (f"first output {statistics.median(firsts):5.2f} s, done after {statistics.median(walls):5.2f} s "
                f"(min {min(walls):.2f}), CPU {statistics.median(cpus):5.2f} s")

    print(f"{args.runs} fabricated runs, {args.repeats} repeats each, a fresh process each time "
          f"(1-minute load average before: {load:.1f} on {os.cpu_count()} cores); medians:")
    print(f"  posexp --help (start-up and imports only)     {fmt(startup)}")
    print(f"  posexp report DIR --by {args.by:<22} {fmt(report)}")
    print(f"  posexp report DIR --format csv (one per run)  {fmt(plain)}")


if __name__ == "__main__":
    main()
