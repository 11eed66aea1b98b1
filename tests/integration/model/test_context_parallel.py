"""The context-parallel contract: each encoding declares whether a shard of the sequence computes it alone, posexp
check verifies a declared yes by attention over shards against the whole, list shows it, and
train.context_parallel refuses what cannot run, in one line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from posexp.config.schema import config_dir
from posexp.encoders import create
from posexp.encoders.contract import PositionalEncoder
from posexp.encoders.cope import CoPE
from posexp.evaluation.conformance import FAIL, PASS, Probe, run_checks
from posexp.evaluation.conformance.sharded import SHARDS, sharded_difference

from helpers import TINY_RUN, invoke

ENCODERS = sorted(p.stem for p in (config_dir() / "encoder").glob("*.yaml"))
# a query's logits read a prefix over the keys between it and the key (or the sequence's length)
WHOLE_SEQUENCE = {"cope", "fox", "stickbreaking", "path", "normalized"}
# rotary, distance biases, relative scores and absolute embeddings: computed from q_pos and k_pos alone. An encoding
# in neither set (a new one) is held only to its declaration: a False is safe, a True must pass the check.
SHARDABLE = {"alibi", "binary", "deberta", "fire", "fope", "integer", "irope", "kerple", "learned", "mixed", "none",
             "prope", "resonance", "rope", "sandwich", "shaw", "sinusoidal", "t5", "transformer_xl", "xpos"}


def _check(make, probe=None):
    return run_checks(make, probe, names=["context parallel"])[0]


@pytest.mark.parametrize("name", ENCODERS)
def test_every_encoding_declares_what_the_shards_show(name):
    """A declared yes passes; the encodings that need the whole sequence say no, and their shards do differ."""
    encoder = create(name, d_model=64, n_heads=4)
    if name in WHOLE_SEQUENCE | SHARDABLE:
        assert encoder.context_parallel is (name in SHARDABLE)
    check = _check(lambda d, h: create(name, d_model=d, n_heads=h))
    assert check.status == PASS, check
    if name in WHOLE_SEQUENCE:
        assert check.measured > 1e-3 and "differ, as declared" in check.detail


def test_a_declared_yes_that_shards_cannot_compute_fails():
    class ShardedCoPE(CoPE):
        context_parallel = True  # wrong: CoPE counts gated keys over the whole span between key and query

    check = _check(lambda d, h: ShardedCoPE(d, h))
    assert check.status == FAIL and check.measured > 1e-3 and "declared shardable" in check.detail


def test_an_encoding_that_says_nothing_is_refused_not_trusted():
    class Quiet(PositionalEncoder):
        name = "quiet"

    assert Quiet(64, 4).context_parallel is False  # the safe default: train.context_parallel refuses it


def test_shards_merged_by_log_sum_exp_equal_softmax_over_the_whole_row():
    """The reference the check relies on, from the equation: softmax over all keys = the shards' softmaxes weighted
    by exp(lse_j - lse) (Milakov & Gimelshein 2018), for NoPE (no encoding: only the merge is under test)."""
    probe = Probe()
    assert sharded_difference(create("none", d_model=probe.d_model, n_heads=probe.n_heads), probe, 64) < 1e-12
    gen = torch.Generator().manual_seed(0)
    logits, v = torch.randn(5, 12, generator=gen, dtype=torch.float64), torch.randn(12, 3, generator=gen,
                                                                                     dtype=torch.float64)
    parts = [(torch.softmax(c, -1) @ w, torch.logsumexp(c, -1, keepdim=True))
             for c, w in zip(logits.chunk(SHARDS, -1), v.chunk(SHARDS, 0))]
    total = torch.logsumexp(torch.cat([lse for _, lse in parts], -1), -1, keepdim=True)
    merged = sum(o * torch.exp(lse - total) for o, lse in parts)
    assert torch.allclose(merged, torch.softmax(logits, -1) @ v, atol=1e-12)
    assert math.isclose(float(total[0, 0]), float(torch.logsumexp(logits[0], -1)), rel_tol=1e-12)


def test_list_names_the_encodings_that_need_the_whole_sequence(tmp_path):
    out = invoke("list", columns=200).stdout
    note = " ".join(out[out.index("context parallel"):].split())
    assert "except cable, cope, fox, normalized, path, pope, stickbreaking, which need the whole sequence" in note
    assert "irope, mixed: when every layer's encoding does" in note


@pytest.mark.parametrize("encoder, says", [("fox", "needs the whole sequence"), ("rope", "runs on CUDA only"),
                                           ("alibi", "runs on CUDA only")])
def test_context_parallel_is_refused_in_one_line_where_it_cannot_run(tmp_path, monkeypatch, encoder, says):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *TINY_RUN, f"encoder={encoder}", "train.context_parallel=2")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "train.context_parallel" in lines[0] and says in lines[0]
    assert not Path("outputs").exists()


def test_context_parallel_on_cuda_refuses_a_bias_and_a_process_count_it_cannot_split():
    from posexp.training.context import refusal

    cuda = torch.device("cuda")
    assert "adds terms to the attention logits" in refusal(2, create("alibi", d_model=64, n_heads=4), cuda, 2)
    assert "must equal the number of processes" in refusal(2, create("rope", d_model=64, n_heads=4), cuda, 4)
    assert refusal(2, create("rope", d_model=64, n_heads=4), cuda, 2) is None
    assert refusal(1, create("fox", d_model=64, n_heads=4), torch.device("cpu"), 1) is None  # off: nothing to refuse
