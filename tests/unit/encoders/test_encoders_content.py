"""Encodings that read the content: what each paper claims, on the encoders and through the model.

FoX (Lin et al. 2025) and PaTH (Yang et al. 2025) enter attention through the ``transform`` hook, stick-breaking
(Tan et al. 2025) through ``normalise``. Each is checked against a slow by-hand version of its formula and
for the property its paper states; the hook contract inside the model (causality, blocks) is checked for every
yaml by tests/integration/commands/test_check.py.
"""

from __future__ import annotations

import pytest
import torch

from posexp.encoders import create
from posexp.encoders.fox import forget_bias
from posexp.encoders.path import path_logits
from posexp.encoders.stickbreaking import stick_breaking_weights
from posexp.errors import ConfigError
from posexp.model.gpt import GPT, AttentionPlan, ModelShape

D_MODEL, N_HEADS = 32, 4
HEAD_DIM = D_MODEL // N_HEADS


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _enc(name: str, **options):
    torch.manual_seed(0)
    enc = create(name, d_model=D_MODEL, n_heads=N_HEADS, **options).double()
    with torch.no_grad():  # randomised, so that no property holds by zeros
        for p in enc.parameters():
            p.normal_(0.0, 0.5)
    return enc


def _model(name: str, block: int = 8, **options) -> GPT:
    torch.manual_seed(0)
    shape = ModelShape(d_model=D_MODEL, n_heads=N_HEADS, n_layers=2, vocab_size=64, attn_block_size=block,
                       init="pytorch")
    return GPT(shape, create(name, d_model=D_MODEL, n_heads=N_HEADS, **options)).double().eval()


# -- FoX: forgetting attention --------------------------------------------------------------------------------------

def test_fox_bias_is_the_sum_of_log_forget_gates_between_key_and_query():
    enc = _enc("fox")
    x = _rand(2, 12, D_MODEL)
    log_f = enc.log_forget(x)  # (B, H, L)
    gates = torch.sigmoid(x @ enc.gate.weight.T + enc.gate.bias).transpose(1, 2)
    torch.testing.assert_close(log_f, gates.log())
    D = forget_bias(log_f, 0, 12)
    for i in range(12):
        for j in range(i + 1):  # D_ij = sum_{l=j+1}^{i} log f_l (Lin et al. 2025, §2)
            torch.testing.assert_close(D[..., i, j], log_f[..., j + 1:i + 1].sum(-1))


def test_fox_bias_is_non_positive_zero_on_the_diagonal_and_decays_with_distance():
    enc = _enc("fox")
    D = enc.transform(_rand(2, 40, D_MODEL), _rand(2, N_HEADS, 40, HEAD_DIM), _rand(2, N_HEADS, 40, HEAD_DIM),
                      torch.arange(40))(0, 40)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    assert (D[..., causal] <= 0).all()
    assert D.diagonal(dim1=-2, dim2=-1).abs().max() == 0
    # further back (j - 1 instead of j) never decays less: D_{i,j-1} <= D_{i,j}
    steps = D[..., :, 1:] - D[..., :, :-1]
    assert (steps[..., causal[:, 1:]] >= 0).all()
    assert D[..., -1, 0].max() < -1  # and it does decay, by content-dependent gates


def test_fox_a_query_block_gets_the_rows_of_the_whole_and_later_content_changes_nothing_before():
    enc = _enc("fox")
    x = _rand(1, 30, D_MODEL)
    qk = _rand(1, N_HEADS, 30, HEAD_DIM)
    whole = enc.transform(x, qk, qk, torch.arange(30))(0, 30)
    torch.testing.assert_close(enc.transform(x, qk, qk, torch.arange(30))(20, 30), whole[..., 20:30, :30])
    changed = x.clone()
    changed[:, 16:] = _rand(1, 14, D_MODEL, seed=1)
    later = enc.transform(changed, qk, qk, torch.arange(30))(0, 30)
    torch.testing.assert_close(later[..., :16, :16].tril(), whole[..., :16, :16].tril())


def test_fox_with_gates_open_is_nope():
    fox, nope = _model("fox", init_bias=50.0), _model("none")
    nope.load_state_dict({k: v for k, v in fox.state_dict().items() if not k.startswith("encoder.")})
    idx = torch.randint(64, (2, 20), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fox(idx), nope(idx))  # log sigmoid(50) ~ -2e-22: no forgetting at all


def test_fox_future_tokens_do_not_change_earlier_outputs():
    model = _model("fox")
    idx = torch.randint(64, (2, 25), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 13:] = (changed[:, 13:] + 7) % 64
    torch.testing.assert_close(model(idx)[:, :13], model(changed)[:, :13])


