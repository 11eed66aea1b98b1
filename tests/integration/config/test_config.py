"""What shapes the weights: one rule (config.identity.weights_config) behind the run-folder hash and the cache
key."""

from __future__ import annotations

import hashlib
import json

import pytest
from omegaconf import OmegaConf

from posexp.commands.edge import typed
from posexp.config.identity import NOT_WEIGHTS, config_dict, config_hash, weights_config
from posexp.data.corpus import data_kind, tokenizer_spec
# (overrides, config_hash, SHA-256 of the training config the sweep cache keys on): the hashes as posexp de5c9a3
# computed them, the cache keys as posexp 616cc01 did (the last version with two separate rules). Run folders and
# cache entries written since keep their hash and their cache hits.
SAVED = [
    ((), "11a6c3e4ec2c77a3", "eaeefade355ebd34"),
    (("encoder=t5",), "e97a4fcbe3eb617d", "86c88fbbd640e3b1"),
    (("encoder=rope", "train.positions=randomized"), "b59e068417f1d82c", "b31333ed6c732efc"),
    (("encoder=mixed", "encoder.layers=[rope,none]"), "546591382e9e8d1e", "29a417d60ca935c8"),
    (("train.threads=1", "train.progress=false"), "11a6c3e4ec2c77a3", "eaeefade355ebd34"),
    (("encoder=alibi", "seed=3", "train.steps=10", "data.cache_dir=/tmp/x"), "bc19821815a7e94d", "6daaf024be2ea731"),
    (("encoder=learned", "encoder.lr_mult=2", "compile=true", "precision=fp32"), "36afd6b54914b01d",
     "2549a95bafdc591c"),
]


# encoders whose code a fix changed (PositionalEncoder.revision), with the hash of their default run before the fix
# (posexp bf8540c): FoPE's coefficients drawn as Hua et al.'s code draws them; FoX's gates and CABLE's bias maps
# weight-decayed as their authors' optimizers do; encoder.lr_mult on every layer's parameters of the encoders with
# one set per layer (FoX, CABLE, PaTH, PoPE), not the first layer's only
REVISED = [("fope", 2, "e17c6000c8ae0b9c"), ("fox", 2, "d2f38fa6d72e3d2b"), ("cable", 2, "387eafe4803ffa3e"),
           ("path", 2, "0e0688d8e1281c60"), ("pope", 2, "af151e40d2fce0ab")]


