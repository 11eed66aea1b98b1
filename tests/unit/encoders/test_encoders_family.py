"""What each paper of the wider family claims, checked on the encoders themselves.

The hook contract inside the model (causality, blocked == whole, gradients) is
checked for every yaml by tests/unit/encoders/test_encoders.py; here each encoder gets the
property its paper states, against a slow by-hand version of the formula.
"""

from __future__ import annotations

import math

import pytest
import torch

from posexp.encoders import create
from posexp.encoders.binary import binary_code
from posexp.encoders.cope import cope_positions
from posexp.encoders.deberta import deberta_log_bucket
from posexp.encoders.sandwich import sandwich_kernel
from posexp.encoders.sinusoidal import sinusoidal_table
from posexp.errors import ConfigError

D_MODEL, N_HEADS = 32, 4
HEAD_DIM = D_MODEL // N_HEADS


def _enc(name: str, **options):
    """The encoder in float64 with every parameter randomised, so no check passes by zeros."""
    torch.manual_seed(0)
    enc = create(name, d_model=options.pop("d_model", D_MODEL), n_heads=options.pop("n_heads", N_HEADS),
                 **options).double()
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0.0, 0.5)
    return enc


def _qk(L: int, seed: int = 0, heads: int = N_HEADS, head_dim: int = HEAD_DIM):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, L, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(2, heads, L, head_dim, generator=g, dtype=torch.float64)
    return q, k


def _logits(enc, q, k, pos):
    """What the model adds to q.k / sqrt(d) for queries and keys at ``pos``, (B, H, L, L)."""
    if enc.uses_rotate:
        qr, kr = enc.rotate(q, k, pos, pos)
        return qr @ kr.transpose(-1, -2)
    if enc.uses_scores:
        return enc.scores(q, k, pos, pos)
    return enc.bias(pos, pos).expand(q.shape[0], -1, -1, -1)


def _causal(L: int) -> torch.Tensor:
    return torch.ones(L, L, dtype=torch.bool).tril()


# -- relative encodings: the logit depends on positions only through i - j ------------------


@pytest.mark.parametrize("name", ["shaw", "transformer_xl", "deberta", "kerple", "sandwich", "xpos"])
def test_relative_encodings_depend_only_on_offset(name: str) -> None:
    enc = _enc(name)
    L = 24
    q, k = _qk(L)
    pos = torch.arange(L)
    ref = _logits(enc, q, k, pos)
    mask = _causal(L)
    for shift in (1, 37, 1000):
        got = _logits(enc, q, k, pos + shift)
        assert torch.allclose(got[..., mask], ref[..., mask], atol=1e-8, rtol=1e-6), (name, shift)
    # and positions do matter: the same q, k spread further apart read differently
    spread = _logits(enc, q, k, 3 * pos)
    assert not torch.allclose(spread[..., mask], ref[..., mask], atol=1e-6), name


# -- naive encodings (the seeds: integer, [0, 1], binary) --------------------------------------


def test_integer_adds_the_raw_index_and_grows_without_bound() -> None:
    enc = _enc("integer")
    pos = torch.arange(0, 4096, 128)
    x = torch.zeros(1, len(pos), D_MODEL, dtype=torch.float64)
    code = enc.embed(x, pos)[0]  # (L, D)
    assert torch.allclose(code, pos.double()[:, None] * enc.direction[None, :])
    norms = code.norm(dim=-1)
    # unbounded: the code's size is proportional to the index, 16x the training length = 16x the size
    assert torch.allclose(norms[1:] / norms[1], pos[1:].double() / pos[1], rtol=1e-10)


