"""The newer encodings (p-RoPE, FoPE, Resonance RoPE, iRoPE) and Scalable-Softmax: what each paper claims."""

from __future__ import annotations

import math

import pytest
import torch

from posexp.encoders import create
from posexp.encoders.fope import clipped_frequencies
from posexp.encoders.frequencies import rope_frequencies
from posexp.encoders.irope import attention_temperature, irope_layers
from posexp.encoders.scaling import yarn_frequencies
from posexp.encoders.extension import scaled_encoder
from posexp.model.gpt import GPT, AttentionPlan, CausalSelfAttention, ModelShape
from posexp.model.window import AttentionWindow, layer_window, visible_keys

D_MODEL, N_HEADS = 64, 2  # head width 32: 16 rotary frequencies
HEAD_DIM = D_MODEL // N_HEADS


def _qk(L: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, N_HEADS, L, HEAD_DIM, generator=g), torch.randn(1, N_HEADS, L, HEAD_DIM, generator=g)


def _logits(enc, q, k, shift: int = 0) -> torch.Tensor:
    pos = torch.arange(q.shape[2]) + shift
    qr, kr = enc.rotate(q, k, pos, pos)
    return qr @ kr.transpose(-1, -2)


def _pairs(i: int) -> list[int]:
    """The two features of rotary pair ``i`` (pairs as halves)."""
    return [i, i + HEAD_DIM // 2]


# -- p-RoPE (Barbero et al. 2024) -------------------------------------------------------------------------------


def test_prope_with_every_frequency_kept_is_rope():
    q, k = _qk()
    assert torch.allclose(_logits(create("prope", D_MODEL, N_HEADS, p=1.0), q, k),
                          _logits(create("rope", D_MODEL, N_HEADS), q, k), atol=1e-6)


def test_prope_leaves_its_lowest_frequencies_unrotated_and_keeps_ropes_highest():
    enc = create("prope", D_MODEL, N_HEADS, p=0.75)
    assert enc.n_kept == 12  # round(0.75 * 16)
    theta = rope_frequencies(HEAD_DIM, 10000.0).float()
    assert torch.equal(enc.inv_freq[:12], theta[:12])  # RoPE's own, not a schedule squeezed into fewer pairs
    q, k = _qk()
    pos = torch.arange(1000, 1012)
    qr, kr = enc.rotate(q, k, pos, pos)
    nope = sum((_pairs(i) for i in range(12, 16)), [])
    assert torch.equal(qr[..., nope], q[..., nope]) and torch.equal(kr[..., nope], k[..., nope])
    rotated = sum((_pairs(i) for i in range(12)), [])
    assert not torch.allclose(qr[..., rotated], q[..., rotated])


def test_prope_is_relative_and_its_scalings_keep_the_dropped_frequencies_at_zero():
    enc = create("prope", D_MODEL, N_HEADS, p=0.5)
    q, k = _qk()
    assert torch.allclose(_logits(enc, q, k), _logits(enc, q, k, shift=777), atol=1e-4)
    for kind in ("linear", "ntk", "yarn", "llama3"):
        scaled = enc.with_scaling(kind, 4.0, 128)
        assert torch.all(scaled.inv_freq[8:] == 0) and torch.all(scaled.inv_freq[:8] > 0), kind


# -- FoPE (Hua et al. 2024) -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["hope", "prope", "resonance"])
def test_a_rope_variants_refusals_name_the_encoder_asked_for(name):
    from posexp.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^model.d_model: {name} rotates pairs of features"):
        create(name, 36, 4)  # a head of 9 features
    with pytest.raises(ConfigError, match=f"must be > 1 for {name} "):
        create(name, 32, 2, base=1.0)


def test_fope_clips_every_frequency_that_completes_no_period_in_training():
    train_len = 100
    enc = create("fope", D_MODEL, N_HEADS, train_len=train_len)
    theta = rope_frequencies(HEAD_DIM, 10000.0)
    periods = 2 * math.pi / theta
    assert enc.n_kept == int((periods <= train_len).sum()) and 0 < enc.n_kept < HEAD_DIM // 2
    assert torch.all(2 * math.pi / enc.inv_freq.double() <= train_len)  # the kept ones turn at least once
    # the clipped pairs carry no position at any position, coefficients or not
    q, k = _qk()
    pos = torch.arange(5000, 5012)
    qr, kr = enc.rotate(q, k, pos, pos)
    clipped = sum((_pairs(i) for i in range(enc.n_kept, HEAD_DIM // 2)), [])
    assert torch.equal(qr[..., clipped], q[..., clipped]) and torch.equal(kr[..., clipped], k[..., clipped])
    assert torch.equal(clipped_frequencies(HEAD_DIM, 10000.0, train_len)[enc.n_kept:], torch.zeros(16 - enc.n_kept,
                                                                                                    dtype=torch.float64))


def test_fope_without_coefficients_is_rope_with_the_floor_clipped_and_relative():
    enc = create("fope", D_MODEL, N_HEADS, train_len=128, sigma=0.0)
    assert enc.relative
    rope = create("rope", D_MODEL, N_HEADS)
    rope.inv_freq = clipped_frequencies(HEAD_DIM, 10000.0, 128).float()
    q, k = _qk()
    assert torch.allclose(_logits(enc, q, k), _logits(rope, q, k), atol=1e-5)
    assert torch.allclose(_logits(enc, q, k), _logits(enc, q, k, shift=300), atol=1e-4)


def test_fope_series_have_their_own_frequency_dominant_and_are_not_relative():
    enc = create("fope", D_MODEL, N_HEADS, sigma=0.3)
    assert not enc.relative
    K = enc.n_kept
    off = ~torch.eye(K, dtype=torch.bool)
    for coef in (enc.cos_coef, enc.sin_coef):
        assert coef.shape == (N_HEADS, K, K)
        # each pair's own frequency leads its series (coef[h, k, d]: frequency k in pair d)
        assert torch.all(coef.diagonal(dim1=-2, dim2=-1) > (coef.abs() * off).amax(dim=-2))
        assert 0 < coef[:, off].abs().max() < 1  # small harmonics besides
    q, k = _qk()
    # the cross terms of two frequencies read absolute positions: a common shift changes the logits
    assert not torch.allclose(_logits(enc, q, k), _logits(enc, q, k, shift=300), atol=1e-3)
    # the same config builds the same coefficients, and a checkpoint keeps them
    again = create("fope", D_MODEL, N_HEADS, sigma=0.3)
    assert torch.equal(again.cos_coef, enc.cos_coef) and "cos_coef" in enc.state_dict()


def test_fope_coefficients_spread_as_the_authors_xavier_draw_dominant_frequency_included():
    # Hua et al.'s olmo/model.py (fourier_init: eye_xavier_norm, gain = sigma): xavier_normal_ on the (H, K, K)
    # tensor, whose fans are K * K in and H * K out (Glorot & Bengio 2010: std = gain * sqrt(2 / (in + out))),
    # then the identity added; at the paper's 60M head (64 features, 8 heads, 512 tokens: K = 16), sigma = 0.3
    sigma, n_heads = 0.3, 8
    enc = create("fope", 64 * n_heads, n_heads, train_len=512, sigma=sigma)
    K = enc.n_kept
    assert K == 16
    std = sigma * math.sqrt(2 / (K * K + n_heads * K))  # 0.0217
    for coef in (enc.cos_coef, enc.sin_coef):
        harmonics = coef - torch.eye(K)
        assert abs(harmonics.std().item() / std - 1) < 0.06  # 2048 draws
        own = harmonics.diagonal(dim1=-2, dim2=-1)  # the dominant coefficient is 1 plus a draw of the same spread
        assert 0 < own.abs().min() and abs(own.std().item() / std - 1) < 0.25  # 128 draws
    assert not torch.equal(enc.cos_coef, enc.sin_coef)


def test_fope_without_kept_frequencies_has_no_series():
    enc = create("fope", D_MODEL, N_HEADS, train_len=2)  # no frequency turns once in 2 tokens
    q, k = _qk()
    assert enc.n_kept == 0 and enc.cos_coef.shape == (N_HEADS, 0, 0)
    assert torch.equal(enc.rotate(q, k, torch.arange(12), torch.arange(12))[0], q)


# -- Resonance RoPE (Wang et al. 2024) --------------------------------------------------------------------------


def _assert_resonant(inv_freq: torch.Tensor, reference: torch.Tensor) -> None:
    wavelengths = 2 * math.pi / inv_freq.double()
    assert torch.allclose(wavelengths, wavelengths.round(), atol=1e-3 * wavelengths.max().item() * 1e-3 + 1e-3)
    assert torch.equal(wavelengths.round(), (2 * math.pi / reference).round())


def test_resonance_wavelengths_are_whole_tokens_and_the_rotation_repeats_in_them():
    enc = create("resonance", D_MODEL, N_HEADS)
    _assert_resonant(enc.inv_freq, rope_frequencies(HEAD_DIM, 10000.0))
    assert torch.all(enc.wavelengths == enc.wavelengths.round())
    pos = torch.arange(0, 50)
    cos, sin = enc.angles(pos)
    for i, wavelength in enumerate(enc.wavelengths[:6].long().tolist()):
        cos_later, sin_later = enc.angles(pos + wavelength)
        # feature i at position p + lambda_i rotates exactly as at p
        assert torch.allclose(cos_later[:, i], cos[:, i], atol=1e-4)
        assert torch.allclose(sin_later[:, i], sin[:, i], atol=1e-4)
    # plain RoPE's wavelengths are not whole, so its rotation does not repeat
    rope_cos, _ = create("rope", D_MODEL, N_HEADS).angles(torch.tensor([0, 6]))
    assert abs(rope_cos[1, 0] - rope_cos[0, 0]) > 1e-2


def test_resonance_is_relative():
    enc = create("resonance", D_MODEL, N_HEADS)
    q, k = _qk()
    assert torch.allclose(_logits(enc, q, k), _logits(enc, q, k, shift=1234), atol=1e-3)


def test_resonance_yarn_rounds_yarns_wavelengths():
    """Resonance YaRN (Wang et al. 2024, §3.2): YaRN's rescaled wavelengths, each rounded to whole tokens."""
    enc = create("resonance", D_MODEL, N_HEADS)
    scaled = scaled_encoder(enc, "yarn", 4.0, 128)  # the evaluator's one entry point for eval.scaling
    _assert_resonant(scaled.inv_freq, yarn_frequencies(HEAD_DIM, 10000.0, 4.0, 128))
    assert not torch.equal(scaled.inv_freq, enc.inv_freq) and scaled.attention_scaling > 1
    dynamic = enc.with_scaling("dynamic_ntk", 1.0, 128)
    theta, _ = dynamic.frequencies(512)
    assert torch.allclose(2 * math.pi / theta.double(), (2 * math.pi / theta.double()).round(), atol=1e-2)


# -- iRoPE (Llama 4; Yang et al. 2025) --------------------------------------------------------------------------


def test_irope_lays_a_global_nope_layer_every_kth_layer_from_the_top():
    assert irope_layers(8, 4) == ["rope"] * 3 + ["none"] + ["rope"] * 3 + ["none"]  # Llama 4's (i + 1) % 4 == 0
    assert irope_layers(2, 4) == ["rope", "none"]
    enc = create("irope", D_MODEL, N_HEADS, window=5)
    layers = enc.for_layers(8)
    assert [e.layer_window for e in layers] == [5, 5, 5, None] * 2
    assert enc.label == "irope"


def test_irope_is_itself_a_mix_and_cannot_be_one_layer_of_another():
    from posexp.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^encoder\.layers: a mix cannot contain 'irope'"):
        create("mixed", D_MODEL, N_HEADS, layers=["rope", "irope"])


def _attention_output(enc, x: torch.Tensor) -> torch.Tensor:
    """One attention layer using ``enc``, with the window the model gives a layer of that encoding."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(ModelShape(d_model=D_MODEL, n_heads=N_HEADS, attn_block_size=4))
    plan = AttentionPlan(enc, torch.arange(x.shape[1]), 4, window=layer_window(None, enc.layer_window))
    with torch.no_grad():
        return attn(x, plan)


def test_irope_nope_layers_see_every_key_and_rope_layers_only_their_window():
    enc = create("irope", D_MODEL, N_HEADS, window=4, every=2)
    rope_layer, nope_layer = enc.for_layers(2)
    x = torch.randn(1, 16, D_MODEL, generator=torch.Generator().manual_seed(3))
    changed = x.clone()
    changed[:, 0] += 1.0  # a key 15 tokens before the last query, far outside the window of 4
    for layer, sees_it in ((rope_layer, False), (nope_layer, True)):
        before, after = _attention_output(layer, x), _attention_output(layer, changed)
        assert not torch.allclose(before[:, 1:4], after[:, 1:4])  # keys 0..3 are in every layer's view
        assert torch.allclose(before[:, 4:], after[:, 4:], atol=1e-6) != sees_it, layer


def test_irope_temperature_is_one_at_training_lengths_and_grows_with_the_log_of_length():
    train_len = 128
    enc = create("irope", D_MODEL, N_HEADS, train_len=train_len)
    nope = enc.for_layers(4)[3]
    tau = attention_temperature(torch.arange(16 * train_len), nope.floor_scale, nope.attn_scale)
    assert torch.all(tau[:train_len] == 1)
    assert tau[-1] > tau[4 * train_len] > tau[2 * train_len] > 1
    # Llama 4's numbers: floor_scale 8192, attn_scale 0.1
    assert attention_temperature(torch.tensor([8190, 8191, 3 * 8192 - 1]), 8192, 0.1).tolist() == pytest.approx(
        [1.0, 0.1 * math.log(2) + 1, 0.1 * math.log(4) + 1])
    q, k = _qk(L=3)
    pos = torch.tensor([0, 200, 1000])
    qt, kt = nope.rotate(q, k, pos, pos)
    assert torch.equal(kt, k) and torch.equal(qt[:, :, 0], q[:, :, 0])
    assert torch.allclose(qt[:, :, 2], q[:, :, 2] * attention_temperature(pos, 129, 0.1)[2])


def test_irope_out_of_memory_shrinks_the_query_blocks_of_its_windowed_layers():
    """Its RoPE layers attend on the blocked path (their window is a mask), so evaluation can shrink the blocks."""
    import numpy as np

    from helpers import evaluate_at

    torch.manual_seed(0)
    model = GPT(ModelShape(d_model=16, n_layers=2, n_heads=2, attn_block_size=64),
                create("irope", 16, 2, window=8)).eval()
    real, blocks = model.token_losses, []

    def token_losses(idx, targets, pos=None):
        blocks.append(model.shape.attn_block_size)
        if idx.shape[0] > 1 or model.shape.attn_block_size > 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(idx, targets, pos)

    model.token_losses = token_losses
    val = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)
    row = evaluate_at(model, val, [64], 64, tokens=512, batch_tokens=512, device=torch.device("cpu"))[0]
    assert row["attn_block_size"] == 16 and blocks[-1] == 16 and math.isfinite(row["ppl"])


def test_a_layers_own_window_and_evals_window_the_narrower_applies():
    assert layer_window(None, None) is None
    assert layer_window(None, 64) == AttentionWindow(64)
    assert layer_window(AttentionWindow(128, sinks=4), 64) == AttentionWindow(64)  # the layer's is narrower
    assert layer_window(AttentionWindow(32, sinks=4), 64) == AttentionWindow(32, sinks=4)  # eval's, with its sinks
    assert layer_window(AttentionWindow(32), None) == AttentionWindow(32)  # a global layer: eval's window


def test_irope_without_temperature_is_relative():
    from posexp.evaluation.conformance import PASS, Probe, run_checks

    (result,) = run_checks(lambda d, h: create("irope", d, h, attn_scale=0.0),
                           Probe(train_len=32, block=8, long_block=32), ["relative"])
    assert result.status == PASS


# -- Scalable-Softmax (Nakanishi 2025) --------------------------------------------------------------------------


def test_ssmax_off_leaves_the_model_as_it_was():
    from posexp.config.identity import MODEL_KEYS_BEFORE

    torch.manual_seed(0)
    plain = GPT(ModelShape(), create("rope", 128, 4))
    torch.manual_seed(0)
    off = GPT(ModelShape(ssmax=False), create("rope", 128, 4))
    assert list(plain.state_dict()) == list(off.state_dict())
    assert not any("ssmax" in name for name in plain.state_dict())
    idx = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain(idx), off(idx))
    assert MODEL_KEYS_BEFORE["ssmax"] is False  # earlier runs keep their hash


def test_ssmax_multiplies_each_querys_logits_by_s_log_n():
    torch.manual_seed(0)
    shape = ModelShape(d_model=D_MODEL, n_heads=N_HEADS, ssmax=True)
    attn = CausalSelfAttention(shape)
    with torch.no_grad():
        attn.ssmax.copy_(torch.tensor([0.5, 2.0]))
    L = 10
    x = torch.randn(1, L, D_MODEL, generator=torch.Generator().manual_seed(2))
    none = create("none", D_MODEL, N_HEADS)
    with torch.no_grad():
        out = attn(x, AttentionPlan(none, torch.arange(L), 256))
        q, k, v = attn.qkv(x).view(1, L, 3, N_HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        z = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)  # (1, H, L, L)
        n = torch.arange(1, L + 1, dtype=torch.float32)
        scale = attn.ssmax[:, None, None] * n.log()[None, :, None]  # s log n, n = keys a query attends to
        z = (z * scale).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        expected = attn.proj((z.softmax(-1) @ v).transpose(1, 2).reshape(1, L, D_MODEL))
    assert torch.allclose(out, expected, atol=1e-5)
    # with a window the keys stop growing: log n stays at log(window)
    assert visible_keys(torch.arange(8), AttentionWindow(3)).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]
    assert visible_keys(torch.arange(6), AttentionWindow(2, sinks=1)).tolist() == [1, 2, 3, 3, 3, 3]


def test_ssmax_is_a_model_option_any_encoding_trains_with(tiny, tmp_path):
    from posexp.commands.train import run_train

    overrides = ["model.ssmax=true", "encoder=alibi", "train.steps=3", "train.warmup_steps=0", "eval.tokens=256", "eval.multiples=[1,2]",
                 "eval.loss_by_position=false"]
    results = run_train(tiny(*overrides), tmp_path, overrides)
    assert all(math.isfinite(r["ppl"]) for r in results["rows"])
    assert results["run"]["config"]["model"]["ssmax"] is True
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "checkpoint" / "model.safetensors")
    assert {name for name in weights if "ssmax" in name} == {"blocks.0.attn.ssmax", "blocks.1.attn.ssmax"}
