"""Key-token perplexity (LongPPL, Fang et al. 2024): the paper's selection rule against a direct reference, the
cache every compared model shares, ``ppl_key`` on the rows, the report's ``ppl_key@Kx`` and the refusals."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from helpers import TINY_RUN, evaluate_at, invoke
from posexp.evaluation.key_tokens import (Evaluator, KeySelector, OpenedEvaluator, Rule, key_summary, short_contexts,
                                          target_contexts)
from posexp.evaluation.perplexity import plan_windows


@pytest.fixture
def lm(tiny):
    from posexp.commands.edge import typed
    from posexp.model.factory import build_model

    return build_model(typed(tiny("model.n_layers=1", "model.d_model=16", "model.n_heads=2")), 256).eval()


def _val(n: int = 400, seed: int = 3) -> np.ndarray:
    # a text with repeats, so that the long context helps some targets
    rng = np.random.default_rng(seed)
    piece = rng.integers(0, 256, 37)
    return np.concatenate([piece, rng.integers(0, 256, n - 74), piece]).astype(np.uint8)[:n]


def _reference(model, val, win, length, K, S):
    """The paper's quantities per candidate target, one forward pass per target and context (Eqs. 2-3)."""
    out = []
    for start, k in zip(win.starts.tolist(), win.scored.tolist()):
        for q in range(length - k, length):  # window position of the input before target t
            t, c = start + q + 1, q + 1  # target index, tokens of long context
            if c < K + S:
                continue  # the short window (K .. K+S-1 tokens, aligned to the window start) reads the same
            cs = K + (c - K) % S

            def loss(ctx: int) -> float:
                x = torch.from_numpy(val[t - ctx:t + 1].astype("int64"))[None]
                with torch.no_grad():
                    return float(model.token_losses(x[:, :-1], x[:, 1:])[0, -1])

            lo, sh = loss(c), loss(cs)
            out.append((t, -lo - (-sh), -lo))  # LSD = log p(long) - log p(short), LCL = log p(long)
    return out


def _selector(model, val, rule, tmp_path, calls=None):
    def opener():
        if calls is not None:
            calls.append(1)
        return OpenedEvaluator(model, 32)

    return KeySelector(Evaluator("tiny", "tiny-identity", "byte", opener), rule, val, tmp_path / "keys",
                       torch.device("cpu"), batch_tokens=256)


@pytest.mark.parametrize("protocol,stride,K,S", [("nonoverlap", None, 16, 1), ("nonoverlap", None, 16, 4),
                                                 ("sliding", 24, 8, 3)])
def test_selection_is_the_papers_rule_on_a_direct_reference(lm, tmp_path, protocol, stride, K, S):
    val, length = _val(), 64
    win = plan_windows(protocol, length, val.size, 128, stride)  # nonoverlap: 2 windows; sliding: 4
    ref = _reference(lm, val, win, length, K, S)
    lsd, lcl = np.array([r[1] for r in ref]), np.array([r[2] for r in ref])
    alpha, beta = float(np.median(lsd)), float(np.median(lcl))  # thresholds that split the candidates
    expected = {t for t, d, c in ref if d > alpha and c > beta}
    assert 0 < len(expected) < len(ref)
    keys, candidates, reason = _selector(lm, val, Rule(alpha, beta, K, S), tmp_path).select(length, win)
    assert reason is None and candidates == len(ref)
    assert set(keys.tolist()) == expected


def test_short_contexts_follow_the_authors_windows():
    # K = 4, S = 2: contexts 6, 7 -> 4, 5; 8, 9 -> 4, 5; under K + S none
    assert short_contexts(np.arange(1, 10), 4, 2).tolist() == [0, 0, 0, 0, 0, 4, 5, 4, 5]
    win = plan_windows("sliding", 8, 100, 24, 4)  # the first window scores 8 targets, the next ones 4
    assert target_contexts(win, 8).tolist() == [*range(1, 9), 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8]


