"""Evaluation protocols, uncertainty, loss by position, memory, and ``posexp eval`` on trained runs."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import TINY_RUN, invoke, invoke_main
from posexp.encoders import create
from posexp.errors import ConfigError, PosexpError
from posexp.evaluation.perplexity import batch_means_se, plan_windows
from helpers import evaluate_at
from posexp.runs.layout import merge_rows
from posexp.model.gpt import GPT, ModelShape
from posexp.commands.edge import typed

CPU = torch.device("cpu")


def _tiny(encoder: str = "alibi", seed: int = 0, **shape) -> GPT:
    torch.manual_seed(seed)
    s = ModelShape(d_model=16, n_layers=1, n_heads=2, **shape)
    return GPT(s, create(encoder, d_model=16, n_heads=2)).eval()


def _val(n: int = 3000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _window_losses(model: GPT, val: np.ndarray, start: int, length: int) -> torch.Tensor:
    """Per-target losses of one window read directly with the model: targets start+1 .. start+L."""
    ids = torch.from_numpy(val[start:start + length + 1].astype(np.int64))[None]
    with torch.no_grad():
        return F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:], reduction="none")


# -- which tokens each protocol scores ------------------------------------------------------------

@pytest.mark.parametrize("length,stride", [(16, 1), (16, 5), (32, 16), (32, 32)])
def test_sliding_windows_score_each_target_once_with_at_least_L_minus_S_context(length, stride):
    win = plan_windows("sliding", length, 10_000, budget=256, stride=stride)
    assert win.scored[0] == length  # the first window scores all of its targets
    assert win.tokens == 256 and (win.first, win.last) == (1, 256)
    scored = []
    for start, k in zip(win.starts, win.scored):
        assert start >= 0 and 1 <= k <= stride or start == 0
        scored += list(range(start + 1 + length - k, start + 1 + length))
    assert scored == list(range(1, 257))  # every target exactly once, in order
    assert all(k == stride for k in win.scored[1:-1])


def test_sliding_with_stride_L_is_exactly_nonoverlap():
    model, val = _tiny(), _val()
    a = evaluate_at(model, val, [16, 32], 16, tokens=512, batch_tokens=128, device=CPU)
    b = evaluate_at(model, val, [16, 32], 16, tokens=512, batch_tokens=128, device=CPU, protocol="sliding", stride=16)
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-12)  # L = 16 = S: the same windows
    assert [r["targets"] for r in a] == [r["targets"] for r in b] == [[1, 512], [1, 512]]
    assert b[1]["windows"] == 1 + (512 - 32) // 16  # at L = 32 the windows overlap by 16
    assert b[1]["loss"] != a[1]["loss"]  # more context for the same targets


def test_sliding_matches_a_direct_computation():
    """Press et al. 2022's sliding evaluation, written out by hand: stride 5, L = 12, targets 1..48."""
    model, val = _tiny("rope"), _val()
    L, S, N = 12, 5, 48
    row = evaluate_at(model, val, [L], L, tokens=N, batch_tokens=7 * L, device=CPU, protocol="sliding", stride=S)[0]
    losses = list(_window_losses(model, val, 0, L))  # the first window scores all L targets
    end = L
    while end < N:
        new_end = min(end + S, N)
        losses += list(_window_losses(model, val, new_end - L, L)[L - (new_end - end):])
        end = new_end
    assert len(losses) == N == row["tokens"]
    assert row["loss"] == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5)


def test_last_k_scores_the_same_targets_at_every_length_and_matches_a_direct_computation():
    model, val = _tiny("t5"), _val(2000)
    K, T = 8, 1999
    rows = evaluate_at(model, val, [16, 64], 16, tokens=96, batch_tokens=256, device=CPU, protocol="last_k", last_k=K)
    assert [r["targets"] for r in rows] == [[T - 95, T], [T - 95, T]]
    assert all(r["tokens"] == 96 and r["windows"] == 12 and r["last_k"] == K for r in rows)
    for row in rows:
        L = row["length"]
        direct = [_window_losses(model, val, T - (11 - j) * K - L, L)[-K:] for j in range(12)]
        assert row["loss"] == pytest.approx(torch.cat(direct).mean().item(), rel=1e-5)
    # the windows are anchored at the end of the split, so another call scores the same targets
    again = evaluate_at(model, val, [16], 16, tokens=96, batch_tokens=256, device=CPU, protocol="last_k", last_k=K)[0]
    assert again["targets"] == rows[0]["targets"] and again["loss"] == pytest.approx(rows[0]["loss"], rel=1e-12)


