"""``task=babilong`` (Kuratov et al. 2024): bAbI-like stories hidden in data's text, a question at the end.

What a user relies on: the answer is the one the facts give (checked by a solver written from bAbI's rules that
reads only the text), the facts sit at the depth asked, in story order, between the background's lines, and the
instances are a function of the seed.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from posexp.errors import ConfigError
from posexp.tasks import GENERATOR_VERSION, task_fingerprint
from posexp.tasks.babilong import BAND, COUNTS, PLACES, VARIANTS, Babilong
from helpers.tasks import FACT, make, solve_babilong

LINES = b"".join(b"line %d of the background text, as code or prose has.\n" % i for i in range(300))
TEXT = np.frombuffer(LINES, dtype=np.uint8).astype(np.int64)


def _facts_in_background(row: np.ndarray) -> tuple[list[int], int]:
    """Where each fact starts in background coordinates (the row less the facts), and the background's length."""
    text = bytes(row.tolist()).rpartition(b"\nQ: ")[0]
    places, removed = [], 0
    for m in FACT.finditer(text):
        places.append(m.start() - removed)
        removed += m.end() - m.start()
    return places, len(text) - removed


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_answer_is_the_one_the_facts_give(variant):
    task = Babilong(TEXT, TEXT, variant)
    made = task.instances(400, 64, np.random.default_rng(0), split="val")
    answers = set()
    for row, answer in zip(made.tokens, made.answer):
        assert row[answer].tolist() == solve_babilong(bytes(row.tolist()))
        assert len(FACT.findall(bytes(row.tolist()))) == 4  # the story's four facts
        answers.add(bytes(row[answer].tolist()))
    assert len(answers) > 2  # not one answer always


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_facts_lie_at_the_requested_depth_between_lines_in_story_order(depth):
    task = Babilong(TEXT, TEXT, "qa2")
    made = task.instances(1000, 32, np.random.default_rng(1), depth=depth, split="val")
    for row in made.tokens:
        places, size = _facts_in_background(row)
        assert places == sorted(places)
        lo, hi = max(0.0, depth - BAND / 2), min(1.0, depth + BAND / 2)
        assert all(lo * size - 1 <= p <= hi * size + 1 for p in places), (places, size)
        text = bytes(row.tolist())
        for m in FACT.finditer(text):  # each fact starts a line of the background (or the row)
            assert m.start() == 0 or text[m.start() - 1] == ord("\n")
    anywhere = task.instances(1000, 64, np.random.default_rng(2), split="train")
    spread = [p / s for p, s in map(_facts_in_background, anywhere.tokens) for p in p]
    assert min(spread) < 0.2 and max(spread) > 0.8  # training: anywhere in the background


def test_instances_are_deterministic_per_seed_and_read_the_split_asked():
    task = Babilong(TEXT[:3000], TEXT[3000:], "qa7")
    a = task.instances(300, 8, np.random.default_rng(5), depth=0.5, split="val")
    b = task.instances(300, 8, np.random.default_rng(5), depth=0.5, split="val")
    c = task.instances(300, 8, np.random.default_rng(6), depth=0.5, split="val")
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.answer, b.answer)
    assert not np.array_equal(a.tokens, c.tokens)
    train = task.instances(300, 8, np.random.default_rng(5), depth=0.5, split="train")
    assert b"line 1" not in bytes(train.tokens[0].tolist())[:10] or not np.array_equal(train.tokens, a.tokens)


@pytest.mark.parametrize("variant,words", [("qa1", PLACES), ("qa2", PLACES), ("qa7", COUNTS)])
def test_every_answer_word_is_about_equally_likely(variant, words):
    """qa7 answered "one" in 87% of stories: a model that always said "one" scored 87% without reading one fact. Each
    answer word now comes up 1 / len(words) of the time (a 2,000-instance share within 0.05 of it)."""
    made = Babilong(TEXT, TEXT, variant).instances(400, 2000, np.random.default_rng(0), split="val")
    said = Counter(bytes(row[answer].tolist()).decode() for row, answer in zip(made.tokens, made.answer))
    assert set(said) == set(words)
    assert all(abs(n / 2000 - 1 / len(words)) < 0.05 for n in said.values()), said


def test_new_qa7_instances_have_a_new_fingerprint_and_the_unchanged_variants_keep_theirs():
    """An old qa7 run (its "one"-heavy instances) is never silently compared with, or re-evaluated on, the new
    ones: its fingerprint differs. qa1, qa2 and every other task make the instances they made, under the same
    fingerprint."""
    qa1, qa7 = Babilong(TEXT, TEXT, "qa1"), Babilong(TEXT, TEXT, "qa7")
    assert qa1.generator_version() == Babilong(TEXT, TEXT, "qa2").generator_version() == GENERATOR_VERSION
    assert qa7.generator_version() > GENERATOR_VERSION
    assert task_fingerprint(make("copy")) == "7810ca83386c9f38"  # unchanged since version 1
    assert task_fingerprint(qa1, "data") == "9d14a5d35aeda674"
    assert task_fingerprint(qa7, "data") != "2d87bef6b618e3a0"  # version 1's


def test_the_chance_of_version_1_qa7_is_what_always_saying_one_scored_on_its_instances():
    """Version 1 drew four facts at random, redrawn until someone handled an object, and asked about any such
    person: the share of "one" among 20,000 of its stories is the chance an old qa7 run is judged against."""
    from posexp.tasks.babilong import COUNTING_V1_CHANCE, _story, answer

    rng, said = np.random.default_rng(0), Counter()
    while sum(said.values()) < 20000:  # version 1's _asked, as it was
        events = _story("qa7", rng)
        asked = [p for p in ("Mary", "John", "Sandra", "Daniel") if answer("qa7", events, p) is not None]
        if asked:
            said[answer("qa7", events, asked[int(rng.integers(len(asked)))])] += 1
    assert said.most_common(1)[0][0] == "one"
    assert abs(said["one"] / 20000 - COUNTING_V1_CHANCE) < 0.01
    assert Babilong.chance({"variant": "qa7"}, 3.5, version=1) == COUNTING_V1_CHANCE
    assert Babilong.chance({"variant": "qa7"}, 3.5, version=2) == Babilong.chance({"variant": "qa7"}, 3.5) == 0.25
    assert Babilong.chance({"variant": "qa1"}, 6.0, version=1) == 1 / len(PLACES)


def test_a_bad_variant_names_the_key_and_the_choices():
    with pytest.raises(ConfigError) as err:
        Babilong(TEXT, TEXT, "qa3")
    assert err.value.key == "task.variant" and "qa1, qa2, qa7" in str(err.value)


@pytest.mark.slow  # a training run through the CLI (~10 s)
def test_a_babilong_run_reports_accuracy_by_length_and_depth(tmp_path):
    import json

    from helpers import TINY_RUN, invoke

    run = tmp_path / "babilong"
    result = invoke("train", *TINY_RUN, "task=babilong", "train_len=192", "train.steps=4", "eval.examples=16",
                    "eval.multiples=[1,2]", "eval.depths=[0,1]", f"hydra.run.dir={run}")
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "results.json").read_text())
    rows = saved["rows"]
    assert {(r["length"], r["depth"]) for r in rows} == {(192, 0.0), (192, 1.0), (384, 0.0), (384, 1.0)}
    assert all(r["task"] == "babilong" and r["metric"] == "accuracy" for r in rows)
    assert "filler from" in saved["run"]["corpus"]  # the background is data's text