def test_a_second_selection_reads_the_cache_and_the_rule_is_in_its_key(lm, tmp_path):
    val, calls = _val(), []
    win = plan_windows("nonoverlap", 64, val.size, 320)
    first = _selector(lm, val, Rule(0.0, -20.0, 16, 4), tmp_path, calls)
    keys, _, _ = first.select(64, win)
    again = _selector(lm, val, Rule(0.0, -20.0, 16, 4), tmp_path, calls)
    assert np.array_equal(again.select(64, win)[0], keys) and again.computed == 0 and len(calls) == 1
    other = _selector(lm, val, Rule(0.5, -20.0, 16, 4), tmp_path, calls)
    other.select(64, win)
    assert other.computed == 1 and len(calls) == 2
    assert len(list((tmp_path / "keys").glob("*.npz"))) == 2


def test_ppl_key_on_rows_is_the_mean_loss_of_the_key_targets(lm, tmp_path):
    val = _val()
    rows = evaluate_at(lm, val, [64], 32, tokens=320)
    selector = _selector(lm, val, Rule(0.0, -20.0, 16, 4), tmp_path)
    from posexp.config.schema import EvalConfig
    from posexp.evaluation.perplexity import EvalHooks, evaluate

    keyed = evaluate(lm, val, EvalConfig(lengths=[64], tokens=320), 32, torch.device("cpu"),
                     hooks=EvalHooks(key_tokens=selector))
    assert "ppl_key" not in rows[0] and "key_tokens" not in rows[0]
    assert keyed[0]["ppl"] == rows[0]["ppl"]
    keys, _, _ = selector.select(64, plan_windows("nonoverlap", 64, val.size, 320))
    x = torch.from_numpy(val[:321].astype("int64"))
    with torch.no_grad():  # five windows of 64, each target's loss directly
        losses = torch.cat([lm.token_losses(x[None, s:s + 64], x[None, s + 1:s + 65])[0] for s in range(0, 320, 64)])
    expected = math.exp(float(losses[keys - 1].double().mean()))
    assert keyed[0]["key_tokens"] == keys.size > 0
    assert keyed[0]["ppl_key"] == pytest.approx(expected, rel=1e-6)
    assert keyed[0]["ppl_key_low"] < keyed[0]["ppl_key"] < keyed[0]["ppl_key_high"]


def test_key_summary_interval_needs_two_blocks_with_key_tokens():
    losses = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    one = key_summary(losses, 1, np.array([2]), 2)
    assert one["ppl_key"] == pytest.approx(math.e ** 2) and one["ppl_key_low"] is None and one["key_tokens"] == 1
    two = key_summary(losses, 1, np.array([1, 5]), 2)
    # blocks (1,2) (3,4) (5,6): key sums 1, 0, 5 over counts 1, 0, 1; R = 3
    se = math.sqrt(3 / 2 * ((1 - 3) ** 2 + 0 + (5 - 3) ** 2) / 4)
    assert two["loss_key_se"] == pytest.approx(se) and two["ppl_key_high"] == pytest.approx(math.exp(3 + 1.959964 * se))
    assert key_summary(losses, 1, np.array([], dtype=np.int64), 2)["ppl_key"] is None


