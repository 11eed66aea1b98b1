"""``posexp analyze``: the properties the papers claim, checked with the built-in analysis.

Decay measure used for comparing bases (see :func:`posexp.analysis.geometry.decay_summary`): the
envelope ``e(r) = max_{r' >= r} |c(r') / c(0)|`` of the diagonal-mean inner product
``c(r)``, its half distance (first ``r`` with ``e(r) <= 1/2``) and the mean of
``|c(r) / c(0)|`` over the range.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from posexp.analysis.app import print_summary, run_analyze
from posexp.analysis.schema import AnalyzeRootConfig
from posexp.commands.edge import typed
from posexp.analysis.attention import attention_statistics
from posexp.analysis.geometry import (
    analyse_unit,
    decay_summary,
    diagonal_means,
    envelope,
    position_dependence,
    rope_relative_bound,
    rotary_frequencies,
    score_map,
    units,
)
from posexp.analysis.schema import register_analyze_schema
from posexp.config.schema import config_dir
from posexp.encoders import create
from posexp.errors import ConfigError
from helpers import invoke_main

ENCODERS = sorted(p.stem for p in (config_dir() / "encoder").glob("*.yaml"))
TINY = ("model.d_model=32", "model.n_heads=2", "train_len=16", "eval.multiples=[1,4]")


@pytest.fixture
def compose_analyze():
    from hydra import compose, initialize_config_dir

    register_analyze_schema()

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return compose(config_name="analyze", overrides=list(overrides))

    return _compose


def _sinusoid_curve(base: float, d_model: int = 64, length: int = 1024) -> tuple[torch.Tensor, np.ndarray]:
    S = score_map(create("sinusoidal", d_model=d_model, n_heads=4, base=base), "embed", length)
    return S, diagonal_means(S)[0].numpy()


# -- sinusoidal (Vaswani et al. 2017; Su 2021, "Transformer升级之路 1") --------------------------

def test_sinusoidal_inner_products_depend_only_on_distance():
    S, curve = _sinusoid_curve(10000.0, d_model=64, length=256)
    assert position_dependence(S) < 1e-6
    # Su 2021, Eq. 31: <p_m, p_n> = sum_i cos((m - n) theta_i), theta_i = base^(-2i/d)
    theta = 10000.0 ** (-2 * np.arange(32) / 64)
    expected = np.cos(np.arange(256)[:, None] * theta[None, :]).sum(-1)
    np.testing.assert_allclose(curve, expected, atol=1e-4)


def test_position_dependence_flags_absolute_encodings():
    torch.manual_seed(0)
    for name in ("learned", "integer", "normalized"):
        S = score_map(create(name, d_model=32, n_heads=2), "embed", 64)
        assert position_dependence(S) > 0.1, name


def test_sinusoidal_envelope_decays_with_distance():
    _, curve = _sinusoid_curve(10000.0, d_model=128, length=1024)
    dec = decay_summary(curve)
    env = dec["envelope"]
    assert env[1] > 0.9
    assert env[511] < 0.5 * env[1]
    assert dec["half_distance"] is not None and 1 < dec["half_distance"] < 511
    assert dec["power_law"]["exponent"] > 0


def test_a_flat_envelope_is_fitted_exactly_not_with_a_negative_r2():
    """A curve whose envelope is flat (learned positions at their initialisation: the largest inner product is at
    the last distance) printed 'envelope ~ r^-0.00 (r2 -24.00)': the ratio of two rounding errors. A constant is
    fitted exactly, exponent 0, r2 1, as any least-squares line's r2 lies in [0, 1]."""
    curve = np.zeros(128)
    curve[0], curve[-1] = 1.0, 0.158
    fit = decay_summary(curve)["power_law"]
    assert fit["r2"] == 1.0 and abs(fit["exponent"]) < 1e-9 and fit["a"] == pytest.approx(0.158)


@pytest.mark.parametrize("small,large", [(100.0, 10000.0), (1000.0, 100000.0)])
def test_larger_base_decays_more_slowly(small, large):
    d_small = decay_summary(_sinusoid_curve(small)[1])
    d_large = decay_summary(_sinusoid_curve(large)[1])
    # over distances 8..511 the larger base's envelope is never below the smaller base's
    assert np.all(d_large["envelope"][8:512] >= d_small["envelope"][8:512])
    assert d_large["half_distance"] > d_small["half_distance"]
    assert d_large["mean_abs"] > d_small["mean_abs"]


