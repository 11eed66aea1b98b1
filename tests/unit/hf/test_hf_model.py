"""A transformers causal LM read through posexp's model seam (posexp.hf.model): losses, chunks, positions, limits,
windows, and which scalings apply, on tiny random models built from their configs."""

from __future__ import annotations

import pytest

from helpers.hf_tiny import NO_ROPE, ROPE, configs, model, tokens

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from posexp.encoders.scaling import ROTARY_SCALINGS, SCALINGS  # noqa: E402
from posexp.errors import ConfigError, PosexpError  # noqa: E402
from posexp.hf.model import MIN_CHUNK, HFLanguageModel  # noqa: E402
from posexp.model.interface import EvaluableLM, Reading  # noqa: E402
from posexp.model.window import AttentionWindow  # noqa: E402

ALL = ROPE + NO_ROPE


def plain_losses(m, x):
    """Cross entropy of one ordinary transformers forward pass, no cache, no positions given."""
    logits = m(x).logits[:, :-1].float()
    return F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none").view(x.shape[0], -1)


def count_calls(m) -> list:
    calls: list = []
    m.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("kind", ALL)
def test_token_losses_equal_a_plain_forwards_cross_entropy_in_chunks(kind):
    m = model(kind)
    x = tokens(41, batch=2)
    lm = HFLanguageModel(m, kind, chunk=16)
    calls = count_calls(m)
    losses = lm.token_losses(x[:, :-1], x[:, 1:])
    assert len(calls) == 3  # 40 queries in chunks of 16 over one cache of keys
    assert losses.dtype == torch.float32 and losses.shape == (2, 40)
    torch.testing.assert_close(losses, plain_losses(m, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ALL)
def test_chunked_logits_equal_unchunked(kind):
    m = model(kind)
    x = tokens(50)
    whole = HFLanguageModel(m, kind, chunk=64).logits(x)
    for chunk in (1 << 4, 7):
        torch.testing.assert_close(HFLanguageModel(m, kind, chunk=chunk).logits(x), whole, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ("llama", "gpt2"))
def test_positions_are_the_models_position_ids(kind):
    m = model(kind)
    x = tokens(12)
    pos = torch.arange(12) + 9
    want = m(x, position_ids=pos[None]).logits
    torch.testing.assert_close(HFLanguageModel(m, kind, chunk=5).logits(x, pos), want, atol=1e-5, rtol=0)


def test_a_model_without_position_ids_refuses_positions_it_cannot_read():
    lm = HFLanguageModel(model("bloom"), "bloom")
    x = tokens(6)
    torch.testing.assert_close(lm.logits(x, torch.arange(6) + 3), lm.logits(x))  # ALiBi: a shift is nothing
    with pytest.raises(PosexpError, match="takes no position ids"):
        lm.logits(x, torch.arange(6) * 2)


def test_the_adapter_is_an_evaluable_lm_named_by_its_model():
    lm = HFLanguageModel(model("llama"), "org/tiny-llama")
    assert isinstance(lm, EvaluableLM)
    assert lm.label == "org/tiny-llama"
    assert lm.eval() is lm and not lm.model.training


def test_a_learned_table_is_honoured_and_rope_or_alibi_have_none():
    gpt2 = HFLanguageModel(model("gpt2"), "gpt2")
    assert gpt2.max_length == 64
    assert gpt2.length_refusal(Reading(), 64) is None
    assert "64 positions" in gpt2.length_refusal(Reading(), 65)
    mpt = HFLanguageModel(model("mpt"), "mpt")  # its ALiBi table is built for max_seq_len
    assert mpt.max_length == 64 and mpt.length_refusal(Reading(), 65)
    for kind in ("llama", "qwen2", "neox", "bloom"):
        lm = HFLanguageModel(model(kind), kind)
        assert lm.max_length is None and lm.length_refusal(Reading(), 10**6) is None


def test_the_context_length_scalings_stretch_from_is_the_published_one():
    assert HFLanguageModel(model("llama"), "llama").context_length == 32
    assert HFLanguageModel(model("gpt2"), "gpt2").context_length == 64
    assert HFLanguageModel(model("mpt"), "mpt").context_length == 64
    extended = {"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert HFLanguageModel(model("llama", max_position_embeddings=128, rope_parameters=extended),
                           "llama-3.1-like").context_length == 16


@pytest.mark.parametrize("kind", NO_ROPE)
def test_rotary_scalings_do_not_apply_to_a_model_without_rope(kind):
    lm = HFLanguageModel(model(kind), kind)
    assert not lm.has_rope
    assert lm.check_scaling("none") is None
    for scaling in (*ROTARY_SCALINGS, "longrope", "rerope"):
        assert "no rotary position embedding" in lm.check_scaling(scaling)
    with pytest.raises(ConfigError, match="eval.scaling"):
        with lm.reading(Reading("yarn", 2.0, 16, 32)):
            pass


@pytest.mark.parametrize("kind", ROPE)
def test_rope_is_found_in_the_model_and_every_rotary_scaling_and_remapping_applies(kind):
    lm = HFLanguageModel(model(kind), kind)
    assert lm.has_rope
    assert all(lm.check_scaling(s) is None for s in SCALINGS)


def test_an_unknown_scaling_is_a_config_error_naming_the_allowed_values():
    lm = HFLanguageModel(model("llama"), "llama")
    with pytest.raises(ConfigError, match=r"eval.scaling.*unknown scaling 'ntk_by_parts'.*linear"):
        lm.check_scaling("ntk_by_parts")


def test_partial_rotary_rotates_only_its_share_of_each_head():
    lm = HFLanguageModel(model("neox"), "neox")
    head = 32 // 4
    assert [s.dim for s in lm._rotary] == [head // 2]  # rotary_pct = 0.5


def test_shrink_halves_the_chunk_until_its_floor_and_a_reading_restores_it():
    lm = HFLanguageModel(model("llama"), "llama", chunk=64)
    with lm.reading(Reading()):
        assert lm.shrink() == "query chunks of 32"
        assert lm.memory_settings() == {"query_chunk": 32}
        while lm.shrink() is not None:
            pass
        assert lm.chunk == MIN_CHUNK
    assert lm.memory_settings() == {"query_chunk": 64}


def visible_only(m, x, window: AttentionWindow, i: int):
    """Logits of query ``i`` from a plain forward of only the tokens it may see, at their own positions: what a
    one-layer model attending within the window must give."""
    keep = [k for k in range(i + 1) if i - k < window.size or k < window.sinks]
    idx = torch.tensor(keep)
    return m(x[:, idx], position_ids=idx[None], attention_mask=torch.ones(1, len(keep))).logits[0, -1]


@pytest.mark.parametrize("kind", ("llama", "gpt2", "mpt"))
@pytest.mark.parametrize("window", (AttentionWindow(4), AttentionWindow(5, sinks=2)))
def test_a_window_sees_its_last_keys_and_sinks_only(kind, window):
    layer = {"mpt": {"n_layers": 1}, "gpt2": {"n_layer": 1}}.get(kind, {"num_hidden_layers": 1})
    m = model(kind, **layer)
    x = tokens(20)
    lm = HFLanguageModel(m, kind, chunk=6)
    assert lm.window_refusal() is None
    with lm.reading(Reading(window=window)):
        assert lm.length_refusal(Reading(window=window), 20) is None
        got = lm.logits(x)
    full = lm.logits(x)
    if kind == "mpt":  # MPT reads positions implicitly, from the end of its table: only relative ones agree
        assert not torch.allclose(got[0, -1], full[0, -1], atol=1e-3)
        return
    for i in (3, 9, 19):
        torch.testing.assert_close(got[0, i], visible_only(m, x, window, i), atol=1e-5, rtol=0)
    assert not torch.allclose(got[0, 19], full[0, 19], atol=1e-3)


def test_a_window_the_model_cannot_apply_is_refused_with_its_reason():
    lm = HFLanguageModel(model("bloom"), "bloom")  # Bloom builds its ALiBi from a 2-D mask
    how = Reading(window=AttentionWindow(4))
    assert "4-D attention mask" in lm.length_refusal(how, 16)
    with lm.reading(how), pytest.raises(PosexpError, match="eval.window does not apply"):
        lm.logits(tokens(8))


def test_a_model_with_sliding_window_layers_refuses_posexps_window():
    lm = HFLanguageModel(model("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0), "qwen2")
    assert "sliding-window layers" in lm.window_refusal()


def test_configs_build_every_kind_the_tests_name():
    assert set(configs()) == set(ALL)
