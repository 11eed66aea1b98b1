"""Context-extension scalings on a pretrained RoPE model (posexp.hf.rotary through posexp.hf.model): the
properties transformers tests for its own rope types, equality with transformers' own models of each type, and one
defined dynamic NTK whatever the chunk."""

from __future__ import annotations

import pytest

from helpers.hf_tiny import ROPE, build, configs, model, tokens

import torch  # noqa: E402

from posexp.hf.model import HFLanguageModel  # noqa: E402
from posexp.model.interface import Reading  # noqa: E402

TRAIN = 32  # the tiny configs' max_position_embeddings: the "original" context length


def logits_under(lm, how: Reading, x, pos=None):
    with lm.reading(how):
        return lm.logits(x, pos)


def close(a, b) -> bool:
    return torch.allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ROPE)
def test_linear_reads_position_x_under_factor_s_as_x_over_s(kind):
    # Chen et al. 2023, §2.3: f'(x, m) = f(x, m / s)
    lm = HFLanguageModel(model(kind), kind, chunk=8)
    x = tokens(24)
    s = 4.0
    stretched = logits_under(lm, Reading("linear", s, TRAIN, 24 * 4), x, torch.arange(24) * 4)
    torch.testing.assert_close(stretched, lm.logits(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ROPE)
def test_dynamic_ntk_is_identical_below_the_original_length_and_differs_above(kind):
    lm = HFLanguageModel(model(kind), kind, chunk=8)
    x = tokens(64)
    plain = lm.logits(x)
    below = logits_under(lm, Reading("dynamic_ntk", 2.0, TRAIN, TRAIN), x[:, :TRAIN])
    torch.testing.assert_close(below, plain[:, :TRAIN], atol=1e-5, rtol=0)
    above = logits_under(lm, Reading("dynamic_ntk", 2.0, TRAIN, 64), x)
    assert not close(above, plain)


@pytest.mark.parametrize("kind", ROPE)
def test_yarn_differs_at_every_length(kind):
    lm = HFLanguageModel(model(kind), kind, chunk=8)
    for length in (TRAIN // 2, TRAIN, 2 * TRAIN):
        x = tokens(length)
        assert not close(logits_under(lm, Reading("yarn", 4.0, TRAIN, length), x), lm.logits(x))


@pytest.mark.parametrize("kind", ROPE)
def test_posexps_static_ntk_equals_transformers_dynamic_at_the_matching_length(kind):
    # dynamic NTK with a = 1 at n = s * L tokens is the NTK-aware base of factor s (Peng et al. 2023, §3.1, §3.3)
    lm = HFLanguageModel(model(kind), kind, chunk=16)
    x = tokens(4 * TRAIN)
    ntk = logits_under(lm, Reading("ntk", 4.0, TRAIN, 4 * TRAIN), x)
    dynamic = logits_under(lm, Reading("dynamic_ntk", 1.0, TRAIN, 4 * TRAIN), x)
    torch.testing.assert_close(ntk, dynamic, atol=1e-4, rtol=0)
    assert not close(ntk, lm.logits(x))


OWN_TYPES = [
    ("linear", {"rope_type": "linear", "factor": 4.0}),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAIN}),
    ("llama3", {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": TRAIN,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("dynamic_ntk", {"rope_type": "dynamic", "factor": 4.0}),
    ("longrope", {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": TRAIN,
                  "long_factor": [1.0, 1.5, 2.5, 4.0], "short_factor": [1.0] * 4}),
]


@pytest.mark.parametrize("kind", ("llama", "neox"))
@pytest.mark.parametrize("scaling,params", OWN_TYPES, ids=[t[0] for t in OWN_TYPES])
def test_each_scaling_equals_transformers_own_model_of_that_rope_type(kind, scaling, params):
    """The same weights, published with transformers' rope parameters for the scaling: one uncached forward of
    the whole window gives what the adapter gives in chunks."""
    if kind == "neox" and scaling == "longrope":
        params = {**params, "long_factor": [1.0, 2.5], "short_factor": [1.0, 1.0]}  # half the head rotates
    partial = {"partial_rotary_factor": 0.5} if kind == "neox" else {}
    ours = model(kind)
    theirs = build(configs()[kind](rope_parameters={"rope_theta": 10000.0, **partial, **params}))
    theirs.load_state_dict(ours.state_dict())
    x = tokens(3 * TRAIN)
    how = Reading(scaling, 4.0, TRAIN, 3 * TRAIN, longrope_factors=tuple(params.get("long_factor", ())) or None)
    got = logits_under(HFLanguageModel(ours, kind, chunk=16), how, x)
    torch.testing.assert_close(got, theirs(x).logits, atol=1e-5, rtol=0)
    assert not close(got, ours(x).logits)


def test_dynamic_ntk_is_one_base_for_the_whole_window_whatever_the_chunk():
    """transformers' dynamic type recomputes its base per call, so a key cache mixes bases; posexp uses the base
    of the window's length for every query and key, as one uncached forward does."""
    params = {"rope_theta": 10000.0, "rope_type": "dynamic", "factor": 2.0}
    published = build(configs()["llama"](rope_parameters=params))
    x = tokens(4 * TRAIN)
    one_pass = published(x).logits
    lm = HFLanguageModel(published, "dynamic-llama")
    for chunk in (4 * TRAIN, 16, 24):
        lm.chunk = chunk
        torch.testing.assert_close(logits_under(lm, Reading(), x), one_pass, atol=1e-5, rtol=0)
        torch.testing.assert_close(lm.logits(x), one_pass, atol=1e-5, rtol=0)  # outside a reading too
    # what transformers gives chunk by chunk over its own cache: the early keys keep the early base
    from transformers import DynamicCache
    cache = DynamicCache(config=published.config)
    chunks = [published(x[:, i:i + 16], cache=cache, use_cache=True).logits for i in range(0, 4 * TRAIN, 16)]
    assert not close(torch.cat(chunks, dim=1), one_pass)


def test_a_reading_restores_the_models_own_rotary_modules():
    m = model("llama")
    lm = HFLanguageModel(m, "llama")
    own = m.model.rotary_emb
    x = tokens(TRAIN)
    before = m(x).logits
    with lm.reading(Reading("yarn", 4.0, TRAIN, TRAIN)):
        lm.logits(x)
        assert m.model.rotary_emb is own  # swapped only during a forward call
    assert m.model.rotary_emb is own and own.rope_type == "default"
    torch.testing.assert_close(m(x).logits, before)


def test_longrope_needs_one_factor_per_rotary_frequency():
    from posexp.errors import ConfigError

    lm = HFLanguageModel(model("llama"), "llama")
    with pytest.raises(ConfigError, match="eval.longrope_factors.*4 of them"):
        with lm.reading(Reading("longrope", 4.0, TRAIN, 4 * TRAIN, longrope_factors=(1.0, 2.0))):
            pass


def unnamed_architectures() -> dict:
    """Architectures no other test names, built the same way: the adapter may not know any of them."""
    import transformers as T

    shape = {"vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": TRAIN,
             "initializer_range": 0.2, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    return {"mistral": lambda **kw: T.MistralConfig(**{**shape, "sliding_window": None, **kw}),
            "phi3": lambda **kw: T.Phi3Config(**{**shape, "original_max_position_embeddings": TRAIN, **kw}),
            "gemma": lambda **kw: T.GemmaConfig(**{**shape, "head_dim": 8, **kw})}


@pytest.mark.parametrize("arch", ("mistral", "phi3", "gemma"))
def test_an_architecture_no_test_names_reads_under_every_scaling_that_applies(arch):
    from posexp.encoders.extension import REMAPPINGS
    from posexp.encoders.scaling import SCALINGS
    from posexp.model.window import AttentionWindow

    make = unnamed_architectures()[arch]
    m = build(make())
    lm = HFLanguageModel(m, arch, chunk=16)
    x = tokens(2 * TRAIN)
    plain = m(x).logits
    torch.testing.assert_close(lm.logits(x), plain, atol=1e-5, rtol=0)
    applies = [s for s in SCALINGS if lm.check_scaling(s) is None]
    assert applies == list(SCALINGS)  # the position remappings included (tests/unit/encoders/test_remapping.py)
    types = dict(OWN_TYPES)
    compared = []
    for scaling in [s for s in applies[1:] if s not in REMAPPINGS]:
        params = types.get(scaling, {})
        how = Reading(scaling, 4.0, TRAIN, 2 * TRAIN, longrope_factors=tuple(params.get("long_factor", ())) or None)
        got = logits_under(lm, how, x)
        lm.chunk = 2 * TRAIN
        torch.testing.assert_close(logits_under(lm, how, x), got, atol=1e-5, rtol=0)  # chunked == unchunked
        lm.chunk = 16
        assert not close(got, plain), scaling
        try:  # transformers' own model of that rope type, the same weights (Phi-3's config takes only longrope)
            theirs = build(make(rope_parameters={"rope_theta": 10000.0, **params})) if params else None
        except Exception:  # noqa: BLE001 - the config class refuses that rope type
            theirs = None
        if theirs is not None:
            theirs.load_state_dict(m.state_dict())
            torch.testing.assert_close(got, theirs(x).logits, atol=1e-5, rtol=0, msg=scaling)
            compared.append(scaling)
    assert compared
    assert lm.window_refusal() is None
    with lm.reading(Reading(window=AttentionWindow(8, sinks=1))):
        assert not close(lm.logits(x), plain)


GEMMA_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
GEMMA_LOCAL = {"rope_type": "default", "rope_theta": 100.0}


def gemma3(full: dict, seed: int = 0):
    """A random Gemma 3 whose rope parameters are per layer type, as transformers 5 writes them: a sliding window
    of 8 keys on half its layers, another base there."""
    import transformers as T

    config = T.Gemma3TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=TRAIN, sliding_window=8, initializer_range=0.2,
        layer_types=GEMMA_TYPES, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"full_attention": {"rope_theta": 10000.0, **full}, "sliding_attention": GEMMA_LOCAL},
        attn_implementation="eager")
    return build(config, seed)


GEMMA_OWN = [(scaling, {**params, "original_max_position_embeddings": TRAIN}) for scaling, params in OWN_TYPES]


@pytest.mark.parametrize("scaling,params", GEMMA_OWN, ids=[t[0] for t in GEMMA_OWN])
def test_gemma3_scales_its_full_attention_layers_as_its_own_config_would(scaling, params):
    """Rope parameters per layer type (Gemma 3): each scaling equals transformers' Gemma 3 given that rope type for
    its full-attention layers, the sliding-window layers left as they are."""
    ours = gemma3({"rope_type": "default"})
    theirs = gemma3(params)
    theirs.load_state_dict(ours.state_dict())
    lm = HFLanguageModel(ours, "gemma3", chunk=16)
    assert lm.has_rope and lm.check_scaling(scaling) is None
    x = tokens(3 * TRAIN)
    how = Reading(scaling, 4.0, TRAIN, 3 * TRAIN, longrope_factors=tuple(params.get("long_factor", ())) or None)
    got = logits_under(lm, how, x)
    torch.testing.assert_close(got, theirs(x).logits, atol=1e-5, rtol=0)
    assert not close(got, ours(x).logits)
    torch.testing.assert_close(lm.logits(x), ours(x).logits, atol=1e-5, rtol=0)  # restored after the reading


def test_gemma3_sliding_layers_keep_their_frequencies_under_a_scaling():
    from posexp.hf.rotary import find_rotary, scaled_frequencies

    sites = {s.layer_type: s for s in find_rotary(gemma3({"rope_type": "default"}))}
    assert sorted(sites) == ["full_attention", "sliding_attention"]
    local, full = sites["sliding_attention"], sites["full_attention"]
    inv, scale = scaled_frequencies(local, "yarn", 4.0, TRAIN, 4 * TRAIN)
    torch.testing.assert_close(inv, 1.0 / 100.0 ** (torch.arange(0, 8, 2).float() / 8))
    assert scale == 1.0
    inv, _ = scaled_frequencies(full, "linear", 4.0, TRAIN, 4 * TRAIN)
    torch.testing.assert_close(inv, full.inv_freq / 4.0)


def test_a_gemma3_whose_layers_all_attend_within_a_window_says_a_scaling_does_not_apply():
    """Every layer a sliding-window one (Gemma 3's default pattern at under 6 layers): no layer reads the
    full-attention frequencies a scaling stretches, so its rows would be the unscaled ones labelled yarn."""
    import transformers as T

    config = T.Gemma3TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=TRAIN, sliding_window=8,
        layer_types=["sliding_attention"] * 2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "sliding_attention": GEMMA_LOCAL}, attn_implementation="eager")
    lm = HFLanguageModel(build(config), "gemma3")
    for scaling in ("linear", "yarn", "ntk"):
        assert lm.check_scaling(scaling) == (f"{scaling} rescales the frequencies of full-attention layers, and "
                                             "every layer of this model attends within a window")
    assert lm.check_scaling("none") is None
    assert HFLanguageModel(gemma3({"rope_type": "default"}), "gemma3").check_scaling("yarn") is None


def test_a_rotary_layout_posexp_does_not_read_is_named_not_called_absent():
    class OddRotaryEmbedding(torch.nn.Module):
        rope_type = "default"

    m = model("gpt2")
    m.transformer.odd = OddRotaryEmbedding()
    reason = HFLanguageModel(m, "odd").check_scaling("yarn")
    assert "OddRotaryEmbedding" in reason and "no rotary position embedding" not in reason
    assert "no rotary position embedding" in HFLanguageModel(model("gpt2"), "gpt2").check_scaling("yarn")


def test_run_pretrained_records_the_rope_parameters_per_layer_type():
    from posexp.hf.rotary import rope_record

    record = rope_record(gemma3({"rope_type": "linear", "factor": 8.0}).config)
    assert record["rope_theta"] == 10000.0  # the full-attention layers', the ones a scaling stretches
    assert record["rope_parameters"]["sliding_attention"]["rope_theta"] == 100.0
    assert record["rope_parameters"]["full_attention"]["factor"] == 8.0
    shared = rope_record(model("llama").config)
    assert shared["rope_theta"] == 10000.0 and shared["rope_parameters"]["rope_type"] == "default"