def _digest(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@pytest.mark.parametrize("overrides,saved_hash,saved_cache", SAVED, ids=[" ".join(c[0]) or "default" for c in SAVED])
def test_saved_runs_keep_their_hash_and_cache_hits(compose, overrides, saved_hash, saved_cache):
    """A run folder still hashes to what it recorded; a cache entry keeps its key."""
    cfg = compose(*overrides)
    assert config_dict(typed(cfg)) == OmegaConf.to_container(cfg, resolve=True)  # the config as Hydra saves it
    assert config_hash(typed(cfg)) == saved_hash
    assert _digest(weights_config(typed(cfg))) == saved_cache


@pytest.mark.parametrize("name,revision,hash_before", REVISED, ids=[r[0] for r in REVISED])
def test_a_revised_encoder_hashes_new_runs_apart_and_runs_of_before_as_recorded(compose, name, revision, hash_before):
    """A new run records the encoder's revision, so neither its hash nor its cache key is a run's of before the fix;
    a run of before (its config has no revision) still hashes to what it recorded, and its encoder still builds."""
    from posexp.encoders import create
    from posexp.errors import ConfigError

    new = OmegaConf.to_container(compose(f"encoder={name}"), resolve=True)
    assert new["encoder"]["revision"] == revision
    before = {**new, "encoder": {k: v for k, v in new["encoder"].items() if k != "revision"}}
    assert config_hash(typed(OmegaConf.create(before))) == hash_before
    assert config_hash(typed(OmegaConf.create(new))) != hash_before
    assert weights_config(typed(OmegaConf.create(new))) != weights_config(typed(OmegaConf.create(before)))
    create(name, 64, 2)
    with pytest.raises(ConfigError, match=f"^encoder.revision: is the revision of {name}'s code, {revision} in this"):
        create(name, 64, 2, revision=revision - 1)


@pytest.mark.parametrize("layers", ["[rope,fox]", "[fope,cable]", "[path,pope]"])
def test_a_new_mix_of_revised_encoders_records_their_revisions_and_hashes_apart(compose, layers):
    """A mix's layers train with their encoders' current code, so a new mix records each revised layer's revision
    as the mix's option for that layer (what the encoder alone records as encoder.revision): neither its hash nor
    its cache key is that of a mix of the same layers trained before their fix, whose config records none."""
    from posexp.commands.train import check_config

    spec = check_config(compose("encoder=mixed", f"encoder.layers={layers}"))
    names = layers.strip("[]").split(",")
    assert spec.encoder["options"] == {n: {"revision": 2} for n in names if n in {r[0] for r in REVISED}}
    before = typed(compose("encoder=mixed", f"encoder.layers={layers}"))
    assert before.encoder["options"] is None
    assert config_hash(spec) != config_hash(before)
    assert weights_config(spec) != weights_config(before)


def test_a_new_mix_of_encoders_never_revised_keeps_the_hash_of_the_mixes_of_before(compose):
    from posexp.commands.train import check_config

    assert config_hash(check_config(compose("encoder=mixed", "encoder.layers=[rope,none]"))) == "546591382e9e8d1e"


@pytest.mark.parametrize("dotted", sorted(NOT_WEIGHTS))
def test_keys_that_do_not_shape_the_weights_leave_the_cache_key_alone(compose, dotted):
    weights = weights_config(typed(compose()))
    group, _, key = dotted.rpartition(".")
    assert key not in (weights.get(group, {}) if group else weights)
    assert NOT_WEIGHTS[dotted].strip(), f"{dotted} needs its reason"


@pytest.mark.parametrize("override", ["train.lr=0.001", "seed=1", "model.d_model=64", "encoder=alibi",
                                      "train_len=64", "tokenizer=bpe", "model.init=pytorch",
                                      "model.tie_embeddings=false", "base=500", "precision=bf16",
                                      "encoder.lr_mult=2"])
def test_keys_that_shape_the_weights_change_hash_and_cache_key(compose, override):
    plain, changed = typed(compose()), typed(compose(override))
    assert config_hash(changed) != config_hash(plain)
    assert _digest(weights_config(changed)) != _digest(weights_config(plain))


@pytest.mark.parametrize("override", ["train.threads=3", "train.progress=false", "train.log_every=7",
                                      "train.checkpoint_every=3", "train.checkpoint_minutes=2.5",
                                      "data.cache_dir=/tmp/x", "data.description=x", "tokenizer.description=x",
                                      "eval.multiples=[1,2]", "eval.tokens=4096", "cache=true", "objective=mean",
                                      "logger=tensorboard", "compile=true", "data.on_bad_file=skip"])
def test_keys_that_do_not_shape_the_weights_leave_the_hash_alone(compose, override):
    """The hash new runs record covers what shapes the weights only: thread count, logging, checkpoint timing,
    where the token cache lies, evaluation, trackers and compiling leave it as it was."""
    assert config_hash(typed(compose(override))) == config_hash(typed(compose()))


def test_a_base_the_encoder_does_not_read_leaves_the_hash_alone(compose):
    """``base`` reaches the weights as ``encoder.base``; ALiBi has none, so ``base=`` cannot change its weights."""
    assert config_hash(typed(compose("encoder=alibi", "base=500"))) == config_hash(typed(compose("encoder=alibi")))


def test_the_typed_config_reads_the_tokenizer_and_the_loader(compose):
    """Read from the typed config: tokenizer=bpe is BPE (not byte), data=wikitext103 loads through hf."""
    spec = typed(compose("tokenizer=bpe", "data=wikitext103"))
    assert tokenizer_spec(spec).name == "bpe"
    assert data_kind(spec.data) == "hf"
    assert data_kind(typed(compose()).data) == "stdlib"


def test_randomized_positions_key_on_the_range_eval_lengths_imply(compose):
    """The default range of train.positions=randomized comes from the eval lengths: the cache keys on it."""
    short = typed(compose("train.positions=randomized", "eval.multiples=[1,2]"))
    long = typed(compose("train.positions=randomized", "eval.multiples=[1,16]"))
    assert weights_config(short)["train"]["max_position"] == 256
    assert weights_config(long)["train"]["max_position"] == 2048
    assert _digest(weights_config(short)) != _digest(weights_config(long))