@pytest.mark.parametrize("kwargs,key", [
    ({"protocol": "bogus"}, "eval.protocol"),
    ({"protocol": "sliding"}, "eval.stride"),
    ({"protocol": "sliding", "stride": 0}, "eval.stride"),
    ({"protocol": "sliding", "stride": 33}, "eval.stride"),
    ({"protocol": "last_k", "last_k": 33}, "eval.last_k"),
    ({"protocol": "nonoverlap", "stride": 4}, "eval.stride"),
    ({"scaling": "yarn"}, "eval.scaling"),  # alibi has no rotary frequencies
    ({"scaling": "bogus"}, "eval.scaling"),
])
def test_bad_protocol_settings_name_the_key(kwargs, key):
    with pytest.raises(ConfigError) as err:
        evaluate_at(_tiny(), _val(), [32, 64], 32, tokens=256, batch_tokens=256, device=CPU, **kwargs)
    assert err.value.key == key


def test_config_validation_names_the_key_and_the_allowed_values(compose):
    from posexp.commands.validation import validate

    for overrides, key, needle in [
        (["eval.protocol=sliding"], "eval.stride", "eval.stride=S"),
        (["eval.protocol=sliding", "eval.stride=4096"], "eval.stride", "shortest eval length 128"),
        (["eval.protocol=last_k", "eval.last_k=0"], "eval.last_k", "between 1 and"),
        (["eval.protocol=windows"], "eval.protocol", "nonoverlap, sliding, last_k"),
        (["encoder=alibi", "eval.scaling=yarn"], "eval.scaling", "rope"),
        (["eval.scaling=linear", "eval.scaling_factor=0.5"], "eval.scaling_factor", ">= 1"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate(typed(compose(*overrides)))
        assert err.value.key == key and needle in str(err.value), (overrides, str(err.value))


# -- uncertainty and loss by position --------------------------------------------------------------

def test_batch_means_se_weights_a_short_last_block_by_its_size():
    x = np.array([1.0, 1.0, 3.0, 3.0, 5.0])
    se, m = batch_means_se(x, 2)  # blocks [1,1], [3,3], [5]
    mean = x.mean()
    expected = math.sqrt(3 / 2 * ((2 - 2 * mean) ** 2 + (6 - 2 * mean) ** 2 + (5 - mean) ** 2) / 25)
    assert m == 3 and se == pytest.approx(expected)
    equal, _ = batch_means_se(x[:4], 2)
    assert equal == pytest.approx(np.std([1.0, 3.0], ddof=1) / math.sqrt(2))
    assert batch_means_se(x, 8) == (None, 1)


def test_standard_errors_are_over_L_token_blocks_for_every_protocol():
    model, val = _tiny(), _val()
    kw = dict(tokens=512, batch_tokens=256, device=CPU)
    non = evaluate_at(model, val, [32], 32, **kw)[0]
    windows = [_window_losses(model, val, 32 * i, 32).mean().item() for i in range(16)]
    assert non["loss_se"] == pytest.approx(np.std(windows, ddof=1) / 4, rel=1e-4)  # the windows themselves
    slide = evaluate_at(model, val, [32], 32, protocol="sliding", stride=1, **kw)[0]
    assert slide["windows"] == 1 + 512 - 32 and slide["se_blocks"] == 16  # not 481 one-token "samples"
    last = evaluate_at(model, val, [32], 32, protocol="last_k", last_k=4, **kw)[0]
    assert last["se_blocks"] == 16
    for row in (non, slide, last):
        assert row["ppl_low"] < row["ppl"] < row["ppl_high"]
        assert row["ppl_low"] == pytest.approx(math.exp(row["loss"] - 1.959964 * row["loss_se"]))


def test_loss_by_position_counts_only_scored_positions():
    model, val = _tiny(), _val()
    records: list = []
    rows = evaluate_at(model, val, [16, 64], 16, tokens=256, batch_tokens=256, device=CPU, positions=records)
    records_k: list = []
    evaluate_at(model, val, [16, 64], 16, tokens=256, batch_tokens=256, device=CPU, protocol="last_k", last_k=4,
             positions=records_k)
    for rec, row in zip(records, rows):
        assert (rec["position_count"] == row["windows"]).all()  # nonoverlap: every position of every window
        assert rec["position_sum"].sum() / rec["position_count"].sum() == pytest.approx(row["loss"])
    for rec in records_k:
        L = rec["length"]
        assert rec["position_count"][:L - 4].sum() == 0 and (rec["position_count"][L - 4:] == 64).all()


# -- long contexts, memory, speed, out-of-memory ----------------------------------------------------

@pytest.mark.parametrize("encoder", ["rope", "alibi", "t5"])
def test_32x_the_default_training_length_on_the_default_model(encoder):
    """128 -> 4096 tokens on the default model shape: finishes, records speed and memory."""
    torch.manual_seed(0)
    model = GPT(ModelShape(), create(encoder, d_model=128, n_heads=4)).eval()
    row = evaluate_at(model, _val(4097), [4096], 128, tokens=4096, batch_tokens=4096, device=CPU)[0]
    assert row["applicable"] and math.isfinite(row["ppl"]) and row["tokens"] == 4096
    assert row["tokens_per_s"] > 0 and row["forward_tokens"] == 4096
    assert row["peak_rss_mb"] > 0 and "rss" in row["mem_measure"]
    if row["peak_mem_mb"] is not None:  # Linux: the high-water mark can be reset per length
        assert 0 < row["peak_mem_mb"] < 1024


def _oom_when(model: GPT, too_big) -> list:
    """Make ``model.token_losses`` raise out-of-memory while ``too_big(batch)`` holds."""
    calls = []
    real = model.token_losses

    def token_losses(idx, targets, pos=None):
        calls.append((idx.shape[0], model.shape.attn_block_size))
        if too_big(idx):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(idx, targets, pos)

    model.token_losses = token_losses
    return calls


def test_out_of_memory_halves_the_batch_then_the_query_blocks():
    val = _val()
    reference = evaluate_at(_tiny(attn_block_size=64), val, [64], 64, tokens=512, batch_tokens=512, device=CPU)[0]
    model = _tiny(attn_block_size=64)
    calls = _oom_when(model, lambda idx: idx.shape[0] > 1 or model.shape.attn_block_size > 16)
    notes: list[str] = []
    row = evaluate_at(model, val, [64], 64, tokens=512, batch_tokens=512, device=CPU, log=notes.append)[0]
    assert row["batch_windows"] == 1 and row["attn_block_size"] == 16 and row["oom_retries"] == 5
    assert row["loss"] == pytest.approx(reference["loss"], rel=1e-5)  # same numbers, smaller pieces
    assert [c[0] for c in calls[:4]] == [8, 4, 2, 1] and calls[-1] == (1, 16)
    assert any("query blocks of 16" in n for n in notes)
    assert model.shape.attn_block_size == 64  # restored for whoever uses the model next


def test_out_of_memory_with_nothing_left_to_shrink_is_a_clear_error():
    model = _tiny(attn_block_size=64)
    _oom_when(model, lambda idx: True)
    with pytest.raises(PosexpError, match="out of memory evaluating length 64"):
        evaluate_at(model, _val(), [64], 64, tokens=512, batch_tokens=512, device=CPU)


def test_other_runtime_errors_are_not_mistaken_for_out_of_memory():
    model = _tiny()

    def broken(*a, **k):
        raise RuntimeError("shape mismatch")

    model.token_losses = broken
    with pytest.raises(RuntimeError, match="shape mismatch"):
        evaluate_at(model, _val(), [32], 32, tokens=256, batch_tokens=256, device=CPU)


# -- scaling rows ----------------------------------------------------------------------------------

def test_scaled_rows_record_the_scaling_and_factor_and_change_nothing_at_the_training_length():
    model, val = _tiny("rope"), _val()
    plain = evaluate_at(model, val, [16, 64], 16, tokens=256, batch_tokens=256, device=CPU)
    yarn = evaluate_at(model, val, [16, 64], 16, tokens=256, batch_tokens=256, device=CPU, scaling="yarn")
    assert [(r["scaling"], r["scaling_factor"]) for r in yarn] == [("yarn", 1.0), ("yarn", 4.0)]
    assert yarn[0]["loss"] == pytest.approx(plain[0]["loss"], rel=1e-6)  # s = 1: the trained encoding
    assert yarn[1]["loss"] != plain[1]["loss"]
    fixed = evaluate_at(model, val, [16, 64], 16, tokens=256, batch_tokens=256, device=CPU, scaling="linear",
                     scaling_factor=2.0)
    assert [r["scaling_factor"] for r in fixed] == [2.0, 2.0]
    assert model.encoder.scaling is None  # the trained encoder is back in place


def test_learned_positions_become_applicable_with_interpolation():
    torch.manual_seed(0)
    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), create("learned", d_model=16, n_heads=2,
                                                                         max_length=16)).eval()
    plain = evaluate_at(model, _val(), [16, 64], 16, tokens=256, batch_tokens=256, device=CPU)
    pi = evaluate_at(model, _val(), [16, 64], 16, tokens=256, batch_tokens=256, device=CPU, scaling="linear")
    assert [r["applicable"] for r in plain] == [True, False]
    assert [r["applicable"] for r in pi] == [True, True] and math.isfinite(pi[1]["ppl"])


