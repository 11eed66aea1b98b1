"""Evaluation-time context extension: the formulas against transformers, and the encoder hooks."""

from __future__ import annotations

import math

import pytest
import torch

from posexp.encoders import create
from posexp.encoders.sinusoidal import sinusoidal_table
from posexp.errors import ConfigError
from posexp.encoders.scaling import ROTARY_SCALINGS, rope_frequencies, rope_scaling, yarn_attention_scaling
from posexp.evaluation.conformance.scalings import transformers_rope
from posexp.encoders.extension import check_scaling, encoders_supporting, scaled_encoder

SHAPES = [(32, 10000.0, 128), (64, 500000.0, 32), (16, 100.0, 256)]  # (head dim, base, train_len)
FACTORS = [1.0, 2.0, 4.0, 8.0, 16.0]


def _hf(kind: str, dim: int, base: float, train_len: int, factor: float, seq_len=None, **extra):
    """transformers' own inv_freq and attention scaling for a Llama config of head width ``dim``."""
    pytest.importorskip("transformers")
    return transformers_rope(kind, dim, base, train_len, factor, seq_len=seq_len, **extra)


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    # transformers computes in float32; ours is float64
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-6, atol=0)


@pytest.mark.parametrize("dim,base,train_len", SHAPES)
@pytest.mark.parametrize("factor", FACTORS)
def test_linear_matches_transformers(dim, base, train_len, factor):
    ours, att = rope_scaling("linear", dim, base, factor, train_len)
    theirs, their_att = _hf("linear", dim, base, train_len, factor)
    _close(ours, theirs)
    assert att == their_att == 1.0


@pytest.mark.parametrize("dim,base,train_len", SHAPES)
@pytest.mark.parametrize("factor", FACTORS)
def test_ntk_matches_transformers(dim, base, train_len, factor):
    """Static NTK-aware base = transformers' dynamic type with factor 1 read at s * train_len tokens."""
    ours, att = rope_scaling("ntk", dim, base, factor, train_len)
    theirs, their_att = _hf("dynamic", dim, base, train_len, 1.0, seq_len=int(factor * train_len))
    _close(ours, theirs)
    assert att == their_att == 1.0
    # and the closed form of bloc97 2023: base' = base * s^(d/(d-2))
    _close(ours, rope_frequencies(dim, base * factor ** (dim / (dim - 2))))


@pytest.mark.parametrize("dim,base,train_len", SHAPES)
@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0])
@pytest.mark.parametrize("multiple", [0.5, 1, 3, 16])
def test_dynamic_ntk_matches_transformers(dim, base, train_len, factor, multiple):
    seq_len = int(multiple * train_len)
    ours, _ = rope_scaling("dynamic_ntk", dim, base, factor, train_len, seq_len=seq_len)
    theirs, _ = _hf("dynamic", dim, base, train_len, factor, seq_len=seq_len)
    _close(ours, theirs)
    if seq_len <= train_len:  # nothing changes up to the training length
        _close(ours, rope_frequencies(dim, base))


@pytest.mark.parametrize("dim,base,train_len", SHAPES)
@pytest.mark.parametrize("factor", FACTORS)
def test_yarn_matches_transformers(dim, base, train_len, factor):
    ours, att = rope_scaling("yarn", dim, base, factor, train_len)
    theirs, their_att = _hf("yarn", dim, base, train_len, factor, original_max_position_embeddings=train_len)
    _close(ours, theirs)
    assert att == pytest.approx(their_att, rel=1e-12)
    assert att == pytest.approx(1.0 if factor == 1 else 0.1 * math.log(factor) + 1)  # sqrt(1/t), YaRN §3.4


@pytest.mark.parametrize("dim,base,train_len", SHAPES)
@pytest.mark.parametrize("factor", FACTORS)
def test_llama3_matches_transformers(dim, base, train_len, factor):
    ours, att = rope_scaling("llama3", dim, base, factor, train_len)
    theirs, their_att = _hf("llama3", dim, base, train_len, factor, original_max_position_embeddings=train_len,
                            low_freq_factor=1.0, high_freq_factor=4.0)
    _close(ours, theirs)
    assert att == their_att == 1.0