def test_normalized_code_depends_on_sequence_length() -> None:
    enc = _enc("normalized")
    x = lambda L: torch.zeros(1, L, D_MODEL, dtype=torch.float64)  # noqa: E731
    short, long = enc.embed(x(10), torch.arange(10))[0], enc.embed(x(20), torch.arange(20))[0]
    # the ends are 0 and w at every length ...
    for code in (short, long):
        assert torch.allclose(code[0], torch.zeros(D_MODEL, dtype=torch.float64))
        assert torch.allclose(code[-1], enc.direction)
    # ... so the same position 5 reads 5/9 of the way in one sequence and 5/19 in the other (the flaw)
    assert torch.allclose(short[5], enc.direction * 5 / 9)
    assert torch.allclose(long[5], enc.direction * 5 / 19)
    assert not torch.allclose(short[5], long[5])
    # and one step between neighbours means a different amount at each length
    assert not torch.allclose(short[1] - short[0], long[1] - long[0])


def test_binary_codes_distinct_below_two_to_the_bits() -> None:
    bits = 8
    codes = binary_code(torch.arange(2**bits), bits)
    assert codes.shape == (2**bits, bits)
    assert len({tuple(c.tolist()) for c in codes}) == 2**bits  # every position its own code
    assert codes[5].tolist() == [1, 0, 1, 0, 0, 0, 0, 0]  # least significant bit first
    # neighbours are not neighbours in code space: 7 -> 8 flips four bits, 8 -> 9 only one
    assert (codes[7] != codes[8]).sum() == 4 and (codes[8] != codes[9]).sum() == 1
    enc = _enc("binary", bits=bits)
    assert enc.max_length == 2**bits and enc.supports(256) and not enc.supports(257)
    x = torch.zeros(1, 2**bits, D_MODEL, dtype=torch.float64)
    embedded = enc.embed(x, torch.arange(2**bits))[0]
    assert torch.allclose(embedded, codes.double() @ enc.proj.weight.T)
    assert torch.cdist(embedded, embedded).add(torch.eye(2**bits, dtype=torch.float64)).min() > 0
    with pytest.raises(ValueError, match="0..255"):
        enc.embed(torch.zeros(1, 257, D_MODEL, dtype=torch.float64), torch.arange(257))


# -- Shaw et al. 2018 ------------------------------------------------------------------------


def test_shaw_matches_eq5_and_clips_beyond_max_relative_position() -> None:
    kmax, L = 5, 16
    enc = _enc("shaw", max_relative_position=kmax)
    q, k = _qk(L)
    pos = torch.arange(100, 100 + L)
    got = enc.scores(q, k, pos, pos)
    for i in range(L):
        for j in range(i + 1):
            # a_ij^K = w^K_{clip(j - i, k)} (Eq. 5's key-side term, divided by sqrt(d_z))
            row = min(i - j, kmax)
            expected = q[:, :, i] @ enc.relative_keys[row] / math.sqrt(HEAD_DIM)
            assert torch.allclose(got[:, :, i, j], expected), (i, j)
    # every key at distance >= k reads the same vector: identical terms along a query's row
    i = L - 1
    far = got[:, :, i, : i - kmax + 1]  # distances i - j >= kmax
    assert far.shape[-1] > 1
    assert torch.allclose(far, far[..., :1].expand_as(far))
    near = got[:, :, i, i - kmax + 1:]
    assert not torch.allclose(near, near[..., :1].expand_as(near))


# -- Transformer-XL (Dai et al. 2019, §3.3) --------------------------------------------------


def test_transformer_xl_terms_b_c_d() -> None:
    enc = _enc("transformer_xl")
    L = 12
    q, k = _qk(L)
    pos = torch.arange(7, 7 + L)
    got = enc.scores(q, k, pos, pos)
    R = sinusoidal_table(torch.arange(L), D_MODEL, 10000.0, dtype=torch.float64)  # R_{i-j}
    WR = (R @ enc.W_R.weight.T).view(L, N_HEADS, HEAD_DIM)  # W_R R_d, per head
    for i in range(L):
        for j in range(i + 1):
            r = WR[i - j]  # (H, Dh)
            b = (q[:, :, i] * r).sum(-1)  # q_i . W_R R_{i-j}
            c = (enc.u * k[:, :, j]).sum(-1)  # u . k_j
            d = (enc.v * r).sum(-1)  # v . W_R R_{i-j}
            assert torch.allclose(got[:, :, i, j], (b + c + d) / math.sqrt(HEAD_DIM)), (i, j)