# -- rotary (Su et al. 2021, RoFormer) ------------------------------------------------------------

def test_rope_score_depends_only_on_distance():
    rope = create("rope", d_model=64, n_heads=2, base=10000)
    S = score_map(rope, "rotate", 256)
    assert position_dependence(S) < 1e-5
    # constant content q = k = 1 on halves-paired features: sum_i 2 cos((m - n) theta_i)
    theta = rope.inv_freq.double().numpy()
    expected = 2 * np.cos(np.arange(256)[:, None] * theta[None, :]).sum(-1)
    np.testing.assert_allclose(diagonal_means(S)[0].numpy(), expected, atol=1e-3)


def test_rotary_frequencies_are_read_off_the_hook():
    rope = create("rope", d_model=64, n_heads=2, base=500.0)
    theta = rotary_frequencies(rope)
    np.testing.assert_allclose(theta.numpy(), 500.0 ** (-2 * np.arange(16) / 32), rtol=1e-5)
    partial = rotary_frequencies(create("rope", d_model=64, n_heads=2, rotary_fraction=0.5))
    assert (partial[:8] > 0).all() and torch.allclose(partial[8:], torch.zeros(8, dtype=partial.dtype), atol=1e-6)


def test_a_rotate_hook_that_turns_no_pair_has_no_wavelengths_and_no_rotary_bound():
    """iRoPE's global NoPE layer only rescales its queries in rotate (Llama 4's temperature): posexp analyze drew an
    empty wavelengths.png titled '16 of 16 pairs turn less than once in train_len' and a flat RoFormer bound for it.
    Its RoPE layer keeps both."""
    (_, rope), (_, nope) = units(create("irope", d_model=32, n_heads=2, train_len=16), 2)
    local, tempered = (analyse_unit(enc, 64, 16, [16, 64]) for enc in (rope, nope))
    assert local["frequencies"]["pairs"] == 8 and "rope_bound" in local
    assert "frequencies" not in tempered and "rope_bound" not in tempered and "rotate" in tempered["maps"]
    assert "turns no pair" in tempered["not_applicable"]["rope_bound"]


def test_rope_relative_upper_bound_decays():
    rope = create("rope", d_model=128, n_heads=2, base=10000)
    bound = rope_relative_bound(rotary_frequencies(rope), 1024)
    half_pairs = 32
    assert bound[0] == pytest.approx((half_pairs + 1) / 2)  # S_j = j at distance 0
    assert envelope(bound)[512] < 0.5 * bound[0]
    assert bound[512:].mean() < 0.3 * bound[0]


def test_rope_bound_bounds_the_score():
    # RoFormer §3.4.3: |sum_i h_i e^{i r theta_i}| <= max_i |h_{i+1} - h_i| * sum_j |S_j|, h_{d/2} = 0
    torch.manual_seed(0)
    rope = create("rope", d_model=64, n_heads=1, base=10000)
    Dh, length = 64, 512
    q, k = torch.randn(Dh, dtype=torch.float64), torch.randn(Dh, dtype=torch.float64)
    pos = torch.arange(length)
    qr, kr = rope.rotate(q.float().expand(1, 1, length, Dh), k.float().expand(1, 1, length, Dh), pos, pos)
    score = (qr[0, 0, :, None, :].double() * kr[0, 0, None, 0, :].double()).sum(-1)[:, 0]  # query r, key 0
    half = Dh // 2
    h = torch.complex(q[:half], q[half:]) * torch.complex(k[:half], k[half:]).conj()
    h = torch.cat((h, torch.zeros(1, dtype=h.dtype)))
    step = (h[1:] - h[:-1]).abs().max().item()
    bound = step * half * rope_relative_bound(rotary_frequencies(rope), length)
    assert np.all(score.abs().numpy() <= bound + 1e-3)


# -- bias (ALiBi, Press et al. 2022, §3) ------------------------------------------------------