def test_yarn_keeps_fast_dimensions_and_interpolates_slow_ones():
    """NTK-by-parts (YaRN §3.2): wavelengths far below the context extrapolate, far above interpolate."""
    theta = rope_frequencies(64, 10000.0)
    scaled, _ = rope_scaling("yarn", 64, 10000.0, 8.0, 4096)
    turns = 4096 * theta / (2 * math.pi)  # r(d) = L / lambda_d
    fast, slow = turns > 32 * 1.5, turns < 1 / 1.5  # clear of the rounded ramp ends
    assert fast.sum() >= 8 and slow.sum() >= 8
    assert torch.equal(scaled[fast], theta[fast])  # many turns over the training context: unchanged
    torch.testing.assert_close(scaled[slow], theta[slow] / 8)  # under one turn: position interpolation
    assert torch.all(scaled <= theta) and torch.all(scaled >= theta / 8)


LONGROPE_FACTORS = {16: [1.0 + 0.25 * i for i in range(16)], 32: [1.0 + 0.1 * i for i in range(32)],
                    8: [1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 4.0]}


@pytest.mark.parametrize("dim,base,train_len", SHAPES)
@pytest.mark.parametrize("factor", FACTORS)
def test_longrope_matches_transformers(dim, base, train_len, factor):
    """LongRoPE (Ding et al. 2024): theta_i / lambda_i past the training length, and sqrt(1 + ln s / ln L)."""
    factors = LONGROPE_FACTORS[dim // 2]
    theirs, their_att = _hf("longrope", dim, base, train_len, factor, seq_len=int(factor * train_len),
                            long_factor=factors, short_factor=[1.0] * (dim // 2),
                            original_max_position_embeddings=train_len)
    ours, att = rope_scaling("longrope", dim, base, factor, train_len, factors=factors)
    _close(ours, theirs)
    assert att == pytest.approx(their_att, rel=1e-12)


def test_longrope_needs_one_factor_per_rotary_frequency_past_the_training_length():
    enc = create("rope", d_model=64, n_heads=2)
    for factors in (None, [2.0] * 3, [0.0] * 16):
        with pytest.raises(ConfigError, match=r"^eval\.longrope_factors: .*16 of them"):
            scaled_encoder(enc, "longrope", 4.0, 32, factors)
    unscaled = scaled_encoder(enc, "longrope", 1.0, 32)  # at the training length: RoPE as trained
    assert torch.equal(unscaled.inv_freq, enc.inv_freq) and unscaled.attention_scaling == 1.0


def test_longrope_reaches_every_rotary_layer_of_a_mix():
    factors = LONGROPE_FACTORS[16]
    expected = (rope_frequencies(32, 10000.0) / torch.tensor(factors, dtype=torch.float64)).float()
    for name in ("rope", "prope", "mixed", "irope"):
        enc = create(name, d_model=64, n_heads=2)
        enc.for_layers(4)  # as the model builds its layers before anything scales them
        layers = scaled_encoder(enc, "longrope", 4.0, 32, factors).for_layers(4)
        rotary = [e for e in layers if hasattr(e, "inv_freq")]
        assert rotary, name
        for e in rotary:
            n = getattr(e, "n_kept", 16)  # p-RoPE keeps its dropped frequencies at zero
            torch.testing.assert_close(e.inv_freq[:n], expected[:n])
            assert e.attention_scaling == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(32)))


# -- the encoder hooks -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ROTARY_SCALINGS)
def test_rope_with_scaling_returns_a_scaled_copy_and_leaves_the_original(kind):
    enc = create("rope", d_model=64, n_heads=2, base=10000.0)
    before = enc.inv_freq.clone()
    scaled = scaled_encoder(enc, kind, 4.0, 32)
    assert scaled is not enc and torch.equal(enc.inv_freq, before) and enc.scaling is None
    theta, att = scaled.frequencies(128)
    expected, expected_att = rope_scaling(kind, 32, 10000.0, 4.0, 32, seq_len=128)
    torch.testing.assert_close(theta, expected.float())
    assert att == pytest.approx(expected_att)


