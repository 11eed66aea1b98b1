"""Options of the sinusoidal and rotary encodings, ReRoPE, and per-layer mixes, each against its paper.

Sinusoidal / rotary frequency schedules: Su 2021, "Transformer升级之路 1", §2.3
(Eqs. 30, 31, 41, 43). Partial rotary: GPT-NeoX-20B (Black et al. 2022). ReRoPE:
Su 2023. Mixing NoPE layers among RoPE layers: Llama 4's iRoPE (Meta 2025).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from helpers import TINY_RUN, invoke_main
from posexp.encoders import create
from posexp.encoders.frequencies import frequency_schedule
from posexp.encoders.rope import RemappedRoPE, ReRoPEScores, rope_frequencies
from posexp.encoders.sinusoidal import sinusoidal_table
from posexp.errors import ConfigError
from helpers import evaluate_at
from posexp.model.gpt import GPT, AttentionPlan, ModelShape
from posexp.encoders.scaling import rope_scaling
from posexp.commands.edge import typed

D_MODEL, N_HEADS, VOCAB = 32, 4, 64
HEAD_DIM = D_MODEL // N_HEADS
SCHEDULES = [("exponential", 1.0), ("power", 1.0), ("power", 0.5), ("linear", 1.0)]


def _qk(L: int, seed: int = 0, head_dim: int = HEAD_DIM):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, L, head_dim, generator=g, dtype=torch.float64),
            torch.randn(1, 2, L, head_dim, generator=g, dtype=torch.float64))


def _model(encoder, n_layers: int = 2, attn_block_size: int = 256) -> GPT:
    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, d_model=D_MODEL, n_layers=n_layers, n_heads=N_HEADS,
                       attn_block_size=attn_block_size)
    return GPT(shape, encoder).eval()


# -- the frequency schedules (Su 2021, §2.3) --------------------------------------------------


def test_schedules_are_the_papers_formulas():
    d = 16
    i = torch.arange(d // 2, dtype=torch.float64)
    # the exponential schedule is bit-for-bit what the encoders computed before the option existed
    assert torch.equal(frequency_schedule(d, 500.0), 500.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
    torch.testing.assert_close(frequency_schedule(d, 10.0, "power", 0.7), (i + 1) ** -0.7)  # Eq. 41
    torch.testing.assert_close(frequency_schedule(d, 10.0, "linear"), 1 - 2 * i / d)  # Eq. 43, t = 2i/d
    # one function serves every encoding: rope's frequencies are the same schedule
    for schedule, alpha in SCHEDULES:
        assert torch.equal(rope_frequencies(d, 100.0, schedule, alpha), frequency_schedule(d, 100.0, schedule, alpha))
        rope = create("rope", d_model=4 * d, n_heads=4, freq_schedule=schedule, alpha=alpha, base=100.0)
        torch.testing.assert_close(rope.inv_freq, frequency_schedule(d, 100.0, schedule, alpha).float())


def _mean_inner(schedule: str, alpha: float, delta: float, d: int = 512) -> float:
    """<p_0, p_delta> / (d/2) of the sinusoidal encoder's own table (Su 2021, Eq. 31 divided by d/2)."""
    enc = create("sinusoidal", d_model=d, n_heads=1, freq_schedule=schedule, alpha=alpha)
    pe = sinusoidal_table(torch.tensor([0.0, delta], dtype=torch.float64), d, dtype=torch.float64,
                          inv_freq=enc.frequencies())
    return float(pe[0] @ pe[1]) / (d / 2)


def test_linear_schedule_returns_to_zero_periodically_as_su_eq_43_says():
    # Re of Eq. 43 is sin(D)/D: zero at every D = 2 pi k, while the exponential schedule stays clearly positive
    for delta in (1.0, 3.0, 5.0, 20.0):
        assert _mean_inner("linear", 1.0, delta) == pytest.approx(math.sin(delta) / delta, abs=0.01)
    for k in (1, 2, 3):
        assert abs(_mean_inner("linear", 1.0, 2 * math.pi * k)) < 0.01
        assert _mean_inner("exponential", 1.0, 2 * math.pi * k) > 0.5


