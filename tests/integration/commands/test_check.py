"""posexp check: every built-in encoding conforms, and each way of breaking the contract is caught by its check."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import Tensor, nn

import posexp.encoders as encoders
from posexp.commands.check import check_main, yaml_options
from posexp.encoders import create, register
from posexp.encoders.contract import PositionalEncoder, bias_score_mod, relative_distance
from posexp.errors import PosexpError
from posexp.evaluation.conformance import CHECKS, FAIL, PASS, Probe, run_checks
from helpers import REPO, invoke_main

# small enough for the test suite: 16x the nominal length is 512 tokens
PROBE = Probe(train_len=32, block=8, long_block=32)
NOT_TIMED = [name for name in CHECKS if name != "speed vs rope"]  # timing is a measurement, not a property
BUILT_INS = sorted(p.stem for p in (REPO / "configs" / "encoder").glob("*.yaml"))
# normalized reads n / (L - 1): a position's code depends on the sequence's length, its documented flaw
KNOWN_FAILURES = {"normalized": {"prefix", "absolute positions"}}


def _failed(name: str, **options) -> set[str]:
    results = run_checks(lambda d, h: create(name, d, h, **options), PROBE, NOT_TIMED)
    return {r.name for r in results if r.status == FAIL}


@pytest.mark.parametrize("name", BUILT_INS)
def test_every_built_in_encoding_conforms(name):
    # built as posexp check NAME builds it: its yaml's options at the probe's train_len (learned's table ends there)
    assert _failed(name, **yaml_options(name, train_len=PROBE.train_len)) == KNOWN_FAILURES.get(name, set())


# -- encodings that break the contract, one way each ----------------------------------------------------------------

class LengthLeak(PositionalEncoder):
    """A bias that looks ahead: distances normalised by the last key, so each output reads how many tokens follow."""

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return -relative_distance(q_pos, k_pos).float()[None] / (k_pos.max() + 1) * 8


class ContentLeak(PositionalEncoder):
    """Each key mixes in the next one: a query reads the token after it through its own key."""

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k + k.roll(-1, dims=2)


class IgnoresQueryPositions(PositionalEncoder):
    """ALiBi-like, but counts queries from 0 in every block instead of reading ``q_pos``."""

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        own = torch.arange(len(q_pos), device=q_pos.device)
        return -0.5 * relative_distance(own, k_pos).float()[None]


class FalselyRelative(PositionalEncoder):
    """Declares itself relative, but biases by the query's absolute position."""

    relative = True

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return 0.1 * (q_pos[:, None] + 0 * k_pos[None, :]).float()[None]


class Overflows(PositionalEncoder):
    """An absolute code ``exp(pos / 5)``: fine at the training length, infinite by 16x."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.direction = nn.Parameter(torch.full((d_model,), 1e-3))

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + torch.exp(pos.to(x.dtype) / 5)[:, None] * self.direction.to(x.dtype)


class ScalarSlope(PositionalEncoder):
    """ALiBi with one learned slope shared by every head, which its score_mod reads as a 0-d tensor."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.slope = nn.Parameter(torch.tensor(0.5))

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (-self.slope * relative_distance(q_pos, k_pos).float())[None].expand(self.n_heads, -1, -1)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor):
        slope = self.slope
        return bias_score_mod(lambda h, i, j: -slope * (i - j).float(), q_pos, k_pos)


class SlopeReadTwice(PositionalEncoder):
    """ALiBi with learned per-head slopes, which its score_mod looks up twice for every logit."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.slopes = nn.Parameter(torch.full((n_heads,), 0.5))

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return -self.slopes[:, None, None] * relative_distance(q_pos, k_pos).float()[None]

    def score_mod(self, q_pos: Tensor, k_pos: Tensor):
        slopes = self.slopes
        return bias_score_mod(lambda h, i, j: -(slopes[h] / 2 + slopes[h] / 2) * (i - j).float(), q_pos, k_pos)


class GatesReadAhead(PositionalEncoder):
    """FoX-like forget gates, off by one token: each key decays by the gate of the token after it."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.gate = nn.Linear(d_model, n_heads)

    def transform(self, x: Tensor, q: Tensor, k: Tensor, pos: Tensor):
        log_f = torch.nn.functional.logsigmoid(self.gate(x)).transpose(1, 2)  # (B, H, L)
        ahead = log_f.roll(-1, dims=-1)  # key j decays by the gate of token j + 1: the query's own key reads ahead
        return lambda start, end: ahead[..., None, :end].expand(-1, -1, end - start, -1)