def test_posexp_eval_writes_ppl_key_reuses_the_cache_and_reports_the_metric(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    args = ("eval", str(run), f"eval.key_tokens.evaluator={trained}", "eval.key_tokens.alpha=0",
            "eval.key_tokens.beta=-20", f"eval.key_tokens.cache_dir={tmp_path / 'keys'}")
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "reads the long and short contexts" in first.output
    rows = json.loads((run / "results.json").read_text())["rows"]
    longest = max(rows, key=lambda r: r["length"])
    assert longest["key_tokens"] > 0 and longest["ppl_key"] > 0 and longest["key_selection"]["alpha"] == 0
    assert "ppl_key" in (run / "results.csv").read_text().splitlines()[0]
    second = invoke(*args)
    assert second.exit_code == 0 and "reads the long and short contexts" not in second.output
    again = json.loads((run / "results.json").read_text())["rows"]
    assert [r.get("ppl_key") for r in again] == [r.get("ppl_key") for r in rows]
    multiple = longest["length"] // 32 if longest["length"] % 32 == 0 else None
    report = invoke("report", str(run), "--metric", f"ppl_key@{multiple}x")
    assert report.exit_code == 0, report.output
    assert f"ppl_key@{multiple}x" in report.output and f"{longest['ppl_key']:.2f}" in report.output


def test_an_evaluator_that_is_no_run_or_reads_other_tokens_is_one_line(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    result = invoke("eval", str(run), f"eval.key_tokens.evaluator={tmp_path}")
    assert result.exit_code != 0 and "eval.key_tokens.evaluator" in result.output
    assert "not a run folder with weights" in result.output and "Traceback" not in result.output
    hf_tiny = pytest.importorskip("helpers.hf_tiny")
    folder = tmp_path / "hf-model"
    hf_tiny.model("llama").save_pretrained(folder)
    hf_tiny.tokenizer(folder)
    result = invoke("eval", str(run), f"eval.key_tokens.evaluator=hf:{folder}")
    assert result.exit_code != 0 and "Traceback" not in result.output
    line = " ".join(result.output.split())
    assert f"hf:{folder}" in line and str(run) in line and "posexp byte tokens" in line and "same tokenizer" in line
    assert json.loads((run / "results.json").read_text()) == json.loads((trained / "results.json").read_text())
    train = invoke("train", *TINY_RUN, f"eval.key_tokens.evaluator=hf:{folder}", f"hydra.run.dir={tmp_path / 'new'}")
    assert train.exit_code != 0 and "same tokenizer" in train.output and not (tmp_path / "new").exists()
    bad = invoke("eval", str(run), f"eval.key_tokens.evaluator={trained}", "eval.key_tokens.short_len=0")
    assert bad.exit_code != 0 and "eval.key_tokens.short_len" in bad.output


def test_a_byte_run_exported_by_posexp_export_is_an_evaluator_of_the_same_tokens(trained, tmp_path):
    """posexp export writes the byte tokenizer as a transformers one that gives the run's ids: as the evaluator it
    reads the tokens the run reads, and picks the key tokens the run itself picks."""
    pytest.importorskip("transformers")
    exported = tmp_path / "exported"
    result = invoke("export", str(trained), str(exported))
    assert result.exit_code == 0, result.output
    picked = []
    for evaluator in (f"hf:{exported}", str(trained)):
        run = tmp_path / f"run{len(picked)}"
        shutil.copytree(trained, run)
        result = invoke("eval", str(run), f"eval.key_tokens.evaluator={evaluator}", "eval.lengths=[64]",
                        "eval.key_tokens.alpha=0", "eval.key_tokens.beta=-20",
                        f"eval.key_tokens.cache_dir={tmp_path / 'keys'}")
        assert result.exit_code == 0, result.output
        row = next(r for r in json.loads((run / "results.json").read_text())["rows"] if r["length"] == 64)
        picked.append((row["key_tokens"], row["ppl_key"]))
    assert picked[0][0] > 0 and picked[0][0] == picked[1][0] and picked[0][1] == pytest.approx(picked[1][1])


def test_unset_key_tokens_stay_out_of_a_pretrained_models_hash_and_set_ones_do_not():
    from posexp.config.identity import unset_keys_dropped

    config = {"eval": {"tokens": 1024, "key_tokens": {"evaluator": None, "alpha": 2.0}}, "seed": 0}
    assert unset_keys_dropped(config) == {"eval": {"tokens": 1024}, "seed": 0}
    assert config["eval"]["key_tokens"] == {"evaluator": None, "alpha": 2.0}  # the record keeps it
    keyed = {"eval": {"tokens": 1024, "key_tokens": {"evaluator": "hf:m", "alpha": 2.0}}}
    assert unset_keys_dropped(keyed) == keyed


def test_a_pretrained_model_gets_ppl_key_from_an_hf_evaluator(tmp_path):
    hf_tiny = pytest.importorskip("helpers.hf_tiny")
    folder, text = tmp_path / "hf-model", tmp_path / "text"
    hf_tiny.model("llama", eos_token_id=0).save_pretrained(folder)
    hf_tiny.tokenizer(folder)
    text.mkdir()
    rng = np.random.default_rng(0)
    words = "the cat sat on mat a dog ran far and then slept".split()
    for i in range(12):
        (text / f"d{i}.txt").write_text(" ".join(rng.choice(words, 300)))
    args = ("eval", f"hf:{folder}", "data=text", f"data.path={text}", "eval.lengths=[32,64]", "eval.tokens=512",
            "eval.key_tokens.alpha=0", "eval.key_tokens.beta=-20", f"eval.key_tokens.cache_dir={tmp_path / 'keys'}")
    result = invoke(*args, f"eval.key_tokens.evaluator=hf:{folder}", f"hydra.run.dir={tmp_path / 'keyed'}")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "keyed" / "results.json").read_text())["rows"]
    at64 = next(r for r in rows if r["length"] == 64)
    assert at64["key_tokens"] > 0 and at64["ppl_key"] > 0
    assert at64["key_selection"]["short_len"] == 32  # the model's own context length
    again = invoke(*args, f"eval.key_tokens.evaluator=hf:{folder}", f"hydra.run.dir={tmp_path / 'again'}")
    assert again.exit_code == 0 and "reads the long and short contexts" not in again.output  # from the cache
    assert json.loads((tmp_path / "again" / "results.json").read_text())["rows"][1]["ppl_key"] == at64["ppl_key"]



