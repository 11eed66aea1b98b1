"""The resumable run the interruption tests stop and resume, and what they compare of it with an uninterrupted one."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from helpers import TINY_RUN

STEPS = 60
# log every step and checkpoint every 4: a kill usually lands between a checkpoint and the
# rows logged after it, which resume must drop and log again. T5: an encoder with parameters of
# its own, in an optimizer group at 10x the learning rate, which resume must restore too.
RESUMABLE = (*TINY_RUN, "encoder=t5", f"train.steps={STEPS}", "train.log_every=1", "train.checkpoint_every=4",
             "eval.multiples=[1,2]")


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def numbers(results: dict) -> list[tuple]:
    return [(r["length"], r["protocol"], r["ppl"], r["loss"], r["ppl_low"], r["ppl_high"]) for r in results["rows"]]


def logged_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]