def test_rope_scaled_rotation_is_still_relative_and_yarn_scales_the_logits():
    torch.manual_seed(0)
    enc = create("rope", d_model=32, n_heads=1, base=10000.0)
    yarn = enc.with_scaling("yarn", 4.0, 16)
    q, k = torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32)

    def score(e, m, n):
        qr, kr = e.rotate(q, k, torch.tensor([m]), torch.tensor([n]))
        return (qr * kr).sum().item()

    assert score(yarn, 40, 30) == pytest.approx(score(yarn, 13, 3), rel=1e-4)  # depends on m - n only
    # at distance 0 the rotation cancels, so only YaRN's temperature is left: (0.1 ln s + 1)^2
    assert score(yarn, 7, 7) == pytest.approx(score(enc, 7, 7) * yarn_attention_scaling(4.0) ** 2, rel=1e-5)


def test_rope_linear_scaling_is_position_interpolation():
    """PI (Chen et al. 2023, §2.3): the scaled encoding at position m*s is the original at m."""
    torch.manual_seed(0)
    enc = create("rope", d_model=32, n_heads=1)
    pi = enc.with_scaling("linear", 4.0, 16)
    q, k = torch.randn(1, 1, 3, 32), torch.randn(1, 1, 3, 32)
    pos = torch.tensor([0, 5, 11])
    a = enc.rotate(q, k, pos, pos)
    b = pi.rotate(q, k, pos * 4, pos * 4)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_dynamic_ntk_follows_the_length_read():
    enc = create("rope", d_model=32, n_heads=1, base=10000.0).with_scaling("dynamic_ntk", 1.0, 16)
    short, _ = enc.frequencies(16)
    long, _ = enc.frequencies(64)
    torch.testing.assert_close(short, rope_frequencies(32, 10000.0).float())
    torch.testing.assert_close(long, rope_scaling("ntk", 32, 10000.0, 4.0, 16)[0].float())


def test_sinusoidal_linear_scaling_reads_fractional_positions():
    enc = create("sinusoidal", d_model=16, n_heads=2)
    pi = enc.with_scaling("linear", 4.0, 32)
    x = torch.zeros(1, 3, 16)
    pos = torch.tensor([0, 8, 100])
    torch.testing.assert_close(pi.embed(x, pos), sinusoidal_table(pos / 4, 16, 10000.0)[None])
    torch.testing.assert_close(pi.embed(x, pos * 4), enc.embed(x, pos))


def test_learned_linear_scaling_interpolates_the_table():
    torch.manual_seed(0)
    enc = create("learned", d_model=8, n_heads=2, max_length=16)
    pi = enc.with_scaling("linear", 4.0, 16)
    assert pi.max_length == 64 and pi.supports(64) and not pi.supports(65) and not enc.supports(64)
    assert enc.max_length == 16  # the original is untouched
    table = enc.wpe.weight.detach()
    x = torch.zeros(1, 4, 8)
    got = pi.embed(x, torch.tensor([0, 4, 6, 63]))[0].detach()
    torch.testing.assert_close(got[0], table[0])
    torch.testing.assert_close(got[1], table[1])  # position 4 -> row 1
    torch.testing.assert_close(got[2], (table[1] + table[2]) / 2)  # 6 -> 1.5: halfway
    torch.testing.assert_close(got[3], table[15])  # 63 -> 15.75: past the last row, takes it
    assert pi.wpe is enc.wpe  # shares the trained weights


@pytest.mark.parametrize("encoder", ["alibi", "t5", "none"])
def test_scaling_that_does_not_apply_names_the_key_and_the_encodings(encoder):
    with pytest.raises(ConfigError) as err:
        check_scaling("yarn", encoder)
    assert err.value.key == "eval.scaling"
    assert "rope" in str(err.value) and encoder in str(err.value)
    assert "learned" not in str(err.value).split("applies to")[1].split(";")[0]  # yarn is rotary only


def test_unknown_scaling_lists_the_choices():
    with pytest.raises(ConfigError) as err:
        check_scaling("rope2x", "rope")
    assert err.value.key == "eval.scaling" and "yarn" in str(err.value) and "llama3" in str(err.value)


def test_linear_applies_to_every_encoding_with_positions_to_interpolate():
    assert {"rope", "learned", "sinusoidal"} <= set(encoders_supporting("linear"))
    assert "alibi" not in encoders_supporting("linear")
