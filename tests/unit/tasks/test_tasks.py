"""The task generators: every answer right by construction (checked by an independent solver per task),
seeded and deterministic, every requested length met exactly; and the Wilson interval of the accuracy rows."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from posexp.errors import ConfigError, PosexpError
from posexp.evaluation.accuracy import eval_instances, wilson_interval
from posexp.tasks import PAD, TASKS
from posexp.tasks.sampler import TaskSampler
from helpers.tasks import (SHIPPED, make, solve_babilong, solve_kv_retrieval, solve_niah, solve_top_words,
                           solve_vartrack, unpadded)

def solve(name: str, row: np.ndarray, answer: np.ndarray) -> tuple[list[int], list[int]]:
    """(the answer tokens a solver written from the task's description expects, the tokens marked as answer)."""
    marked = row[answer].tolist()
    pad = row.size - unpadded(row).size
    seq, ans = row[pad:].tolist(), answer[pad:]
    if name in ("copy", "reverse", "sort"):
        n = (len(seq) - 1) // 2
        x = seq[:n]
        assert seq[n] == 1 and not ans[: n + 1].any()
        return {"copy": x, "reverse": x[::-1], "sort": sorted(x)}[name], marked
    if name == "addition":
        n = (len(seq) - 3) // 3
        a, b = seq[:n], seq[n + 1:2 * n + 1]
        assert seq[n] == 11 and seq[2 * n + 1] == 12
        value = sum((d - 1) * 10**i for i, d in enumerate(a)) + sum((d - 1) * 10**i for i, d in enumerate(b))
        return [int(c) + 1 for c in str(value).zfill(n + 1)[::-1]], marked
    if name == "parity":
        return [sum(t - 1 for t in seq[:-2]) % 2 + 1], marked
    if name == "mqar":
        d = len(seq) // 4
        table = dict(zip(seq[0:2 * d:2], seq[1:2 * d:2]))
        assert len(table) == d  # distinct keys
        queries = seq[2 * d:]
        assert sorted(queries[0::2]) == sorted(table)  # every key queried once
        return [table[k] for k in queries[0::2]], marked
    if name == "flipflop":
        expected, memory = [], None
        for op, bit in zip(seq[0::2], seq[1::2]):
            if op == 3:
                memory = bit
            elif op == 4:
                expected.append(memory)
        assert seq[0] == 3 and seq[-2] == 4
        return expected, marked
    if name == "passkey":
        text = bytes(seq)
        needle = re.search(rb"pass key (\d+)\. ", text)
        assert text[-15:-5] == b"pass key? "
        return list(needle.group(1)), marked
    if name == "babilong":
        return solve_babilong(bytes(seq)), marked
    ruler = {"niah": solve_niah, "vartrack": solve_vartrack, "cwe": solve_top_words, "fwe": solve_top_words,
             "kv_retrieval": solve_kv_retrieval}
    if name in ruler:
        return ruler[name](seq), marked
    raise AssertionError(name)


def test_every_shipped_task_yaml_has_a_generator():
    assert SHIPPED == sorted(TASKS)


@pytest.mark.parametrize("name", SHIPPED)
def test_answers_are_right_by_construction_and_every_length_is_met(name):
    task = make(name)
    rng = np.random.default_rng(0)
    shortest = task.shortest_length()
    longer = (max(n, shortest + n - 32) for n in (64, 65, 97))  # babilong's shortest is past 64
    for length in sorted({shortest, shortest + 1, shortest + 2, shortest + 3, *longer}):
        made = task.instances(length, 16, rng, split="val")
        assert made.tokens.shape == (16, length + 1) and made.length == length
        assert made.tokens.min() >= 0 and made.tokens.max() < task.vocab_size
        assert not made.answer[:, 0].any() and made.answer.any(axis=1).all()
        assert (made.tokens[~made.answer] >= 0).all() and (made.tokens[made.answer] != PAD).all()
        for row, answer in zip(made.tokens, made.answer):
            expected, marked = solve(name, row, answer)
            assert marked == expected
        # the largest instance that fits: one size more would not
        assert task.tokens_for(task.size_for(length)) <= length + 1 < task.tokens_for(task.size_for(length) + 1)


@pytest.mark.parametrize("name", SHIPPED)
def test_generators_are_seeded_and_deterministic(name):
    task = make(name)
    length = max(40, task.shortest_length())  # babilong's story and question take more
    a = task.instances(length, 8, np.random.default_rng([1, 2]), split="train")
    b = task.instances(length, 8, np.random.default_rng([1, 2]), split="train")
    c = task.instances(length, 8, np.random.default_rng([1, 3]), split="train")
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.answer, b.answer)
    assert not np.array_equal(a.tokens, c.tokens)


