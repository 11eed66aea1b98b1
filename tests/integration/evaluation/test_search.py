"""``posexp search RUN_OR_hf:NAME --target-len N`` as a user runs it: LongRoPE's search (Ding et al. 2024) with n^ in
its space, on a tiny run and on a tiny random Llama; stopped and continued from its state; its factors file read by
posexp eval; refused in one line where it cannot run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import invoke

SMALL = ("--tokens", "512", "--population", "4", "--generations", "1", "--parents", "2")


@pytest.fixture
def run(trained, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(trained, target)
    return target


def test_a_search_writes_factors_no_worse_than_its_start_that_eval_reads(run):
    result = invoke("search", str(run), "--target-len", "128", *SMALL)
    assert result.exit_code == 0, result.output
    folder = run / "longrope" / "128"
    record = json.loads((folder / "factors.json").read_text())
    assert len(record["factors"]) == 8 and record["factors"] == sorted(record["factors"])  # head 16: 8 frequencies
    assert record["score"] <= min(record["initial"].values())  # the starting points are in the pool: never worse
    assert record["start"] in (0, 1, 2, 4, 8, 12, 16, 20, 24, 28) and record["target_len"] == 128
    said = " ".join(result.output.split())
    assert "6 candidates at most" in said and "6/6" in said and "8/8" not in said  # 4 + 1 x (4 - 2) scored
    assert f"posexp eval {run} eval.scaling=longrope eval.longrope_file={folder}" in said
    assert f"posexp finetune {run} train_len=128 scaling=longrope longrope_file={folder}" in said
    evaluated = invoke("eval", str(run), "eval.scaling=longrope", f"eval.longrope_file={folder}", "eval.lengths=[128]")
    assert evaluated.exit_code == 0, evaluated.output
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert any(r.get("scaling") == "longrope" and r["length"] == 128 and math.isfinite(r["ppl"]) for r in rows)


def test_a_stopped_search_continues_from_its_state(run, monkeypatch):
    import posexp.evaluation.longrope_search as search

    original, calls = search.perplexity_score, {"n": 0, "stop_after": 3}

    def counted(*args, **kwargs):
        score = original(*args, **kwargs)

        def wrapped(factors, start=0):
            if calls["n"] == calls["stop_after"]:
                raise KeyboardInterrupt  # Ctrl-C while a candidate is scored
            calls["n"] += 1
            return score(factors, start)
        return wrapped

    monkeypatch.setattr(search, "perplexity_score", counted)
    stopped = invoke("search", str(run), "--target-len", "128", *SMALL)
    assert stopped.exit_code == 130 and "run the same command to continue" in stopped.output
    state = json.loads((run / "longrope" / "128" / "state.json").read_text())
    assert len(state["scored"]) == 3 and not (run / "longrope" / "128" / "factors.json").exists()
    calls.update(n=0, stop_after=-1)
    resumed = invoke("search", str(run), "--target-len", "128", *SMALL)
    assert resumed.exit_code == 0 and "resuming with 3 scored" in " ".join(resumed.output.split())
    continued = calls["n"]
    calls.update(n=0)
    fresh = invoke("search", str(run), "--target-len", "128", *SMALL, "--out", str(run / "fresh"))
    assert fresh.exit_code == 0
    assert continued == calls["n"] - 3  # only what the stopped search had not scored
    first = json.loads((run / "longrope" / "128" / "factors.json").read_text())
    again = json.loads((run / "fresh" / "factors.json").read_text())
    assert (first["factors"], first["start"], first["score"]) == (again["factors"], again["start"], again["score"])


def test_the_search_replays_to_the_same_candidates_from_a_cache():
    from posexp.evaluation.longrope_search import SearchSettings, Stretch, search_factors

    target = np.geomspace(1.0, 3.0, 8)

    def score(factors, start):
        return 1.0 + float(np.sum(np.log(factors / target) ** 2)) + 0.01 * abs(start - 8)

    settings = SearchSettings(population=8, generations=4, parents=3, seed=1)
    calls: list[str] = []
    whole = search_factors(score, Stretch(16, 10000.0, 64, 256), settings, on_scored=lambda k, v, fresh: calls.append(k))
    cache: dict[str, float] = {}
    with pytest.raises(KeyboardInterrupt):
        def stopping(factors, start):
            if len(cache) == 5:
                raise KeyboardInterrupt
            return score(factors, start)
        search_factors(stopping, Stretch(16, 10000.0, 64, 256), settings, cache=cache)
    new: list[str] = []
    resumed = search_factors(score, Stretch(16, 10000.0, 64, 256), settings, cache=cache,
                             on_scored=lambda k, v, fresh: fresh and new.append(k))
    assert (resumed.factors, resumed.start, resumed.ppl) == (whole.factors, whole.start, whole.ppl)
    assert len(new) == len(set(calls)) - 5
    assert whole.ppl < min(whole.initial.values()) and whole.start in (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32)


def test_n_hat_is_searched_and_can_be_fixed():
    from posexp.evaluation.longrope_search import SearchSettings, Stretch, search_factors

    def score(factors, start):  # best with n^ = 16, whatever the factors
        return 1.0 + abs(start - 16) + 0.001 * float(np.sum(factors))

    found = search_factors(score, Stretch(16, 10000.0, 64, 256), SearchSettings(population=12, generations=10, parents=3))
    assert found.start == 16
    fixed = search_factors(score, Stretch(16, 10000.0, 64, 256), SearchSettings(population=8, generations=2, parents=3,
                                                                        start=2))
    assert fixed.start == 2


@pytest.mark.parametrize("args, message", [
    (("--target-len", "32"), "--target-len: must be longer than the training length 32"),
    (("--target-len", "128", "--objective", "loss"), "--objective: must be one of: ppl, needle"),
    (("--target-len", "128", "--start", "32"), "--start: must be below the training length 32"),
    (("--target-len", "128", "--population", "2"), "--population: must be at least 4"),
    (("--target-len", "128", "data=text"), "data=text: overrides apply to a hf: model"),
])
def test_refusals_are_one_line(run, args, message):
    result = invoke("search", str(run), *args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not (run / "longrope").exists()


def test_a_target_past_a_randomized_runs_positions_is_refused_in_one_line(tiny, tmp_path):
    # every candidate would score inf there ("not applicable"): the search ran to its end and wrote inf factors
    from posexp.commands.train import run_train

    run = tmp_path / "run"
    run_train(tiny("train.steps=2", "train.positions=randomized", "train.max_position=64"), run, [])
    result = invoke("search", str(run), "--target-len", "128", *SMALL)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "--target-len: " in said and "0..63 (train.max_position)" in said, said
    assert "Traceback" not in result.output and not (run / "longrope").exists()


@pytest.mark.parametrize("objective", ["ppl", "needle"])
def test_a_randomized_runs_candidates_are_read_at_the_positions_its_eval_reads(tiny, tmp_path, monkeypatch, objective):
    # Ruoss et al. 2023: the run's own eval draws sorted positions from its range; a search scoring its candidates at
    # 0..L-1 would rank them by positions the run never reads
    from posexp.commands.train import run_train
    from posexp.model.gpt import GPT
    from posexp.model.positions import PositionPlan

    cfg = tiny("train.steps=2", "train.positions=randomized", "train.max_position=512")
    run_train(cfg, tmp_path / "run", [])
    read: list = []
    token_losses = GPT.token_losses

    def spy(self, idx, targets, pos=None):
        read.append(None if pos is None else pos.tolist())
        return token_losses(self, idx, targets, pos)

    monkeypatch.setattr(GPT, "token_losses", spy)
    result = invoke("search", str(tmp_path / "run"), "--target-len", "300", "--objective", objective, "--needles", "2",
                    "--tokens", "128", "--population", "4", "--generations", "0", "--parents", "2")
    assert result.exit_code == 0, result.output
    assert read and all(pos == PositionPlan(cfg).eval_positions(300).tolist() for pos in read)


def test_a_fine_tune_that_trained_a_scaling_is_refused_as_posexp_eval_refuses_longrope_on_top(run, tmp_path):
    # its rotary is the parent's extended by yarn: the search scored LongRoPE in its place, then printed an eval and
    # a finetune command that both refuse the run
    child = tmp_path / "ft"
    tuned = invoke("finetune", str(run), "train_len=64", "scaling=yarn", "train.steps=2", "train.progress=false",
                   "train.threads=1", "precision=fp32", "eval.multiples=[1]", "eval.tokens=256", f"hydra.run.dir={child}")
    assert tuned.exit_code == 0, tuned.output
    result = invoke("search", str(child), "--target-len", "128", *SMALL)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "scaling=yarn" in said and f"search its parent {run}" in said
    assert "Traceback" not in result.output and not (child / "longrope").exists()


def test_a_direct_fine_tune_is_searched_and_offered_only_the_eval_its_factors_take(run, tmp_path):
    # posexp finetune refuses a fine-tune ("fine-tune a run trained from scratch"): no such command is printed
    child = tmp_path / "ft"
    tuned = invoke("finetune", str(run), "train_len=64", "train.steps=2", "train.progress=false", "train.threads=1",
                   "precision=fp32", "eval.multiples=[1]", "eval.tokens=256", f"hydra.run.dir={child}")
    assert tuned.exit_code == 0, tuned.output
    result = invoke("search", str(child), "--target-len", "128", *SMALL)
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert f"posexp eval {child} eval.scaling=longrope" in said and "posexp finetune" not in said


def test_a_search_continues_whichever_way_its_run_folder_is_spelt(run):
    # the same run, from its parent folder and by its absolute path: the same search, not "other settings (model)"
    quick = ("--tokens", "256", "--population", "4", "--generations", "0", "--parents", "2")
    assert invoke("search", run.name, "--target-len", "64", *quick, cwd=run.parent).exit_code == 0
    again = invoke("search", str(run.resolve()), "--target-len", "64", *quick)
    assert again.exit_code == 0, again.output
    assert "resuming with 4 scored" in " ".join(again.output.split())


def test_another_search_in_the_same_folder_is_refused_unless_restarted(run, tmp_path):
    quick = ("--tokens", "256", "--population", "4", "--generations", "0")
    assert invoke("search", str(run), "--target-len", "64", *quick, "--parents", "2").exit_code == 0
    other = invoke("search", str(run), "--target-len", "64", *quick, "--parents", "3")
    assert other.exit_code == 2 and "holds a search with other settings (parents)" in " ".join(other.output.split())
    restarted = invoke("search", str(run), "--target-len", "64", *quick, "--parents", "3", "--restart")
    assert restarted.exit_code == 0, restarted.output
    missing = invoke("search", str(tmp_path / "nowhere"), "--target-len", "128")
    assert missing.exit_code == 2 and "not a run folder" in missing.output


def test_a_transformers_model_is_searched_with_either_objective(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = tmp_path / "text"
    corpus.mkdir()
    words = "the cat sat on a mat and then a dog ran far and slept 0 1 2 3 4 5 6 7 8 9".split()
    rng = np.random.default_rng(0)
    for i in range(6):  # several files: some are held out for validation
        (corpus / f"part{i}.txt").write_text(" ".join(rng.choice(words, 3000)))
    folder = tmp_path / "tiny-llama"
    bpe = Tokenizer(models.BPE())  # byte-level: the passkey's prompt and digits are text like any other
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator([p.read_text() for p in corpus.iterdir()], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                      bos_token_id=None, eos_token_id=tok.eos_token_id, initializer_range=0.2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    common = ("data=text", f"data.path={corpus}", "--population", "4", "--generations", "1", "--parents", "2")
    # a model by a relative path searches into a folder named after it (it was the hidden outputs/longrope/.-tiny-llama)
    ppl = invoke("search", "hf:./tiny-llama", *common, "--target-len", "128", "--tokens", "256", cwd=tmp_path)
    assert ppl.exit_code == 0, ppl.output
    record = json.loads((tmp_path / "outputs" / "longrope" / "tiny-llama" / "128" / "factors.json").read_text())
    assert len(record["factors"]) == 4 and record["train_len"] == 64 and record["model"] == "hf:./tiny-llama"
    assert record["score"] <= min(record["initial"].values())
    needle = invoke("search", f"hf:{folder}", *common, "--target-len", "256", "--objective", "needle", "--needles", "2",
                    "--out", str(tmp_path / "needle"))
    assert needle.exit_code == 0, needle.output
    scored = json.loads((tmp_path / "needle" / "factors.json").read_text())
    assert scored["objective"] == "needle" and math.isfinite(scored["score"]) and scored["score"] > 1
