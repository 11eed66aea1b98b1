"""PoSE, positional skip-wise training (Zhu et al. 2024): ``train.positions=pose`` with ``train.pose_target_len``.

What a user relies on: a window of ``train_len`` tokens is read at positions reaching the target length, in two
contiguous chunks whose sizes and skip are drawn as the authors' code draws them; training feeds exactly those
positions, evaluation reads ordinary ones, and the run records what it did.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posexp.commands.edge import typed
from posexp.commands.train import run_train
from posexp.commands.validation import validate
from posexp.config.identity import config_hash
from posexp.config.schema import Config, EvalConfig, TrainConfig
from posexp.errors import ConfigError
from posexp.model.gpt import GPT
from posexp.model.positions import PositionPlan, pose_positions

TINY = ("train.steps=6", "eval.multiples=[1,2,4]")


def _reference(length: int, target_len: int, first: int, skip: int) -> np.ndarray:
    """Zhu et al. 2024, §3.2 with N = 2 chunks: chunk i holds the tokens ``st_i .. et_i`` at positions
    ``st_i + u_i .. et_i + u_i``; u_1 = 0 (the authors' code), u_2 = ``skip``; chunk 1 is ``0 .. first - 1``."""
    assert 1 <= first <= (length + 1) // 2 and 0 <= skip <= target_len - length
    return np.array([i if i < first else i + skip for i in range(length)])


@pytest.mark.parametrize("length,target", [(128, 512), (128, 2048), (2048, 16384), (7, 7), (1, 10)])
def test_positions_are_the_papers_two_skipped_chunks(length, target):
    rng, replay = np.random.default_rng(3), np.random.default_rng(3)
    for _ in range(200):
        pos = pose_positions(length, target, rng)
        first = int(replay.integers(1, (length + 1) // 2, endpoint=True))
        skip = int(replay.integers(0, target - length, endpoint=True))
        np.testing.assert_array_equal(pos, _reference(length, target, first, skip))
        assert pos[0] == 0 and pos[-1] <= target - 1  # within the target length
        jumps = np.flatnonzero(np.diff(pos) != 1)
        assert len(jumps) <= 1 and np.all(np.diff(pos) >= 1)  # two contiguous chunks, in order


def test_positions_span_the_target_and_the_skip_is_uniform():
    """The property PoSE claims: training at ``L`` covers every relative distance up to the target length, the
    skip bias drawn uniformly over ``0 .. T - L`` and the first chunk's length over ``1 .. (L + 1) // 2``."""
    length, target, draws = 16, 64, 20000
    rng = np.random.default_rng(0)
    skips, firsts, distances = [], [], np.zeros(target, dtype=bool)
    for _ in range(draws):
        pos = pose_positions(length, target, rng)
        cut = np.flatnonzero(np.diff(pos) != 1)
        first = int(cut[0]) + 1 if len(cut) else length  # no jump: skip 0 (or one chunk)
        firsts.append(first)
        skips.append(int(pos[-1] - (length - 1)))
        distances[np.unique(pos[-1] - pos)] = True
    assert distances.all()  # every distance 0 .. T - 1 was trained on
    counts = np.bincount(skips, minlength=target - length + 1)
    assert len(counts) == target - length + 1  # never past T - L
    expected = draws / (target - length + 1)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))  # uniform within 5 sigma
    assert sum((counts - expected) ** 2 / expected) < 100  # chi-square, 48 dof: p < 1e-4 above 100
    jumped = [f for f, s in zip(firsts, skips) if s > 0]
    assert min(jumped) == 1 and max(jumped) == (length + 1) // 2


def test_the_plan_draws_per_step_and_evaluates_contiguously():
    plan = PositionPlan(_cfg(train_len=32, target=256))
    cpu = torch.device("cpu")
    a, b = plan.train_positions(5, 32, cpu), plan.train_positions(5, 32, cpu)
    assert torch.equal(a, b) and not torch.equal(a, plan.train_positions(6, 32, cpu))  # resumable
    assert plan.eval_positions(1024) is None and plan.eval_supports(4096)  # evaluation: 0 .. L - 1
    assert plan.describe()["target_len"] == 256
    default = PositionPlan(_cfg(train_len=32, target=None))
    assert default.target_len == 4 * 32  # the longest eval length


def test_training_feeds_pose_positions_and_records_them(tiny, tmp_path, monkeypatch):
    cfg = tiny(*TINY, "train.positions=pose", "train.pose_target_len=256")
    seen = []
    original = GPT.token_losses

    def spy(self, idx, targets, pos=None):
        if self.training:
            seen.append(pos.clone())
        return original(self, idx, targets, pos)

    monkeypatch.setattr(GPT, "token_losses", spy)
    results = run_train(cfg, tmp_path / "run", ["train.positions=pose"])
    plan = PositionPlan(typed(cfg))
    assert len(seen) == 6
    for step, pos in enumerate(seen):
        assert torch.equal(pos, plan.train_positions(step, cfg.train_len, torch.device("cpu")))
    assert max(int(p.max()) for p in seen) >= cfg.train_len  # positions past the training length
    recorded = results["run"]["train"]["positions"]
    assert recorded["scheme"] == "pose" and recorded["target_len"] == 256


def test_pose_keys_keep_other_runs_hash_and_the_target_shapes_the_weights(tiny):
    plain = typed(tiny(*TINY))
    assert plain.train.pose_target_len is None
    short, long = typed(tiny(*TINY, "train.positions=pose", "train.pose_target_len=128")), \
        typed(tiny(*TINY, "train.positions=pose", "train.pose_target_len=256"))
    assert len({config_hash(plain), config_hash(short), config_hash(long)}) == 3
    # the default target is the longest eval length, made explicit in the hash
    implied = typed(tiny("train.steps=6", "eval.multiples=[1,2,8]", "train.positions=pose"))
    assert config_hash(implied) == config_hash(typed(tiny("train.steps=6", "eval.multiples=[1,2,8]",
                                                         "train.positions=pose", "train.pose_target_len=256")))


@pytest.mark.parametrize("overrides", [
    ("train.pose_target_len=512",),  # without pose
    ("train.positions=pose", "train.pose_target_len=16"),  # below train_len
    ("train.positions=pose", "encoder=learned", "train.pose_target_len=4096"),  # past the table
])
def test_bad_pose_options_are_refused_naming_the_key(tiny, overrides):
    with pytest.raises(ConfigError) as err:
        validate(typed(tiny(*TINY, *overrides)))
    assert err.value.key == "train.pose_target_len"


def _cfg(train_len: int, target) -> Config:
    return Config(seed=0, train_len=train_len, eval=EvalConfig(multiples=[1, 2, 4]),
                  train=TrainConfig(positions="pose", pose_target_len=target, steps=10))


def test_a_pose_fine_tune_trains_at_the_parents_length_toward_its_target(trained):
    """``posexp finetune RUN train.positions=pose``: PoSE extends the context without long windows, so the new
    run keeps the parent's train_len; with an interpolation its factor is target / parent length (the authors'
    ``rope_scaling_factor``)."""
    from hydra import compose, initialize_config_dir

    from posexp.commands.finetune import check_finetune
    from posexp.commands.validation import register_configs
    from posexp.config.schema import config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        app = compose("finetune", overrides=[f"parent={trained}", "train.positions=pose", "scaling=linear",
                                             "train.pose_target_len=256"])
        plain = compose("finetune", overrides=[f"parent={trained}", "train.positions=pose"])
    child = check_finetune(app)
    assert child.train_len == 32 and child.train.positions == "pose"  # experiment=smoke's train_len
    assert child.finetune.scaling_factor == 256 / 32
    default = check_finetune(plain)
    assert default.train_len == 32 and PositionPlan(default).target_len == 4 * 32  # eval multiples [1, 2, 4]