def test_merge_rows_replaces_the_same_measurement_and_keeps_the_rest():
    old = [{"length": 32, "protocol": "nonoverlap", "scaling": None, "ppl": 1.0},
           {"length": 64, "protocol": "nonoverlap", "scaling": None, "ppl": 2.0}]
    new = [{"length": 64, "protocol": "nonoverlap", "stride": None, "last_k": None, "scaling": None,
            "scaling_factor": None, "ppl": 3.0},
           {"length": 64, "protocol": "sliding", "stride": 8, "last_k": None, "scaling": None,
            "scaling_factor": None, "ppl": 4.0}]
    assert [r["ppl"] for r in merge_rows(old, new)] == [1.0, 3.0, 4.0]


# -- posexp eval on trained runs ---------------------------------------------------------------------

@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(trained, dest)
    return dest


def _rows(run: Path) -> list[dict]:
    return json.loads((run / "results.json").read_text())["rows"]


def test_posexp_eval_appends_rows_and_keeps_the_earlier_ones(run_copy):
    before = _rows(run_copy)
    proc = invoke_main("eval", "run", "eval.lengths=[32,256]", "eval.protocol=last_k", "eval.last_k=16",
                       cwd=run_copy.parent)
    assert proc.exit_code == 0, proc.stderr
    assert "perplexity by context length" in proc.stdout and "last_k K=16" in proc.stdout
    rows = _rows(run_copy)
    assert rows[:len(before)] == before  # earlier rows untouched
    new = rows[len(before):]
    assert [(r["length"], r["protocol"], r["last_k"]) for r in new] == [(32, "last_k", 16), (256, "last_k", 16)]
    assert new[0]["targets"] == new[1]["targets"]
    results = json.loads((run_copy / "results.json").read_text())
    assert results["evaluations"][-1]["overrides"] == ["eval.lengths=[32,256]", "eval.protocol=last_k",
                                                        "eval.last_k=16"]
    with open(run_copy / "loss_by_position.csv") as f:
        pos = list(csv.DictReader(f))
    assert {"length", "position", "loss", "count"} <= set(pos[0])
    assert {(p["protocol"], p["length"]) for p in pos} >= {("nonoverlap", "32"), ("last_k", "256")}
    assert (run_copy / "loss_by_position.png").read_bytes()[:4] == b"\x89PNG"
    assert "last_k K=16" in (run_copy / "results.md").read_text()

    # the same evaluation again replaces its rows instead of adding more
    again = invoke("eval", "run", "eval.lengths=[256]", "eval.protocol=last_k", "eval.last_k=16", cwd=run_copy.parent)
    assert again.exit_code == 0, again.output
    assert len(_rows(run_copy)) == len(rows)


