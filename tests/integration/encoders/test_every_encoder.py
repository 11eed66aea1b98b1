"""Every shipped ``configs/encoder/*.yaml`` trains and evaluates end to end.

A new encoding (one file + one yaml) is picked up here with no other edit: it
must compose with the schema, train a few steps through the real trainer,
checkpoint, and produce a finite perplexity at the training length and every
length it claims to support.
"""

from __future__ import annotations

import json
import math

import pytest

from posexp.config.schema import config_dir
from posexp.commands.train import run_train

ENCODERS = sorted(p.stem for p in (config_dir() / "encoder").glob("*.yaml"))
TINY = ("train.steps=6", "train.log_every=3", "eval.tokens=256",
        "eval.multiples=[1,4]", "eval.loss_by_position=false")


def test_the_family_is_all_there():
    # the six of the core loop and the rest of the family; a yaml that disappears is a regression
    assert {"none", "sinusoidal", "learned", "rope", "alibi", "t5"} <= set(ENCODERS)
    assert len(ENCODERS) >= 18


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_trains_and_evaluates_end_to_end(tiny, tmp_path, name):
    overrides = [*TINY, f"encoder={name}"]
    results = run_train(tiny(*overrides), tmp_path, overrides)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["rows"] == results["rows"]
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    train_len = results["run"]["train_len"]
    rows = {r["length"]: r for r in results["rows"]}
    assert set(rows) == {train_len, 4 * train_len}
    assert rows[train_len]["applicable"], f"{name} must run at its own training length"
    for row in rows.values():
        if row["applicable"]:
            assert math.isfinite(row["ppl"]) and 1 < row["ppl"] < 256 * 4, (name, row)
        else:
            assert row["ppl"] is None and row["reason"], (name, row)
    # the loss went down from the uniform 5.55 nats of an untrained byte model
    assert results["run"]["train"]["final_loss"] < math.log(256)


@pytest.mark.parametrize("name", ENCODERS)
def test_a_training_step_of_every_encoder_compiles_as_one_graph(compose, name):
    """On CUDA the step is compiled (``compile=auto``); a graph break inside it splits the step and, where a
    value is read back to Python (a position range check reading ``pos.max()``), synchronises with the host
    every step. Dynamo's tracing alone (``backend="eager"``, ``fullgraph=True``) finds both, on any machine."""
    import torch

    from posexp.commands.edge import typed
    from posexp.model.factory import build_model

    model = build_model(typed(compose(f"encoder={name}", "model.d_model=32", "model.n_heads=4",
                                      "model.n_layers=2")), 64).train()
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    step = torch.compile(lambda i: model.token_losses(i[:, :-1], i[:, 1:]).mean(), backend="eager", fullgraph=True)
    step(idx).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_learned_position_out_of_range_is_named_outside_compiled_code(compose):
    import torch

    from posexp.commands.edge import typed
    from posexp.model.factory import build_encoder

    enc = build_encoder(typed(compose("encoder=learned", "model.d_model=32", "model.n_heads=4")))
    with pytest.raises(ValueError, match=rf"cover positions 0\.\.{enc.max_length - 1}, got positions 3\.\.{enc.max_length}"):
        enc.embed(torch.zeros(1, 2, 32), torch.tensor([3, enc.max_length]))


def _needs_cuda(test):
    import torch

    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


@_needs_cuda
@pytest.mark.parametrize("name", ENCODERS)
def test_every_encoder_trains_and_evaluates_on_cuda_in_bf16(tiny, tmp_path, name):
    """The CUDA defaults (bf16 autocast, FlexAttention for the bias encodings) on every shipped encoding, eager so
    that a whole family fits one device call: a tensor made on the CPU inside an encoder, a dtype the fused kernel
    refuses or a kernel that returns NaN in bf16 shows here and in no CPU test."""
    overrides = [*TINY, f"encoder={name}", "device=cuda", "precision=auto", "compile=false"]
    results = run_train(tiny(*overrides), tmp_path, overrides)
    train = results["run"]["train"]
    assert train["device"].startswith("cuda") and train["precision"] == "bfloat16"
    assert train["final_loss"] < math.log(256), train
    for row in results["rows"]:
        assert not row["applicable"] or (math.isfinite(row["ppl"]) and 1 < row["ppl"] < 256 * 4), (name, row)