def test_exponential_schedule_decays_with_distance():
    """Su 2021 §2.3 (Eqs. 34-40): <p_m, p_n> shrinks as |m - n| grows."""
    values = [_mean_inner("exponential", 1.0, delta) for delta in (1, 10, 100, 1000, 10000)]
    assert all(a > b for a, b in zip(values, values[1:])), values
    assert values[0] > 0.9 and values[-1] < 0.1


def test_power_schedule_decays_slower_for_larger_alpha():
    """Su 2021 §2.3 on Eq. 41: the larger alpha, the slower the decay (all theta_i shrink)."""
    for delta in (10, 20, 50):
        slow, mid, fast = (_mean_inner("power", a, delta) for a in (2.0, 1.0, 0.5))
        assert slow > mid > fast, (delta, slow, mid, fast)


# -- sinusoidal options -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("schedule,alpha", SCHEDULES)
def test_sinusoidal_inner_product_depends_only_on_offset_for_every_layout_and_schedule(layout, schedule, alpha):
    enc = create("sinusoidal", d_model=D_MODEL, n_heads=N_HEADS, freq_schedule=schedule, alpha=alpha, layout=layout)
    x = torch.zeros(1, 1, D_MODEL, dtype=torch.float64)

    def pe(p: int) -> torch.Tensor:
        return enc.embed(x, torch.tensor([p]))[0, 0]

    theta = frequency_schedule(D_MODEL, 10000.0, schedule, alpha)
    for m, n in [(3, 0), (0, 7), (50, 20)]:
        ref = pe(m) @ pe(n)
        torch.testing.assert_close(ref, torch.cos((m - n) * theta).sum())  # Su 2021, Eq. 31
        for s in (1, 99, 4000):
            torch.testing.assert_close(pe(m + s) @ pe(n + s), ref, atol=1e-9, rtol=0)


def test_halves_layout_is_a_fixed_permutation_of_interleaved():
    pos = torch.arange(0, 3000, 7)
    inter = sinusoidal_table(pos, D_MODEL, 10000.0, dtype=torch.float64)
    halves = sinusoidal_table(pos, D_MODEL, 10000.0, dtype=torch.float64, layout="halves")
    perm = torch.cat((torch.arange(0, D_MODEL, 2), torch.arange(1, D_MODEL, 2)))  # sines, then cosines
    assert torch.equal(halves, inter[:, perm])
    assert not torch.equal(halves, inter)


def test_sinusoidal_defaults_are_the_paper_and_learnable_options_start_there():
    x = torch.randn(2, 5, D_MODEL)
    pos = torch.arange(5)
    paper = x * D_MODEL**0.5 + sinusoidal_table(pos, D_MODEL, 10000.0)
    assert torch.equal(create("sinusoidal", d_model=D_MODEL, n_heads=N_HEADS).embed(x, pos), paper)
    for option in ("learnable_scale", "learnable_freqs", "learnable_base"):
        enc = create("sinusoidal", d_model=D_MODEL, n_heads=N_HEADS, **{option: True})
        assert len(list(enc.parameters())) == 1, option
        torch.testing.assert_close(enc.embed(x, pos), paper, atol=1e-4, rtol=1e-5)


