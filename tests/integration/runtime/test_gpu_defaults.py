"""What a training step does on each device: compiled, TF32 and pinned batches on CUDA, today's CPU step unchanged.

The choices are plain functions of the device and the settings, tested here on any machine; the ``cuda``
tests run the step on a GPU and skip cleanly without one.
"""

from __future__ import annotations

import pytest
import torch

from helpers import SMOKE, TINY_RUN
from posexp.config.identity import config_hash, weights_config
from posexp.errors import ConfigError
from posexp.runtime.precision import choose_precision
from posexp.runtime.device import step_settings
from posexp.commands.validation import validate
from posexp.commands.edge import typed

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_cuda_compiles_pins_and_allows_tf32_by_default():
    on_gpu = step_settings(CUDA, "auto")
    assert (on_gpu.compile, on_gpu.tf32, on_gpu.pin_memory) == (True, True, True)
    assert step_settings(CUDA, False).compile is False  # compile=false switches it off
    assert step_settings(CUDA, False).tf32 and step_settings(CUDA, False).pin_memory


def test_the_cpu_step_is_what_it_was():
    assert step_settings(CPU, "auto") == step_settings(CPU, False)
    on_cpu = step_settings(CPU, "auto")
    assert (on_cpu.compile, on_cpu.tf32, on_cpu.pin_memory) == (False, False, False)
    assert step_settings(CPU, True).compile is True  # asked for: compiled
    assert step_settings(torch.device("mps"), "auto").compile is False


def test_bf16_autocast_where_the_gpu_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    choice = choose_precision("auto", CUDA, measure=lambda: pytest.fail("a GPU's auto is not probed"))
    assert choice.dtype == torch.bfloat16 and "natively" in choice.reason


@pytest.mark.parametrize("value", ["maybe", 1, 0.5])
def test_compile_is_auto_true_or_false(compose, value):
    with pytest.raises(ConfigError) as err:
        validate(typed(compose(f"compile={value}")))
    assert err.value.key == "compile" and "auto, true or false" in str(err.value)


def test_compile_auto_keeps_the_cache_key_and_hash_of_compile_false(compose):
    """Trainings cached before compile=auto (all of them with compile false) are still found."""
    default, eager = typed(compose()), typed(compose("compile=false"))
    assert default.compile == "auto"
    assert weights_config(default) == weights_config(eager)
    assert config_hash(default) == config_hash(eager)
    assert weights_config(typed(compose("compile=true"))) != weights_config(eager)


def test_default_cpu_run_records_an_eager_fp32_step_without_tf32(compose, tmp_path):
    from posexp.commands.train import run_train

    overrides = [*TINY_RUN, "device=cpu", "train.steps=2", "eval.multiples=[1]", "eval.loss_by_position=false"]
    train = run_train(compose(*overrides), tmp_path, overrides)["run"]["train"]
    assert train["compile"] is False and "tf32" not in train


# -- on a GPU --------------------------------------------------------------------------------------------

def on_cuda(test):
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


@on_cuda
@pytest.mark.parametrize("encoder", ["rope", "alibi", "t5"])
def test_a_cuda_step_makes_no_host_sync(compose, encoder):
    """After a warm-up step, a whole eager training step (batch copy, forward, backward, clip, fused AdamW)
    runs under CUDA's sync debug mode set to error."""
    from posexp.model.factory import build_model
    from posexp.data.corpus import BatchSampler
    from posexp.model.positions import PositionPlan
    from posexp.runtime.device import Placement, step_settings, world
    from posexp.runtime.precision import PrecisionChoice
    from posexp.training.optim import make_optimizer
    from posexp.training.trainer import StopOnSignal, TrainStep, loss_module

    cfg = typed(compose(*SMOKE, f"encoder={encoder}"))
    model = build_model(cfg, 256).to(CUDA).train()
    opt = make_optimizer(model, cfg.train)
    assert opt.defaults.get("fused") is True  # the fused AdamW kernel on CUDA
    tokens = torch.randint(0, 256, (10_000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8).numpy()
    sampler = BatchSampler(tokens, int(cfg.train_len), int(cfg.train.batch_size), 0)
    placement = Placement(CUDA, world(), step_settings(CUDA, compile=False),
                          PrecisionChoice(torch.bfloat16, "bf16", "asked for"))
    assert placement.settings.pin_memory  # batches come from pinned memory on CUDA
    step = TrainStep(model, loss_module(model, CUDA), opt, sampler, PositionPlan(cfg), cfg.train, placement)
    step(0, StopOnSignal())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step(1, StopOnSignal())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.loss).item()


@on_cuda
def test_tf32_is_allowed_for_a_cuda_run(compose, tmp_path):
    from posexp.commands.train import run_train

    overrides = [*SMOKE, "device=cuda", "precision=fp32", "compile=false", "train.steps=2", "eval.multiples=[1]"]
    train = run_train(compose(*overrides), tmp_path, overrides)["run"]["train"]
    assert train["tf32"] is True and train["compile"] is False and torch.backends.cuda.matmul.allow_tf32
