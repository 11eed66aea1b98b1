"""What shapes the weights: one rule (config.weights_config) behind the run-folder hash and the cache key."""

from __future__ import annotations

import hashlib
import json

import pytest

from posexp.config.identity import HASH_ALSO, NOT_WEIGHTS, config_hash, weights_config

# (overrides, config_hash, SHA-256 of the training config the sweep cache keyed on) as computed by
# posexp 616cc01, the last version with two separate rules: run folders and cache entries written by it
# must keep their hash and their cache hits.
SAVED = [
    ((), "80c57723529b77b5", "eaeefade355ebd34"),
    (("encoder=t5",), "fb2ae6334337bc46", "86c88fbbd640e3b1"),
    (("encoder=rope", "train.positions=randomized"), "3dbf273a440bd12e", "b31333ed6c732efc"),
    (("encoder=mixed", "encoder.layers=[rope,none]"), "1838981de8ae212c", "29a417d60ca935c8"),
    (("train.threads=1", "train.progress=false"), "c69f2024ccf8b243", "eaeefade355ebd34"),
    (("encoder=alibi", "seed=3", "train.steps=10", "data.cache_dir=/tmp/x"), "1545700f775b0963", "6daaf024be2ea731"),
    (("encoder=learned", "encoder.lr_mult=2", "compile=true", "precision=fp32"), "499c92de535224b7",
     "2549a95bafdc591c"),
]


def _digest(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@pytest.mark.parametrize("overrides,saved_hash,saved_cache", SAVED, ids=[" ".join(c[0]) or "default" for c in SAVED])
def test_saved_runs_keep_their_hash_and_cache_hits(compose, overrides, saved_hash, saved_cache):
    cfg = compose(*overrides)
    assert config_hash(cfg) == saved_hash
    assert _digest(weights_config(cfg)) == saved_cache


@pytest.mark.parametrize("dotted", sorted(NOT_WEIGHTS))
def test_keys_that_do_not_shape_the_weights_leave_the_cache_key_alone(compose, dotted):
    cfg = compose()
    group, _, key = dotted.rpartition(".")
    assert key not in (weights_config(cfg).get(group, {}) if group else weights_config(cfg))
    assert NOT_WEIGHTS[dotted].strip(), f"{dotted} needs its reason"


@pytest.mark.parametrize("override", ["train.lr=0.001", "seed=1", "model.d_model=64", "encoder=alibi",
                                      "train_len=64", "tokenizer=bpe", "model.init=pytorch",
                                      "model.tie_embeddings=false"])
def test_keys_that_shape_the_weights_change_hash_and_cache_key(compose, override):
    plain, changed = compose(), compose(override)
    assert config_hash(changed) != config_hash(plain)
    assert _digest(weights_config(changed)) != _digest(weights_config(plain))


def test_the_hash_differs_from_the_rule_only_where_it_says(compose):
    """Of the keys the rule leaves out, only HASH_ALSO reach the hash (format 1 hashed them)."""
    plain = compose()
    for dotted in NOT_WEIGHTS:
        if dotted in HASH_ALSO or not dotted.startswith(("train.", "data.", "tokenizer.")):
            continue
        value = {"train.progress": "false", "train.log_every": "7", "train.checkpoint_every": "3",
                 "train.checkpoint_minutes": "2.5", "data.on_bad_file": "skip"}[dotted]
        assert config_hash(compose(f"{dotted}={value}")) == config_hash(plain), dotted
    assert config_hash(compose("train.threads=3")) != config_hash(plain)


def test_randomized_positions_key_on_the_range_eval_lengths_imply(compose):
    """The default range of train.positions=randomized comes from the eval lengths: the cache keys on it."""
    short = compose("train.positions=randomized", "eval.multiples=[1,2]")
    long = compose("train.positions=randomized", "eval.multiples=[1,16]")
    assert weights_config(short)["train"]["max_position"] == 256
    assert weights_config(long)["train"]["max_position"] == 2048
    assert _digest(weights_config(short)) != _digest(weights_config(long))