@pytest.mark.parametrize("n_heads", [4, 8])
def test_alibi_bias_is_linear_with_the_paper_slopes(n_heads):
    unit = analyse_unit(create("alibi", d_model=64, n_heads=n_heads), 128, 32, [32, 128])
    fits = unit["maps"]["bias"]["linear_fit_per_head"]
    paper = [-(2.0 ** (-8 * h / n_heads)) for h in range(1, n_heads + 1)]  # m_h = 2^(-8h/H)
    np.testing.assert_allclose([f["slope"] for f in fits], paper, rtol=1e-5)
    assert all(f["r2"] > 1 - 1e-9 and abs(f["intercept"]) < 1e-5 for f in fits)
    assert unit["maps"]["bias"]["position_dependence"] == 0.0
    assert "rope_bound" in unit["not_applicable"] and "embed" in unit["not_applicable"]


# -- every encoder config, through the Hydra config ----------------------------------------------

@pytest.mark.parametrize("name", ENCODERS)
def test_every_encoder_config_analyses(name, compose_analyze, tmp_path):
    cfg = compose_analyze(f"encoder={name}", *TINY, "analyze.length=48", "analyze.figures=false")
    spec = typed(cfg, AnalyzeRootConfig)
    result = run_analyze(spec, spec.analyze, tmp_path, Console(file=open(Path(tmp_path) / "out.txt", "w")))
    saved = json.loads((tmp_path / "analysis.json").read_text())
    assert saved["encoder"] == name and saved["units"]
    for unit in saved["units"]:
        for hook in ("embed", "rotate", "bias", "scores"):
            assert (hook in unit["maps"]) != (hook in unit["not_applicable"]), (name, hook)
        for entry in unit["maps"].values():
            assert math.isfinite(entry["position_dependence"])
    assert result["figures"] == []


@pytest.mark.parametrize("exponent,shown", [(0.07, "r^-0.07"), (-1e-17, "r^0.00"), (-0.3, "r^0.30"), (0.0, "r^0.00"),
                                            (0.004, "r^0.00")])
def test_the_summary_writes_the_fitted_power_of_r_with_one_sign(exponent, shown):
    """A flat envelope fitted with exponent -1e-17 (encoder=binary) printed 'envelope ~ r^--0.00'."""
    decay = {"half_distance": None, "mean_abs": 0.5, "power_law": {"a": 1.0, "exponent": exponent, "r2": 1.0}}
    unit = {"name": "binary", "hooks": ["embed"], "not_applicable": {},
            "maps": {"embed": {"position_dependence": 1.0, "decay": decay}}}
    result = {"label": "binary", "d_model": 32, "n_heads": 2, "length": 64, "train_len": 16, "units": [unit]}
    console = Console(record=True, width=200)
    print_summary(result, console)
    assert f"envelope ~ {shown} (r2 1.00)" in console.export_text()


def test_a_layer_of_a_mix_is_analysed_as_that_encoder_alone(compose_analyze):
    """posexp analyze encoder=mixed encoder.layers=[rope,cope] drew CoPE's layer with the class's npos_max=64, while
    posexp analyze encoder=cope (and training either) builds it with train_len entries."""
    from posexp.analysis.schema import check_analyze_job
    from posexp.model.factory import build_encoder

    alone = build_encoder(check_analyze_job(compose_analyze("encoder=cope", *TINY)))
    mix = build_encoder(check_analyze_job(compose_analyze("encoder=mixed", "encoder.layers=[rope,cope]", *TINY)))
    assert mix.per_layer[1].npos_max == alone.npos_max == 16
    with pytest.raises(ConfigError, match="^encoder.layers: unknown encoder 'ropee'"):
        check_analyze_job(compose_analyze("encoder=mixed", "encoder.layers=[rope,ropee]", *TINY))


def test_bad_analyze_value_names_the_key(compose_analyze, tmp_path):
    from posexp.analysis.schema import check_analyze_job

    with pytest.raises(ConfigError, match="analyze.length"):
        check_analyze_job(compose_analyze("encoder=rope", *TINY, "analyze.length=1"))