class NormalisesOverTheFuture(PositionalEncoder):
    """A softmax that treats a masked key's logit as 0 instead of -inf: queries attend to the future."""

    def normalise(self, logits: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return logits.masked_fill(torch.isinf(logits), 0.0).softmax(-1)


class ScoresHeadsFirst(PositionalEncoder):
    """A per-head distance term laid out ``(H, B, Lq, Lk)``: the same shape as the contract's when B = H."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.table = nn.Parameter(torch.zeros(n_heads, 64))

    def scores(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        per_head = self.table[:, relative_distance(q_pos, k_pos).clamp(0, 63)]  # (H, Lq, Lk)
        return per_head[:, None].expand(-1, q.shape[0], -1, -1)


class MaskAsBias(PositionalEncoder):
    """A local window returned as a boolean mask, which the model adds as 1.0 where it was meant to hide."""

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (relative_distance(q_pos, k_pos) > 4)[None].expand(self.n_heads, -1, -1)


# each break, and every check it fails: a future leak also breaks what follows from causality, nothing else fails
BROKEN = {"length_leak": (LengthLeak, {"prefix", "absolute positions"}),
          "content_leak": (ContentLeak, {"causality", "prefix", "absolute positions"}),
          "ignores_q_pos": (IgnoresQueryPositions, {"absolute positions"}),
          "falsely_relative": (FalselyRelative, {"relative"}), "overflows": (Overflows, {"length"}),
          # right on a CPU, refused by FlexAttention's backward on a GPU
          "scalar_slope": (ScalarSlope, {"fused backward"}), "slope_read_twice": (SlopeReadTwice, {"fused backward"}),
          # the content hooks: the model-level checks, and the hook's own, name the break
          "gates_read_ahead": (GatesReadAhead, {"causality", "prefix", "transform: causal, prefix"}),
          "normalises_over_the_future": (NormalisesOverTheFuture,
                                         {"causality", "prefix", "absolute positions", "normalise: masks, blocks"}),
          # what a hook returns: right in the probe's shapes (length runs one sequence: the batch of 1 breaks it, named
          # by no hook), or taken by the model as something else
          "scores_heads_first": (ScoresHeadsFirst, {"hook outputs", "length"}),
          "mask_as_bias": (MaskAsBias, {"hook outputs"})}


@pytest.fixture
def broken():
    """The broken encoders in the registry for one test, and gone from it after."""
    for name, (cls, _) in BROKEN.items():
        register(name)(cls)
    yield
    for name in BROKEN:
        encoders._REGISTRY.remove(name)


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_encoding_fails_its_check_and_the_command_exits_non_zero(broken, name):
    out = io.StringIO()
    code = check_main(name, [], "json", Console(file=out, width=200), probe=PROBE)
    report = json.loads(out.getvalue())
    failed = {c["name"] for c in report["checks"] if c["status"] == FAIL}
    assert code == 1 and not report["passed"]
    assert failed == BROKEN[name][1]


class TransformReturnsLogits(PositionalEncoder):
    """A transform that returns the logits of the whole sequence instead of the function of a query block."""

    def transform(self, x: Tensor, q: Tensor, k: Tensor, pos: Tensor):
        return torch.zeros(q.shape[0], q.shape[1], len(pos), len(pos))


def test_hook_outputs_names_a_transform_that_returns_a_tensor_where_the_others_say_it_is_not_callable():
    checked = {r.name: r for r in run_checks(lambda d, h: TransformReturnsLogits(d, h), PROBE,
                                             ["hook outputs", "causality"])}
    assert checked["hook outputs"].status == FAIL
    assert checked["hook outputs"].detail == "transform returned Tensor, not the function logits(start, end)"
    assert "not callable" in checked["causality"].detail


def test_the_broken_encoders_leave_the_registry(broken):
    assert set(BROKEN) <= set(encoders.registry())


def test_after_the_fixture_no_broken_encoder_is_registered():
    assert not set(BROKEN) & set(encoders.registry())


def test_relative_is_checked_only_where_declared():
    results = {r.name: r for r in run_checks(lambda d, h: create("fire", d, h), PROBE, ["relative"])}
    assert results["relative"].status == "n/a"
    results = {r.name: r for r in run_checks(lambda d, h: create("alibi", d, h), PROBE, ["relative"])}
    assert results["relative"].status == PASS and results["relative"].measured == 0


def test_rotary_scalings_match_transformers_and_the_identity():
    pytest.importorskip("transformers")
    results = run_checks(lambda d, h: create("rope", d, h), PROBE, ["scalings: factor 1", "scalings: = transformers"])
    assert [r.status for r in results] == [PASS, PASS]
    assert all(r.measured < 1e-5 for r in results)


def test_speed_is_measured_against_rope():
    (result,) = run_checks(lambda d, h: create("none", d, h), PROBE, ["speed vs rope"])
    assert result.status == PASS and 0 < result.measured < math.inf


def test_a_max_length_encoding_is_refused_past_it_not_failed():
    results = run_checks(lambda d, h: create("learned", d, h, max_length=300), PROBE, NOT_TIMED)
    assert not [r for r in results if r.status == FAIL]
    (length,) = [r for r in results if r.name == "length"]
    assert length.measured == 300 and "refused past max_length=300" in length.detail


def test_markdown_output_is_one_table_row_per_check():
    out = io.StringIO()
    assert check_main("alibi", [], "markdown", Console(file=out, width=200), probe=PROBE) == 0
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(CHECKS) and "| causality | pass |" in out.getvalue()


@pytest.mark.parametrize("args,message", [
    (["check", "ropee"], "no such encoder 'ropee'; did you mean rope?"),
    (["check", "rope", "bsae=500"], "encoder.bsae: not an option of encoder 'rope'; did you mean base?"),
])
def test_a_bad_name_or_option_is_one_line_and_exit_2(tmp_path: Path, args, message):
    result = invoke_main(*args, cwd=tmp_path)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("args,fmt,message", [
    (["base=0.5"], "table", "base: must be > 1"),
    (["base=abc"], "table", "encoder.base: 'abc' is not a float"),  # a TypeError traceback
    (["base=1e400"], "table", "encoder.base: must be a finite number"),  # passed, while posexp train refuses it
    (["base"], "table", "base: not an option KEY=VALUE"),
    ([], "yaml", "--format yaml: choose one of: table, json, markdown"),
])
def test_a_bad_value_or_format_is_refused_before_any_check(args, fmt, message):
    with pytest.raises(PosexpError, match=re.escape(message)):
        check_main("rope", args, fmt, Console(file=io.StringIO()), probe=PROBE)


def test_options_are_typed_as_posexp_train_types_them():
    from posexp.commands.check import parse_options

    options = parse_options("mixed", ["encoder.layers=[rope,alibi]", "options={rope:{rotary_fraction:0.5}}"])
    assert options == {"layers": ["rope", "alibi"], "options": {"rope": {"rotary_fraction": 0.5}}}


def test_dynamic_ntk_rope_is_not_relative_and_the_check_would_say_so():
    """Its base follows the largest key position, so a common shift changes the logits: declared False."""
    def scaled(d, h):
        enc = create("rope", d, h).with_scaling("dynamic_ntk", 2.0, 16)
        assert enc.relative is False
        enc.relative = True  # claim it anyway
        return enc

    (result,) = run_checks(scaled, PROBE, ["relative"])
    assert result.status == FAIL and result.measured > 1e-3


def test_the_built_ins_that_declare_themselves_relative():
    """The encodings whose papers make their logits a function of i - j (and content) alone; FIRE normalises by
    the query's own position past its threshold, FoPE's Fourier cross terms and iRoPE's query temperature read
    absolute positions, the rest are absolute (mixed: its default [rope, none]); FoX, PaTH and stick-breaking read
    no position index at all, only the content and the keys' order (CABLE too); HoPE and PoPE rotate by s - t."""
    declared = {name for name in BUILT_INS if create(name, 32, 2).relative}
    assert declared == {"alibi", "cable", "cope", "deberta", "fox", "hope", "kerple", "mixed", "none", "path", "pope",
                        "prope", "resonance", "rope", "sandwich", "shaw", "stickbreaking", "t5", "transformer_xl",
                        "xpos"}


# -- no false alarm, a long enough reach, and what cannot be measured or built ---------------------------------------

class LogMLPBias(PositionalEncoder):
    """A FIRE-like bias: an MLP over ``log(1 + distance)``, computed in float32 as most positional code does."""

    relative = True

    def __init__(self, d_model: int, n_heads: int, hidden: int = 8):
        super().__init__(d_model, n_heads)
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        d = relative_distance(q_pos, k_pos).clamp(min=0)
        return self.mlp(torch.log1p(d).float()[..., None]).permute(2, 0, 1)


class LogMLPLengthLeak(LogMLPBias):
    """The same, with distances normalised by the last key: it reads how many tokens follow."""

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        d = relative_distance(q_pos, k_pos).clamp(min=0) / (k_pos.max() + 1)
        return self.mlp(torch.log1p(d).float()[..., None]).permute(2, 0, 1)


EXACT_CHECKS = ["causality", "prefix", "absolute positions", "relative"]


def test_an_encoder_that_computes_in_float32_is_checked_in_float32_not_failed():
    """``.float()`` inside a bias met the float64 model's Linear: "mat1 and mat2 must have the same dtype"."""
    results = run_checks(lambda d, h: LogMLPBias(d, h), PROBE, EXACT_CHECKS)
    assert [r.status for r in results] == [PASS] * 4, [r.detail for r in results]
    assert all("float32" in r.detail and "1e-04" in r.tolerance for r in results)
    # an encoder that follows its input's dtype keeps the float64 bound
    (alibi,) = run_checks(lambda d, h: create("alibi", d, h), PROBE, ["causality"])
    assert alibi.tolerance == "<= 1e-06" and "float32" not in alibi.detail


def test_a_float32_encoder_that_looks_ahead_still_fails():
    failed = {r.name for r in run_checks(lambda d, h: LogMLPLengthLeak(d, h), PROBE, EXACT_CHECKS)
              if r.status == FAIL}
    assert {"prefix", "absolute positions"} <= failed


class TinyOverflow(PositionalEncoder):
    """``exp(pos / 12) · 1e-30``: finite at 1,024 tokens, infinite in float32 by 2,048."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__(d_model, n_heads)
        self.direction = nn.Parameter(torch.ones(d_model))

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        return x + (torch.exp(pos.to(x.dtype) / 12) * 1e-30)[:, None] * self.direction.to(x.dtype)


def test_the_length_check_reaches_16x_the_default_train_len_and_a_given_one():
    (length,) = run_checks(lambda d, h: TinyOverflow(d, h), Probe(), ["length"])
    assert Probe().lengths[-1] == 2048
    assert length.status == FAIL and "2048" in length.detail
    out = io.StringIO()
    register("tiny_overflow")(TinyOverflow)
    try:
        assert check_main("tiny_overflow", ["train_len=32"], "json", Console(file=out, width=200), probe=PROBE) == 0
        report = json.loads(out.getvalue())
        assert report["probe"]["train_len"] == 32 and report["passed"]
        with pytest.raises(PosexpError, match="train_len: must be a positive integer"):
            check_main("tiny_overflow", ["train_len=0"], "json", Console(file=io.StringIO()), probe=PROBE)
    finally:
        encoders._REGISTRY.remove("tiny_overflow")


def test_learned_at_a_given_train_len_reads_no_position_past_its_table():
    # posexp check learned train_len=32: its yaml sets max_length=32, shorter than the probe's blocks of 16 reach
    out = io.StringIO()
    assert check_main("learned", ["train_len=32"], "json", Console(file=out, width=200),
                      probe=Probe(long_block=32)) == 0
    assert json.loads(out.getvalue())["passed"]


def test_an_option_the_yaml_ties_to_train_len_follows_the_given_one():
    # hope's yaml says encoder.train_len: ${train_len}; posexp train encoder=hope train_len=4 refuses, as check must
    with pytest.raises(PosexpError, match=re.escape("encoder.train_len: no frequency of base 10000 completes a "
                                                    "period in 4 tokens")):
        check_main("hope", ["train_len=4"], "json", Console(file=io.StringIO()), probe=PROBE)


def test_a_measurement_that_runs_out_of_memory_is_an_error_not_a_failure(monkeypatch):
    import posexp.evaluation.conformance.numerics as numerics

    def no_memory(model, idx):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 4194304 bytes")

    monkeypatch.setattr(numerics, "_forward_backward", no_memory)
    out = io.StringIO()
    code = check_main("rope", [], "json", Console(file=out, width=200), probe=PROBE)
    report = json.loads(out.getvalue())
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["bf16"] == status["speed vs rope"] == status["length"] == "error"
    assert FAIL not in status.values() and report["passed"] and not report["complete"]
    assert code == 3  # not 1: nothing failed the contract, something could not be measured


class RaisesInInit(PositionalEncoder):
    def __init__(self, d_model: int, n_heads: int, width: int = 3):
        super().__init__(d_model, n_heads)
        raise ValueError("width must divide d_model")


class NoDefault(PositionalEncoder):
    def __init__(self, d_model, n_heads, alpha):  # type: ignore[no-untyped-def]
        super().__init__(d_model, n_heads)


@pytest.mark.parametrize("cls,reason", [(RaisesInInit, "raised ValueError: width must divide d_model"),
                                        (NoDefault, "option 'alpha' needs a default")])
def test_an_encoder_that_cannot_be_built_is_a_failed_check_naming_why(cls, reason):
    register("unbuildable")(cls)
    try:
        out = io.StringIO()
        code = check_main("unbuildable", [], "json", Console(file=out, width=200), probe=PROBE)
    finally:
        encoders._REGISTRY.remove("unbuildable")
        encoders._BROKEN.pop("unbuildable", None)
    (build,) = json.loads(out.getvalue())["checks"]
    assert code == 1 and build["name"] == "build" and build["status"] == FAIL and reason in build["detail"]
