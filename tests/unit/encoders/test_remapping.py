"""Position remappings (ReRoPE, Self-Extend, STRING, Dual Chunk Attention, Ms-PoE) against a direct reference.

The reference is written from each paper's position map and nothing of posexp's remapping code: every (query, key)
pair gets its remapped query and key positions, q and k (before RoPE) are rotated densely at them, the logits are
masked causally, softmaxed and applied to v. posexp's own models and transformers models (Llama, and a Gemma 3
whose sliding-window layers keep their own rope) must give the same logits, within 1e-5 relative, in float64.
"""

from __future__ import annotations

import math

import pytest
import torch

from posexp.encoders import create
from posexp.encoders.remapping import REMAPPINGS, Remapping
from posexp.errors import ConfigError
from posexp.model.gpt import GPT, ModelShape
from posexp.model.interface import Reading

TRAIN, LENGTH = 16, 40
# options small enough that every piece of every method is used within LENGTH tokens
OPTIONS = {
    "rerope": {"rerope_window": 5},
    "self_extend": {"self_extend_group": 3, "self_extend_window": 6},
    "string": {"string_offset": 11, "string_local": 3},
    "dca": {"dca_chunk": 9, "dca_local": 2},
    "ms_poe": {"ms_poe_min": 1.2, "ms_poe_max": 2.5, "ms_poe_skip_layers": 1},
}


# -- the reference, from the papers ---------------------------------------------------------------

def positions(kind: str, o: dict, m: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``(L, L)`` query and key positions of every pair (float64), as each paper defines them."""
    m, n = m.double()[:, None].expand(-1, n.numel()), n.double()[None, :].expand(m.numel(), -1)
    d = m - n
    if kind == "rerope":  # Su 2023: min(m - n, w); beyond w the query at w and the key at 0
        w = o["rerope_window"]
        return torch.where(d <= w, m, torch.full_like(m, w)), torch.where(d <= w, n, torch.zeros_like(n))
    if kind == "self_extend":  # Jin et al. 2024: neighbour d < W; grouped floor(m/G) + W - W/G and floor(n/G)
        G, W = o["self_extend_group"], o["self_extend_window"]
        return (torch.where(d < W, m, torch.floor(m / G) + W - W / G), torch.where(d < W, n, torch.floor(n / G)))
    if kind == "string":  # An et al. 2025: d >= S read at d - S + W
        S, W = o["string_offset"], o["string_local"]
        return torch.where(d < S, m, m - S + W), n
    if kind == "dca":  # An et al. 2024: chunks of c = s - w; intra, successive and inter-chunk query positions
        s, w = o["dca_chunk"], o["dca_local"]
        c = s - w
        cm, cn = torch.floor(m / c), torch.floor(n / c)
        intra, succ = m % c, torch.clamp(m % c + c, max=s)
        inter = torch.full_like(m, min(2 * c - 1, s))
        q = torch.where(cm == cn, intra, torch.where(cm - cn == 1, succ, inter))
        return q, n % c
    raise AssertionError(kind)


def rotate_dense(x: torch.Tensor, at: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x (..., D)`` rotated at positions ``at`` (broadcast over x's leading dims): feature pairs ``(i, i + r/2)`` of
    the first ``r = 2 len(inv_freq)`` features turn by ``at * theta_i`` (RoFormer Eq. 34, halves layout)."""
    half = inv_freq.numel()
    a = at.double()[..., None] * inv_freq.double()
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat((x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos(), rest), dim=-1)


def ms_poe_ratios(q0: torch.Tensor, k0: torch.Tensor, lo: float, hi: float, scale: float) -> torch.Tensor:
    """Zhang et al. 2024: per head (B, H), ranked by the share of the last query's weights above 4x its mean."""
    B, H, L, _ = q0.shape
    w = ((q0[:, :, -1][:, :, None] @ k0.transpose(-1, -2)) * scale).softmax(-1)[:, :, 0]  # (B, H, L)
    share = (w > 4.0 / L).double().mean(-1)
    ratios = torch.empty(B, H, dtype=torch.float64)
    for b in range(B):
        for rank, h in enumerate(sorted(range(H), key=lambda h: (-float(share[b, h]), h))):
            ratios[b, h] = lo + (hi - lo) * rank / H
    return ratios


def reference_attention(kind: str, o: dict, q0, k0, v, pos, inv_freq, scale, layer: int, window=None, softcap=None):
    """Softmax attention of unrotated ``q0, k0 (B, H, L, D)`` at the paper's positions; ``window`` = a sliding window
    the layer keeps as it is (plain RoPE); ``softcap``: logits ``cap * tanh(x / cap)`` (Gemma 2)."""
    B, H, L, D = q0.shape
    i = torch.arange(L)
    visible = i[None, :] <= i[:, None]
    if window is not None or (kind == "ms_poe" and layer < o["ms_poe_skip_layers"]):
        if window is not None:
            visible = visible & (i[:, None] - i[None, :] < window)
        qp = pos.double()[:, None].expand(L, L)
        kp = pos.double()[None, :].expand(L, L)
    elif kind == "ms_poe":
        r = ms_poe_ratios(q0, k0, o["ms_poe_min"], o["ms_poe_max"], scale)[:, :, None, None]  # (B, H, 1, 1)
        qp, kp = pos.double()[:, None] / r, pos.double()[None, :] / r  # (B, H, L, 1), (B, H, 1, L)
        qp, kp = qp.expand(B, H, L, L), kp.expand(B, H, L, L)
    else:
        qp, kp = positions(kind, o, pos, pos)
    qr = rotate_dense(q0[:, :, :, None, :].expand(B, H, L, L, D), qp, inv_freq)  # query i at its position for key j
    kr = rotate_dense(k0[:, :, None, :, :].expand(B, H, L, L, D), kp, inv_freq)
    logits = (qr * kr).sum(-1) * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits.masked_fill(~visible, float("-inf"))
    return logits.softmax(-1) @ v


# -- posexp's own model ---------------------------------------------------------------------------------

def own_model(seed: int = 0, **rope) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelShape(d_model=32, n_layers=3, n_heads=4, attn_block_size=8, vocab_size=61),
                create("rope", d_model=32, n_heads=4, **rope))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)  # wide weights: positions move the logits well above rounding
    return model.eval().double()