@pytest.mark.parametrize("name", SHIPPED)
def test_training_draws_lengths_up_to_train_len_and_masks_the_answers(name):
    task = make(name)
    sampler = TaskSampler(task, batch_size=4, seed=7)
    lengths = set()
    longest = max(48, task.shortest_length() + 48)  # babilong's story and question take more
    for step in range(60):
        tokens, mask = sampler.window(step, longest)
        assert tokens.shape[0] == 4 and mask.shape == (4, tokens.shape[1] - 1)
        full = np.concatenate([np.zeros((4, 1), dtype=bool), mask], axis=1)  # the mask is of the targets
        for row, answer in zip(tokens, full):
            expected, marked = solve(name, row, answer)
            assert marked == expected  # exactly the answer tokens are trained on
        lengths.add(tokens.shape[1] - 1)
        again, _ = sampler.window(step, longest)
        assert np.array_equal(tokens, again)  # a function of (seed, step): resumable
    assert min(lengths) >= task.shortest_length() and max(lengths) <= longest and len(lengths) > 5


def test_passkey_puts_the_key_at_the_requested_depth():
    task = make("passkey")
    for depth in (0.0, 0.25, 0.5, 1.0):
        made = task.instances(120, 4, np.random.default_rng(0), split="val", depth=depth)
        size = task.size_for(120)
        for row in made.tokens:
            body = bytes(unpadded(row).tolist())
            assert body.find(b"pass key ") == round(depth * size)


def test_eval_instances_do_not_depend_on_the_run_and_differ_by_length_and_depth():
    task = make("copy")
    a, b = eval_instances(task, 40, 8), eval_instances(task, 40, 8)
    assert np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(eval_instances(task, 48, 8).tokens[:, 8:], a.tokens)
    key = make("passkey")
    at_half = eval_instances(key, 80, 4, depth=0.5)
    assert np.array_equal(at_half.tokens, eval_instances(key, 80, 4, depth=0.5).tokens)
    assert not np.array_equal(at_half.tokens, eval_instances(key, 80, 4, depth=0.25).tokens)


@pytest.mark.parametrize("name,length", [("copy", 1), ("addition", 4), ("passkey", 10), ("mqar", 2)])
def test_a_length_too_short_for_one_instance_is_refused_with_the_shortest_allowed(name, length):
    with pytest.raises(ConfigError, match="too short for one instance") as e:
        make(name).check_length(length, "eval.lengths")
    assert e.value.key == "eval.lengths"


@pytest.mark.parametrize("name,min_size,said", [("babilong", 1, "an instance of 1 background token (task.min_size)"),
                                                   ("babilong", 2, "an instance of 2 background tokens (task.min_size)"),
                                                   ("addition", 1, "an instance of 1 digit per operand (task.min_size)"),
                                                   ("addition", 3, "an instance of 3 digits per operand")])
def test_a_size_is_said_in_its_unit_singular_or_plural(name, min_size, said):
    """``1 background tokens (task.min_size) take 177 tokens`` read wrong."""
    with pytest.raises(ConfigError) as e:
        make(name, min_size=min_size).check_length(2, "eval.lengths")
    assert said in str(e.value), str(e.value)


def test_mqar_refuses_more_pairs_than_distinct_keys():
    with pytest.raises(ConfigError, match="task.symbols"):
        make("mqar", symbols=8).check_length(40, "eval.lengths")  # 10 pairs of 8 keys


def test_wilson_interval_matches_the_closed_form_and_stays_in_0_1():
    # 0 of n: the upper limit is z^2 / (n + z^2) (Wilson 1927)
    z = 1.959964
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(z * z / (10 + z * z), rel=1e-9)
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and low == pytest.approx(10 / (10 + z * z), rel=1e-9)
    for k, n in ((3, 7), (50, 100), (1, 1000)):
        low, high = wilson_interval(k, n)
        assert 0 <= low < k / n < high <= 1
        low2, high2 = wilson_interval(n - k, n)
        assert low2 == pytest.approx(1 - high) and high2 == pytest.approx(1 - low)  # symmetric
    assert wilson_interval(0, 0) == (None, None)
    assert math.isclose(sum(wilson_interval(50, 100)) / 2, 0.5)


