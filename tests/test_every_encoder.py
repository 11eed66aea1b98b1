"""Every shipped ``configs/encoder/*.yaml`` trains and evaluates end to end.

A new encoding (one file + one yaml) is picked up here with no other edit: it
must compose with the schema, train a few steps through the real trainer,
checkpoint, and produce a finite perplexity at the training length and every
length it claims to support.
"""

from __future__ import annotations

import json
import math

import pytest

from posexp.config.schema import config_dir
from posexp.commands.train import run_train

ENCODERS = sorted(p.stem for p in (config_dir() / "encoder").glob("*.yaml"))
TINY = ("train.steps=6", "train.log_every=3", "eval.tokens=256",
        "eval.multiples=[1,4]", "eval.loss_by_position=false")


def test_the_family_is_all_there():
    # the six of the core loop and the rest of the family; a yaml that disappears is a regression
    assert {"none", "sinusoidal", "learned", "rope", "alibi", "t5"} <= set(ENCODERS)
    assert len(ENCODERS) >= 18


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_trains_and_evaluates_end_to_end(tiny, tmp_path, name):
    overrides = [*TINY, f"encoder={name}"]
    results = run_train(tiny(*overrides), tmp_path, overrides)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["rows"] == results["rows"]
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    train_len = results["run"]["train_len"]
    rows = {r["length"]: r for r in results["rows"]}
    assert set(rows) == {train_len, 4 * train_len}
    assert rows[train_len]["applicable"], f"{name} must run at its own training length"
    for row in rows.values():
        if row["applicable"]:
            assert math.isfinite(row["ppl"]) and 1 < row["ppl"] < 256 * 4, (name, row)
        else:
            assert row["ppl"] is None and row["reason"], (name, row)
    # the loss went down from the uniform 5.55 nats of an untrained byte model
    assert results["run"]["train"]["final_loss"] < math.log(256)