def test_fox_init_bias_must_be_a_number():
    with pytest.raises(ConfigError, match="encoder.init_bias"):
        create("fox", d_model=D_MODEL, n_heads=N_HEADS, init_bias="open")


# -- stick-breaking attention ---------------------------------------------------------------------------------------

def _by_hand(z: torch.Tensor, i: int) -> torch.Tensor:
    """Row ``i`` of stick-breaking: ``A_ij = beta_ij prod_{j<k<i} (1 - beta_ik)``, the rest to ``i`` itself."""
    beta = torch.sigmoid(z[i])
    row = torch.zeros(len(z), dtype=z.dtype)
    for j in range(i):
        row[j] = beta[j] * torch.prod(1 - beta[j + 1:i])
    row[i] = torch.prod(1 - beta[:i])
    return row


def test_stickbreaking_weights_are_the_papers_formula():
    z = 2 * _rand(10, 10)
    pos = torch.arange(10)
    weights = stick_breaking_weights(z.masked_fill(pos[None] > pos[:, None], float("-inf")), pos, pos)
    for i in range(10):
        torch.testing.assert_close(weights[i], _by_hand(z, i))


def test_stickbreaking_weights_are_non_negative_and_earlier_keys_take_at_most_the_stick():
    L = 50
    pos = torch.arange(L)
    future = pos[None] > pos[:, None]
    weights = stick_breaking_weights((3 * _rand(2, N_HEADS, L, L)).masked_fill(future, float("-inf")), pos, pos)
    assert (weights >= 0).all() and (weights[..., future] == 0).all()
    earlier = weights.masked_fill(~(pos[None] < pos[:, None]), 0.0).sum(-1)
    assert (earlier <= 1 + 1e-12).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(earlier))  # the remainder goes to the query itself


def test_stickbreaking_the_closest_key_with_a_large_logit_takes_the_mass():
    L = 12
    pos = torch.arange(L)
    z = torch.full((L, L), -8.0, dtype=torch.float64)
    z[11, 3] = z[11, 7] = 8.0  # two keys match query 11; 7 is the closer
    weights = stick_breaking_weights(z.masked_fill(pos[None] > pos[:, None], float("-inf")), pos, pos)[11]
    assert weights[7] > 0.99 and weights[3] < 1e-3
    assert weights.argmax() == 7


def test_stickbreaking_equal_logits_decay_geometrically_with_distance():
    L, logit = 20, 0.3
    pos = torch.arange(L)
    z = torch.full((L, L), logit, dtype=torch.float64).masked_fill(pos[None] > pos[:, None], float("-inf"))
    row = stick_breaking_weights(z, pos, pos)[L - 1]
    beta = torch.sigmoid(torch.tensor(logit, dtype=torch.float64))
    distance = torch.arange(1, L, dtype=torch.float64)
    torch.testing.assert_close(row[:L - 1].flip(0), beta * (1 - beta) ** (distance - 1))  # A at distance d


def test_stickbreaking_a_masked_key_leaves_the_stick_whole():
    pos = torch.arange(8)
    z = 2 * _rand(8, 8)
    z = z.masked_fill(pos[None] > pos[:, None], float("-inf"))
    windowed = z.clone()
    windowed[7, 5] = float("-inf")  # key 5 outside query 7's window
    full, hidden = stick_breaking_weights(z, pos, pos)[7], stick_breaking_weights(windowed, pos, pos)[7]
    assert hidden[5] == 0
    beta5 = torch.sigmoid(z[7, 5])
    torch.testing.assert_close(hidden[:5], full[:5] / (1 - beta5))  # the keys behind it get what it took


# -- PaTH -----------------------------------------------------------------------------------------------------------

def _dense(q, k, w, beta):
    """``q_i^T H_i H_{i-1} ... H_{j+1} k_j`` with every ``H_t = I - beta_t w_t w_t^T`` built as a matrix."""
    L, d = k.shape[-2], k.shape[-1]
    out = torch.zeros(L, L, dtype=q.dtype)
    for i in range(L):
        product = torch.eye(d, dtype=q.dtype)
        for j in range(i, -1, -1):
            out[i, j] = q[i] @ product @ k[j]
            product = product @ (torch.eye(d, dtype=q.dtype) - beta[j] * torch.outer(w[j], w[j]))
    return out


