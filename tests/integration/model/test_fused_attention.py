"""The fused-attention hook: every bias encoder's ``score_mod`` is its ``bias``, and the model's FlexAttention
path computes what its blocked path computes.

The ``score_mod`` tests are plain tensor functions and run everywhere; the model tests on a CPU use
FlexAttention's unfused reference (forward only); the ``cuda`` tests compare the fused kernel, outputs and
gradients, and skip cleanly without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from helpers import SMOKE, sigterm_at_step
from posexp.model.factory import build_encoder, build_model
from posexp.config.schema import config_dir
from posexp.model.fused import causal_block_mask, flex_attend, flex_available, fused_by_default
from posexp.model.gpt import GPT, ModelShape
from posexp.commands.edge import typed

ENCODERS = sorted(p.stem for p in (config_dir() / "encoder").glob("*.yaml"))
H = 4
needs_flex = pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention (PyTorch >= 2.5)")


def on_cuda(test):
    """A test of the fused kernel: marked ``cuda`` (``-m cuda`` selects them) and skipped without a GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


def _encoder(compose, name: str, **extra):
    enc = build_encoder(typed(compose(f"encoder={name}", "model.d_model=32", f"model.n_heads={H}", "model.n_layers=2",
                                *[f"encoder.{k}={v}" for k, v in extra.items()])))
    torch.manual_seed(1)
    with torch.no_grad():  # learned biases start at zero (T5) or near a fixed shape: make every entry count
        for p in enc.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return enc


def _bias_encoders(compose):
    return [name for name in ENCODERS if name != "mixed" and _encoder(compose, name).uses_bias]


@pytest.mark.slow  # an end-to-end run of several seconds; the default suite stays near 10 minutes
def test_every_bias_encoder_has_a_fused_form(compose):
    # alibi, t5, kerple, sandwich, fire: all biases of (head, query position, key position)
    names = _bias_encoders(compose)
    assert {"alibi", "t5", "kerple", "sandwich", "fire"} <= set(names)
    assert all(_encoder(compose, n).uses_score_mod for n in names), names
    assert not any(_encoder(compose, n).uses_score_mod for n in ENCODERS if n not in names and n != "mixed")


POSITIONS = {
    "contiguous": (torch.arange(0, 77), torch.arange(0, 77)),
    "offset query block": (torch.arange(300, 364), torch.arange(0, 364)),  # queries late in a long sequence
    "randomized": (torch.tensor([3, 9, 40, 41, 200, 513]), torch.tensor([3, 9, 40, 41, 200, 513])),
}


@pytest.mark.parametrize("positions", sorted(POSITIONS))
@pytest.mark.parametrize("name,options", [("alibi", {}), ("t5", {}), ("kerple", {"variant": "log"}),
                                          ("kerple", {"variant": "power"}), ("sandwich", {}), ("fire", {})])
def test_score_mod_on_index_grids_is_the_bias(compose, name, options, positions):
    enc = _encoder(compose, name, **options)
    q_pos, k_pos = POSITIONS[positions]
    Lq, Lk = len(q_pos), len(k_pos)
    mod = enc.score_mod(q_pos, k_pos)
    h, qi, ki = torch.arange(H)[:, None, None], torch.arange(Lq)[None, :, None], torch.arange(Lk)[None, None, :]
    with torch.no_grad():
        fused = mod(torch.zeros(H, Lq, Lk), torch.zeros((), dtype=torch.long), h, qi, ki)
        reference = enc.bias(q_pos, k_pos)
    causal = k_pos[None, :] <= q_pos[:, None]  # (Lq, Lk): what attention sees
    assert fused.shape == reference.shape == (H, Lq, Lk)
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused[:, causal], reference[:, causal], rtol=1e-5, atol=1e-5)
    assert reference[:, causal].std() > 0  # the comparison is not of constants


def test_score_mod_adds_to_the_score_and_keeps_its_dtype(compose):
    enc = _encoder(compose, "alibi")
    mod = enc.score_mod(torch.arange(8), torch.arange(8))
    score = torch.full((), 2.0, dtype=torch.bfloat16)
    out = mod(score, torch.tensor(0), torch.tensor(1), torch.tensor(5), torch.tensor(2))
    assert out.dtype == torch.bfloat16
    assert out.item() == pytest.approx(2.0 - enc.slopes[1].item() * 3, abs=2e-2)


def _models(compose, name: str, block: int):
    # head width 16: the narrowest FlexAttention's kernels take
    cfg = typed(compose(f"encoder={name}", "model.d_model=64", f"model.n_heads={H}", "model.n_layers=2",
                        f"model.attn_block_size={block}"))
    model = build_model(cfg, 64).eval()
    with torch.no_grad():
        for p in model.encoder.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model