def test_posexp_eval_with_yarn_adds_scaled_rows(run_copy):
    result = invoke("eval", str(run_copy), "eval.scaling=yarn", "eval.multiples=[1,8]", cwd=run_copy.parent)
    assert result.exit_code == 0, result.output
    scaled = [r for r in _rows(run_copy) if r["scaling"] == "yarn"]
    assert [(r["length"], r["scaling_factor"]) for r in scaled] == [(32, 1.0), (256, 8.0)]
    assert "yarn" in result.output


def test_posexp_eval_of_a_sweep_folder_evaluates_every_run(trained, tmp_path):
    sweep = tmp_path / "sweep"
    for name in ("0", "1", "2"):
        shutil.copytree(trained, sweep / name)
    shutil.rmtree(sweep / "2" / "checkpoint")  # not a run any more: skipped, with a warning
    untouched = (sweep / "2" / "results.json").read_bytes()
    result = invoke("eval", str(sweep), "eval.lengths=[64]", "eval.protocol=sliding", "eval.stride=16", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    for name in ("0", "1"):
        assert any(r["protocol"] == "sliding" and r["stride"] == 16 for r in _rows(sweep / name))
    assert (sweep / "2" / "results.json").read_bytes() == untouched
    assert "skipping" in result.output


@pytest.fixture
def alibi_run(compose, tmp_path) -> Path:
    """A run of an encoding without rotary frequencies (trained in-process, no .hydra folder)."""
    from posexp.commands.train import run_train

    overrides = [*TINY_RUN, "encoder=alibi", "train.steps=2", "eval.multiples=[1]"]
    run_train(compose(*overrides), tmp_path / "alibi", overrides)
    return tmp_path / "alibi"


BAD_EVAL = [
    (["eval.protocol=bogus"], ["eval.protocol", "nonoverlap", "sliding", "last_k"]),
    (["eval.scaling=bogus"], ["eval.scaling", "linear", "ntk", "dynamic_ntk", "yarn", "llama3"]),
    (["eval.protocol=sliding", "eval.stride=0"], ["eval.stride", "between 1 and"]),
    (["eval.protocol=sliding", "eval.stride=64"], ["eval.stride", "shortest eval length 32"]),
    (["eval.protocol=sliding"], ["eval.stride", "needs a stride"]),
    (["eval.protocol=last_k", "eval.last_k=33"], ["eval.last_k", "between 1 and"]),
    (["eval.stride=8"], ["eval.stride", "sliding"]),
    (["eval.scaling_factor=0.5", "eval.scaling=ntk"], ["eval.scaling_factor", ">= 1"]),
    (["model.d_model=64"], ["model.d_model", "eval"]),
    (["eval.nope=1"], ["eval.nope", "eval.lengths", "eval.protocol"]),
    (["eval.lengths=[abc]"], ["eval.lengths"]),
    (["eval.depths=0.5"], ["eval.depths", "a list of depths in [0, 1], e.g. eval.depths=[0,0.5,1]"]),
    (["eval.examples=many"], ["eval.examples", "a positive integer, e.g. eval.examples=256"]),
    (["eval.key_tokens=5"], ["eval.key_tokens", "e.g. eval.key_tokens.evaluator=RUN"]),
    (["eval.protocol=sliding,last_k"], ["eval.protocol", "one setting at a time"]),
]


@pytest.mark.parametrize("overrides,needles", BAD_EVAL, ids=[" ".join(o) for o, _ in BAD_EVAL])
def test_bad_eval_input_is_a_clear_message_and_leaves_results_alone(run_copy, overrides, needles):
    before = (run_copy / "results.json").read_bytes()
    result = invoke("eval", "run", *overrides, cwd=run_copy.parent)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)
    assert (run_copy / "results.json").read_bytes() == before