def test_sinusoidal_learnable_options_train_what_they_say():
    x = torch.randn(2, 9, D_MODEL)
    pos = torch.arange(9)
    enc = create("sinusoidal", d_model=D_MODEL, n_heads=N_HEADS, learnable_scale=True, learnable_base=True)
    enc.embed(x, pos).pow(2).sum().backward()
    assert enc.scale.grad is not None and enc.scale.grad.abs() > 0
    assert enc.log_base.grad is not None and enc.log_base.grad.abs() > 0
    with torch.no_grad():
        enc.log_base.fill_(math.log(500.0))
        enc.scale.fill_(0.5)
    assert enc.base == pytest.approx(500.0)
    expected = x * D_MODEL**0.5 + 0.5 * sinusoidal_table(pos, D_MODEL, 500.0)
    torch.testing.assert_close(enc.embed(x, pos), expected, atol=1e-4, rtol=1e-5)

    freqs = create("sinusoidal", d_model=D_MODEL, n_heads=N_HEADS, learnable_freqs=True)
    freqs.embed(x, pos).pow(2).sum().backward()
    assert freqs.freqs.shape == (D_MODEL // 2,) and freqs.freqs.grad.abs().sum() > 0


@pytest.mark.parametrize("options", [dict(learnable_scale=True, learnable_freqs=True, layout="halves"),
                                     dict(learnable_base=True), dict(freq_schedule="power", alpha=0.5)])
def test_sinusoidal_options_inside_the_model(options):
    model = _model(create("sinusoidal", d_model=D_MODEL, n_heads=N_HEADS, **options))
    idx = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    loss = model.token_losses(idx[:, :-1], idx[:, 1:]).mean()
    loss.backward()
    for name, p in model.encoder.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# -- rotary options ---------------------------------------------------------------------------


@pytest.mark.parametrize("fraction,rotated", [(1.0, 8), (0.5, 4), (0.25, 2), (0.3, 2), (0.4, 4)])
def test_partial_rotary_rotates_only_the_first_features(fraction, rotated):
    enc = create("rope", d_model=D_MODEL, n_heads=N_HEADS, rotary_fraction=fraction)
    assert enc.rot_dim == rotated
    q, k = _qk(6)
    pos = torch.arange(100, 106)
    qr, kr = enc.rotate(q, k, pos, pos)
    assert torch.equal(qr[..., rotated:], q[..., rotated:]) and torch.equal(kr[..., rotated:], k[..., rotated:])
    assert not torch.allclose(qr[..., :rotated], q[..., :rotated])
    # the rotated part is RoPE on a head of width d_rot, with theta_i = base^(-2i/d_rot)
    full = create("rope", d_model=rotated * N_HEADS, n_heads=N_HEADS)
    ref_q, _ = full.rotate(q[..., :rotated], k[..., :rotated], pos, pos)
    torch.testing.assert_close(qr[..., :rotated], ref_q)


@pytest.mark.parametrize("schedule,alpha", SCHEDULES)
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rope_score_depends_only_on_offset_for_every_schedule_and_fraction(schedule, alpha, fraction):
    enc = create("rope", d_model=D_MODEL, n_heads=N_HEADS, freq_schedule=schedule, alpha=alpha,
                 rotary_fraction=fraction)
    q, k = _qk(1, seed=3)

    def score(m: int, n: int) -> float:
        qr, kr = enc.rotate(q, k, torch.tensor([m]), torch.tensor([n]))
        return float((qr * kr).sum())

    for m, n in [(5, 2), (2, 5), (40, 0)]:
        for s in (1, 37, 1000):
            assert score(m + s, n + s) == pytest.approx(score(m, n), rel=1e-4, abs=1e-4)


def test_partial_rotary_scalings_use_the_rotated_width():
    enc = create("rope", d_model=64, n_heads=2, rotary_fraction=0.5)  # head 32, 16 rotated
    for kind in ("ntk", "yarn", "llama3"):
        theta, _ = enc.with_scaling(kind, 4.0, 32).frequencies(128)
        torch.testing.assert_close(theta, rope_scaling(kind, 16, 10000.0, 4.0, 32)[0].float())


def test_yarn_temperature_reaches_the_unrotated_features_too():
    enc = create("rope", d_model=D_MODEL, n_heads=N_HEADS, rotary_fraction=0.5)
    yarn = enc.with_scaling("yarn", 4.0, 16)
    q, k = _qk(1)
    a = enc.rotate(q, k, torch.tensor([3]), torch.tensor([3]))
    b = yarn.rotate(q, k, torch.tensor([3]), torch.tensor([3]))
    # at equal positions the rotation cancels: the whole logit is multiplied by (0.1 ln 4 + 1)^2
    ratio = float((b[0] * b[1]).sum() / (a[0] * a[1]).sum())
    assert ratio == pytest.approx((0.1 * math.log(4.0) + 1) ** 2, rel=1e-5)


def test_base_scalings_are_refused_on_a_schedule_without_a_base():
    enc = create("rope", d_model=D_MODEL, n_heads=N_HEADS, freq_schedule="power")
    for kind in ("ntk", "dynamic_ntk", "yarn", "llama3"):
        with pytest.raises(ConfigError) as err:
            enc.with_scaling(kind, 4.0, 32)
        assert err.value.key == "eval.scaling" and "freq_schedule=power" in str(err.value)
        assert "linear, rerope" in str(err.value)
    # position interpolation works for any schedule: position m*s reads as m (Chen et al. 2023)
    pi = enc.with_scaling("linear", 4.0, 32)
    q, k = _qk(3)
    pos = torch.tensor([0, 5, 11])
    a, b = enc.rotate(q, k, pos, pos), pi.rotate(q, k, pos * 4, pos * 4)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# -- invalid options and combinations ---------------------------------------------------------


@pytest.mark.parametrize("name,options,key,needles", [
    ("sinusoidal", dict(layout="zigzag"), "encoder.layout", ["interleaved", "halves"]),
    ("sinusoidal", dict(freq_schedule="cubic"), "encoder.freq_schedule", ["exponential", "power", "linear"]),
    ("sinusoidal", dict(freq_schedule="power", alpha=0.0), "encoder.alpha", ["> 0"]),
    ("sinusoidal", dict(learnable_base=True, freq_schedule="linear"), "encoder.learnable_base",
     ["freq_schedule=exponential", "linear"]),
    ("sinusoidal", dict(learnable_base=True, learnable_freqs=True), "encoder.learnable_base", ["learnable_freqs"]),
    ("rope", dict(rotary_fraction=0.0), "encoder.rotary_fraction", ["(0, 1]"]),
    ("rope", dict(rotary_fraction=1.5), "encoder.rotary_fraction", ["(0, 1]"]),
    ("rope", dict(rotary_fraction=0.05), "encoder.rotary_fraction", ["no pair"]),
    ("rope", dict(freq_schedule="log"), "encoder.freq_schedule", ["exponential, power, linear"]),
    ("rope", dict(alpha=-1.0), "encoder.alpha", ["> 0"]),
])
def test_bad_options_name_the_key_and_the_allowed_values(name, options, key, needles):
    with pytest.raises(ConfigError) as err:
        create(name, d_model=D_MODEL, n_heads=N_HEADS, **options)
    assert err.value.key == key
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


# -- ReRoPE (Su 2023) ---------------------------------------------------------------------------


def _rerope_logits(rerope: ReRoPEScores, q, k, pos):
    """What the model's attention computes on the score path: q.k / sqrt(Dh) + scores."""
    return q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + rerope.scores(q, k, pos, pos)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_rerope_logits_are_ropes_within_the_window_and_ropes_at_w_beyond(fraction):
    rope = create("rope", d_model=D_MODEL, n_heads=N_HEADS, rotary_fraction=fraction).double()
    w, L = 5, 16
    rerope = ReRoPEScores(rope, w)  # the explicit-score path a windowed layer (encoder=irope) reads it through
    assert rerope.uses_scores and not rerope.uses_rotate
    q, k = _qk(L, seed=1)
    pos = torch.arange(100, 100 + L)  # absolute positions late in a sequence: only m - n may matter
    got = _rerope_logits(rerope, q, k, pos)
    qr, kr = rope.rotate(q, k, pos, pos)
    plain = qr @ kr.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    checked_far = 0
    for m in range(L):
        for n in range(m + 1):
            if m - n <= w:
                torch.testing.assert_close(got[..., m, n], plain[..., m, n])
            else:
                # RoPE at distance w: query m rotated as if at w, key as if at 0
                qw, k0 = rope.rotate(q[..., m:m + 1, :], k[..., n:n + 1, :], torch.tensor([w]), torch.tensor([0]))
                at_w = (qw * k0).sum(-1)[..., 0] / math.sqrt(HEAD_DIM)
                torch.testing.assert_close(got[..., m, n], at_w)
                assert not torch.allclose(got[..., m, n], plain[..., m, n])
                checked_far += 1
    assert checked_far > 0


def test_rerope_in_the_model_is_rope_when_the_window_covers_the_context():
    model = _model(create("rope", d_model=D_MODEL, n_heads=N_HEADS), attn_block_size=8)
    idx = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(10.0)  # sharp attention, so that where it looks shows in the logits
        plain = model(idx)
        base = model.encoder
        model.encoder = base.with_scaling("rerope", 30, 16)
        wide = model(idx)
        model.encoder = base.with_scaling("rerope", 4, 16)
        narrow = model(idx)
        model.shape.attn_block_size = 256  # one query block: the same logits as the blocked path
        narrow_whole = model(idx)
    torch.testing.assert_close(wide, plain, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(narrow[:, 10:], plain[:, 10:], atol=1e-3)
    torch.testing.assert_close(narrow[:, :5], plain[:, :5], atol=1e-4, rtol=1e-4)  # no key beyond w=4 yet
    torch.testing.assert_close(narrow_whole, narrow, atol=1e-4, rtol=1e-4)


def test_rerope_evaluation_rows_record_the_window():
    model = _model(create("rope", d_model=D_MODEL, n_heads=N_HEADS))
    val = np.random.default_rng(0).integers(0, VOCAB, 2000).astype(np.uint16)
    rows = evaluate_at(model, val, [16, 32], 16, tokens=256, batch_tokens=256, device=torch.device("cpu"),
                    scaling="rerope")
    assert [(r["scaling"], r["scaling_factor"]) for r in rows] == [("rerope", 8.0), ("rerope", 8.0)]  # 16 / 2
    rows = evaluate_at(model, val, [32], 16, tokens=256, batch_tokens=256, device=torch.device("cpu"),
                    scaling="rerope", rerope_window=12)
    assert rows[0]["scaling_factor"] == 12.0 and math.isfinite(rows[0]["ppl"])


@pytest.mark.parametrize("overrides,key,needle", [
    (["encoder=rope", "eval.scaling=rerope", "eval.rerope_window=0"], "eval.rerope_window", "between 1 and"),
    (["encoder=rope", "eval.scaling=rerope", "eval.rerope_window=1000"], "eval.rerope_window", "train_len=128"),
    (["encoder=rope", "eval.rerope_window=8"], "eval.rerope_window", "eval.scaling=rerope"),
    (["encoder=rope", "eval.scaling=rerope", "eval.scaling_factor=4"], "eval.scaling_factor", "eval.rerope_window"),
    (["encoder=sinusoidal", "eval.scaling=rerope"], "eval.scaling", "rope"),
    (["encoder=rope", "encoder.freq_schedule=power", "eval.scaling=yarn"], "eval.scaling", "linear, rerope"),
    (["encoder=rope", "encoder.rotary_fraction=0"], "encoder.rotary_fraction", "(0, 1]"),
    (["encoder=sinusoidal", "encoder.learnable_base=true", "encoder.freq_schedule=power"],
     "encoder.learnable_base", "exponential"),
    (["encoder=mixed", "encoder.layers=[rope,sinusoidal]"], "encoder.layers", "at the input"),
    (["encoder=mixed", "encoder.layers=[rope,rope,rope,rope,none]", "model.n_layers=4"], "encoder.layers",
     "model.n_layers=4"),
    (["encoder=mixed", "encoder.layers=[rope,alibi]", "eval.scaling=yarn"], "eval.scaling", "layer 1"),
])
def test_config_validation_refuses_bad_combinations_before_training(compose, overrides, key, needle):
    from posexp.commands.validation import validate

    with pytest.raises(ConfigError) as err:
        validate(typed(compose(*overrides)))
    assert err.value.key == key and needle in str(err.value), (overrides, str(err.value))


def test_config_validation_accepts_the_new_options(compose):
    from posexp.commands.validation import validate

    validate(typed(compose("encoder=rope", "encoder.rotary_fraction=0.25", "eval.scaling=rerope", "eval.rerope_window=64")))
    validate(typed(compose("encoder=rope", "encoder.freq_schedule=linear", "eval.scaling=linear")))
    validate(typed(compose("encoder=sinusoidal", "encoder.layout=halves", "encoder.learnable_base=true")))
    validate(typed(compose("encoder=mixed", "encoder.layers=[rope,rope,rope,none]", "model.n_layers=8", "eval.scaling=yarn")))


# -- per-layer mixes ------------------------------------------------------------------------------


def _captured_plans(model: GPT, idx: torch.Tensor) -> list[AttentionPlan]:
    plans = []
    hooks = [b.attn.register_forward_hook(lambda mod, args, out: plans.append(args[1])) for b in model.blocks]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return plans


def test_each_layer_attends_with_its_own_encoding():
    mixed = create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["rope", "rope", "none"], base=500.0)
    model = _model(mixed, n_layers=6)
    assert mixed.label == "mixed[rope,rope,none,rope,rope,none]"
    idx = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    plans = _captured_plans(model, idx)
    layers = mixed.for_layers(6)
    assert len({id(e) for e in layers}) == 6  # one module per layer, the pattern repeated
    assert [p.encoder for p in plans] == layers
    assert [p.encoder.name for p in plans] == ["rope", "rope", "none"] * 2
    assert layers[0].base == 500.0

    # a none layer is position-free: its attention output at the last token does not change when the
    # earlier tokens are reordered; a rope layer's does
    torch.manual_seed(1)
    x = torch.randn(1, 12, D_MODEL)
    perm = torch.cat((torch.randperm(11), torch.tensor([11])))
    for block, plan in zip(model.blocks[:3], plans[:3]):
        with torch.no_grad():
            block.attn.qkv.weight.mul_(10.0)  # sharp attention, so that where it looks shows in the output
            a = block.attn(x, plan)[0, -1]
            b = block.attn(x[:, perm], plan)[0, -1]
        change = float((a - b).abs().max() / a.abs().max())
        if plan.encoder.name == "none":
            assert change < 1e-5, change
        else:
            assert change > 1e-2, change


def test_a_mix_of_one_encoding_is_that_encoding_and_a_real_mix_is_neither():
    idx = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))

    def logits(encoder):
        with torch.no_grad():
            return _model(encoder)(idx)

    rope = logits(create("rope", d_model=D_MODEL, n_heads=N_HEADS))
    nope = logits(create("none", d_model=D_MODEL, n_heads=N_HEADS))
    assert torch.equal(logits(create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["rope"])), rope)
    assert torch.equal(logits(create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["none"])), nope)
    both = logits(create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["rope", "none"]))
    assert not torch.allclose(both, rope, atol=1e-4) and not torch.allclose(both, nope, atol=1e-4)


