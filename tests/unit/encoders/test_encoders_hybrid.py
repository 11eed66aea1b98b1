"""p-RoPE's frequency count, iRoPE's local attention (sliding or chunked) and CABLE's context-aware biases,
each against a direct reference written from the paper or the reference code."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posexp.encoders import create
from posexp.encoders.prope import kept_frequencies
from posexp.errors import ConfigError
from posexp.model.window import AttentionWindow, layer_window, visible_keys


@pytest.mark.parametrize("head_dim,p", [(20, 0.75), (20, 0.5), (32, 0.75), (64, 0.3), (256, 0.25), (128, 0.9)])
def test_prope_keeps_the_floor_of_p_times_half_the_head(head_dim, p):
    # Barbero et al. 2024, §6 pseudocode and Gemma's int(rope_proportion * head_dim // 2)
    assert kept_frequencies(head_dim, p) == math.floor(p * head_dim / 2)


def test_prope_at_head_dim_20_keeps_7_frequencies_and_leaves_3_unrotated():
    enc = create("prope", 80, 4, p=0.75)  # head dim 20: 0.75 * 10 = 7.5 -> 7
    assert enc.n_kept == 7
    assert (enc.inv_freq[:7] > 0).all() and (enc.inv_freq[7:] == 0).all()


def test_prope_where_p_times_half_the_head_is_whole_is_unchanged():
    enc = create("prope", 128, 4, p=0.75)  # head dim 32: 12 of 16, as before the floor
    assert enc.n_kept == 12


def _reference_hidden(L: int, size: int, chunk: int | None, sinks: int = 0) -> torch.Tensor:
    hidden = torch.zeros(L, L, dtype=torch.bool)
    for i in range(L):
        for j in range(i + 1):
            outside = i - j >= size or (chunk is not None and i // chunk != j // chunk)
            hidden[i, j] = outside and j >= sinks
    return hidden


@pytest.mark.parametrize("size,chunk,sinks", [(4, 4, 0), (5, 5, 0), (3, 8, 0), (4, 4, 2), (6, None, 1)])
def test_chunked_and_sliding_masks_match_a_direct_reference(size, chunk, sinks):
    # Llama 4's chunked mask (transformers: key j visible to query i when j // C == i // C); a sliding window
    L = 19
    w = AttentionWindow(size, sinks, chunk)
    idx = torch.arange(L)
    hidden = w.hidden(idx[:, None], idx[None, :]) & (idx[None, :] <= idx[:, None])
    ref = _reference_hidden(L, size, chunk, sinks)
    assert torch.equal(hidden, ref)
    assert torch.equal(visible_keys(idx, w), (~ref).tril().sum(-1))


def test_a_chunked_layer_lets_the_first_query_of_a_chunk_see_only_itself():
    w = layer_window(None, 4, chunked=True)
    assert visible_keys(torch.arange(12), w).tolist() == [1, 2, 3, 4] * 3
    narrower = layer_window(AttentionWindow(2), 4, chunked=True)  # eval.window within the chunk
    assert visible_keys(torch.arange(8), narrower).tolist() == [1, 2, 2, 2, 1, 2, 2, 2]


def test_irope_defaults_to_rnope_swa_sliding_window_and_offers_llama4_chunks():
    sliding = create("irope", 64, 4)
    chunked = create("irope", 64, 4, local="chunked")
    s_layers, c_layers = sliding.for_layers(4), chunked.for_layers(4)
    assert [e.layer_chunked for e in s_layers] == [False] * 4
    assert [e.layer_chunked for e in c_layers[:3]] == [True] * 3  # RoPE layers; the last is global NoPE
    assert c_layers[3].layer_window is None and c_layers[0].layer_window == 64
    with pytest.raises(ConfigError, match="encoder.local"):
        create("irope", 64, 4, local="dilated")


def test_irope_chunked_rope_layers_do_not_read_earlier_chunks():
    from posexp.model.gpt import GPT, ModelShape

    torch.manual_seed(0)
    enc = create("irope", 32, 2, window=8, local="chunked", every=1000)  # one global layer: the last of 2
    shape = ModelShape(vocab_size=16, d_model=32, n_layers=2, n_heads=2)
    model = GPT(shape, enc).eval()
    first = model.blocks[0]
    idx = torch.randint(0, 16, (1, 24))
    changed = idx.clone()
    changed[0, 3] = (idx[0, 3] + 1) % 16  # a token of the first chunk
    outputs = []
    for seq in (idx, changed):
        hook_out = []
        h = first.register_forward_hook(lambda m, a, out: hook_out.append(out))
        with torch.no_grad():
            model(seq)
        h.remove()
        outputs.append(hook_out[0])
    # the first (chunked RoPE) layer's output in chunks 2 and 3 ignores the first chunk
    assert torch.allclose(outputs[0][0, 8:], outputs[1][0, 8:])
    assert not torch.allclose(outputs[0][0, 3], outputs[1][0, 3])


def test_cable_bias_matches_the_authors_cumulative_softplus():
    torch.manual_seed(0)
    enc = create("cable", 32, 4)
    torch.nn.init.normal_(enc.proj.weight, std=0.5)
    x = torch.randn(2, 10, 32)
    q = k = torch.zeros(2, 4, 10, 8)
    got = enc.transform(x, q, k, torch.arange(10))(0, 10)
    beta = F.softplus(x @ enc.proj.weight.T + enc.proj.bias)  # (B, L, H)
    ref = torch.zeros(2, 4, 10, 10)
    for i in range(10):
        for j in range(i + 1):
            ref[:, :, i, j] = -beta[:, j + 1:i + 1].sum(1)  # - sum_{l=j+1..i} beta_l
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    assert torch.allclose(got[..., causal], ref[..., causal], atol=1e-5)
    blocked = enc.transform(x, q, k, torch.arange(10))(4, 10)
    assert torch.allclose(blocked, got[:, :, 4:], atol=1e-6)


def test_cable_penalises_a_key_more_the_further_back_it_is_at_a_content_set_rate():
    torch.manual_seed(1)
    enc = create("cable", 32, 4)
    x = torch.randn(1, 12, 32)
    bias = enc.transform(x, None, None, torch.arange(12))(0, 12)[0]  # (H, L, L)
    assert torch.allclose(bias.diagonal(dim1=-2, dim2=-1), torch.zeros(4, 12))
    for i in range(1, 12):
        row = bias[:, i, :i + 1]
        assert (row[:, 1:] > row[:, :-1]).all()  # strictly closer to 0 as the key nears the query
    x2 = x.clone()
    x2[0, 6] *= 5  # another token between changes the penalty of keys behind it, not of those after it
    bias2 = enc.transform(x2, None, None, torch.arange(12))(0, 12)[0]
    assert not torch.allclose(bias[:, 11, :6], bias2[:, 11, :6])
    assert torch.allclose(bias[:, 11, 6:], bias2[:, 11, 6:])


@pytest.mark.parametrize("d_model,n_heads,train_len,base", [(128, 4, 128, 10000.0), (256, 4, 64, 500000.0),
                                                           (4096, 32, 4096, 10000.0)])
def test_hope_rotates_exactly_the_frequencies_completing_a_period_in_train_len(d_model, n_heads, train_len, base):
    # Chen et al. 2024, §5: theta_i kept where theta_i * train_len >= 2 pi, else 0 (position-independent)
    enc = create("hope", d_model, n_heads, base=base, train_len=train_len)
    d = d_model // n_heads
    ref = [base ** (-2 * i / d) if base ** (-2 * i / d) * train_len >= 2 * math.pi else 0.0 for i in range(d // 2)]
    assert torch.allclose(enc.inv_freq.double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-6)
    assert 0 < enc.n_kept < d // 2


def test_hope_scores_have_no_long_term_decay_in_their_position_free_part():
    # the paper's claim: the position-independent components give a score that does not change with distance
    enc = create("hope", 128, 4)
    q = torch.zeros(1, 4, 1, 32)
    k = torch.zeros(1, 4, 1, 32)
    low = [i for i in range(16) if i >= enc.n_kept]
    q[..., low] = 1.0
    q[..., [i + 16 for i in low]] = 1.0
    k[..., low] = 1.0
    k[..., [i + 16 for i in low]] = 1.0
    scores = []
    for dist in (0, 1, 100, 5000):
        qr, kr = enc.rotate(q, k, torch.tensor([dist]), torch.tensor([0]))
        scores.append(float((qr * kr).sum()))
    assert scores == pytest.approx([scores[0]] * 4)
    rope = create("rope", 128, 4)
    qr, kr = rope.rotate(q, k, torch.tensor([100]), torch.tensor([0]))
    assert float((qr * kr).sum()) < scores[0] - 1  # RoPE's same channels decay with distance


def test_hope_needs_a_train_len_with_one_full_period():
    with pytest.raises(ConfigError, match="encoder.train_len"):
        create("hope", 128, 4, train_len=0)


def _pope_reference(enc, q: torch.Tensor, k: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    # Gopalakrishnan et al. 2025, §3: Re sum_c softplus(q_c) e^{i s theta_c} conj(softplus(k_c) e^{i (t theta_c + delta_c)})
    d = q.shape[-1]
    theta = enc.base ** -(torch.arange(d, dtype=torch.float64) / d)
    delta = enc.phase_bias.detach().double().clamp(-2 * math.pi, 0)  # (H, d)
    qc = torch.polar(F.softplus(q.double()), s.double()[:, None] * theta)  # (B, H, Lq, d)
    kc = torch.polar(F.softplus(k.double()), t.double()[:, None] * theta + delta[:, None, :])
    return (qc @ kc.conj().transpose(-1, -2)).real / math.sqrt(d)


@pytest.mark.parametrize("d_model,n_heads", [(128, 4), (768, 12)])
def test_pope_logits_match_the_papers_complex_form(d_model, n_heads):
    torch.manual_seed(0)
    enc = create("pope", d_model, n_heads)
    with torch.no_grad():
        enc.phase_bias.uniform_(-7.0, 1.0)  # the clamp to [-2 pi, 0] is part of the formula
    d = d_model // n_heads
    q, k = torch.randn(2, n_heads, 6, d), torch.randn(2, n_heads, 9, d)
    s, t = torch.arange(3000, 3006), torch.arange(2995, 3004)
    qr, kr = enc.rotate(q, k, s, t)
    got = (qr.double() @ kr.double().transpose(-1, -2)) / math.sqrt(qr.shape[-1])  # what attention computes
    assert torch.allclose(got, _pope_reference(enc, q, k, s, t), atol=1e-3)


def test_pope_is_relative_and_its_magnitudes_are_position_free():
    torch.manual_seed(0)
    enc = create("pope", 128, 4)
    with torch.no_grad():
        enc.phase_bias.uniform_(-6.0, 0.0)
    q, k = torch.randn(1, 4, 5, 32), torch.randn(1, 4, 5, 32)
    pos = torch.arange(5)
    a = torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, pos, pos))
    b = torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, pos + 1000, pos + 1000))
    assert torch.allclose(a, b, atol=1e-3)
    # the "what": each feature's magnitude is softplus of the content, whatever the position
    qr, _ = enc.rotate(q, k, pos + 77, pos)
    mag = (qr[..., :32] ** 2 + qr[..., 32:] ** 2).sqrt() / math.sqrt(2)
    assert torch.allclose(mag, F.softplus(q), atol=1e-5)


@pytest.mark.parametrize("preset,attn_scale", [("swan_gpt", 0.1), ("rnope_swa", 0.0)])
def test_hybrid_presets_build_three_sliding_rope_layers_per_global_nope_layer(compose, preset, attn_scale):
    from posexp.commands.train import check_config
    from posexp.model.factory import build_encoder

    spec = check_config(compose(f"experiment={preset}"))
    layers = build_encoder(spec).for_layers(spec.model.n_layers)
    assert [e.name for e in layers] == ["rope", "rope", "rope", "none"]
    assert all(e.layer_window == spec.train_len // 2 and not e.layer_chunked for e in layers[:3])
    assert layers[3].attn_scale == attn_scale


def test_a_mix_builds_its_parts_at_the_runs_train_len_as_their_own_encoders_do(compose):
    """HoPE and FoPE keep the frequencies completing a period in train_len: in a mix, the run's, not their default."""
    from posexp.commands.edge import typed
    from posexp.commands.train import check_config
    from posexp.model.factory import build_encoder

    spec = check_config(compose("encoder=mixed", "encoder.layers=[hope,fope]", "train_len=512"))
    hope, fope = build_encoder(spec).for_layers(spec.model.n_layers)
    alone = build_encoder(check_config(compose("encoder=hope", "train_len=512")))
    assert (hope.train_len, fope.train_len) == (512, 512) and hope.n_kept == alone.n_kept
    given = check_config(compose("encoder=mixed", "encoder.layers=[hope,none]", "train_len=512",
                                 "encoder.options={hope:{train_len:64}}"))
    assert build_encoder(given).for_layers(2)[0].train_len == 64  # an option given for the part wins
    # a mix saved before it took train_len: its parts were built at 128, and are rebuilt as they trained
    earlier = typed(compose("encoder=mixed", "encoder.layers=[hope,none]", "train_len=512"))
    del earlier.encoder["train_len"]
    assert build_encoder(earlier).for_layers(2)[0].train_len == 128