@needs_flex
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich", "fire"])
def test_the_flex_path_computes_what_the_blocked_path_computes(compose, name, monkeypatch):
    """FlexAttention's unfused reference on a CPU: the same logits as the blocked float-mask path, at a length
    that is not a multiple of the query block (three blocks, the last one short)."""
    import posexp.model.gpt

    calls = []
    attend = posexp.model.gpt.flex_attend
    monkeypatch.setattr(posexp.model.gpt, "flex_attend", lambda *a, **kw: calls.append(1) or attend(*a, **kw))
    model = _models(compose, name, block=32)
    idx = torch.randint(0, 64, (2, 77), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.fused_attention = False
        blocked = model(idx)
        assert not calls
        model.fused_attention = True
        fused = model(idx)
    assert len(calls) == 2  # both layers took the fused path
    torch.testing.assert_close(fused, blocked, rtol=1e-5, atol=1e-5)


@needs_flex
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich", "fire"])
def test_every_learned_bias_gets_its_gradient_through_the_flex_path(compose, name, monkeypatch):
    """FlexAttention's backward returns the gradient of every parameter, those a ``score_mod`` reads included,
    equal to the blocked path's. Its unfused backward runs here on a CPU with its device check lifted (the arithmetic is the same
    dense math that CUDA falls back to); a captured 0-d tensor, which that backward cannot differentiate, fails
    here as it did on an H100 (FIRE's ``|c|`` and ``L``)."""
    import torch.nn.attention.flex_attention as flex

    if not hasattr(flex, "_validate_device"):
        pytest.skip("this torch checks FlexAttention's device elsewhere")
    monkeypatch.setattr(flex, "_validate_device", lambda *a, **kw: None)
    model = _models(compose, name, block=32).train()
    idx = torch.randint(0, 64, (2, 77), generator=torch.Generator().manual_seed(0))
    grads = []
    for fused in (False, True):
        model.fused_attention = fused
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    blocked, fused = grads
    # every parameter, the attention projections (FlexAttention's dq, dk, dv) and the encoder's own
    assert set(fused) == set(blocked) == {n for n, p in model.named_parameters() if p.requires_grad}
    for n in blocked:
        torch.testing.assert_close(fused[n], blocked[n], rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_head_widths_flexattention_cannot_tile_keep_the_blocked_path(compose, monkeypatch):
    import posexp.model.gpt

    monkeypatch.setattr(posexp.model.gpt, "flex_attend", lambda *a, **kw: pytest.fail("head width 8 went fused"))
    model = build_model(typed(compose("encoder=alibi", "model.d_model=32", "model.n_heads=4")), 64).eval()
    model.fused_attention = True
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 64, (1, 20)))).all()


