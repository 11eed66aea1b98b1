"""Training-time position tricks: randomized positions (Ruoss et al. 2023) and sequence-length warmup."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from posexp.config.schema import Config, EvalConfig, TrainConfig
from posexp.errors import ConfigError
from posexp.model.gpt import GPT
from posexp.model.positions import PositionPlan, curriculum_length, randomized_positions
from posexp.commands.edge import typed
from posexp.commands.train import run_train
from posexp.commands.validation import validate
from helpers import invoke

TINY = ("train.steps=8", "eval.multiples=[1,2,4]")  # on top of the shared tiny run (helpers.TINY_RUN)


def test_randomized_positions_are_sorted_distinct_and_in_range():
    rng = np.random.default_rng(0)
    for _ in range(50):
        pos = randomized_positions(64, 512, rng)
        assert pos.shape == (64,)
        assert np.all(np.diff(pos) > 0)  # strictly increasing: ordered and distinct
        assert pos.min() >= 0 and pos.max() < 512


def test_randomized_training_covers_every_test_position():
    # Ruoss et al. 2023, §3: training positions range over 0..L-1, so the positions of a
    # test sequence longer than the training length are no longer out of distribution.
    plan_cfg = _cfg(positions="randomized", max_position=256, train_len=32, steps=400)
    plan = PositionPlan(plan_cfg)
    seen = np.zeros(256, dtype=bool)
    gaps = []
    for step in range(400):
        pos = plan.train_positions(step, 32, torch.device("cpu")).numpy()
        seen[pos] = True
        gaps.extend(np.diff(pos))
    assert seen.all()  # every position up to max_position - 1 was trained on
    assert max(gaps) > 1 and min(gaps) == 1  # gaps of many sizes, not just the contiguous 1
    contiguous = PositionPlan(_cfg(positions="contiguous", train_len=32, steps=400))
    assert contiguous.train_positions(0, 32, torch.device("cpu")) is None  # the model's own 0..L-1


def test_position_draws_are_a_function_of_seed_and_step():
    plan = PositionPlan(_cfg(positions="randomized", max_position=128, train_len=16, steps=10))
    cpu = torch.device("cpu")
    assert torch.equal(plan.train_positions(3, 16, cpu), plan.train_positions(3, 16, cpu))  # resumable
    assert not torch.equal(plan.train_positions(3, 16, cpu), plan.train_positions(4, 16, cpu))
    other_seed = PositionPlan(_cfg(positions="randomized", max_position=128, train_len=16, steps=10, seed=1))
    assert not torch.equal(plan.train_positions(3, 16, cpu), other_seed.train_positions(3, 16, cpu))
    np.testing.assert_array_equal(plan.eval_positions(64), plan.eval_positions(64))
    assert plan.eval_supports(128) and not plan.eval_supports(129)


def test_curriculum_grows_linearly_in_multiples_of_8_then_holds():
    lengths = [curriculum_length(s, 128, 16, 100) for s in range(150)]
    assert lengths[0] == 16 and lengths[100:] == [128] * 50
    assert all(a <= b for a, b in zip(lengths, lengths[1:]))  # never shrinks
    assert all(n % 8 == 0 for n in lengths)
    # halfway: 16 + 112 / 2 = 72, the linear pacing of Li et al. 2022
    assert lengths[50] == 72
    assert curriculum_length(7, 100, 12, 0) == 100  # no warmup steps: the full length at once


def test_training_feeds_the_drawn_positions_and_the_curriculum_lengths(tiny, tmp_path, monkeypatch):
    cfg = tiny(*TINY, "train.positions=randomized", "train.max_position=256", "train.curriculum=linear",
                  "train.curriculum_steps=4", "train.curriculum_start_len=8")
    seen = []
    original = GPT.token_losses

    def spy(self, idx, targets, pos=None):
        if self.training:
            seen.append((idx.shape[1], None if pos is None else pos.clone()))
        return original(self, idx, targets, pos)

    monkeypatch.setattr(GPT, "token_losses", spy)
    results = run_train(cfg, tmp_path / "run", ["train.positions=randomized"])
    plan = PositionPlan(typed(cfg))
    assert [n for n, _ in seen] == [plan.length_at(s) for s in range(8)]
    assert seen[0][0] == 8 and seen[-1][0] == cfg.train_len
    for step, (n, pos) in enumerate(seen):
        assert torch.equal(pos, plan.train_positions(step, n, torch.device("cpu")))
    assert max(int(p.max()) for _, p in seen) >= cfg.train_len  # positions past the training length
    metrics = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    tokens = [int(line.split(",")[1]) for line in metrics[1:]]
    assert tokens[-1] == cfg.train.batch_size * sum(n for n, _ in seen)  # tokens actually trained on
    assert results["run"]["train"]["positions"]["scheme"] == "randomized"


def test_learned_table_trained_with_randomized_positions_answers_past_the_training_length(tiny, tmp_path):
    # a learned table of max_position rows, all of them trained: lengths up to it become applicable
    cfg = tiny(*TINY, "encoder=learned", "encoder.max_length=128", "train.positions=randomized",
                  "train.max_position=128")
    results = run_train(cfg, tmp_path / "run", ["encoder=learned", "train.positions=randomized"])
    rows = {r["length"]: r for r in results["rows"]}
    assert [rows[n]["applicable"] for n in (32, 64, 128)] == [True, True, True]
    assert all(np.isfinite(rows[n]["ppl"]) for n in (32, 64, 128))
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["run"]["train"]["positions"]["max_position"] == 128

    plain = run_train(tiny(*TINY, "encoder=learned"), tmp_path / "plain", ["encoder=learned"])
    assert [r["applicable"] for r in plain["rows"]] == [True, False, False]


def test_lengths_past_max_position_are_not_applicable(tiny, tmp_path):
    cfg = tiny(*TINY, "train.positions=randomized", "train.max_position=64")
    results = run_train(cfg, tmp_path / "run", [])
    rows = {r["length"]: r for r in results["rows"]}
    assert rows[64]["applicable"] and not rows[128]["applicable"]
    assert "train.max_position" in rows[128]["reason"]


@pytest.mark.parametrize("scheme", ["randomized", "pose"])
def test_a_run_whose_position_range_came_from_its_eval_lengths_is_evaluated_at_other_lengths(tiny, tmp_path, scheme):
    # train.max_position (randomized) and train.pose_target_len (pose) default to the longest eval length, 128
    # here: posexp eval at other lengths keeps the range the run trained with, not the one its new lengths give
    run = tmp_path / "run"
    trained = run_train(tiny(*TINY, f"train.positions={scheme}"), run, [f"train.positions={scheme}"])
    result = invoke("eval", str(run), "eval.lengths=[64,256]")
    assert result.exit_code == 0, result.output
    rows = {r["length"]: r for r in json.loads((run / "results.json").read_text())["rows"]}
    before = {r["length"]: r for r in trained["rows"]}
    assert rows[64]["ppl"] == pytest.approx(before[64]["ppl"], rel=1e-6)  # positions drawn as in training
    if scheme == "randomized":
        assert not rows[256]["applicable"] and "train.max_position" in rows[256]["reason"]
    else:
        assert rows[256]["applicable"]  # PoSE evaluates at contiguous positions, any length


@pytest.mark.parametrize("overrides, key", [
    (("train.positions=shuffled",), "train.positions"),
    (("train.curriculum=cosine",), "train.curriculum"),
    (("train.max_position=512",), "train.max_position"),  # without randomized positions
    (("train.positions=randomized", "train.max_position=16"), "train.max_position"),  # below train_len
    (("train.positions=randomized", "encoder=learned", "train.max_position=512"), "train.max_position"),
    (("train.curriculum=linear", "train.curriculum_start_len=1000"), "train.curriculum_start_len"),
    (("train.curriculum=linear", "train.curriculum_steps=99"), "train.curriculum_steps"),
    (("train.curriculum_steps=4",), "train.curriculum_steps"),  # without a curriculum
])
def test_bad_position_options_are_refused_naming_the_key(tiny, overrides, key):
    cfg = tiny(*TINY, *overrides)
    with pytest.raises(ConfigError) as err:
        validate(typed(cfg))
    assert err.value.key == key


def _cfg(positions: str, train_len: int, steps: int, max_position=None, seed: int = 0) -> Config:
    return Config(seed=seed, train_len=train_len, eval=EvalConfig(multiples=[1, 2, 4]),
                  train=TrainConfig(positions=positions, max_position=max_position, steps=steps))
