"""RULER's task families (Hsieh et al. 2024) and the key-value retrieval of "lost in the middle" (Liu et al. 2023):
every variant's answer right by an independent solver, needles and gold pairs at the requested depth, the shapes
each option promises, Zipf's law in fwe, and bad options as one line naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import TINY_RUN, invoke_main
from helpers.tasks import solve_niah, solve_top_words, solve_vartrack, unpadded
from posexp.errors import ConfigError
from posexp.tasks import build_task, chance_exact_match
from posexp.tasks.cwe import COMMON_REPEATS, UNCOMMON_REPEATS, CommonWords
from posexp.tasks.fwe import FrequentWords
from posexp.tasks.kv_retrieval import KVRetrieval
from posexp.tasks.niah import NIAH, VARIANTS
from posexp.tasks.ruler import FILLER_PERIOD, weave
from posexp.tasks.vartrack import VariableTracking

NEEDLE, QUERY = 1, 2  # niah's and vartrack's markers (VAR is 1 too)
WORDS_QUERY = 1  # cwe's and fwe's


def _rows(made):
    for row, answer in zip(made.tokens, made.answer):
        pad = row.size - unpadded(row).size
        yield row[pad:].tolist(), row[answer].tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_niah_variant_is_answered_as_a_solver_reads_it(variant):
    task = NIAH(variant=variant, needles=None if variant == "single" else 3)
    for length in (task.shortest_length(), 40, 97, 300):
        made = task.instances(length, 32, np.random.default_rng(length), split="val")
        assert made.tokens.shape == (32, length + 1)
        for seq, marked in _rows(made):
            assert solve_niah(seq) == marked
            q = seq.index(QUERY)
            needles = [seq[i + 1] for i in range(q) if seq[i] == NEEDLE]
            assert len(needles) == task.needles
            # single / multikey: one value asked; multivalue: one key, every value; multiquery: every key once
            assert len(marked) == {"multivalue": 3, "multiquery": 3}.get(variant, 1)
            assert len(set(needles)) == (1 if variant == "multivalue" else task.needles)


def test_the_niah_haystack_is_the_filler_repeated_around_the_needles():
    task = NIAH(variant="multikey", needles=4)
    made = task.instances(200, 8, np.random.default_rng(0), split="val")
    for seq, _ in _rows(made):
        q = seq.index(QUERY)
        keep = np.ones(q, dtype=bool)
        for i in (i for i in range(q) if seq[i] == NEEDLE):
            keep[i:i + 3] = False
        hay = np.array(seq[:q])[keep]
        assert hay.size == task.size_for(200) and set(hay.tolist()) <= set(range(3, 3 + FILLER_PERIOD))
        assert (np.diff(hay) % FILLER_PERIOD == 1).all()  # the filler cycle, unbroken by the needles


@pytest.mark.parametrize("variant", ["single", "multikey"])
def test_the_niah_needle_asked_sits_at_the_requested_depth(variant):
    task = NIAH(variant=variant)
    size = task.size_for(150)
    for depth in (0.0, 0.3, 0.5, 1.0):
        made = task.instances(150, 16, np.random.default_rng(1), split="val", depth=depth)
        for seq, _ in _rows(made):
            q = seq.index(QUERY)
            asked = seq[q + 1]
            at = next(i for i in range(q) if seq[i] == NEEDLE and seq[i + 1] == asked)
            needles_before = sum(1 for i in range(at) if seq[i] == NEEDLE)
            assert at - 3 * needles_before == round(depth * size)  # haystack tokens before it


def test_niah_training_scatters_the_needle_over_every_depth():
    task = NIAH()
    made = task.instances(60, 400, np.random.default_rng(2), split="train")
    places = {seq.index(NEEDLE) for seq, _ in _rows(made)}
    assert min(places) == 0 and max(places) == task.size_for(60) and len(places) > 40


def test_vartrack_chains_hold_their_own_value_and_keep_their_order():
    task = VariableTracking(chains=3, hops=4)
    made = task.instances(120, 32, np.random.default_rng(3), split="val")
    for seq, marked in _rows(made):
        assert solve_vartrack(seq) == marked and len(marked) == 5  # hops + 1 variables
        q = seq.index(QUERY)
        statements = [(seq[i + 1], seq[i + 2]) for i in range(q) if seq[i] == 1]
        assert len(statements) == 3 * 5
        values = {rhs for _, rhs in statements if rhs >= 11 + task.symbols}
        assert len(values) == 3 and seq[q + 1] in values  # one value per chain, one of them asked
        for x, rhs in statements:  # a variable is read only after it is assigned
            if rhs < 11 + task.symbols:
                assert statements.index(next(s for s in statements if s[0] == rhs)) < statements.index((x, rhs))


def test_vartrack_with_one_chain_of_four_hops_is_rulers_default_shape():
    task = VariableTracking(chains=1, hops=4)
    made = task.instances(task.shortest_length(), 4, np.random.default_rng(0))
    assert made.answer.sum(axis=1).tolist() == [5] * 4


def test_cwe_repeats_the_common_words_more_than_any_other():
    task = CommonWords(top_k=4)
    for length in (task.shortest_length(), 100, 400):
        made = task.instances(length, 16, np.random.default_rng(length), split="val")
        for seq, marked in _rows(made):
            assert solve_top_words(seq) == marked and len(marked) == 4
            words = seq[:seq.index(WORDS_QUERY)]
            counts = {w: words.count(w) for w in set(words)}
            assert sorted(counts.values(), reverse=True)[:5] == [COMMON_REPEATS] * 4 + [UNCOMMON_REPEATS]
            assert {w for w, c in counts.items() if c == COMMON_REPEATS} == set(marked)


def test_fwe_draws_words_by_zipfs_law_with_alpha_two():
    task = FrequentWords()
    made = task.instances(2000, 64, np.random.default_rng(4), split="val")
    ranked = []
    for seq, marked in _rows(made):
        assert solve_top_words(seq) == marked
        words = seq[:seq.index(WORDS_QUERY)]
        ranked.append(sorted((words.count(w) for w in set(words)), reverse=True)[:3])
    first, second, third = np.mean(ranked, axis=0)
    assert first / second == pytest.approx(2 ** 2, rel=0.1)  # p(r) ∝ r^-2: rank 1 four times rank 2
    assert first / third == pytest.approx(3 ** 2, rel=0.15)


def test_fwe_every_instance_has_one_clear_top_k_even_at_its_smallest():
    task = FrequentWords(top_k=2)
    for length in (task.shortest_length(), 8, 30):
        made = task.instances(length, 64, np.random.default_rng(5), split="val")
        for seq, marked in _rows(made):
            assert solve_top_words(seq) == marked and len(marked) == 2  # the solver asserts the top k is clear


def test_kv_retrieval_puts_the_gold_pair_at_the_requested_depth():
    task = KVRetrieval()
    n = task.size_for(100)
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        made = task.instances(100, 16, np.random.default_rng(6), split="val", depth=depth)
        for seq, marked in _rows(made):
            q = seq.index(1)
            pairs = [tuple(seq[i:i + 4]) for i in range(0, q, 4)]
            gold = [p[:2] for p in pairs].index(tuple(seq[q + 1:q + 3]))
            assert gold == round(depth * (n - 1)) and list(pairs[gold][2:]) == marked


def test_kv_retrieval_trains_on_every_gold_place_and_refuses_more_pairs_than_keys():
    task = KVRetrieval(symbols=4)  # 16 distinct keys
    made = task.instances(task.tokens_for(16) - 1, 300, np.random.default_rng(7), split="train")
    golds = set()
    for seq, _ in _rows(made):
        q = seq.index(1)
        golds.add([tuple(seq[i:i + 2]) for i in range(0, q, 4)].index(tuple(seq[q + 1:q + 3])))
    assert golds == set(range(16))
    with pytest.raises(ConfigError, match="task.symbols") as e:
        task.check_length(task.tokens_for(17) - 1, "eval.lengths")
    assert e.value.key == "eval.lengths"


def test_weave_puts_each_piece_before_its_haystack_token():
    hay = np.arange(10, 16)[None, :]  # six haystack tokens
    pieces = np.array([[[1, 1], [2, 2], [3, 3]]])
    out = weave(hay, pieces, np.array([[6, 0, 0]]))
    assert out.tolist() == [[2, 2, 3, 3, 10, 11, 12, 13, 14, 15, 1, 1]]


def test_chance_of_the_new_tasks_is_one_over_their_answer_alphabet():
    assert chance_exact_match("kv_retrieval", {"symbols": 16}, 2) == pytest.approx(16 ** -2)
    assert chance_exact_match("niah", {"symbols": 64}, 1) == pytest.approx(1 / 64)


@pytest.mark.parametrize("options,key,needles", [
    ({"name": "niah", "variant": "bogus"}, "task.variant", ["single, multikey, multivalue, multiquery"]),
    ({"name": "niah", "needles": 3}, "task.needles", ["variant=single", "multikey"]),
    ({"name": "niah", "variant": "multikey", "needles": 1}, "task.needles", ["at least 2"]),
    ({"name": "niah", "variant": "multiquery", "needles": 9, "symbols": 8}, "task.needles", ["task.symbols=8"]),
    ({"name": "vartrack", "hops": 0}, "task.hops", ["at least 1"]),
    ({"name": "vartrack", "chains": 0}, "task.chains", ["at least 1"]),
    ({"name": "vartrack", "chains": 4, "hops": 3, "symbols": 8}, "task.symbols", ["16 distinct variables"]),
    ({"name": "cwe", "top_k": 0}, "task.top_k", ["from 1 to"]),
    ({"name": "fwe", "top_k": 64}, "task.top_k", ["from 1 to task.symbols - 1 = 63"]),
    ({"name": "kv_retrieval", "top_k": 3}, "task.top_k", ["task=cwe|fwe", "drop task.top_k"]),
    ({"name": "copy", "variant": "single"}, "task.variant", ["task=babilong|niah", "drop task.variant"]),
    ({"name": "niah", "hops": 2}, "task.hops", ["task=vartrack"]),
    ({"name": "cwe", "top": 2}, "task.top", ["not an option of task 'cwe'", "task.top_k?", "symbols, min_size, top_k"]),
])
def test_bad_ruler_options_name_the_key_and_what_is_allowed(options, key, needles):
    with pytest.raises(ConfigError) as e:
        build_task(options)
    assert e.value.key == key
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


def test_the_shipped_yamls_build_their_tasks_with_the_options_they_document():
    from omegaconf import OmegaConf

    from posexp.config.schema import config_dir

    for name in ("niah", "vartrack", "cwe", "fwe", "kv_retrieval"):
        raw = OmegaConf.to_container(OmegaConf.load(config_dir() / "task" / f"{name}.yaml"))["task"]
        task = build_task(raw)
        assert task.name == name and task.shortest_length() <= 32  # experiment=smoke trains at 32 tokens


def test_kv_retrieval_run_writes_a_row_per_length_and_depth_and_the_heatmap(tmp_path):
    run = tmp_path / "kv"
    done = invoke_main("train", "task=kv_retrieval", "encoder=rope", *TINY_RUN, "train.steps=4", "eval.examples=16",
                       "eval.depths=[0,0.5,1]", f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.exit_code == 0, done.stderr + done.stdout
    rows = json.loads((run / "results.json").read_text())["rows"]
    assert sorted((r["length"], r["depth"]) for r in rows) == [(n, d) for n in (32, 64, 128) for d in (0, 0.5, 1)]
    assert all(r["answer_tokens"] == 16 * 2 for r in rows)  # a value of two symbols per instance
    assert (run / "passkey_heatmap.png").is_file()
    assert (run / "accuracy_vs_depth.png").is_file()  # lost in the middle: a line per length over depths


def test_a_bad_niah_variant_on_the_command_line_is_one_line(tmp_path):
    done = invoke_main("train", "task=niah", "task.variant=multi", *TINY_RUN, "train.steps=2",
                       f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    out = (done.stdout + done.stderr).strip()
    assert done.exit_code == 2 and len(out.splitlines()) == 1 and "task.variant" in out and "multiquery" in out, out
    assert not (tmp_path / "run" / "results.json").exists()