def test_a_scaling_the_encoding_lacks_is_refused_by_name(alibi_run):
    before = (alibi_run / "results.json").read_bytes()
    result = invoke("eval", str(alibi_run), "eval.scaling=yarn", cwd=alibi_run.parent)
    assert result.exit_code != 0
    assert "eval.scaling" in result.output and "'alibi'" in result.output and "rope" in result.output
    assert (alibi_run / "results.json").read_bytes() == before
    ok = invoke("eval", str(alibi_run), "eval.lengths=[64]", cwd=alibi_run.parent)  # .hydra-less runs still load
    assert ok.exit_code == 0, ok.output


def test_a_run_without_checkpoint_is_refused_and_left_alone(run_copy):
    shutil.rmtree(run_copy / "checkpoint")
    before = (run_copy / "results.json").read_bytes()
    proc = invoke_main("eval", "run", "eval.lengths=[64]", cwd=run_copy.parent)
    assert proc.exit_code != 0 and isinstance(proc.exception, SystemExit), repr(proc.exception)
    assert "Traceback" not in proc.stderr
    assert "checkpoint" in proc.stderr and "model.safetensors" in proc.stderr
    assert (run_copy / "results.json").read_bytes() == before


def test_a_damaged_saved_config_is_named_not_a_traceback(run_copy):
    (run_copy / ".hydra" / "config.yaml").write_text("encoder: [unclosed\n")
    before = (run_copy / "results.json").read_bytes()
    proc = invoke_main("eval", "run", "eval.lengths=[64]", cwd=run_copy.parent)
    assert proc.exit_code != 0 and isinstance(proc.exception, SystemExit), repr(proc.exception)
    assert "Traceback" not in proc.stderr
    assert "config.yaml" in proc.stderr and "not valid YAML" in proc.stderr
    assert (run_copy / "results.json").read_bytes() == before


def test_a_folder_without_runs_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("eval", "empty", cwd=tmp_path)
    assert result.exit_code != 0 and "no runs found" in result.output


def test_a_sweep_skips_runs_whose_encoding_lacks_the_scaling(run_copy, alibi_run, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.move(str(run_copy), sweep / "rope")
    shutil.move(str(alibi_run), sweep / "alibi")
    untouched = (sweep / "alibi" / "results.json").read_bytes()
    result = invoke("eval", "sweep", "eval.scaling=yarn", "eval.lengths=[64]", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "skipping" in result.output and "'alibi'" in result.output
    assert any(r["scaling"] == "yarn" for r in _rows(sweep / "rope"))
    assert (sweep / "alibi" / "results.json").read_bytes() == untouched