def test_trained_run_settings_are_typed_and_checked_before_any_run_loads():
    """``posexp analyze RUN_DIR analyze.KEY=VALUE``: the values are parsed into the typed schema, and a value of
    the wrong type or out of range is refused while reading the command line, before a run folder is read."""
    from posexp.analysis.attention import parse_run_args
    from posexp.analysis.schema import AnalyzeConfig

    runs, settings = parse_run_args(["analyze.multiples=[2,1]", "analyze.tokens=256", "analyze.figures=false"])
    assert runs == [] and settings == AnalyzeConfig(multiples=[2, 1], tokens=256, figures=False)
    for arg, message in (("analyze.tokens=many", "analyze.tokens: 'many' is not a valid value"),
                         ("analyze.tokens=0", "analyze.tokens: must be a positive number of tokens (got 0)"),
                         ("analyze.multiples=[1,-2]", "analyze.multiples: must list positive multiples"),
                         ("analyze.length=1", "analyze.length: must be at least 2 positions")):
        with pytest.raises(ConfigError) as err:
            parse_run_args([arg])
        assert str(err.value).startswith(message), arg


# -- attention statistics of a model ------------------------------------------------------------

@pytest.mark.parametrize("encoder", ["none", "rope", "alibi"])
def test_attention_statistics_match_closed_forms(encoder):
    from posexp.model.gpt import GPT, ModelShape

    torch.manual_seed(0)
    enc = create(encoder, d_model=32, n_heads=2)
    model = GPT(ModelShape(d_model=32, n_layers=1, n_heads=2, attn_block_size=16), enc).eval()
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.zero_()  # q = k = 0: only the position bias is left
    L = 40
    stats = attention_statistics(model, np.arange(2 * L) % 256, L, 2)
    i = np.arange(L)
    if encoder == "alibi":  # a_ij ∝ exp(-m_h (i - j)) (Press et al. 2022, §3)
        for h, m in enumerate(enc.slopes.double().numpy()):
            dist = ent = 0.0
            for q in i:
                d = np.arange(q + 1)
                p = np.exp(-m * d) / np.exp(-m * d).sum()
                dist += (p * d).sum() / L
                ent += -(p * np.log(p)).sum() / L
            assert stats["mean_distance"][0, h] == pytest.approx(dist, rel=1e-4)
            assert stats["entropy"][0, h] == pytest.approx(ent, rel=1e-4)
    else:  # uniform over the causal context
        np.testing.assert_allclose(stats["mean_distance"][0], stats["uniform_distance"], rtol=1e-4)
        np.testing.assert_allclose(stats["entropy"][0], stats["uniform_entropy"], rtol=1e-4)
        assert stats["uniform_distance"] == pytest.approx((i / 2).mean())


# -- the command --------------------------------------------------------------------------------

