"""Tests of the positional encoders: the hook contract inside the model, and what each paper claims."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from posexp.encoders import create, option_names, options_schema, registry
from posexp.encoders.alibi import alibi_slopes
from posexp.encoders.sinusoidal import sinusoidal_table
from posexp.encoders.t5 import t5_bucket
from posexp.errors import ConfigError
from posexp.model.gpt import GPT, ModelShape
from helpers import REPO

ENCODER_CONFIGS = REPO / "configs" / "encoder"
CONFIG_NAMES = sorted(p.stem for p in ENCODER_CONFIGS.glob("*.yaml"))

D_MODEL, N_HEADS, VOCAB = 32, 4, 256


def _model(name: str, attn_block_size: int = 256) -> GPT:
    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, d_model=D_MODEL, n_layers=2, n_heads=N_HEADS,
                       attn_block_size=attn_block_size)
    return GPT(shape, create(name, d_model=D_MODEL, n_heads=N_HEADS))


def _randomise_zero_params(model: GPT) -> None:
    # T5 starts with an all-zero bias, under which blocked and causal checks would pass trivially
    with torch.no_grad():
        for p in model.encoder.parameters():
            p.normal_(0.0, 0.5)


# -- every configured encoder inside the model ------------------------------------------------


def test_configs_found() -> None:
    assert {"none", "rope", "sinusoidal", "learned", "alibi", "t5"} <= set(CONFIG_NAMES)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_matches_registry(name: str) -> None:
    assert name in registry(), f"configs/encoder/{name}.yaml has no registered encoder"
    cls = registry()[name]
    assert cls.description and "\n" not in cls.description
    text = (ENCODER_CONFIGS / f"{name}.yaml").read_text()
    assert text.startswith("#")
    cfg = OmegaConf.load(ENCODER_CONFIGS / f"{name}.yaml")
    assert list(cfg.defaults) == [f"/schema/encoder/{name}@_here_", "_self_"]
    assert set(cfg.keys()) - {"defaults"} <= set(option_names(name))
    # the schema register_configs() stores must be a valid structured config
    OmegaConf.structured(options_schema(cls))


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_model_contract(name: str) -> None:
    B, L = 2, 40
    model = _model(name)
    _randomise_zero_params(model)
    idx = torch.randint(0, VOCAB, (B, L), generator=torch.Generator().manual_seed(1))

    logits = model(idx)
    assert logits.shape == (B, L, VOCAB)

    # causality: tokens after t cannot change the logits at t or before
    t = 17
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % VOCAB
    with torch.no_grad():
        assert torch.allclose(model(changed)[:, : t + 1], logits[:, : t + 1], atol=1e-5)

    # the blocked bias path passes absolute positions, so it must agree with one block
    blocked = _model(name, attn_block_size=8)
    blocked.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.allclose(blocked(idx), logits, atol=1e-5)

    loss = model.token_losses(idx[:, :-1], idx[:, 1:]).mean()
    assert torch.isfinite(loss)
    loss.backward()
    for pname, p in model.encoder.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"encoder.{pname} got no gradient"
            assert p.grad.abs().sum() > 0, f"encoder.{pname} got an all-zero gradient"


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_zero_init_params_still_get_gradient(name: str) -> None:
    model = _model(name)
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(2))
    model.token_losses(idx[:, :-1], idx[:, 1:]).mean().backward()
    for pname, p in model.encoder.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"encoder.{pname} cannot start training"


# -- RoPE (Su et al. 2021) --------------------------------------------------------------------


def _rope_score(enc, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    qr, kr = enc.rotate(q, k, torch.tensor([m]), torch.tensor([n]))
    return (qr * kr).sum()


def test_rope_score_depends_only_on_offset() -> None:
    enc = create("rope", d_model=D_MODEL, n_heads=N_HEADS)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 1, D_MODEL // N_HEADS, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, D_MODEL // N_HEADS, generator=g, dtype=torch.float64)
    for m, n in [(5, 2), (2, 5), (40, 0), (7, 7)]:
        ref = _rope_score(enc, q, k, m, n)
        for s in (1, 13, 100, 777):
            assert torch.allclose(_rope_score(enc, q, k, m + s, n + s), ref, atol=1e-4), (m, n, s)
    # and it does depend on the offset, or the check above would be empty
    assert not torch.allclose(_rope_score(enc, q, k, 5, 2), _rope_score(enc, q, k, 6, 2), atol=1e-3)


def test_rope_preserves_norms() -> None:
    enc = create("rope", d_model=D_MODEL, n_heads=N_HEADS)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, N_HEADS, 50, D_MODEL // N_HEADS, generator=g, dtype=torch.float64)
    k = torch.randn(2, N_HEADS, 50, D_MODEL // N_HEADS, generator=g, dtype=torch.float64)
    pos = torch.arange(1000, 1050)
    qr, kr = enc.rotate(q, k, pos, pos)
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-6)
    assert torch.allclose(kr.norm(dim=-1), k.norm(dim=-1), rtol=1e-6)


# -- sinusoidal (Vaswani et al. 2017, §3.5) ---------------------------------------------------


def test_sinusoidal_layout() -> None:
    pe = sinusoidal_table(torch.tensor([0, 1]), 8, 10000.0, dtype=torch.float64)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 4, dtype=torch.float64))
    w = [10000.0 ** (-2 * i / 8) for i in range(4)]
    expected = [f(x) for x in w for f in (math.sin, math.cos)]
    assert torch.allclose(pe[1], torch.tensor(expected, dtype=torch.float64))


def test_sinusoidal_shift_is_fixed_rotation() -> None:
    d, base = D_MODEL, 10000.0
    pos = torch.arange(0, 5000, 37)
    pe = sinusoidal_table(pos, d, base, dtype=torch.float64)
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    for k in (1, 5, 250):
        # (sin, cos)(w(p+k)) = [[cos wk, sin wk], [-sin wk, cos wk]] (sin, cos)(wp), one block per pair
        c, s = torch.cos(w * k), torch.sin(w * k)
        blocks = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)  # (d/2, 2, 2)
        M = torch.block_diag(*blocks)
        shifted = sinusoidal_table(pos + k, d, base, dtype=torch.float64)
        assert torch.allclose(pe @ M.T, shifted, atol=1e-9), k


def test_sinusoidal_inner_product_depends_only_on_offset() -> None:
    pe = lambda p: sinusoidal_table(torch.tensor([p]), D_MODEL, 10000.0, dtype=torch.float64)[0]  # noqa: E731
    for m, n in [(3, 0), (0, 3), (50, 20)]:
        ref = pe(m) @ pe(n)
        for s in (1, 99, 4000):
            assert torch.allclose(pe(m + s) @ pe(n + s), ref, atol=1e-9)


def test_sinusoidal_long_positions_stay_precise() -> None:
    pos = torch.tensor([1_000_003])
    got = sinusoidal_table(pos, D_MODEL, 10000.0)[0, 0].double()
    assert abs(got.item() - math.sin(1_000_003)) < 1e-6


# -- ALiBi (Press et al. 2022, §3) ------------------------------------------------------------


def test_alibi_slopes_power_of_two() -> None:
    expected = torch.tensor([2.0 ** -h for h in range(1, 9)], dtype=torch.float64)
    assert torch.equal(alibi_slopes(8), expected)
    assert torch.equal(create("alibi", d_model=D_MODEL, n_heads=8).slopes, expected.float())


def test_alibi_slopes_non_power_of_two() -> None:
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    expected = geometric(8) + geometric(16)[0::2][:4]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert len(alibi_slopes(5)) == 5 and len(alibi_slopes(1)) == 1


def test_alibi_bias_linear_in_distance() -> None:
    enc = create("alibi", d_model=D_MODEL, n_heads=N_HEADS)
    pos = torch.arange(30)
    bias = enc.bias(pos, pos)
    assert bias.shape == (N_HEADS, 30, 30)
    assert torch.equal(torch.diagonal(bias, dim1=1, dim2=2), torch.zeros(N_HEADS, 30))
    dist = (pos[:, None] - pos[None, :]).float()
    causal = dist >= 0
    expected = -enc.slopes[:, None, None] * dist
    assert torch.equal(bias[:, causal], expected[:, causal])
    # a late block of queries sees the same bias as the matching rows of the whole
    assert torch.equal(enc.bias(pos[20:], pos), bias[:, 20:])
    assert not list(enc.parameters())


# -- T5 (Raffel et al. 2020, §2.1) ------------------------------------------------------------


def test_t5_buckets() -> None:
    nb, md = 32, 128
    n = torch.arange(0, 3000)
    b = t5_bucket(n, nb, md)
    assert b.dtype == torch.long
    assert torch.equal(b[: nb // 2], n[: nb // 2])  # exact half
    assert bool((b[1:] >= b[:-1]).all())  # monotone
    assert bool((b[md:] == nb - 1).all())
    assert int(b.max()) == nb - 1 and int(b.min()) == 0
    # by hand: 16 + floor(log(n/16) / log(8) * 16) = 16 + floor(16/3 * log2(n/16))
    known = {16: 16, 18: 16, 19: 17, 30: 20, 31: 21, 32: 21, 64: 26, 112: 30, 113: 31, 127: 31}
    for dist, bucket in known.items():
        assert int(t5_bucket(torch.tensor(dist), nb, md)) == bucket, dist
    # future keys (negative distance) share bucket 0 with the diagonal
    assert int(t5_bucket(torch.tensor(-5), nb, md)) == 0


def test_t5_bias_looks_up_buckets() -> None:
    enc = create("t5", d_model=D_MODEL, n_heads=N_HEADS, num_buckets=8, max_distance=20)
    with torch.no_grad():
        enc.relative_attention_bias.weight.normal_()
    pos = torch.arange(100, 160)
    bias = enc.bias(pos, pos)
    assert bias.shape == (N_HEADS, 60, 60)
    dist = pos[:, None] - pos[None, :]
    expected = enc.relative_attention_bias.weight[t5_bucket(dist, 8, 20)].permute(2, 0, 1)
    assert torch.equal(bias, expected)


# -- learned and NoPE -------------------------------------------------------------------------


def test_learned_max_length() -> None:
    enc = create("learned", d_model=D_MODEL, n_heads=N_HEADS, max_length=64)
    assert enc.max_length == 64
    assert enc.supports(64) and not enc.supports(65)
    x = torch.zeros(1, 64, D_MODEL)
    assert enc.embed(x, torch.arange(64)).shape == x.shape
    with pytest.raises(ValueError, match="max_length|0..63"):
        enc.embed(torch.zeros(1, 65, D_MODEL), torch.arange(65))
    assert abs(enc.wpe.weight.std().item() - 0.02) < 0.005


def test_nope_uses_no_hooks() -> None:
    enc = create("none", d_model=D_MODEL, n_heads=N_HEADS)
    assert not (enc.uses_embed or enc.uses_rotate or enc.uses_bias or enc.uses_scores)
    assert enc.supports(10**9) and enc.base is None


def test_hooks_in_use() -> None:
    used = {
        name: {h for h in ("embed", "rotate", "bias", "scores")
               if getattr(create(name, d_model=D_MODEL, n_heads=N_HEADS), f"uses_{h}")}
        for name in ("rope", "sinusoidal", "learned", "alibi", "t5")
    }
    assert used == {"rope": {"rotate"}, "sinusoidal": {"embed"}, "learned": {"embed"},
                    "alibi": {"bias"}, "t5": {"bias"}}


# -- bad options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kwargs, key",
    [
        ("rope", dict(d_model=32, n_heads=4, base=1), "base"),
        ("rope", dict(d_model=12, n_heads=4), "model.d_model"),
        ("sinusoidal", dict(d_model=32, n_heads=4, base=0.5), "base"),
        ("sinusoidal", dict(d_model=33, n_heads=3), "model.d_model"),
        ("learned", dict(d_model=32, n_heads=4, max_length=0), "encoder.max_length"),
        ("t5", dict(d_model=32, n_heads=4, num_buckets=1), "encoder.num_buckets"),
        ("t5", dict(d_model=32, n_heads=4, num_buckets=32, max_distance=16), "encoder.max_distance"),
        ("alibi", dict(d_model=32, n_heads=4, foo=1), "encoder.foo"),
        ("alibi", dict(d_model=32, n_heads=4, lr_mult=0), "encoder.lr_mult"),
        ("t5", dict(d_model=32, n_heads=4, lr_mult=-1.0), "encoder.lr_mult"),
        ("no-such-encoder", dict(d_model=32, n_heads=4), "encoder"),
    ],
)
def test_bad_options(name: str, kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        create(name, **kwargs)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ")


def test_sinusoidal_scales_token_embeddings_as_the_paper_does():
    """Vaswani et al. 2017 §3.4: embeddings times sqrt(d_model), then the encoding is added (§3.5)."""
    enc = create("sinusoidal", d_model=16, n_heads=2)
    x = torch.randn(2, 5, 16)
    pos = torch.arange(5)
    expected = x * 4.0 + sinusoidal_table(pos, 16, 10000.0)
    assert torch.allclose(enc.embed(x, pos), expected)
