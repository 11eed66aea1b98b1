"""Token accuracy's interval counts the instances, not the answer tokens: the tokens of one instance are no
independent trials, and a report's better/worse verdict on ``tok@Kx`` must not be called on the noise of a
too-narrow interval."""

from __future__ import annotations

import numpy as np
import pytest

from posexp.evaluation.accuracy import _summarise, token_accuracy_interval, wilson_interval


def test_with_one_token_per_instance_it_is_the_per_instance_wilson_interval():
    """Token accuracy is then exact match: its interval is exact match's, at every count (0 and all included)."""
    for right in (0, 1, 37, 100, 199, 200):
        hits = np.array([1] * right + [0] * (200 - right))
        assert token_accuracy_interval(hits, np.ones(200, np.int64)) == pytest.approx(wilson_interval(right, 200))


def test_tokens_right_or_wrong_together_give_exact_matchs_width_not_a_narrower_one():
    """200 instances of 16 answer tokens, each all right or all wrong: 16 tokens that move together are worth one
    trial; a Wilson interval over the 3,200 tokens would be 4 (sqrt 16) times narrower."""
    solved = np.array([True] * 130 + [False] * 70)
    total = np.full(200, 16)
    row = _summarise(np.where(solved, 16, 0), total, loss_sum=1.0)
    assert (row["token_accuracy_low"], row["token_accuracy_high"]) == pytest.approx(
        (row["exact_match_low"], row["exact_match_high"]))
    low, high = token_accuracy_interval(np.where(solved, 16, 0), total)
    naive_low, naive_high = wilson_interval(130 * 16, 3200)
    assert (high - low) / (naive_high - naive_low) == pytest.approx(4.0, rel=0.02)


def test_independent_tokens_keep_the_narrower_interval_they_are_worth():
    """Where an instance's tokens are independent trials the interval is no wider than one over the tokens (about
    as wide): clustering widens it only as far as the data show."""
    rng = np.random.default_rng(3)
    total = np.full(300, 8)
    right = rng.binomial(total, 0.6)
    low, high = token_accuracy_interval(right, total)
    naive_low, naive_high = wilson_interval(int(right.sum()), int(total.sum()))
    assert 0.8 < (high - low) / (naive_high - naive_low) <= 1.0 + 1e-12
    assert low < right.sum() / total.sum() < high


def test_95_percent_of_intervals_cover_the_true_token_accuracy_of_clustered_instances():
    """Simulated evaluations: 100 instances of 1 to 8 answer tokens, each instance with its own chance of a token
    right (Beta around 0.7), so errors cluster. The interval over instances covers 0.7 about 95% of the time; one
    over the tokens as independent trials, far less."""
    rng = np.random.default_rng(0)
    truth, covered, covered_naive, runs = 0.7, 0, 0, 2000
    for _ in range(runs):
        total = rng.integers(1, 9, 100)
        right = rng.binomial(total, rng.beta(1.4, 0.6, 100))
        low, high = token_accuracy_interval(right, total)
        covered += low <= truth <= high
        naive_low, naive_high = wilson_interval(int(right.sum()), int(total.sum()))
        covered_naive += naive_low <= truth <= naive_high
    assert 0.93 <= covered / runs <= 0.97
    assert covered_naive / runs < 0.85


def test_the_interval_stays_in_0_1_and_is_empty_of_nothing():
    assert token_accuracy_interval(np.zeros(0, np.int64), np.zeros(0, np.int64)) == (None, None)
    assert token_accuracy_interval(np.zeros(5, np.int64), np.full(5, 3)) == pytest.approx(wilson_interval(0, 5))
    assert token_accuracy_interval(np.full(5, 3), np.full(5, 3)) == pytest.approx(wilson_interval(5, 5))
    low, high = token_accuracy_interval(np.array([2, 1, 1]), np.array([2, 1, 1]) * 2)  # the same share in each
    assert 0.0 <= low < 0.5 < high <= 1.0
