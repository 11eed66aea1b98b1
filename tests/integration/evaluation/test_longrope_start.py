"""LongRoPE's n^ (Ding et al. 2024, §3.2): the first n^ positions keep the trained rotation, the rest turn at
theta_i / lambda_i, checked against the equation written out directly, on posexp's rope and on transformers models;
and where the option is taken (eval, finetune, posexp search's factors file)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from posexp.encoders import create
from posexp.encoders.extension import scaled_encoder
from posexp.errors import ConfigError


def reference_rotation(x: torch.Tensor, pos: torch.Tensor, rot_dim: int, base: float, factors, start: int,
                       factor: float, train_len: int) -> torch.Tensor:
    """The paper's rotation, written out: pair (x_i, x_{i + d/2}) of the first ``rot_dim`` features turns by
    ``n * theta_i * I(lambda_i, n^)``, ``I = 1`` for ``n < n^`` and ``1 / lambda_i`` otherwise; the scaled
    positions carry the temperature ``sqrt(1 + ln s / ln L)`` on every feature, the first n^ none (authors' code)."""
    x = x.double()
    half = rot_dim // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / rot_dim)
    lam = torch.tensor(factors, dtype=torch.float64)
    out = torch.empty_like(x)
    mscale = math.sqrt(1 + math.log(factor) / math.log(train_len))
    for j, n in enumerate(pos.tolist()):
        early = n < start
        angle = n * theta * (1.0 if early else 1.0 / lam)
        a, b = x[..., j, :half], x[..., j, half:rot_dim]
        m = 1.0 if early else mscale
        out[..., j, :half] = (a * angle.cos() - b * angle.sin()) * m
        out[..., j, half:rot_dim] = (b * angle.cos() + a * angle.sin()) * m
        out[..., j, rot_dim:] = x[..., j, rot_dim:] * m
    return out


@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
@pytest.mark.parametrize("start", [1, 4, 40])
def test_rope_rotation_matches_the_equation(rotary_fraction, start):
    enc = create("rope", d_model=64, n_heads=2, base=10000.0, rotary_fraction=rotary_fraction)
    n = enc.rot_dim // 2
    factors = [1.0 + 3.0 * i / (n - 1) for i in range(n)]
    scaled = scaled_encoder(enc, "longrope", 4.0, 16, factors, longrope_start=start)
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 64, 32), torch.randn(2, 2, 64, 32)
    pos = torch.arange(64)
    q_rot, k_rot = scaled.rotate(q, k, pos, pos)
    for x, got in ((q, q_rot), (k, k_rot)):
        ref = reference_rotation(x, pos, enc.rot_dim, 10000.0, factors, start, 4.0, 16)
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    # queries and keys at other positions than each other (a block of queries late in the sequence)
    q_late, k_all = scaled.rotate(q[:, :, :8], k, pos[56:], pos)
    torch.testing.assert_close(q_late.double(), reference_rotation(q[:, :, :8], pos[56:], enc.rot_dim, 10000.0,
                                                                   factors, start, 4.0, 16), atol=1e-5, rtol=1e-5)


def test_start_zero_is_longrope_as_before_to_the_bit():
    enc = create("rope", d_model=64, n_heads=2)
    factors = [1.0 + i / 8 for i in range(16)]
    q, k = torch.randn(1, 2, 20, 32), torch.randn(1, 2, 20, 32)
    pos = torch.arange(20)
    before = enc.with_scaling("longrope", 4.0, 16, factors).rotate(q, k, pos, pos)
    now = scaled_encoder(enc, "longrope", 4.0, 16, factors, longrope_start=0).rotate(q, k, pos, pos)
    assert all(torch.equal(a, b) for a, b in zip(before, now))
    # positions past n^ are rotated exactly as without it; the first n^ differ
    late = scaled_encoder(enc, "longrope", 4.0, 16, factors, longrope_start=5).rotate(q, k, pos, pos)
    assert torch.equal(late[0][:, :, 5:], before[0][:, :, 5:]) and not torch.equal(late[0][:, :, :5], before[0][:, :, :5])


def test_start_reaches_every_rotary_layer_of_a_mix_and_is_checked():
    enc = create("mixed", d_model=64, n_heads=2, layers=["rope", "none"])
    layers = scaled_encoder(enc, "longrope", 4.0, 16, [1.0] * 16, longrope_start=3).for_layers(2)
    assert [getattr(e, "longrope_start", None) for e in layers] == [3, None]
    with pytest.raises(ConfigError, match=r"^eval\.longrope_start: must be a whole number"):
        scaled_encoder(create("rope", d_model=64, n_heads=2), "longrope", 4.0, 16, [1.0] * 16, longrope_start=-1)


# -- transformers models --------------------------------------------------------------------------

def _reference_rotary(module, factors, start: int, factor: float, train_len: int):
    """A rotary module computing the equation directly (in place of transformers' own, same call signature)."""
    dim = 2 * module.inv_freq.numel()
    theta = module.inv_freq.double()  # the model's trained frequencies
    lam = torch.tensor(factors, dtype=torch.float64)
    mscale = math.sqrt(1 + math.log(factor) / math.log(train_len))

    class Reference(torch.nn.Module):
        def forward(self, x, position_ids, *args, **kwargs):
            n = position_ids.double()[..., None]  # (B, L, 1)
            early = n < start
            angle = torch.where(early, n * theta, n * theta / lam)  # (B, L, dim/2)
            m = torch.where(early, torch.ones_like(n), torch.full_like(n, mscale))
            emb = torch.cat((angle, angle), dim=-1)
            return (emb.cos() * m).to(x.dtype), (emb.sin() * m).to(x.dtype)

    assert dim == 2 * len(factors)
    return Reference()