def own_reference(model: GPT, kind: str, o: dict, idx: torch.Tensor) -> torch.Tensor:
    """The model's forward with each attention replaced by :func:`reference_attention`."""
    rope = model.encoder
    B, L = idx.shape
    pos = torch.arange(L)
    x = model.wte(idx)
    for layer, block in enumerate(model.blocks):
        att = block.attn
        h = block.ln1(x)
        q, k, v = att.qkv(h).view(B, L, 3, att.n_heads, att.head_dim).permute(2, 0, 3, 1, 4)
        y = reference_attention(kind, o, q, k, v, pos, rope.inv_freq, 1 / math.sqrt(att.head_dim), layer)
        x = x + att.proj(y.transpose(1, 2).reshape(B, L, -1))
        x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x))


def read(model, kind: str, o: dict, idx: torch.Tensor, train_len: int = TRAIN) -> torch.Tensor:
    remap = Remapping.of(kind, o, train_len, idx.shape[1])
    how = Reading(kind, remap.factor or 1.0, train_len, idx.shape[1], None, None, remap=remap)
    with torch.no_grad(), model.reading(how):
        return model.logits(idx)


def close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 1e-5, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("kind", [k for k in REMAPPINGS if k != "rerope"])
@pytest.mark.parametrize("rope", [{}, {"rotary_fraction": 0.5}], ids=["full", "partial"])
def test_a_posexp_run_reads_each_remapping_as_its_paper_defines_it(kind, rope):
    model = own_model(**rope)
    idx = torch.randint(0, 61, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = own_reference(model, kind, OPTIONS[kind], idx)
        plain = model(idx)
    ours = read(model, kind, OPTIONS[kind], idx)
    close(ours, ref, kind)
    assert float((ours - plain).abs().max() / plain.abs().max()) > 1e-3, "the remapping changed nothing"


def test_posexp_rerope_matches_the_reference_too():
    """eval.scaling=rerope on a run (its own explicit-score path) is the same min(m - n, w) as the reference."""
    model = own_model()
    idx = torch.randint(0, 61, (2, LENGTH), generator=torch.Generator().manual_seed(3))
    how = Reading("rerope", 5.0, TRAIN, LENGTH)
    with torch.no_grad():
        ref = own_reference(model, "rerope", OPTIONS["rerope"], idx)
        with model.reading(how):
            ours = model.logits(idx)
    close(ours, ref, "rerope")


def test_the_blocked_path_does_not_depend_on_the_block_size():
    model = own_model()
    idx = torch.randint(0, 61, (1, LENGTH), generator=torch.Generator().manual_seed(4))
    a = read(model, "dca", OPTIONS["dca"], idx)
    model.shape.attn_block_size = 3
    b = read(model, "dca", OPTIONS["dca"], idx)
    close(b, a, "block size 3 vs 8")


def test_defaults_follow_the_authors_and_the_self_extend_group_reaches_the_length():
    se = Remapping.of("self_extend", {}, 128, 2048)
    W, G = se["window"], se["group"]
    assert (W, G) == (32, 21) and (128 - W) * G + W >= 2048 > (128 - W) * (G - 1) + W
    assert dict(Remapping.of("dca", {}, 128, 512).options) == {"dca_chunk": 96, "dca_local": 8}
    assert dict(Remapping.of("string", {}, 128, 512).options) == {"string_offset": 42, "string_local": 8}
    assert dict(Remapping.of("ms_poe", {}, 128, 512).options) == {"ms_poe_min": 1.2, "ms_poe_max": 1.8,
                                                                   "ms_poe_skip_layers": 2}


@pytest.mark.parametrize("given,key", [({"dca_local": 9, "dca_chunk": 9}, "eval.dca_local"),
                                       ({"string_local": 11, "string_offset": 11}, "eval.string_local"),
                                       ({"ms_poe_min": 0.5}, "eval.ms_poe_min"),
                                       ({"self_extend_group": 0}, "eval.self_extend_group")])
def test_an_option_out_of_range_is_one_line_naming_its_key(given, key):
    kind = next(k for k in REMAPPINGS if any(g.startswith(k) for g in given))
    with pytest.raises(ConfigError) as e:
        Remapping.of(kind, given, TRAIN, LENGTH)
    assert e.value.key == key and "\n" not in str(e.value)


# -- transformers models --------------------------------------------------------------------------------



def _hf():
    transformers = pytest.importorskip("transformers")
    from helpers import hf_tiny
    return transformers, hf_tiny


def gemma3(seed: int = 0):
    """A random Gemma 3 with rope parameters per layer type: sliding-window layers (8 keys, their own base) that a
    remapping leaves alone, and full-attention layers it remaps."""
    T, hf_tiny = _hf()
    config = T.Gemma3TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=TRAIN, sliding_window=8, initializer_range=0.2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    return hf_tiny.build(config, seed)


def gemma2(seed: int = 0):
    """A random Gemma 2: attention logits soft-capped, sliding-window layers between full ones."""
    T, hf_tiny = _hf()
    return hf_tiny.build(T.Gemma2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=TRAIN, sliding_window=8, initializer_range=0.2,
        attn_logit_softcapping=5.0, bos_token_id=None, eos_token_id=None, pad_token_id=None), seed)