def test_a_depth_listed_twice_is_measured_once():
    from posexp.evaluation.accuracy import eval_depths

    assert eval_depths([0.5, 0.0, 0.5, 1]) == [0.5, 0.0, 1.0]


# The hashes these task runs had before each task owned its options (TaskConfig held every task's keys), from
# `posexp train train.steps=30 train.threads=1 task=NAME eval.examples=16 eval.multiples=[1,2]`: unchanged.
@pytest.mark.parametrize("name,recorded", [("passkey", "b220626c7e108c8b"), ("niah", "47e469a0934bd32d"),
                                           ("copy", "b47d4c486a3e2ae3")])
def test_a_task_runs_hash_is_the_one_it_had_when_one_schema_held_every_tasks_options(compose, name, recorded):
    from posexp.commands.train import check_config
    from posexp.config.identity import config_hash

    spec = check_config(compose("train.steps=30", "train.threads=1", f"task={name}", "eval.examples=16",
                                "eval.multiples=[1,2]"))
    assert config_hash(spec) == recorded


def test_a_saved_config_of_the_one_schema_builds_its_task_and_refuses_what_it_refused():
    from posexp.errors import ConfigError
    from posexp.tasks import build_task

    old = {"name": "niah", "description": "", "symbols": 64, "min_size": None, "digits": 5, "variant": "multikey",
           "needles": 3, "chains": None, "hops": None, "top_k": None}  # a run folder's .hydra/config.yaml task
    assert build_task(old).options() == {"symbols": 64, "variant": "multikey", "needles": 3}
    with pytest.raises(ConfigError) as e:
        build_task({**old, "digits": 3})  # not the value every config held: a passkey option set on niah
    assert str(e.value) == "task.digits: only applies to task=passkey (the task is niah); drop task.digits"


def test_a_task_that_does_not_list_its_options_records_every_option_it_holds():
    """A task of one's own, written as components.md says (its options the keywords of ``__init__``), recorded only
    task.symbols in results.json and its fingerprint: two runs of different ``repeats`` were the same task. The
    built-ins that list no options of their own record what they did."""
    from posexp.tasks import task_fingerprint
    from posexp.tasks.task import Task, fill, with_answer
    from helpers.tasks import make

    class First(Task):
        name = "first"
        default_symbols = 8

        def __init__(self, symbols=None, min_size=None, repeats: int = 1):
            super().__init__(symbols, min_size)
            self.repeats = repeats

        vocab_size = 10

        def tokens_for(self, size):
            return size + 1 + self.repeats

        def generate(self, size, count, rng, **options):
            x = fill(count, size, 10, rng, low=2)
            return with_answer([(x, False), (np.full((count, 1), 1), False), (np.repeat(x[:, :1], self.repeats, 1), True)])

    assert First(repeats=2).options() == {"symbols": 8, "repeats": 2}
    assert task_fingerprint(First(repeats=2)) != task_fingerprint(First(repeats=3))
    assert make("copy").options() == {"symbols": 16} and make("parity").options() == {} == make("flipflop").options()



def _mine(extra_sep: int = 0, high: int = 9, answer_first: bool = False):
    """A copy task of one's own (vocab_size 10) whose generator breaks its contract as told."""
    from posexp.tasks.task import Task, fill, with_answer

    class Mine(Task):
        name = "mine"
        default_symbols = 8
        vocab_size = 10

        def tokens_for(self, size):
            return 2 * size + 1

        def generate(self, size, count, rng, **options):
            x = fill(count, size, high, rng, low=2)
            return with_answer([(x, answer_first), (np.full((count, 1 + extra_sep), 1), False), (x, True)])

    return Mine()


@pytest.mark.parametrize("broken,wrong", [
    ({"extra_sep": 1}, "returned tokens (4, 20) and answer (4, 20)"),
    ({"high": 12}, "outside its vocab_size 10"),
    ({"answer_first": True}, "an answer on the first token"),
])
def test_a_generator_that_breaks_its_contract_is_one_line_naming_the_task_not_a_numpy_error(broken, wrong):
    """One separator too many was 'ValueError: negative dimensions are not allowed' from numpy (padding), a token past
    vocab_size an index error in the embedding: posexp train printed a traceback far from the generator."""
    with pytest.raises(PosexpError, match=r"^task=mine: Mine\.generate\(size=9, count=4\) returned ") as e:
        _mine(**broken).instances(19, 4, np.random.default_rng(0))
    assert wrong in str(e.value) and "\n" not in str(e.value)
    assert _mine().instances(19, 4, np.random.default_rng(0)).tokens.shape == (4, 20)