def test_ppl_key_metric_reads_the_rows_and_is_in_help_and_completion(tmp_path):
    from posexp.reporting import build_report, parse_metric
    from posexp.reporting.metrics import PERPLEXITY, metric_examples, metric_help
    from posexp.reporting.options import ReportOptions
    from helpers.runs import make_run

    keyed = make_run(tmp_path / "keyed", {128: 3.0, 512: 4.0, 1024: 5.0}, ["encoder=rope"])
    data = json.loads((keyed / "results.json").read_text())
    for row in data["rows"]:  # 1x: no key token (null); 4x and 8x: key-token perplexities
        row.update(key_tokens=0 if row["length"] == 128 else 40,
                   **({} if row["length"] == 128 else {"ppl_key": row["ppl"] * 3}))
    (keyed / "results.json").write_text(json.dumps(data))
    plain = make_run(tmp_path / "plain", {128: 3.0, 512: 4.0}, ["encoder=alibi"], encoder="alibi")
    report = build_report([keyed, plain], ReportOptions(by="encoder", metrics="ppl_key@4x,ppl_key@1x,ppl_key@1024"))
    groups = {g.label: g for g in report.groups}
    assert groups["encoder=rope"].metrics["ppl_key@4x"].mean == pytest.approx(12.0)
    assert groups["encoder=rope"].metrics["ppl_key@1024"].mean == pytest.approx(15.0)
    assert groups["encoder=rope"].metrics["ppl_key@1x"].text() == "n/a"  # evaluated, no key token
    assert groups["encoder=alibi"].metrics["ppl_key@4x"].applicable is None  # no evaluator: not evaluated
    assert "ppl_key@4x" in metric_examples() and "ppl_key@Kx" in metric_help(PERPLEXITY)
    assert "key tokens" in parse_metric("ppl_key@4x").describe(report)
    from posexp.cli.completion import complete

    assert "ppl_key@4x" in complete(["report", "run", "--metric"], "ppl_").items
    assert "eval.key_tokens.evaluator=" in complete(["eval", "run"], "eval.key_tokens.").items


@pytest.mark.parametrize("overrides,says", [
    (("eval.key_tokens.evaluator=/no/such/run",), "/no/such/run: not a run folder with weights"),
    (("eval.key_tokens.evaluator=hf:",), "names a run folder or hf:NAME"),
    (("task=copy", "eval.key_tokens.evaluator=hf:m"), "applies to perplexity (task=lm); task=copy"),
    (("eval.key_tokens.evaluator=hf:m", "eval.key_tokens.short_stride=0"), "must be a positive number of tokens"),
])
def test_posexp_train_refuses_a_bad_evaluator_before_training(tiny, overrides, says):
    from posexp.commands.edge import typed
    from posexp.commands.train import check_spec
    from posexp.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.key_tokens") as caught:
        check_spec(typed(tiny(*overrides)))
    assert says in str(caught.value) and "\n" not in str(caught.value)
