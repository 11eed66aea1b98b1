"""Devices and precision: the top-level keys, auto = bf16 only where it is native, fp32 perplexities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import SMOKE, run_cli
from posexp.validate import validate
from posexp.encoders import create
from posexp.errors import ConfigError
from posexp.evaluation.perplexity import evaluate
from posexp.model import GPT, ModelShape
from posexp.commands.train import run_train
from posexp.runtime import autocast, bf16_is_native, resolve_device, resolve_precision

CPU = torch.device("cpu")
TINY = ("experiment=smoke", "train.progress=false", "train.steps=4", "train.log_every=2", "eval.multiples=[1]",
        "eval.loss_by_position=false")


def test_top_level_keys_drive_the_train_keys(compose):
    cfg = compose("device=cpu", "precision=fp32")
    assert (cfg.train.device, cfg.train.precision) == ("cpu", "fp32")
    default = compose()
    assert (default.precision, default.train.precision, default.device, default.compile) == ("auto", "auto", "auto",
                                                                                             False)
    # the old keys are still accepted, and win over the top level
    old_style = compose("train.device=cpu", "train.precision=bf16", "compile=true")
    assert (old_style.train.device, old_style.train.precision, old_style.device) == ("cpu", "bf16", "auto")
    assert old_style.compile is True


@pytest.mark.parametrize("override,key,allowed", [
    ("device=gpu", "device", ("auto", "cpu", "cuda", "mps")),
    ("precision=fp16", "precision", ("auto", "fp32", "bf16")),
    ("train.device=tpu", "train.device", ("auto", "cpu", "cuda", "mps")),
    ("train.precision=half", "train.precision", ("auto", "fp32", "bf16")),
])
def test_unknown_device_or_precision_names_the_key_and_the_choices(compose, override, key, allowed):
    with pytest.raises(ConfigError) as err:
        validate(compose(override))
    assert err.value.key == key
    assert all(a in str(err.value) for a in allowed), str(err.value)


def test_cli_reports_a_bad_precision_in_one_line(tmp_path):
    proc = run_cli("train", *SMOKE, "precision=fp16", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "precision: unknown precision 'fp16'; choose one of: auto, fp32, bf16" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="no CUDA device") as err:
        resolve_device("cuda")
    assert err.value.key == "device"
    assert resolve_device("auto").type in ("cpu", "mps")


def test_auto_is_bf16_only_with_native_bf16_matmuls(monkeypatch):
    for flag in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, flag, lambda: False, raising=False)
    assert resolve_precision("auto", CPU) == torch.float32  # an AVX2 CPU converts bf16 back and forth: slow
    assert resolve_precision("bf16", CPU) == torch.bfloat16  # asked for explicitly: given
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert resolve_precision("auto", CPU) == torch.bfloat16
    assert resolve_precision("fp32", CPU) == torch.float32

    # a pre-Ampere GPU emulates bf16: torch.cuda.is_bf16_supported() says yes unless emulation is excluded
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert not bf16_is_native(torch.device("cuda"))
    assert resolve_precision("auto", torch.device("cuda")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_precision("auto", torch.device("mps")) == torch.float32


def test_auto_stays_fp32_on_a_cpu_without_bf16_hardware():
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert resolve_precision("auto", CPU) == (torch.bfloat16 if native else torch.float32)


def _tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelShape(d_model=32, n_layers=2, n_heads=2), create("rope", d_model=32, n_heads=2)).eval()


def test_losses_are_fp32_under_bf16_autocast():
    model = _tiny_model()
    idx = torch.randint(0, 256, (2, 17))
    with torch.no_grad(), autocast(CPU, torch.bfloat16):
        assert model(idx[:, :-1]).dtype == torch.bfloat16  # autocast is really on
        assert model.token_losses(idx[:, :-1], idx[:, 1:]).dtype == torch.float32


def test_bf16_evaluation_accumulates_in_fp32():
    """Same perplexity as fp32 to 1e-4 nats; summing the same losses in bf16 misses by far more."""
    model = _tiny_model()
    val = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(1), dtype=torch.uint8).numpy()
    kw = dict(tokens=4096, batch_tokens=1024, device=CPU)
    fp32 = evaluate(model, val, [64], 64, **kw)[0]
    bf16 = evaluate(model, val, [64], 64, dtype=torch.bfloat16, **kw)[0]
    assert bf16["tokens"] == fp32["tokens"] == 4096
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=1e-4)
    # what a bf16 accumulator would report: 8 mantissa bits stop the sum growing long before 4096 terms
    idx = np.arange(65)[None, :] + np.arange(0, 4096, 64)[:, None]
    batch = torch.from_numpy(val[idx].astype("int64"))
    with torch.no_grad():
        losses = model.token_losses(batch[:, :-1], batch[:, 1:]).flatten()
    total = torch.zeros((), dtype=torch.bfloat16)
    for x in losses.bfloat16():
        total += x
    assert abs(total.item() / losses.numel() - fp32["loss"]) > 100 * 1e-4


def test_bf16_training_records_its_precision(compose, tmp_path):
    overrides = [*TINY, "precision=bf16"]
    result = run_train(compose(*overrides), tmp_path / "bf16", overrides)
    train = result["run"]["train"]
    assert train["precision"] == "bfloat16" and train["processes"] == 1 and train["compile"] is False
    assert np.isfinite(train["final_loss"]) and result["rows"][0]["ppl"] > 1
    fp32 = run_train(compose(*TINY, "precision=fp32"), tmp_path / "fp32", list(TINY))
    assert fp32["run"]["train"]["precision"] == "float32"
    # the same run in bf16: close, not identical (bf16 rounds every matmul's inputs)
    assert train["final_loss"] == pytest.approx(fp32["run"]["train"]["final_loss"], abs=0.05)


@pytest.mark.slow
def test_compiled_training_matches_eager(compose, tmp_path):
    overrides = [*TINY, "device=cpu"]
    eager = run_train(compose(*overrides), tmp_path / "eager", overrides)
    compiled = run_train(compose(*overrides, "compile=true"), tmp_path / "compiled", [*overrides, "compile=true"])
    assert compiled["run"]["train"]["compile"] is True
    assert compiled["run"]["train"]["final_loss"] == pytest.approx(eager["run"]["train"]["final_loss"], abs=1e-3)
    assert compiled["rows"][0]["loss"] == pytest.approx(eager["rows"][0]["loss"], abs=1e-3)
