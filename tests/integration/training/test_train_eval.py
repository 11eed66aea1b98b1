"""Trainer and evaluator: schedule, determinism, the evaluation protocol."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from posexp.commands.edge import typed
from posexp.config.schema import eval_lengths
from posexp.encoders import create
from posexp.evaluation.perplexity import eval_budget
from helpers import evaluate_at
from posexp.model.gpt import GPT, ModelShape
from posexp.commands.train import run_train
from posexp.training.optim import lr_at

TINY = ("train.steps=6", "eval.multiples=[1,2]")  # on the shared tiny run (helpers.TINY_RUN)


def test_lr_warms_up_then_decays_to_the_floor(compose):
    cfg = compose("train.lr=0.01", "train.warmup_steps=10", "train.steps=110", "train.min_lr_ratio=0.1")
    lrs = [lr_at(s, cfg.train) for s in range(110)]
    assert lrs[0] == pytest.approx(0.001) and lrs[9] == pytest.approx(0.01)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # cosine falls
    assert lr_at(110, cfg.train) == pytest.approx(0.001)  # ends at min_lr_ratio * lr
    assert lrs[60] == pytest.approx(0.001 + 0.5 * 0.009, rel=1e-6)  # halfway down the cosine


def _trained_weights(run_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoint" / "model.safetensors"))


def test_encoder_lr_mult_scales_only_the_encoders_own_steps(tiny, tmp_path):
    """AdamW's first step moves each parameter by about lr (times the sign of its gradient), so with
    encoder.lr_mult=10 T5's biases (zero at the start) move ten times as far; every other weight,
    whose gradient is the same in both runs at the first step, takes exactly the same step."""
    after = {}
    for mult in (1, 10):
        overrides = [*TINY, "train.steps=1", "train.warmup_steps=1", "encoder=t5", f"encoder.lr_mult={mult}"]
        run_train(tiny(*overrides), tmp_path / str(mult), overrides)
        after[mult] = _trained_weights(tmp_path / str(mult))
    key = "encoder.relative_attention_bias.weight"
    moved = {m: w[key][w[key] != 0].abs() for m, w in after.items()}
    assert moved[1].numel() > 0 and moved[1].max() < 1.5 * 3e-3  # ~lr: train.lr is 3e-3
    assert torch.allclose(moved[10], 10 * moved[1], rtol=1e-3)
    others = [k for k in after[1] if not k.startswith("encoder.")]
    assert others and all(torch.equal(after[1][k], after[10][k]) for k in others)


def test_encoder_lr_mult_defaults_and_groups(compose):
    from posexp.model.factory import build_encoder, build_model
    from posexp.training.optim import make_optimizer

    assert compose("encoder=t5").encoder.lr_mult == create("t5", d_model=16, n_heads=2).lr_mult
    assert compose("encoder=rope").encoder.lr_mult == 1.0
    cfg = typed(compose("experiment=smoke", "encoder=kerple", "encoder.lr_mult=4"))
    assert build_encoder(cfg).lr_mult == 4.0
    model = build_model(cfg, 256)
    groups = make_optimizer(model, cfg.train).param_groups
    encoder_params = {id(p) for p in model.encoder.parameters()}
    assert encoder_params
    for g in groups:
        ids = {id(p) for p in g["params"]}
        if ids & encoder_params:
            assert ids <= encoder_params and g["lr_mult"] == 4.0 and g["weight_decay"] == 0.0
        else:
            assert g["lr_mult"] == 1.0
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


# which of an encoder's parameters its authors' optimizer weight-decays, by their rule: FoX (Lin et al. 2025,
# forgetting_transformer/utils.py group_parameters: nn.Linear weights, no bias, train.bias_weight_decay false),
# CABLE (axiomlab/Cable src/Cable.py configure_optimizers: every tensor of 2+ dimensions), and posexp's rule for
# encoders whose papers give none (nothing decayed)
AUTHORS_DECAY = {"fox": lambda name, p: name.endswith("weight"), "cable": lambda name, p: p.dim() >= 2,
                 "kerple": lambda name, p: False, "fire": lambda name, p: False, "t5": lambda name, p: False}


@pytest.mark.parametrize("name", sorted(AUTHORS_DECAY))
def test_an_encoders_parameters_are_weight_decayed_as_its_authors_optimizer_does(compose, name):
    from posexp.model.factory import build_model
    from posexp.training.optim import make_optimizer

    cfg = typed(compose("experiment=smoke", f"encoder={name}", "train.weight_decay=0.05"))
    model = build_model(cfg, 256)
    decay_of = {id(p): g["weight_decay"] for g in make_optimizer(model, cfg.train).param_groups for p in g["params"]}
    params = list(model.encoder.named_parameters())
    assert params and len(decay_of) == len(list(model.parameters()))
    expected = {pname: 0.05 if AUTHORS_DECAY[name](pname, p) else 0.0 for pname, p in params}
    assert {pname: decay_of[id(p)] for pname, p in params} == expected
    assert any(v > 0 for v in expected.values()) == (name in ("fox", "cable"))  # every layer's gate or map too


@pytest.mark.parametrize("name", ["cable", "fox", "path", "pope"])
def test_encoder_lr_mult_reaches_every_layers_own_parameters(compose, name):
    from posexp.model.factory import build_model
    from posexp.training.optim import make_optimizer

    cfg = typed(compose("experiment=smoke", f"encoder={name}", "encoder.lr_mult=4", "model.n_layers=3"))
    model = build_model(cfg, 256)
    mult_of = {id(p): g["lr_mult"] for g in make_optimizer(model, cfg.train).param_groups for p in g["params"]}
    params = dict(model.encoder.named_parameters())
    assert any(n.startswith("other_layers.1.") for n in params)  # the third layer's own
    assert {n: mult_of[id(p)] for n, p in params.items()} == {n: 4.0 for n in params}


def test_eval_lengths_default_to_multiples_of_train_len(compose):
    assert eval_lengths(compose("train_len=100")) == [100, 200, 400, 800, 1600]
    assert eval_lengths(compose("eval.lengths=[512,128,128]")) == [128, 512]


def test_same_budget_of_target_tokens_at_every_length():
    val = (np.arange(20_000) % 256).astype(np.uint8)
    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), create("alibi", d_model=16, n_heads=2))
    rows = evaluate_at(model, val, [64, 128, 512], train_len=64, tokens=5000, batch_tokens=1024,
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
    row = evaluate_at(model, val, [50], train_len=50, tokens=400, batch_tokens=120, device=torch.device("cpu"))[0]
    ids = torch.from_numpy(val[:401].astype(np.int64))
    losses = []
    with torch.no_grad():
        for i in range(8):
            w = ids[i * 50:i * 50 + 51][None]
            losses.append(torch.nn.functional.cross_entropy(model(w[:, :-1])[0], w[0, 1:]))
    assert row["loss"] == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5)
    assert row["windows"] == 8 and row["tokens"] == 400


def test_same_seed_same_numbers(tiny, tmp_path):
    overrides = [*TINY, "encoder=t5"]
    a = run_train(tiny(*overrides), tmp_path / "a", overrides)
    b = run_train(tiny(*overrides), tmp_path / "b", overrides)
    assert [r["loss"] for r in a["rows"]] == [r["loss"] for r in b["rows"]]
    numbers = lambda res: [(r["ppl"], r["loss"], r["ppl_low"], r["ppl_high"]) for r in res["rows"]]  # noqa: E731
    assert numbers(a) == numbers(b)  # exactly, not approximately
    assert a["run"]["train"]["final_loss"] == b["run"]["train"]["final_loss"]
    assert (tmp_path / "a" / "metrics.csv").read_text().split("\n")[0] == "step,tokens,loss,lr,tokens_per_s,elapsed_s"
    losses = [[line.split(",")[2] for line in (tmp_path / d / "metrics.csv").read_text().splitlines()[1:]]
              for d in ("a", "b")]
    assert losses[0] == losses[1]  # the whole training curve, not only the end
    assert a["run"]["config_hash"] == b["run"]["config_hash"]
    c = run_train(tiny(*overrides, "seed=1"), tmp_path / "c", [*overrides, "seed=1"])
    assert [r["loss"] for r in c["rows"]] != [r["loss"] for r in a["rows"]]
    on_disk = json.loads((tmp_path / "a" / "results.json").read_text())
    assert on_disk["rows"][0]["loss"] == a["rows"][0]["loss"]
