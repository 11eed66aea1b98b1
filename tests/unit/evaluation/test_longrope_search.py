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