@pytest.mark.slow  # a two-job sweep, then analyze; the single-run command tests stay in the default suite
def test_analyze_multirun_compares_bases(tmp_path):
    sweep = tmp_path / "sweep"
    proc = invoke_main("analyze", "-m", "encoder=rope", "base=100,10000", *TINY, "analyze.length=64",
                       f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    for job, base in (("0", 100.0), ("1", 10000.0)):
        saved = json.loads((sweep / job / "analysis.json").read_text())
        assert saved["base"] == base and saved["label"] == f"rope base={base:g}"
        for png in saved["figures"]:
            assert (sweep / job / png).stat().st_size > 0
        assert {"rotate_heatmap.png", "rope_bound.png", "wavelengths.png"} <= set(saved["figures"])
    assert (sweep / "comparison.png").stat().st_size > 0
    assert "rope base=100" in proc.stdout and "rope bound" in proc.stdout


def test_the_sweep_comparison_draws_each_kind_of_curve_on_its_own_axis(monkeypatch, tmp_path):
    """posexp analyze -m encoder=rope,alibi drew rope's decay envelope (a ratio, about 1) on alibi's axis titled
    'bias vs distance', in logits down to -170: a panel per kind of curve, each with its own axis."""
    import posexp.analysis.drawing as drawing

    drawn = []
    monkeypatch.setattr(drawing, "save_png", lambda fig, path: drawn.append(fig) or path)
    r = np.arange(64)
    rope = {"label": "rope base=10000", "train_len": 16,
            "curves": [{"rotate": np.cos(r / 8).tolist(), "rope_bound": (8 / (1 + r)).tolist()}]}
    alibi = {"label": "alibi", "train_len": 16, "curves": [{"bias": [(-0.25 * r).tolist(), (-0.0625 * r).tolist()]}]}
    drawing.draw_comparison([rope, alibi], tmp_path / "comparison.png")
    panels = {ax.get_title(): [line.get_label() for line in ax.get_lines() if "train length" not in line.get_label()]
              for ax in drawn[0].axes}
    assert panels == {"decay with distance": ["rope base=10000"], "bias vs distance": ["alibi (mean over heads)"],
                      drawing.ROPE_BOUND_TITLE: ["rope base=10000"]}


def test_a_sweep_with_no_curve_to_compare_writes_no_empty_comparison(tmp_path):
    """posexp analyze -m encoder=none,fox wrote a comparison.png of one empty axis from 0 to 1."""
    from posexp.analysis.drawing import draw_comparison

    nothing = [{"label": name, "train_len": 16, "curves": [{"name": name}]} for name in ("none", "fox")]
    assert draw_comparison(nothing, tmp_path / "comparison.png") is None
    assert not (tmp_path / "comparison.png").exists()


def test_an_analysis_length_past_memory_is_one_line_naming_the_key(monkeypatch, tmp_path):
    """posexp analyze encoder=rope analyze.length=100000 printed torch's traceback of a 320 GB allocation (the score
    maps are length x length per head): one line naming analyze.length, as training names its keys."""
    import posexp.analysis.geometry as geometry

    def too_big(encoder, hook, length):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 320000000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(geometry, "score_map", too_big)
    done = invoke_main("analyze", "encoder=rope", *TINY, "analyze.length=100000", "analyze.figures=false",
                       f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.exit_code != 0 and "Traceback" not in done.output, done.output[-2000:]
    line, = done.stderr.strip().splitlines()
    assert line.startswith("error: ran out of memory analysing positions 0..99999 on cpu")
    assert line.endswith("; lower analyze.length")


def test_analyze_bad_input_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    result = CliRunner().invoke(app, ["analyze", "encoder=rope", "base=0.5", f"hydra.run.dir={tmp_path / 'r'}"])
    assert result.exit_code == 2
    assert "base: must be > 1" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_analyze_trained_run(tmp_path):
    run = tmp_path / "run"
    proc = invoke_main("train", "experiment=smoke", "train.progress=false", "encoder=alibi", f"hydra.run.dir={run}",
                       cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    proc = invoke_main("analyze", str(run), "analyze.multiples=[1,2]", "analyze.tokens=256", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    saved = json.loads((run / "analysis" / "analysis.json").read_text())
    assert [r["length"] for r in saved["attention"]] == [32, 64]
    for row in saved["attention"]:
        assert np.array(row["entropy"]).shape == (2, 2)  # layers x heads
        assert np.all(np.array(row["entropy"]) <= math.log(row["length"]) + 1e-6)
    assert (run / "analysis" / "attention_entropy.png").is_file()
    proc = invoke_main("analyze", str(run), "analyze.lenght=3", cwd=tmp_path)
    assert proc.exit_code == 2 and "analyze.lenght" in proc.stderr and "Traceback" not in proc.stderr


def test_a_randomized_runs_attention_is_read_at_its_eval_positions_and_not_past_its_range(tiny, tmp_path,
                                                                                          monkeypatch):
    # Ruoss et al. 2023: the run reads a length at sorted positions drawn from its range, and no length past it
    from helpers import invoke
    from posexp.commands.train import run_train
    from posexp.model.gpt import GPT
    from posexp.model.positions import PositionPlan

    run = tmp_path / "run"
    cfg = tiny("train.steps=2", "train.positions=randomized", "train.max_position=64")
    run_train(cfg, run, [])
    read: dict[int, list] = {}
    forward = GPT.forward

    def spy(self, idx, pos=None):
        read.setdefault(idx.shape[1], []).append(None if pos is None else pos.tolist())
        return forward(self, idx, pos)

    monkeypatch.setattr(GPT, "forward", spy)
    result = invoke("analyze", str(run), "analyze.multiples=[1,2,4]", "analyze.tokens=256", "analyze.figures=false")
    assert result.exit_code == 0, result.output
    rows = json.loads((run / "analysis" / "analysis.json").read_text())["attention"]
    assert [r.get("windows", 0) > 0 for r in rows] == [True, True, False]
    assert "0..63 (train.max_position)" in rows[2]["not_applicable"]
    plan = PositionPlan(cfg)
    assert set(read) == {32, 64} and all(pos == plan.eval_positions(n).tolist() for n in read for pos in read[n])
