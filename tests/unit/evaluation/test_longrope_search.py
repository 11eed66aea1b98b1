"""LongRoPE's evolutionary search (Ding et al. 2024, §2.2): its starting points, its constraint, and a search
that finds factors better than every starting point on held-out perplexity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posexp.evaluation.longrope_search import (SearchSettings, Stretch, constrained, initial_factors,
                                               perplexity_score, search_factors)


def test_the_starting_points_are_pi_ntk_and_yarn():
    """PI scales every frequency by s; NTK's new base leaves the highest frequency as it is and scales the
    lowest by s (lambda_i = s^(2i / (d - 2)), bloc97 2023): the non-uniform rescaling LongRoPE generalises."""
    start = initial_factors(32, 10000.0, 4.0, 128)
    assert np.allclose(start["pi"], 4.0)
    assert start["ntk"][0] == pytest.approx(1.0) and start["ntk"][-1] == pytest.approx(4.0)
    assert np.all(np.diff(start["ntk"]) > 0)
    assert start["yarn"][0] == pytest.approx(1.0) and start["yarn"][-1] == pytest.approx(4.0)  # by parts


def test_every_candidate_keeps_the_papers_monotone_constraint():
    c = constrained(np.array([3.0, 0.5, 2.0, 9.0, 1.234]), 4.0)
    assert list(c) == [1.0, 1.23, 2.0, 3.0, 8.0]  # sorted, at least 1, at most 2 s, on the paper's 0.01 grid


def test_the_search_beats_its_starting_points_and_is_reproducible():
    target = np.geomspace(1.0, 3.0, 16)  # an optimum no starting point is

    def score(factors, start):
        return 1.0 + float(np.sum(np.log(factors / target) ** 2))

    settings = SearchSettings(population=12, generations=6, seed=3)
    result = search_factors(score, Stretch(32, 10000.0, 128, 512), settings)
    assert result.ppl < min(result.initial.values())
    assert result.history == sorted(result.history, reverse=True)  # the elite is kept: never worse
    assert list(result.factors) == sorted(result.factors) and min(result.factors) >= 1.0
    assert search_factors(score, Stretch(32, 10000.0, 128, 512), settings).factors == result.factors


def test_a_search_on_a_trained_run_scores_held_out_perplexity(tiny, tmp_path):
    import torch

    import posexp
    from posexp.commands.train import run_train
    from posexp.data.corpus import corpus_from_config

    cfg = tiny("train.steps=6", "train.warmup_steps=1", "eval.multiples=[1]", "eval.tokens=256",
               "eval.loss_by_position=false")
    run_train(cfg, tmp_path / "run", [])
    run = posexp.load_run(tmp_path / "run")
    spec, model = run.config, run.model
    val = corpus_from_config(spec).val
    score = perplexity_score(model, val[-(512 + 4 * spec.train_len + 1):], spec.eval, spec.train_len, 4 * spec.train_len, torch.device("cpu"),
                             torch.float32)
    n = model.encoder.rot_dim // 2
    assert math.isfinite(score(np.ones(n), 0)) and score(np.ones(n), 0) != score(np.full(n, 4.0), 0)
    assert score(np.full(n, 4.0), 0) != score(np.full(n, 4.0), 8)  # n^ reaches the model
    result = search_factors(score, Stretch(model.encoder.rot_dim, model.encoder.base, spec.train_len, 4 * spec.train_len),
                            SearchSettings(population=4, generations=1, parents=2))
    assert len(result.factors) == n and math.isfinite(result.ppl)


def test_the_needle_objective_is_the_perplexity_of_the_answer_tokens_alone():
    """LongRoPE2's needle-driven objective (Shang et al. 2025, §3.2): exp of the mean cross-entropy over the answer
    tokens only, read under LongRoPE with the candidate's factors and n^; written out here from the model's logits."""
    import torch

    from posexp.encoders import create
    from posexp.encoders.scaling import LONGROPE
    from posexp.evaluation.longrope_search import needle_score
    from posexp.model.gpt import GPT, ModelShape
    from posexp.model.interface import Reading

    torch.manual_seed(0)
    model = GPT(ModelShape(d_model=32, n_layers=2, n_heads=4, attn_block_size=8, vocab_size=61),
                create("rope", d_model=32, n_heads=4)).eval()
    train_len, length, n = 16, 64, 4
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 61, (3, length + 1))
    answer = np.zeros_like(tokens, dtype=bool)
    answer[:, -6:-1] = True  # the answer's tokens, as needle_documents marks them
    factors = np.linspace(1.0, length / train_len, n)
    scored = needle_score(model, tokens, answer, train_len, torch.device("cpu"), torch.float32, batch=2)(factors, 3)

    x, y = torch.as_tensor(tokens[:, :-1]), torch.as_tensor(tokens[:, 1:])
    how = Reading(LONGROPE, length / train_len, train_len, length, tuple(factors), None, 3)
    with torch.no_grad(), model.reading(how):
        losses = torch.nn.functional.cross_entropy(model.logits(x).transpose(1, 2).double(), y, reduction="none")
    direct = math.exp(float(losses[torch.as_tensor(answer[:, 1:])].mean()))
    assert scored == pytest.approx(direct, rel=1e-5)
    assert scored != pytest.approx(needle_score(model, tokens, answer, train_len, torch.device("cpu"),
                                                torch.float32)(np.ones(n), 0), rel=1e-6)  # the factors reach it