@pytest.mark.parametrize("train_len", [96, 64])
def test_a_layer_of_a_new_mix_is_built_as_that_encoder_alone(compose, train_len):
    """encoder=cope takes npos_max from its yaml (${train_len}); a cope layer of a mix took the class's 64 at any
    training length. A new mix records the options each layer's own yaml takes from the run, so the layer is built
    as the encoder alone is; one set in encoder.options stays, and a mix of before (its config records none) builds
    as it did, keeping its hash where it built the same."""
    from posexp.commands.train import check_config
    from posexp.config.identity import config_hash
    from posexp.model.factory import build_encoder

    alone = build_encoder(check_config(compose("encoder=cope", f"train_len={train_len}")))
    mix = ("encoder=mixed", "encoder.layers=[rope,cope]", f"train_len={train_len}")
    assert build_encoder(check_config(compose(*mix))).per_layer[1].npos_max == alone.npos_max == train_len
    given = build_encoder(check_config(compose(*mix, "encoder.options={cope:{npos_max:32}}")))
    assert given.per_layer[1].npos_max == 32
    before = typed(compose(*mix))
    assert build_encoder(before).per_layer[1].npos_max == 64
    assert (config_hash(check_config(compose(*mix))) == config_hash(before)) == (train_len == 64)


def test_mix_with_bias_layers_trains_each_layers_own_parameters():
    mixed = create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["t5", "rope"])
    model = _model(mixed, n_layers=4)
    t5_layers = [e for e in mixed.for_layers(4) if e.name == "t5"]
    assert len(t5_layers) == 2
    assert t5_layers[0].relative_attention_bias is not t5_layers[1].relative_attention_bias
    with torch.no_grad():
        for p in mixed.parameters():
            p.normal_(0.0, 0.5)
    idx = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    blocked = _model(create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["t5", "rope"]), n_layers=4,
                     attn_block_size=8)
    blocked.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(blocked(idx), model(idx), atol=1e-5, rtol=1e-5)
    model.token_losses(idx[:, :-1], idx[:, 1:]).mean().backward()
    for enc in t5_layers:
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