def hf_model(arch: str):
    if arch in ("gemma3", "gemma2"):
        return (gemma3() if arch == "gemma3" else gemma2()).double()
    _, hf_tiny = _hf()
    return hf_tiny.model(arch, max_position_embeddings=TRAIN).double()


def _reference_function(kind: str, o: dict, model):
    """An attention function for transformers' interface computing :func:`reference_attention` from q and k
    rotated back to position 0 with the model's own rotation (its cos, sin at the true positions, inverted)."""
    import sys

    module_ns = sys.modules[type(model).__module__]
    rotary = model.base_model.rotary_emb
    types = getattr(model.config, "layer_types", None)

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        pos = kwargs["position_ids"]
        t = types[module.layer_idx] if types is not None else None
        extra = {"layer_type": t} if isinstance(rotary.rope_type, dict) else {}
        cos, sin = rotary(value, pos, **extra)
        q0, k0 = module_ns.apply_rotary_pos_emb(query, key, cos, -sin)  # R(-m) R(m) = identity
        inv = getattr(rotary, f"{t}_inv_freq" if extra else "inv_freq")
        groups = query.shape[1] // key.shape[1]
        k0, v = k0.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        window = model.config.sliding_window if t == "sliding_attention" else None
        y = reference_attention(kind, o, q0, k0, v, pos[0], inv, scaling, module.layer_idx, window,
                                kwargs.get("softcap"))
        return y.transpose(1, 2).contiguous(), None

    return attend