# -- DeBERTa (He et al. 2021, §3.1) ----------------------------------------------------------


def test_deberta_log_buckets() -> None:
    nb, maxpos = 32, 128
    r = torch.arange(-3000, 3001)
    b = deberta_log_bucket(r, nb, maxpos)
    assert torch.equal(b[r.abs() <= nb // 2], r[r.abs() <= nb // 2])  # exact near the diagonal
    assert torch.equal(deberta_log_bucket(-r, nb, maxpos), -b)  # odd in the offset
    assert bool((b[1:] >= b[:-1]).all())  # monotone
    # by hand: 16 + ceil(log(r/16) / log(127/16) * 15)
    known = {17: 17, 18: 17, 20: 18, 32: 22, 64: 27, 100: 30, 127: 31, 128: 32, 1000: 46}
    for dist, bucket in known.items():
        assert int(deberta_log_bucket(torch.tensor(dist), nb, maxpos)) == bucket, dist


@pytest.mark.parametrize("buckets", [0, 8])
def test_deberta_eq4_with_sqrt_3d_scaling(buckets: int) -> None:
    kmax = 4 if buckets == 0 else 20
    enc = _enc("deberta", position_buckets=buckets, max_relative_positions=kmax)
    span = kmax if buckets == 0 else buckets
    L = 14 if buckets == 0 else 30
    q, k = _qk(L)
    pos = torch.arange(50, 50 + L)
    got = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + enc.scores(q, k, pos, pos)  # what the softmax sees

    def delta(i: int, j: int) -> int:
        if buckets == 0:  # Eq. 3 literally
            return 0 if i - j <= -span else 2 * span - 1 if i - j >= span else i - j + span
        return min(max(int(deberta_log_bucket(torch.tensor(i - j), buckets, kmax)) + span, 0), 2 * span - 1)

    P = enc.rel_embeddings
    Q_r = (P @ enc.W_q_r.weight.T).view(-1, N_HEADS, HEAD_DIM)  # (2k, H, Dh)
    K_r = (P @ enc.W_k_r.weight.T).view(-1, N_HEADS, HEAD_DIM)
    for i in range(L):
        for j in range(L):
            c2c = (q[:, :, i] * k[:, :, j]).sum(-1)
            c2p = (q[:, :, i] * K_r[delta(i, j)]).sum(-1)  # Q^c_i . K^r_{delta(i,j)}
            p2c = (k[:, :, j] * Q_r[delta(j, i)]).sum(-1)  # K^c_j . Q^r_{delta(j,i)}
            expected = (c2c + c2p + p2c) / math.sqrt(3 * HEAD_DIM)  # Eq. 4, softmax(A~ / sqrt(3d))
            assert torch.allclose(got[:, :, i, j], expected), (i, j)


# -- KERPLE (Chi et al. 2022) ----------------------------------------------------------------


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_formula_and_monotone_decay(variant: str) -> None:
    for randomise in (False, True):
        torch.manual_seed(1)
        enc = create("kerple", d_model=D_MODEL, n_heads=N_HEADS, variant=variant).double()
        if randomise:
            with torch.no_grad():
                for p in enc.parameters():
                    p.normal_(0.0, 2.0)
        r1, r2 = enc.r1, enc.r2
        assert bool((r1 > 0).all()) and bool((r2 > 0).all())
        if variant == "power":
            assert bool((r2 <= 2).all())  # CPD only for exponents in (0, 2]
        pos = torch.arange(200)
        bias = enc.bias(pos[-1:], pos)[:, 0].flip(-1)  # (H, 200): distance 0, 1, ..., 199 from the last query
        d = torch.arange(200, dtype=torch.float64)
        if variant == "log":
            expected = -r1[:, None] * torch.log(1 + r2[:, None] * d)
        else:
            expected = -r1[:, None] * d ** r2[:, None]
        assert torch.allclose(bias, expected, atol=1e-12)
        assert torch.equal(bias[:, 0], torch.zeros(N_HEADS, dtype=torch.float64))
        assert bool((bias[:, 1:] <= bias[:, :-1]).all()), "the paper's kernels never increase with distance"


def test_kerple_power_gradient_is_finite_on_the_diagonal() -> None:
    enc = create("kerple", d_model=D_MODEL, n_heads=N_HEADS, variant="power")
    pos = torch.arange(10)
    enc.bias(pos, pos).sum().backward()
    for p in enc.parameters():
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


# -- Sandwich (Chi et al. 2023) --------------------------------------------------------------


def test_sandwich_is_the_scaled_sinusoid_inner_product() -> None:
    dim = 16
    enc = create("sandwich", d_model=D_MODEL, n_heads=N_HEADS, sinusoid_dim=dim)
    pos = torch.arange(40)
    bias = enc.bias(pos, pos).double()
    assert not list(enc.parameters())
    for i, j in [(0, 0), (5, 2), (39, 0), (20, 19)]:
        # p_m . p_n - d~/2 by the sum, then ALiBi's head range 8h/H as a divisor
        kernel = sum(math.cos((i - j) / 10000 ** (2 * t / dim)) for t in range(1, dim // 2 + 1)) - dim / 2
        for h in range(N_HEADS):
            assert math.isclose(bias[h, i, j].item(), kernel / (8 * (h + 1) / N_HEADS), rel_tol=1e-5, abs_tol=1e-6)
    # the same kernel as the inner product of two sinusoidal encodings of width d~ (sin and cos at each frequency)
    freqs = 10000 ** (-2 * torch.arange(1, dim // 2 + 1, dtype=torch.float64) / dim)
    p = lambda m: torch.cat((torch.sin(m * freqs), torch.cos(m * freqs)))  # noqa: E731
    assert math.isclose(float(p(31) @ p(4) - dim / 2), float(sandwich_kernel(torch.tensor(27), dim)), abs_tol=1e-9)


def test_sandwich_decays_logarithmically_with_ripples() -> None:
    # the paper: largest on the diagonal, and a log-decaying envelope like KERPLE and T5 (not monotone point by point)
    k = sandwich_kernel(torch.arange(4096), 128)
    assert k[0] == 0 and bool((k[1:] < 0).all())
    octave_max = torch.stack([k[2**e: 2 ** (e + 1)].max() for e in range(12)])  # distances [1,2), [2,4), ...
    assert bool((octave_max[1:] < octave_max[:-1]).all())
    assert bool((k[1:] > k[:-1]).any()), "ripples: the kernel is not monotone point by point"


# -- FIRE (Li et al. 2024) -------------------------------------------------------------------


def test_fire_formula_with_progressive_interpolation() -> None:
    enc = _enc("fire", init_threshold=20.0)
    with torch.no_grad():
        enc.c.fill_(0.3)
        enc.threshold_multiplier.fill_(1.0)  # L = 20
    L_thr, c = 20.0, 0.3
    pos = torch.arange(300)
    bias = enc.bias(pos, pos)  # (H, 300, 300)
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    for i, j in [(0, 0), (5, 1), (19, 0), (20, 3), (150, 0), (299, 250)]:
        x = psi(i - j) / psi(max(L_thr, i))  # b(i, j) = f(psi(i - j) / psi(max(L, i)))
        expected = enc.mlp(torch.tensor([[x]], dtype=torch.float64))[0]
        assert torch.allclose(bias[:, i, j], expected, atol=1e-10), (i, j)
    x = enc.normalized_distance(pos, pos).detach()
    causal = _causal(300)
    assert float(x[causal].min()) >= 0 and float(x[causal].max()) <= 1 + 1e-12  # in [0, 1] at any length
    # past L the farthest key always reads 1, so f(1) is the farthest key's bias at every length ...
    assert torch.allclose(x[20:, 0], torch.ones(280, dtype=torch.float64))
    assert torch.allclose(bias[:, 20:, 0], bias[:, 20:21, 0].expand(-1, 280))
    # ... and past L the same key distance maps closer to 0 the later the query (the interpolation)
    at_ten = torch.stack([x[i, i - 10] for i in range(20, 300)])
    assert bool((at_ten[1:] < at_ten[:-1]).all())
    # below L the bias is purely relative: queries 10 and 15 see the same bias at the same offsets
    assert torch.allclose(bias[:, 10, :8], bias[:, 15, 5:13])


# -- xPos (Sun et al. 2023) ------------------------------------------------------------------


def test_xpos_score_decays_per_pair_as_zeta_to_the_distance() -> None:
    xpos = create("xpos", d_model=D_MODEL, n_heads=N_HEADS).double()
    half = HEAD_DIM // 2
    theta = [10000.0 ** (-i / half) for i in range(half)]  # RoPE's theta_i = base^(-2i/d)
    zeta = torch.tensor([(i / half + 0.4) / 1.4 for i in range(half)], dtype=torch.float64)
    assert torch.allclose(xpos.zeta, zeta)

    pos = torch.arange(3000, 5000, 50)  # one call, many queries and keys, as the model makes it
    n, m = pos.double()[:, None], pos.double()[None, :]

    def pair_scores(pair: int) -> torch.Tensor:
        v = torch.zeros(1, 1, len(pos), HEAD_DIM, dtype=torch.float64)
        v[..., pair] = v[..., pair + half] = 1.0  # identical q and k, living in one rotation pair (halves layout)
        qr, kr = xpos.rotate(v, v, pos, pos)
        return (qr @ kr.transpose(-1, -2))[0, 0]  # (L, L): [n, m] = q_n . k_m

    for pair in range(half):
        # RoPE alone gives q_n . k_m = 2 cos((n - m) theta_i) for this q = k; xPos multiplies it by
        # zeta_i^((n - m)/B), B = 512: the query's zeta^(n/B) times the key's zeta^(-m/B)
        expected = 2 * torch.cos((n - m) * theta[pair]) * zeta[pair] ** ((n - m) / 512.0)
        assert torch.allclose(pair_scores(pair), expected, atol=1e-9), pair
    # for the slowest-turning pair the rotation barely moves, so the score itself falls with distance
    last_query = pair_scores(half - 1)[-1]  # keys at distance 1950, 1900, ..., 0
    assert bool((last_query[1:] > last_query[:-1]).all())


# -- CoPE (Golovneva et al. 2024) ------------------------------------------------------------


def test_cope_counts_tokens_when_every_gate_is_open() -> None:
    L = 12
    pos = torch.arange(L)
    p = cope_positions(torch.ones(L, L), pos, pos)
    i, j = pos[:, None], pos[None, :]
    assert torch.equal(p, torch.where(j <= i, (i - j + 1).float(), torch.zeros(L, L)))  # p_ij = i - j + 1


def test_cope_positions_count_keys_not_indices() -> None:
    # p_ij counts gated keys, so only the order of the tokens matters, never their index values
    enc = _enc("cope", npos_max=40)
    L = 24
    q, k = _qk(L)
    pos = torch.arange(L)
    ref = enc.scores(q, k, pos, pos)
    mask = _causal(L)
    for relabelled in (pos + 1000, 3 * pos, pos**2):
        assert torch.allclose(enc.scores(q, k, relabelled, relabelled)[..., mask], ref[..., mask])


def test_cope_positions_are_causal_sums_of_gates() -> None:
    L = 10
    pos = torch.arange(L)
    g = torch.rand(3, L, L, generator=torch.Generator().manual_seed(0))
    p = cope_positions(g, pos, pos)
    for i in range(L):
        for j in range(i + 1):
            assert torch.allclose(p[:, i, j], g[:, i, j:i + 1].sum(-1))  # sum_{t=j}^{i} g_it
    # gates of future keys never enter the count: changing them changes nothing
    g2 = g.clone()
    g2[:, ~_causal(L)] = 1.0
    assert torch.equal(cope_positions(g2, pos, pos), p)


def test_cope_scores_interpolate_the_table() -> None:
    enc = _enc("cope", npos_max=6)
    L = 16
    q, k = _qk(L)
    pos = torch.arange(L)
    got = enc.scores(q, k, pos, pos)
    gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM))
    p = cope_positions(gates, pos, pos).clamp(max=5)
    e = enc.pos_emb  # (Dh, npos_max), e[p] is column p
    for b, h, i, j in [(0, 0, 0, 0), (1, 2, 7, 3), (0, 3, 15, 0), (1, 1, 15, 14)]:
        pij = float(p[b, h, i, j])
        lo, hi = math.floor(pij), math.ceil(pij)
        # e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p] (Eq. 5)
        e_p = (pij - lo) * e[:, hi] + (1 - pij + lo) * e[:, lo]
        assert torch.allclose(got[b, h, i, j], q[b, h, i] @ e_p), (b, h, i, j)
    # far keys pass enough gates to reach the end of the table and share its last entry
    assert float(p[..., L - 1, 0].min()) == 5.0


# -- which hook each uses, and bad options -------------------------------------------------


def test_hooks_in_use() -> None:
    expected = {"integer": "embed", "normalized": "embed", "binary": "embed", "shaw": "scores",
                "transformer_xl": "scores", "deberta": "scores", "cope": "scores", "kerple": "bias",
                "sandwich": "bias", "fire": "bias", "xpos": "rotate"}
    for name, hook in expected.items():
        enc = create(name, d_model=D_MODEL, n_heads=N_HEADS)
        used = {h for h in ("embed", "rotate", "bias", "scores") if getattr(enc, f"uses_{h}")}
        assert used == {hook}, name


@pytest.mark.parametrize(
    "name, kwargs, key",
    [
        ("kerple", dict(variant="exp"), "encoder.variant"),
        ("shaw", dict(max_relative_position=0), "encoder.max_relative_position"),
        ("shaw", dict(max_relative_position=-3), "encoder.max_relative_position"),
        ("binary", dict(bits=0), "encoder.bits"),
        ("deberta", dict(position_buckets=1), "encoder.position_buckets"),
        ("deberta", dict(position_buckets=32, max_relative_positions=17), "encoder.max_relative_positions"),
        ("sandwich", dict(sinusoid_dim=7), "encoder.sinusoid_dim"),
        ("fire", dict(init_c=0.0), "encoder.init_c"),
        ("fire", dict(init_threshold=-1.0), "encoder.init_threshold"),
        ("xpos", dict(gamma=0.0), "encoder.gamma"),
        ("xpos", dict(base=1.0), "base"),
        ("xpos", dict(d_model=12, n_heads=4), "model.d_model"),
        ("cope", dict(npos_max=1), "encoder.npos_max"),
        ("transformer_xl", dict(d_model=33, n_heads=3), "model.d_model"),
    ],
)
def test_bad_options(name: str, kwargs: dict, key: str) -> None:
    d_model, n_heads = kwargs.pop("d_model", D_MODEL), kwargs.pop("n_heads", N_HEADS)
    with pytest.raises(ConfigError) as err:
        create(name, d_model=d_model, n_heads=n_heads, **kwargs)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ")


def test_kerple_unknown_variant_names_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="'log'|log, power") as err:
        create("kerple", d_model=D_MODEL, n_heads=N_HEADS, variant="exp")
    assert "log" in str(err.value) and "power" in str(err.value) and "'exp'" in str(err.value)