def test_mix_scales_its_rotary_layers_and_leaves_nope_alone():
    mixed = create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["rope", "none"])
    mixed.for_layers(2)
    yarn = mixed.with_scaling("yarn", 4.0, 16)
    rope, nope = yarn.for_layers(2)
    assert rope.scaling == ("yarn", 4.0, 16) and nope is mixed.for_layers(2)[1]
    assert mixed.for_layers(2)[0].scaling is None  # the trained encoder is untouched
    rerope = mixed.with_scaling("rerope", 8, 16)
    first = rerope.for_layers(2)[0]
    assert isinstance(first, RemappedRoPE) and first.remapping["window"] == 8 and rerope.uses_attend


@pytest.mark.parametrize("options,key,needle", [
    (dict(layers=["sinusoidal", "rope"]), "encoder.layers", "at the input"),
    (dict(layers=["learned"]), "encoder.layers", "encoder=learned"),
    (dict(layers=[]), "encoder.layers", "at least one"),
    (dict(layers=["rope", "ropee"]), "encoder.layers", "unknown encoder 'ropee'"),
    (dict(layers=["mixed"]), "encoder.layers", "cannot contain"),
    (dict(layers=["rope"], options={"alibi": {}}), "encoder.options", "alibi"),
    (dict(layers=["rope"], options={"rope": {"rotary_fraction": 2.0}}), "encoder.options.rope.rotary_fraction",
     "(0, 1]"),
])
def test_bad_mixes_name_the_key(options, key, needle):
    with pytest.raises(ConfigError) as err:
        create("mixed", d_model=D_MODEL, n_heads=N_HEADS, **options)
    assert err.value.key == key and needle in str(err.value), str(err.value)