@pytest.mark.parametrize("kind", ["llama", "neox"])
def test_a_transformers_model_with_n_hat_matches_the_equation(kind):
    from helpers.hf_tiny import model, tokens

    from posexp.hf.model import HFLanguageModel
    from posexp.hf.rotary import find_rotary
    from posexp.model.interface import Reading

    train, factor, start = 32, 4.0, 6
    m = model(kind)
    (site,) = find_rotary(m)
    n = site.dim // 2
    factors = tuple(1.0 + 2.5 * i / max(n - 1, 1) for i in range(n))
    x = tokens(3 * train)
    lm = HFLanguageModel(m, kind, chunk=16)
    with lm.reading(Reading("longrope", factor, train, 3 * train, factors, None, start)):
        ours = lm.logits(x)
    with lm.reading(Reading("longrope", factor, train, 3 * train, factors)):
        without = lm.logits(x)
    reference = model(kind)
    (ref_site,) = find_rotary(reference)
    setattr(ref_site.parent, ref_site.name, _reference_rotary(ref_site.module, factors, start, factor, train))
    with torch.no_grad():
        theirs = reference(x).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ours, without, atol=1e-3)  # n^ changed the logits


# -- where it is taken -------------------------------------------------------------------------------

def test_eval_refuses_n_hat_without_longrope_and_reads_the_factors_file(tiny, tmp_path):
    from posexp.commands.validation import validate
    from posexp.evaluation.perplexity import reading_of

    with pytest.raises(ConfigError, match=r"^eval\.longrope_start: only applies with eval\.scaling=longrope"):
        validate(tiny("eval.longrope_start=4"), memory=None)
    with pytest.raises(ConfigError, match=r"^eval\.longrope_start: must be a whole number"):
        validate(tiny("eval.scaling=longrope", "eval.longrope_start=-2",
                      f"eval.longrope_factors=[{','.join(['1.0'] * 8)}]"), memory=None)
    folder = tmp_path / "longrope" / "512"
    folder.mkdir(parents=True)
    (folder / "factors.json").write_text(json.dumps({"factors": [1.5] * 8, "start": 3}))
    cfg = tiny("eval.scaling=longrope", f"eval.longrope_file={folder}")
    validate(cfg, memory=None)
    how, _ = reading_of(cfg.eval, "longrope", 512, int(cfg.train_len), None)
    assert how.longrope_factors == (1.5,) * 8 and how.longrope_start == 3
    with pytest.raises(ConfigError, match=r"^eval\.longrope_file: gives the factors and n\^ itself"):
        validate(tiny("eval.scaling=longrope", f"eval.longrope_file={folder}", "eval.longrope_start=2"), memory=None)
    with pytest.raises(ConfigError, match=r"^eval\.longrope_file: no LongRoPE factors file at"):
        validate(tiny("eval.scaling=longrope", f"eval.longrope_file={tmp_path / 'nowhere'}"), memory=None)


def test_a_fine_tune_without_n_hat_keeps_the_hash_it_had():
    from posexp.config.identity import weights_of

    lineage = {"parent": "p", "parent_config_hash": "h", "parent_weights_sha256": "s", "parent_train_len": 32,
               "scaling": "longrope", "scaling_factor": 4.0, "longrope_factors": [1.0, 2.0]}
    before = weights_of({"train_len": 128, "finetune": lineage})
    assert weights_of({"train_len": 128, "finetune": {**lineage, "longrope_start": None}}) == before
    assert weights_of({"train_len": 128, "finetune": {**lineage, "longrope_start": 4}}) != before


def test_posexp_eval_keeps_rows_of_other_factors_apart_and_names_them(trained, tmp_path):
    """Evaluating a run again with other factors (or another n^) adds rows; the same factors replace theirs; each row
    names its factors (a fingerprint) and its n^, typed or read from a file alike, and the report's lines do too."""
    import shutil

    from helpers import invoke

    from posexp.runs.longrope import fingerprint

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    one, two = [1.0] * 8, [1.0 + i / 4 for i in range(8)]
    folder = tmp_path / "longrope" / "256"
    folder.mkdir(parents=True)
    (folder / "factors.json").write_text(json.dumps({"factors": two, "start": 3}))
    common = ("eval.scaling=longrope", "eval.lengths=[64,256]", "eval.tokens=512")
    for given in ((f"eval.longrope_factors=[{','.join(map(str, one))}]",),
                  (f"eval.longrope_factors=[{','.join(map(str, two))}]",),
                  (f"eval.longrope_factors=[{','.join(map(str, two))}]", "eval.longrope_start=3"),
                  (f"eval.longrope_factors=[{','.join(map(str, one))}]",),  # again: replaces its rows
                  (f"eval.longrope_file={folder}",)):  # the factors and n^ typed before: replaces their rows
        result = invoke("eval", str(run), *common, *given)
        assert result.exit_code == 0, result.output
    rows = [r for r in json.loads((run / "results.json").read_text())["rows"] if r.get("scaling") == "longrope"]
    expected = [f"factors={fingerprint(one)} start=0", f"factors={fingerprint(two)} start=0",
                f"factors={fingerprint(two)} start=3"]
    assert [r["scaling_options"] for r in rows] == [o for o in expected for _ in (64, 256)]
    assert fingerprint(one) != fingerprint(two) and fingerprint([1] * 8) == fingerprint(one)
    assert all(f"longrope ×8 {o} |" in (run / "results.md").read_text() for o in expected)
    report = invoke("report", str(run), "--cols", "scaling", "--format", "markdown")
    assert report.exit_code == 0, report.output
    assert all(f"scaling=longrope {o}" in report.output.replace("\\_", "_") for o in expected), report.output
