"""Config checks that run before any data is read: non-finite numbers, encodings shorter than train_len."""

from __future__ import annotations

import pytest

from helpers import TINY_RUN, invoke_main
from posexp.errors import ConfigError
from posexp.commands.validation import validate
from posexp.commands.edge import typed


@pytest.mark.parametrize("override,key", [
    ("base=inf", "base"), ("train.lr=nan", "train.lr"), ("train.grad_clip=inf", "train.grad_clip"),
    ("eval.scaling=yarn", None), ("encoder=alibi", None),
    ("encoder=kerple", None), ("model.mlp_ratio=-inf", "model.mlp_ratio"),
    ("eval.scaling_factor=nan", "eval.scaling_factor"), ("train.checkpoint_minutes=inf", "train.checkpoint_minutes"),
])
def test_non_finite_numbers_are_refused_naming_the_key(compose, override, key):
    if key is None:  # the finite neighbours of the cases above still pass
        validate(typed(compose(override)))
        return
    with pytest.raises(ConfigError) as e:
        validate(typed(compose(override)))
    assert e.value.key == key and "finite" in str(e.value)


def test_a_non_finite_encoder_option_is_refused(compose):
    with pytest.raises(ConfigError) as e:
        validate(typed(compose("encoder=rope", "encoder.base=inf")))
    assert e.value.key in ("base", "encoder.base")


@pytest.mark.parametrize("overrides,key", [
    (("encoder=learned", "encoder.max_length=64"), "encoder.max_length"),
    (("encoder=binary", "encoder.bits=6"), "encoder.bits"),
])
def test_an_encoding_shorter_than_train_len_is_refused_before_training(compose, overrides, key):
    with pytest.raises(ConfigError) as e:
        validate(typed(compose(*overrides, "train_len=128")))
    assert e.value.key == key and "train_len=128" in str(e.value)
    validate(typed(compose(*overrides, "train_len=64")))  # exactly as long as the training length is fine


def test_posexp_train_refuses_inf_in_one_line(tmp_path):
    proc = invoke_main("train", *TINY_RUN, "base=inf", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.exit_code == 2
    assert proc.stderr.strip().splitlines() == ["error: base: must be a finite number (got inf)"]


@pytest.mark.parametrize("steps, warmup, warned", [(500, 60, False), (300, 100, False), (300, 101, True),
                                                   (20, 5, False), (12, 5, True)])
def test_a_warmup_over_a_third_of_the_run_is_warned(compose, steps, warmup, warned):
    from posexp.commands.validation import config_warnings

    notes = config_warnings(compose(f"train.steps={steps}", f"train.warmup_steps={warmup}"))
    third = [n for n in notes if "more than a third" in n]
    assert bool(third) == warned
    if warned:
        assert f"train.warmup_steps={warmup}" in third[0] and f"train.steps={steps}" in third[0]


def test_the_shipped_runs_are_not_warned_about_warmup(compose):
    from posexp.commands.validation import config_warnings

    for overrides in ((), ("experiment=smoke",), ("experiment=converged",), ("task=copy",)):
        assert config_warnings(compose(*overrides)) == [], overrides