@needs_flex
def test_an_offset_query_block_sees_its_own_positions(compose):
    """Queries 48..76 over keys 0..76 give the last rows of attention over the whole sequence."""
    enc = _encoder(compose, "t5")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 77, 8) for _ in range(3))
    pos = torch.arange(77)
    with torch.no_grad():
        whole = flex_attend(q, k, v, enc.score_mod(pos, pos), compiled=False)
        late = flex_attend(q[:, :, 48:], k, v, enc.score_mod(pos[48:], pos), offset=48, compiled=False)
    torch.testing.assert_close(late, whole[:, :, 48:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,trains_fused", [("alibi", True), ("fire", False)])
def test_an_encoder_that_opts_out_trains_on_the_blocked_path_and_evaluates_fused(compose, monkeypatch, name,
                                                                                  trains_fused):
    """Where the model goes fused by default (CUDA), an encoder with ``fused_training = False`` (FIRE, whose fused
    backward did not compile in 8 minutes on an H200) trains on the blocked path and still evaluates fused; an
    explicit ``fused_attention = True`` takes the fused path for training too."""
    import posexp.model.gpt

    calls = []
    monkeypatch.setattr(posexp.model.gpt, "fused_by_default", lambda device: True)
    monkeypatch.setattr(posexp.model.gpt, "flex_attend", lambda q, *a, **kw: calls.append(1) or torch.zeros_like(q))
    model = _models(compose, name, block=32)
    idx = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(0))
    model(idx)
    assert bool(calls) is trains_fused
    calls.clear()
    with torch.no_grad():
        model(idx)
    assert calls, "evaluation takes the fused path"
    calls.clear()
    model.fused_attention = True
    model(idx)
    assert calls, "an explicit fused_attention=True is honoured while training"


def test_cpu_keeps_the_blocked_path_by_default():
    assert not fused_by_default(torch.device("cpu"))
    model = GPT(ModelShape(d_model=16, n_layers=1, n_heads=2), _alibi())
    assert model.fused_attention is None  # None: fused where it runs fused (CUDA)


def _alibi():
    from posexp.encoders import create

    return create("alibi", d_model=16, n_heads=2)


# -- on a GPU --------------------------------------------------------------------------------------------

def _reference_and_fused(model, idx, dtype):
    """Logits and gradients of every parameter, blocked path then fused path, under autocast of ``dtype``."""
    out = []
    for fused in (False, True):
        model.fused_attention = fused
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(idx)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
        loss.backward()
        out.append((logits.float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    return out


@on_cuda
@pytest.mark.parametrize("length", [256, 300])  # a multiple of the query block and FlexAttention's, and not
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich", "fire"])
def test_fused_kernel_equals_the_reference_path_outputs_and_gradients(compose, name, dtype, tol, length):
    if name == "fire" and dtype == torch.bfloat16:
        pytest.skip("FIRE's bf16 fused backward had not compiled after 8 minutes on an H200 (torch 2.11): FIRE trains "
                    "on the blocked path (fused_training = False)")
    torch.backends.cuda.matmul.allow_tf32 = False  # the 1e-5 comparison is of fp32 arithmetic
    model = _models(compose, name, block=128).cuda().train()
    idx = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(0)).cuda()
    (ref, ref_grads), (fused, fused_grads) = _reference_and_fused(model, idx, dtype)
    torch.testing.assert_close(fused, ref, rtol=tol, atol=tol)
    assert ref_grads.keys() == fused_grads.keys()
    for n in ref_grads:
        torch.testing.assert_close(fused_grads[n], ref_grads[n], rtol=tol, atol=tol, msg=n)


@on_cuda
def test_a_process_that_compiles_many_score_mods_stays_fused(compose, monkeypatch):
    """Past dynamo's recompile limit, flex_attention runs its dense reference (every logit in memory, host
    syncs) with no more than a log line: an H100 test session reached it after 16 compiles. Here the limit is
    lowered to 2 and four distinct score_mods are compiled; not one call may reach the dense reference."""
    import torch._higher_order_ops.flex_attention as hop
    from torch._subclasses.fake_tensor import FakeTensor

    dense, math_attention = [], hop.math_attention
    monkeypatch.setattr(hop, "math_attention", lambda q, *a, **kw: (
        dense.append(1) if not isinstance(q, FakeTensor) else None) or math_attention(q, *a, **kw))
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    pos = torch.arange(256, device="cuda")
    q, k, v = (torch.randn(1, H, 256, 16, device="cuda") for _ in range(3))
    for name in ("alibi", "t5"):
        enc = _encoder(compose, name).cuda()
        for dtype in (torch.float32, torch.bfloat16):
            with torch.no_grad():
                out = flex_attend(q.to(dtype), k.to(dtype), v.to(dtype), enc.score_mod(pos, pos))
            assert out.dtype == dtype and torch.isfinite(out).all()
    assert not dense


@on_cuda
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich"])  # not fire: fused_training = False
def test_a_compiled_bf16_step_at_gpt2_small_width_compiles_and_learns(compose, name):
    """The kernels at the width the GPU runs use (head width 64, GPT-2 small's 12 heads, sequence 1,024), inside
    a compiled step as posexp trains on CUDA: T5's lookup overflowed the H100's shared memory with Inductor's
    default tiles, and FIRE's MLP tables were indexed more than once, which Inductor's backward refuses."""
    model = build_model(typed(compose(f"encoder={name}", "model.d_model=768", "model.n_heads=12",
                                      "model.n_layers=2")), 256).cuda().train()
    model.fused_attention = True
    idx = torch.randint(0, 256, (4, 1025), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    step = torch.compile(lambda i: model.token_losses(i[:, :-1], i[:, 1:]).mean())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(idx)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.encoder.parameters())
    assert losses[-1] < losses[0], losses


@on_cuda
def test_fused_offset_query_block_on_cuda(compose):
    enc = _encoder(compose, "alibi").cuda()
    q, k, v = (torch.randn(1, H, 1000, 64, device="cuda") for _ in range(3))
    pos = torch.arange(1000, device="cuda")
    whole = flex_attend(q, k, v, enc.score_mod(pos, pos))
    late = flex_attend(q[:, :, 700:], k, v, enc.score_mod(pos[700:], pos), block_mask=causal_block_mask(
        300, 1000, 700, q.device), offset=700)
    torch.testing.assert_close(late, whole[:, :, 700:], rtol=1e-5, atol=1e-5)


@on_cuda
def test_short_cuda_training_resumes_to_the_same_numbers(compose, tmp_path, monkeypatch):
    """Compiled, bf16, fused ALiBi on the GPU: stopped by SIGTERM at step 4 of 8, resumed, the same loss."""
    from posexp.commands.train import check_config, run_train, train_run
    from posexp.config.identity import run_hash
    from posexp.errors import TrainingInterrupted
    from posexp.data.corpus import BatchSampler

    overrides = [*SMOKE, "encoder=alibi", "device=cuda", "train.steps=8", "eval.multiples=[1]",
                 "eval.loss_by_position=false"]
    whole = run_train(compose(*overrides), tmp_path / "whole", overrides)["run"]["train"]
    assert whole["device"].startswith("cuda") and whole["compile"] is True and whole["precision"] == "bfloat16"
    sample = sigterm_at_step(monkeypatch, BatchSampler, "batch", 3)
    with pytest.raises(TrainingInterrupted):
        run_train(compose(*overrides), tmp_path / "resumed", overrides)
    monkeypatch.setattr(BatchSampler, "batch", sample)
    spec = check_config(compose(*overrides))
    resumed = train_run(spec, tmp_path / "resumed", overrides, resume=run_hash(spec))["run"]["train"]
    assert resumed["resumed_at"] == [4]
    assert resumed["final_loss"] == pytest.approx(whole["final_loss"], rel=1e-4)