def test_a_mix_longer_than_the_model_is_refused():
    mixed = create("mixed", d_model=D_MODEL, n_heads=N_HEADS, layers=["rope", "rope", "none"])
    with pytest.raises(ConfigError) as err:
        _model(mixed, n_layers=2)
    assert err.value.key == "encoder.layers" and "model.n_layers=2" in str(err.value)


# -- through the CLI, as a user types it --------------------------------------------------------


def test_list_shows_the_new_options(tmp_path):
    proc = invoke_main("list", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    for option in ("freq_schedule", "rotary_fraction", "learnable_scale", "layout", "layers"):
        assert option in proc.stdout, option


@pytest.mark.slow  # rerope rows and mixing stay covered in-process above; this is the end-to-end run
def test_a_mixed_run_says_its_mix_and_evaluates_with_rerope(tmp_path):
    proc = invoke_main("train", *TINY_RUN, "encoder=mixed", "encoder.layers=[rope,none]",
                       "encoder.options={rope:{rotary_fraction:0.5}}", "eval.scaling=rerope", "eval.rerope_window=16",
                       "hydra.run.dir=run", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["run"]["encoder"] == "mixed[rope,none]"
    assert results["run"]["eval_settings"]["rerope_window"] == 16
    assert {(r["scaling"], r["scaling_factor"]) for r in results["rows"]} == {("rerope", 16.0)}
    assert "rerope w=16" in (tmp_path / "run" / "results.md").read_text()

    # posexp eval: another window is another measurement, kept beside the first
    proc = invoke_main("eval", "run", "eval.scaling=rerope", "eval.rerope_window=8", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert {(r["scaling"], r["scaling_factor"]) for r in results["rows"]} == {("rerope", 16.0), ("rerope", 8.0)}
    proc = invoke_main("eval", "run", "eval.rerope_window=0", cwd=tmp_path)
    assert proc.exit_code == 2 and "eval.rerope_window" in proc.stderr and "Traceback" not in proc.stderr


BAD_INPUT = [
    (["encoder=rope", "encoder.rotary_fraction=1.5"], ["encoder.rotary_fraction", "(0, 1]"]),
    (["encoder=sinusoidal", "encoder.layout=zigzag"], ["encoder.layout", "interleaved", "halves"]),
    (["encoder=sinusoidal", "encoder.freq_schedule=power", "encoder.learnable_base=true"],
     ["encoder.learnable_base", "exponential"]),
    (["encoder=rope", "encoder.freq_schedule=power", "encoder.alpha=0"], ["encoder.alpha", "> 0"]),
    (["encoder=mixed", "encoder.layers=[sinusoidal,rope]"], ["encoder.layers", "sinusoidal", "rope"]),
    (["encoder=rope", "eval.scaling=rerope", "eval.rerope_window=0"], ["eval.rerope_window"]),
]


@pytest.mark.parametrize("overrides,needles", BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_is_a_one_line_message_and_exit_code_2(tmp_path, monkeypatch, overrides, needles):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    monkeypatch.chdir(tmp_path)  # in this interpreter; tests/process/test_cli.py checks the fresh-interpreter form
    result = CliRunner().invoke(app, ["train", *TINY_RUN, *overrides, "hydra.run.dir=run"], env={"COLUMNS": "200"})
    out = result.output
    assert result.exit_code == 2 and isinstance(result.exception, (SystemExit, type(None))), out
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "run" / "results.json").exists()