def hf_reference(model, kind: str, o: dict, idx: torch.Tensor) -> torch.Tensor:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("posexp_test_reference", _reference_function(kind, o, model))
    AttentionMaskInterface.register("posexp_test_reference", sdpa_mask)
    original = model.config._attn_implementation
    model.set_attn_implementation("posexp_test_reference")
    try:
        with torch.no_grad():
            return model(input_ids=idx, position_ids=torch.arange(idx.shape[1])[None].expand(idx.shape[0], -1)).logits
    finally:
        model.set_attn_implementation(original)


# Llama and Gemma 3 (rope per layer type) under every method; GPT-NeoX's half-rotated heads, Gemma 2's soft-capped logits
HF_CASES = [(arch, kind) for arch in ("llama", "gemma3") for kind in REMAPPINGS]
HF_CASES += [("neox", "dca"), ("neox", "ms_poe"), ("gemma2", "string")]


@pytest.mark.parametrize("arch,kind", HF_CASES, ids=[f"{a}-{k}" for a, k in HF_CASES])
def test_a_transformers_model_reads_each_remapping_as_its_paper_defines_it(arch, kind):
    """Through the attention interface, over a key cache in query chunks of 16: the reference's logits; Gemma 3's
    sliding-window layers as they were; GPT-NeoX rotating half of each head."""
    from posexp.hf.model import HFLanguageModel

    model = hf_model(arch)
    o = dict(OPTIONS[kind], **({"ms_poe_skip_layers": 1} if kind == "ms_poe" else {}))
    idx = torch.randint(0, 97, (2, LENGTH), generator=torch.Generator().manual_seed(5))
    ref = hf_reference(model, kind, o, idx)
    lm = HFLanguageModel(model, arch, chunk=16)
    assert lm.check_scaling(kind) is None
    ours = read(lm, kind, o, idx) if kind != "rerope" else _rerope(lm, o, idx)
    close(ours, ref, f"{arch} {kind}")
    with torch.no_grad():
        plain = model(idx).logits
    assert float((ours - plain).abs().max() / plain.abs().max()) > 1e-3, "the remapping changed nothing"
    assert model.config._attn_implementation in ("sdpa", "eager"), "the reading left its attention switched"


def _rerope(lm, o, idx):
    how = Reading("rerope", float(o["rerope_window"]), TRAIN, idx.shape[1])
    with torch.no_grad(), lm.reading(how):
        return lm.logits(idx)


def _cohere():
    T, hf_tiny = _hf()
    return hf_tiny.build(T.CohereConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=32, pad_token_id=0,
                                        bos_token_id=None, eos_token_id=None))


@pytest.mark.parametrize("arch,expect", [("qwen2", None), ("gpt2", "no rotary position embedding"),
                                         ("cohere", "rotary layout is another")])
def test_which_transformers_models_take_a_remapping(arch, expect):
    """Qwen2 takes them; a model without RoPE, or rotating interleaved pairs (Cohere), gets one line saying why."""
    from posexp.hf.model import HFLanguageModel

    _, hf_tiny = _hf()
    lm = HFLanguageModel(_cohere() if arch == "cohere" else hf_tiny.model(arch), arch)
    for kind in REMAPPINGS:
        reason = lm.check_scaling(kind)
        assert (reason is None) if expect is None else (expect in reason and "\n" not in reason), (kind, reason)


def test_ms_poe_skipping_every_layer_is_not_applicable_with_the_reason():
    """The default run has 2 layers, Ms-PoE's default skips 2 (the authors' first 2 of 32): rows say so, not numbers
    identical to plain evaluation."""
    model = own_model()
    remap = Remapping.of("ms_poe", {"ms_poe_skip_layers": 3}, TRAIN, LENGTH)
    how = Reading("ms_poe", 1.0, TRAIN, LENGTH, None, None, remap=remap)
    assert model.length_refusal(how, LENGTH) == ("ms_poe leaves its first 3 layers as trained, every layer of this "
                                                 "3-layer model: set eval.ms_poe_skip_layers below 3")
    assert model.length_refusal(Reading("ms_poe", 1.0, TRAIN, LENGTH, None, None, remap=Remapping.of(
        "ms_poe", {}, TRAIN, LENGTH)), LENGTH) is None