def _householder_inputs(L: int, d: int, beta_value=None):
    q, k = _rand(L, d, seed=1), _rand(L, d, seed=2)
    w = torch.nn.functional.normalize(_rand(L, d, seed=3), dim=-1)
    beta = 2 * torch.rand(L, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    if beta_value is not None:
        beta = torch.full((L,), float(beta_value), dtype=torch.float64)
    return q, k, w, beta


@pytest.mark.parametrize("start", [0, 5])
def test_path_logits_are_the_accumulated_householder_products(start):
    L, d = 11, 6
    q, k, w, beta = _householder_inputs(L, d)
    dense = _dense(q, k, w, beta)
    block = path_logits(q[start:][None], k[None], w[None], beta[None], start)[0]
    causal = torch.arange(L)[None] <= torch.arange(start, L)[:, None]
    torch.testing.assert_close(block[causal], dense[start:][causal])


def test_path_with_beta_zero_is_nope():
    q, k, w, beta = _householder_inputs(9, 6, beta_value=0.0)
    logits = path_logits(q[None], k[None], w[None], beta[None], 0)[0]
    torch.testing.assert_close(logits.tril(), (q @ k.T).tril())


@pytest.mark.parametrize("beta_value, orthogonal", [(2.0, True), (0.7, False)])
def test_path_beta_two_is_a_reflection_and_any_beta_in_0_2_never_grows_a_key(beta_value, orthogonal):
    """Yang et al. 2025, §3: at beta = 2 each H_t is a reflection (orthogonal), so a key keeps its length however
    far it is carried; in (0, 2) the eigenvalue along w_t is 1 - beta in (-1, 1), so no length grows."""
    L, d = 10, 6
    _, k, w, beta = _householder_inputs(L, d, beta_value)
    # queries that are the basis vectors: the logits of query i are the coordinates of H_i ... H_{j+1} k_j
    carried = torch.stack([path_logits(torch.eye(d, dtype=torch.float64)[:, None].expand(d, L, d)[b][None],
                                       k[None], w[None], beta[None], 0)[0] for b in range(d)])  # (d, L, L)
    lengths = carried[:, -1, :].norm(dim=0)  # the keys as query L-1 sees them
    if orthogonal:
        torch.testing.assert_close(lengths, k.norm(dim=-1))
    else:
        assert (lengths <= k.norm(dim=-1) + 1e-12).all() and (lengths[:-1] < k.norm(dim=-1)[:-1]).all()


def test_path_householder_directions_are_unit_and_strengths_in_0_2():
    w, beta = _enc("path").householder(_rand(2, 15, D_MODEL))
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(2, N_HEADS, 15, dtype=torch.float64))
    assert (beta > 0).all() and (beta < 2).all()


def test_path_future_tokens_do_not_change_earlier_outputs_and_blocks_equal_the_whole():
    model = _model("path", block=6)
    idx = torch.randint(64, (2, 23), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 5) % 64
    out = model(idx)
    torch.testing.assert_close(out[:, :12], model(changed)[:, :12])
    model.shape.attn_block_size = 23
    torch.testing.assert_close(out, model(idx))


def test_path_gradients_match_finite_differences():
    L, d = 7, 4
    q, k, w, beta = (t[None, None].clone().requires_grad_() for t in _householder_inputs(L, d))
    assert torch.autograd.gradcheck(lambda *a: path_logits(*a, 3), (q[..., 3:, :].detach().requires_grad_(),
                                                                      k, w, beta))


# -- the model's side of the hooks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, hook", [("fox", "transform"), ("path", "transform"), ("stickbreaking", "normalise")])
def test_content_encodings_take_the_explicit_path_never_the_fused_one(name, hook):
    enc = create(name, d_model=D_MODEL, n_heads=N_HEADS)
    assert getattr(enc, f"uses_{hook}") and enc.explicit_attention
    plan = AttentionPlan(enc, torch.arange(10), block_size=4, fused=True)
    assert plan.needs_mask and not plan.fused


def test_encoders_without_content_hooks_do_not_declare_them():
    for name in ("rope", "alibi", "none", "cope", "t5"):
        enc = create(name, d_model=D_MODEL, n_heads=N_HEADS)
        assert not (enc.uses_transform or enc.uses_normalise or enc.explicit_attention), name


@pytest.mark.parametrize("name", ["fox", "path"])
def test_every_layer_has_its_own_gates_as_in_the_papers(name):
    model = _model(name)
    layers = model.encoder.for_layers(2)
    assert layers[0] is model.encoder and layers[1] is not layers[0]
    first, second = ({n: p for n, p in e.named_parameters() if not n.startswith("other_layers")} for e in layers)
    assert first.keys() == second.keys() and all(first[n] is not second[n] for n in first)
    names = {n for n, _ in model.named_parameters()}
    assert any(n.startswith("encoder.other_layers.0.") for n in names)  # trained and saved with the model
    with pytest.raises(ConfigError, match="model.n_layers"):
        model.encoder.for_layers(1)  # built for 2
