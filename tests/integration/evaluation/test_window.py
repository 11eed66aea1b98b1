"""Window baselines (``eval.window`` / ``eval.sinks``): every attention path attends only within the window,
a query's output ignores the tokens outside it, rows record it and stay apart from plain rows, and an
evaluation without it is what it always was."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
import torch

from posexp.commands.edge import typed
from posexp.errors import ConfigError
from helpers import evaluate_at
from helpers.runs import make_run, make_task_run
from posexp.model.factory import build_model
from posexp.model.fused import flex_available
from posexp.model.gpt import AttentionPlan
from posexp.model.window import AttentionWindow, check_window
from posexp.runs.layout import merge_rows, row_key
from posexp.reporting.options import ReportOptions

VOCAB = 64



@pytest.fixture
def compose(compose):
    """The composed config as the commands hand it down: typed (``compose.raw``: as Hydra composes it)."""
    def typed_compose(*overrides):
        return typed(compose(*overrides))

    typed_compose.raw = compose
    return typed_compose

def _model(compose, encoder: str, n_layers: int = 1, block: int = 8):
    # head width 16, the narrowest FlexAttention tiles; query blocks of 8, so a length of 37 spans five
    cfg = compose(f"encoder={encoder}", "model.d_model=64", "model.n_heads=4", f"model.n_layers={n_layers}",
                  f"model.attn_block_size={block}")
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB).eval()
    model.fused_attention = False
    with torch.no_grad():  # learned biases start at zero (T5, Shaw): make every entry count
        for p in model.encoder.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model


def _reference(attn, enc, x: torch.Tensor, pos: torch.Tensor, size: int, sinks: int) -> torch.Tensor:
    """Brute force: every logit, the encoder's bias and scores added, then query ``i`` masked to keys ``j <= i``
    with ``i - j < size`` or ``j < sinks`` by a loop, softmax, values, projection."""
    B, L, D = x.shape
    q, k, v = attn.qkv(x).view(B, L, 3, attn.n_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    if enc.uses_rotate:
        q, k = enc.rotate(q, k, pos, pos)
    logits = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)  # (B, H, L, L)
    if enc.uses_bias:
        logits = logits + enc.bias(pos, pos)
    if enc.uses_scores:
        logits = logits + enc.scores(q, k, pos, pos)
    allowed = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(i + 1):
            allowed[i, j] = i - j < size or j < sinks
    y = logits.masked_fill(~allowed, float("-inf")).softmax(-1) @ v  # (B, H, L, Dh)
    return attn.proj(y.transpose(1, 2).reshape(B, L, D))


PATHS = [("none", False), ("rope", False), ("alibi", False), ("shaw", False), ("alibi", True)]


@pytest.mark.parametrize("size,sinks", [(5, 0), (5, 2), (1, 0), (100, 0)])
@pytest.mark.parametrize("encoder,fused", PATHS, ids=["sdpa", "rope", "bias", "scores", "flex"])
def test_windowed_attention_is_the_brute_force_masked_softmax(compose, encoder, fused, size, sinks):
    if fused and not flex_available():
        pytest.skip("this torch has no FlexAttention")
    model = _model(compose, encoder)
    enc, attn = model.encoder, model.blocks[0].attn
    x = torch.randn(2, 37, 64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(37)
    plan = AttentionPlan(enc, pos, 8, fused=fused, window=AttentionWindow(size, sinks))
    assert plan.fused == fused  # the path under test is the one taken
    with torch.no_grad():
        got = attn(x, plan)
        want = _reference(attn, enc, x, pos, size, sinks)
        plain = attn(x, AttentionPlan(enc, pos, 8, fused=fused))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if size < 37:
        assert not torch.allclose(got, plain, atol=1e-4)  # the window changed what was seen


def _outputs_after_change(model, changed: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    other = idx.clone()
    other[0, changed] = (other[0, changed] + 1) % VOCAB
    with torch.no_grad():
        return model(idx)[0], model(other)[0]


@pytest.mark.parametrize("encoder", ["rope", "alibi", "shaw"])
def test_a_query_ignores_tokens_older_than_its_window(compose, encoder):
    model = _model(compose, encoder, n_layers=2)
    model.attention_window = AttentionWindow(5)
    # two layers of windows of 5: query 39 reaches back 2 * (5 - 1) = 8 tokens, to token 31
    a, b = _outputs_after_change(model, list(range(31)))
    torch.testing.assert_close(a[39], b[39], rtol=0, atol=1e-6)
    a, b = _outputs_after_change(model, [31])
    assert not torch.allclose(a[39], b[39], atol=1e-4)


def test_sinks_keep_the_first_tokens_visible(compose):
    model = _model(compose, "rope", n_layers=2)
    model.attention_window = AttentionWindow(5, sinks=2)
    a, b = _outputs_after_change(model, [1])  # a sink: seen from every query
    assert not torch.allclose(a[39], b[39], atol=1e-4)
    a, b = _outputs_after_change(model, list(range(2, 31)))  # neither a sink nor within reach
    torch.testing.assert_close(a[39], b[39], rtol=0, atol=1e-6)


# -- evaluation rows -------------------------------------------------------------------------------

def _evaluate(model, **kwargs) -> list[dict]:
    val = np.random.default_rng(0).integers(0, VOCAB, 4096).astype(np.uint16)
    return evaluate_at(model, val, [16, 32], 16, tokens=512, batch_tokens=1024, **kwargs)


NUMBERS = ("ppl", "loss", "loss_se", "ppl_low", "ppl_high", "tokens", "targets", "windows")


@pytest.mark.parametrize("protocol,extra", [("nonoverlap", {}), ("sliding", {"stride": 8}), ("last_k", {"last_k": 8})])
def test_no_window_is_the_evaluation_as_it_was(compose, protocol, extra):
    model = _model(compose, "alibi", n_layers=2)
    plain = _evaluate(model, protocol=protocol, **extra)
    unset = _evaluate(model, protocol=protocol, window=None, **extra)
    for a, b in zip(plain, unset):
        assert "window" not in a and "sinks" not in a
        assert {k: a[k] for k in NUMBERS} == {k: b[k] for k in NUMBERS}  # bit for bit
    # a window as long as the longest length hides nothing: the same losses, to rounding
    wide = _evaluate(model, protocol=protocol, window=AttentionWindow(32), **extra)
    for a, b in zip(plain, wide):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["window"] == 32 and b["sinks"] is None


def test_windowed_rows_record_it_and_merge_apart_from_plain_rows(compose):
    model = _model(compose, "rope")
    plain = _evaluate(model)
    windowed = _evaluate(model, window=AttentionWindow(4, sinks=1))
    assert [(r["window"], r["sinks"]) for r in windowed] == [(4, 1), (4, 1)]
    assert windowed[1]["loss"] != pytest.approx(plain[1]["loss"], rel=1e-6)
    assert model.attention_window is None  # the model attends as before once the evaluation is done
    merged = merge_rows(plain, windowed)
    assert len(merged) == 4 and merged[:2] == plain
    again = merge_rows(merged, _evaluate(model, window=AttentionWindow(4, sinks=1)))
    assert len(again) == 4  # a windowed row re-measured replaces only its own
    assert len({row_key(r) for r in merge_rows(merged, _evaluate(model, window=AttentionWindow(4)))}) == 6


@pytest.mark.parametrize("window,sinks,key", [(0, None, "eval.window"), (-3, None, "eval.window"),
                                              (2.5, None, "eval.window"), (None, 4, "eval.sinks"),
                                              (8, 0, "eval.sinks"), (True, None, "eval.window")])
def test_bad_values_are_one_line_naming_the_key(window, sinks, key):
    with pytest.raises(ConfigError) as e:
        check_window(window, sinks)
    assert e.value.key == key and "\n" not in str(e.value)


def test_passkey_rows_under_a_window_record_it(compose):
    from posexp.data.corpus import corpus_from_config
    from posexp.evaluation.accuracy import evaluate_task_config as evaluate_task
    from posexp.tasks.source import TrainingSource

    overrides = ("task=passkey", "model.d_model=64", "model.n_heads=4", "model.n_layers=1", "train_len=64",
                 "eval.lengths=[64,128]", "eval.examples=4", "eval.depths=[0.0,1.0]")
    cfg = compose(*overrides)
    source = TrainingSource.of_task(cfg, corpus_from_config(cfg))
    model = build_model(cfg, source.vocab_size).eval()
    with torch.no_grad():
        plain = evaluate_task(model, source.task, cfg, torch.device("cpu"))
        windowed = evaluate_task(model, source.task, compose(*overrides, "eval.window=16", "eval.sinks=4"),
                                 torch.device("cpu"))
    assert all("window" not in r for r in plain)
    assert [(r["length"], r["depth"], r["window"], r["sinks"]) for r in windowed] == [
        (64, 0.0, 16, 4), (64, 1.0, 16, 4), (128, 0.0, 16, 4), (128, 1.0, 16, 4)]
    assert len(merge_rows(plain, windowed)) == 8
    assert model.attention_window is None


@pytest.mark.parametrize("overrides,key", [(["eval.window=0"], "eval.window"), (["eval.sinks=4"], "eval.sinks"),
                                          (["eval.window=abc"], "eval.window")])
def test_posexp_eval_refuses_bad_windows_in_one_line(compose, overrides, key):
    from posexp.commands.eval import apply_eval_overrides, parse_eval_overrides
    from posexp.commands.validation import validate

    with pytest.raises(ConfigError) as e:
        validate(typed(apply_eval_overrides(compose.raw(), parse_eval_overrides(overrides))), memory=None)
    assert e.value.key == key and "\n" not in str(e.value)


def test_posexp_eval_window_null_drops_the_sinks_it_was_trained_with(compose):
    from posexp.commands.eval import apply_eval_overrides, parse_eval_overrides

    trained = compose.raw("eval.window=128", "eval.sinks=4")
    cfg = apply_eval_overrides(trained, parse_eval_overrides(["eval.window=null"]))
    assert cfg.eval.window is None and cfg.eval.sinks is None


# -- reports ---------------------------------------------------------------------------------------

def _rows(ppls: dict[int, float], **fields) -> list[dict]:
    return [{"length": n, "multiple": n / 128, "protocol": "nonoverlap", "stride": None, "last_k": None,
             "scaling": None, "scaling_factor": None, "applicable": True, "ppl": p, "loss": math.log(p),
             "ppl_low": p * 0.98, "ppl_high": p * 1.02, "tokens": 1024, "targets": [1, 1024], "windows": 4,
             **fields} for n, p in ppls.items()]


def test_reports_keep_windowed_rows_apart_like_scalings(tmp_path):
    from posexp.reporting import build_report, render_csv, render_json, render_markdown

    windowed = _rows({128: 3.0, 512: 3.1}, window=128, sinks=4)
    both = make_run(tmp_path / "both", {}, extra_rows=windowed + _rows({128: 3.0, 512: 5.0}))
    report = build_report([both])
    assert report.window is None and report.rows[0].cells[512].mean == 5.0  # plain rows, though listed second
    assert "nonoverlap with window 128 + 4 sinks" in render_markdown(report)
    only = make_run(tmp_path / "only", {}, extra_rows=windowed)
    report = build_report([only])
    assert report.window == (128, 4) and report.rows[0].cells[512].mean == 3.1
    assert "with window 128 + 4 sinks" in render_markdown(report)
    assert (json.loads(render_json(report))["window"], json.loads(render_json(report))["sinks"]) == (128, 4)
    table = list(csv.DictReader(io.StringIO(render_csv(report))))
    assert [(r["length"], r["window"], r["sinks"]) for r in table] == [("128", "128", "4"), ("512", "128", "4")]
    assert "window" not in json.loads(render_json(build_report([make_run(tmp_path / "plain", {128: 3.0})])))


def test_a_runs_own_files_show_its_windowed_rows_apart(tmp_path):
    from posexp.runs.layout import read_results
    from posexp.rendering.results import results_csv, results_markdown, write_results

    folder = make_run(tmp_path / "r", {}, extra_rows=_rows({128: 3.0, 512: 5.0}) + _rows({512: 3.1}, window=128))
    results = read_results(folder)
    write_results(folder, results)
    table = list(csv.DictReader(io.StringIO(results_csv(results))))
    assert [(r["length"], r["window"]) for r in table] == [("128", ""), ("512", ""), ("512", "128")]
    assert "| 512 | 4 | nonoverlap window 128 |" in results_markdown(results)
    plain = make_run(tmp_path / "p", {}, extra_rows=_rows({128: 3.0}))
    assert "window" not in results_csv(read_results(plain)).splitlines()[0].split(",")  # as it was


def test_context_gain_reads_the_rows_of_its_own_window(tmp_path):
    from posexp.reporting import build_report

    def last_k(ppls, **fields):
        return [{**r, "protocol": "last_k", "last_k": 32} for r in _rows(ppls, **fields)]

    folder = make_run(tmp_path / "r", {}, extra_rows=last_k({128: 3.0, 512: 2.5}) + last_k({128: 3.0, 512: 3.0},
                                                                                           window=128))
    gain = {view: build_report([folder], ReportOptions(metrics="gain", view=view)).groups[0].metrics["gain"].mean
            for view in (None, "window=128")}
    assert gain == {None: pytest.approx(math.log(3.0) - math.log(2.5)), "window=128": pytest.approx(0.0)}


def test_report_view_shows_the_window_baseline_and_its_context_gain(tmp_path):
    from posexp.reporting import build_report

    def last_k(ppls, **fields):
        return [{**r, "protocol": "last_k", "last_k": 32} for r in _rows(ppls, **fields)]

    folder = make_run(tmp_path / "r", {}, extra_rows=_rows({128: 3.0, 512: 5.0}) + _rows({128: 3.0, 512: 3.1},
                      window=128) + last_k({128: 3.0, 512: 2.5}) + last_k({128: 3.0, 512: 3.0}, window=128))
    plain, windowed = build_report([folder]), build_report([folder], ReportOptions(view="window=128", metrics="gain"))
    assert plain.window is None and plain.rows[0].cells[512].mean == 5.0
    assert windowed.window == (128, None) and windowed.protocol == "nonoverlap"
    assert windowed.rows[0].cells[512].mean == 3.1
    assert windowed.groups[0].metrics["gain"].mean == pytest.approx(0.0)  # the windowed last_k rows' gain
    last = build_report([folder], ReportOptions(view=["protocol=last_k", "window=128"]))
    assert (last.protocol, last.window, last.rows[0].cells[512].mean) == ("last_k", (128, None), 3.0)


@pytest.mark.parametrize("view,message", [
    ("window=64", "no results of the selected runs are window=64; they have: nonoverlap; nonoverlap with window 128"),
    ("wndow=128", "KEY one of protocol, scaling, window, sinks"),
    ("window=0", "window=0: a positive integer"),
    ("protocol=strided", "unknown protocol 'strided'; choose one of nonoverlap, sliding, last_k"),
    ("sinks=4,window=none", "sinks belong to a window"),
])
def test_a_view_that_is_not_there_or_malformed_is_one_line_naming_view(tmp_path, view, message):
    from posexp.reporting import build_report

    folder = make_run(tmp_path / "r", {}, extra_rows=_rows({128: 3.0}) + _rows({128: 3.0}, window=128))
    with pytest.raises(ConfigError, match="--view") as err:
        build_report([folder], ReportOptions(view=view))
    assert message in str(err.value)


def test_a_view_report_goes_beside_the_folders_own_and_covers_task_runs(tmp_path):
    from rich.console import Console

    from posexp.reporting.summary import report_main

    folder = tmp_path / "sweep"
    make_run(folder / "0", {}, extra_rows=_rows({128: 3.0, 512: 5.0}) + _rows({128: 3.0, 512: 3.1}, window=128))
    task = make_task_run(folder / "1", {64: 0.9, 128: 0.5})
    results = json.loads((task / "results.json").read_text())
    results["rows"] += [{**r, "window": 64, "sinks": None, "exact_match": r["exact_match"] / 2}
                        for r in results["rows"]]
    (task / "results.json").write_text(json.dumps(results))
    report_main([folder], console=Console(file=io.StringIO(), width=200))
    out = io.StringIO()
    report_main([folder], console=Console(file=out, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(view="window=64", fmt="markdown"))
    assert "Rows shown: window 64." in out.getvalue() and "| 45.0 | 25.0 |" in out.getvalue()
    with pytest.raises(ConfigError, match="no results of the selected runs are window=64"):
        report_main([folder / "0"], console=Console(file=io.StringIO()), options=ReportOptions(view="window=64"))
    out = io.StringIO()
    report_main([folder / "0"], console=Console(file=out, width=200), err_console=Console(file=io.StringIO()),
                options=ReportOptions(view="window=128", fmt="markdown"))
    assert "| 3.00 | 3.10 |" in out.getvalue().replace("3.000", "3.00")
    mine = (folder / "0" / "reports" / "view-window=128" / "report.md").read_text()
    plain = (folder / "reports" / "default" / "report.md").read_text()
    assert "window 128" in mine and "window 128" not in plain.split("Also in")[0]


# -- the commands ----------------------------------------------------------------------------------

def test_train_and_posexp_eval_with_a_window(compose, tmp_path):
    from rich.console import Console

    from posexp.commands.eval import reeval_main
    from posexp.commands.train import run_train
    from posexp.runs.layout import read_loss_by_position, read_results
    from posexp.tracking.tracker import metric_name

    overrides = ["experiment=smoke", "train.progress=false", "train.steps=2", "train.warmup_steps=0",
                 "eval.window=16", "eval.sinks=2"]
    run_train(compose(*overrides), tmp_path, overrides, console=Console(file=io.StringIO()))
    trained = read_results(tmp_path)["rows"]
    assert {(r["window"], r["sinks"]) for r in trained} == {(16, 2)}
    assert read_results(tmp_path)["run"]["eval_settings"]["window"] == 16
    quiet = Console(file=io.StringIO(), width=200)
    reeval_main([str(tmp_path), "eval.window=null"], quiet)  # the plain rows, beside the windowed ones
    reeval_main([str(tmp_path), "eval.window=8"], quiet)  # sinks belong to the window they were given with
    rows = read_results(tmp_path)["rows"]
    lengths = sorted({r["length"] for r in rows})
    assert [(r.get("window"), r.get("sinks")) for r in rows] == (
        [(16, 2)] * len(lengths) + [(None, None)] * len(lengths) + [(8, None)] * len(lengths))
    assert {(r.get("window"), r.get("sinks")) for r in read_loss_by_position(tmp_path)} == {(16, 2), (None, None),
                                                                                           (8, None)}
    assert len({metric_name(r) for r in rows if r["length"] == lengths[0]}) == 3
