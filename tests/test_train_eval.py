"""Trainer and evaluator: schedule, determinism, the evaluation protocol."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from posexp.config import eval_lengths
from posexp.encoders import create
from posexp.evaluate import eval_budget, evaluate
from posexp.model import GPT, ModelShape
from posexp.run import run_train
from posexp.train import lr_at

TINY = ("experiment=smoke", "train.progress=false", "train.steps=6", "eval.multiples=[1,2]")


def test_lr_warms_up_then_decays_to_the_floor(compose):
    cfg = compose("train.lr=0.01", "train.warmup_steps=10", "train.steps=110", "train.min_lr_ratio=0.1")
    lrs = [lr_at(s, cfg) for s in range(110)]
    assert lrs[0] == pytest.approx(0.001) and lrs[9] == pytest.approx(0.01)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # cosine falls
    assert lr_at(110, cfg) == pytest.approx(0.001)  # ends at min_lr_ratio * lr
    assert lrs[60] == pytest.approx(0.001 + 0.5 * 0.009, rel=1e-6)  # halfway down the cosine


def test_eval_lengths_default_to_multiples_of_train_len(compose):
    assert eval_lengths(compose("train_len=100")) == [100, 200, 400, 800, 1600]
    assert eval_lengths(compose("eval.lengths=[512,128,128]")) == [128, 512]


def test_same_budget_of_target_tokens_at_every_length():
    val = (np.arange(20_000) % 256).astype(np.uint8)
    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), create("alibi", d_model=16, n_heads=2))
    rows = evaluate(model, val, [64, 128, 512], train_len=64, tokens=5000, batch_tokens=1024,
                    device=torch.device("cpu"))
    assert eval_budget(5000, val.size, 512) == 4608
    assert [r["tokens"] for r in rows] == [4608, 4608, 4608]
    assert [r["windows"] for r in rows] == [72, 36, 9]
    for r in rows:
        assert r["ppl"] == pytest.approx(math.exp(r["loss"]))


def test_evaluation_matches_a_direct_computation():
    """Non-overlapping windows of L+1 tokens, every target scored: recomputed by hand."""
    torch.manual_seed(0)
    val = torch.randint(0, 256, (1000,), dtype=torch.uint8).numpy()
    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), create("rope", d_model=16, n_heads=2)).eval()
    row = evaluate(model, val, [50], train_len=50, tokens=400, batch_tokens=120, device=torch.device("cpu"))[0]
    ids = torch.from_numpy(val[:401].astype(np.int64))
    losses = []
    with torch.no_grad():
        for i in range(8):
            w = ids[i * 50:i * 50 + 51][None]
            losses.append(torch.nn.functional.cross_entropy(model(w[:, :-1])[0], w[0, 1:]))
    assert row["loss"] == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5)
    assert row["windows"] == 8 and row["tokens"] == 400


def test_same_seed_same_numbers(compose, tmp_path):
    overrides = [*TINY, "encoder=t5"]
    a = run_train(compose(*overrides), tmp_path / "a", overrides)
    b = run_train(compose(*overrides), tmp_path / "b", overrides)
    assert [r["loss"] for r in a["rows"]] == [r["loss"] for r in b["rows"]]
    numbers = lambda res: [(r["ppl"], r["loss"], r["ppl_low"], r["ppl_high"]) for r in res["rows"]]  # noqa: E731
    assert numbers(a) == numbers(b)  # exactly, not approximately
    assert a["run"]["train"]["final_loss"] == b["run"]["train"]["final_loss"]
    assert (tmp_path / "a" / "metrics.csv").read_text().split("\n")[0] == "step,tokens,loss,lr,tokens_per_s,elapsed_s"
    losses = [[line.split(",")[2] for line in (tmp_path / d / "metrics.csv").read_text().splitlines()[1:]]
              for d in ("a", "b")]
    assert losses[0] == losses[1]  # the whole training curve, not only the end
    assert a["run"]["config_hash"] == b["run"]["config_hash"]
    c = run_train(compose(*overrides, "seed=1"), tmp_path / "c", [*overrides, "seed=1"])
    assert [r["loss"] for r in c["rows"]] != [r["loss"] for r in a["rows"]]
    on_disk = json.loads((tmp_path / "a" / "results.json").read_text())
    assert on_disk["rows"][0]["loss"] == a["rows"][0]["loss"]
