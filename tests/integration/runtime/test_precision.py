"""Devices and precision: the top-level keys, auto = bf16 only where it is native and (on a CPU) measured faster,
fp32 perplexities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import TINY_RUN, invoke_main
from posexp.commands.validation import validate
from posexp.encoders import create
from posexp.errors import ConfigError
from helpers import evaluate_at
from posexp.model.gpt import GPT, ModelShape
from posexp.commands.train import run_train
from posexp.runtime.precision import bf16_is_native, choose_precision, resolve_precision
from posexp.runtime.device import autocast, resolve_device
from posexp.training.precision import BF16_MARGIN, measured_cpu_precision, training_precision
from posexp.commands.edge import typed

CPU = torch.device("cpu")
TINY = ("train.steps=4", "train.log_every=2", "eval.multiples=[1]", "eval.loss_by_position=false")  # on helpers.TINY_RUN


def test_top_level_keys_drive_the_train_keys(compose):
    cfg = compose("device=cpu", "precision=fp32")
    assert (cfg.train.device, cfg.train.precision) == ("cpu", "fp32")
    default = compose()
    assert (default.precision, default.train.precision, default.device, default.compile) == ("auto", "auto", "auto",
                                                                                             "auto")
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
        validate(typed(compose(override)))
    assert err.value.key == key
    assert all(a in str(err.value) for a in allowed), str(err.value)


def test_cli_reports_a_bad_precision_in_one_line(tmp_path):
    proc = invoke_main("train", *TINY_RUN, "precision=fp16", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.exit_code != 0 and isinstance(proc.exception, SystemExit), repr(proc.exception)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "precision: unknown precision 'fp16'; choose one of: auto, fp32, bf16" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="no CUDA device") as err:
        resolve_device("cuda")
    assert err.value.key == "device"
    assert resolve_device("auto").type in ("cpu", "mps")


def _native_cpu_bf16(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)


def test_auto_is_bf16_only_with_native_bf16_matmuls(monkeypatch):
    _native_cpu_bf16(monkeypatch, False)
    assert resolve_precision("auto", CPU) == torch.float32  # an AVX2 CPU converts bf16 back and forth: slow
    assert resolve_precision("bf16", CPU) == torch.bfloat16  # asked for explicitly: given
    assert choose_precision("auto", CPU, measure=lambda: pytest.fail("an AVX2 CPU is never probed")).dtype \
        == torch.float32
    _native_cpu_bf16(monkeypatch, True)
    # bf16 instructions are no promise of speed: without a measurement a CPU's auto is fp32
    assert resolve_precision("auto", CPU) == torch.float32
    assert resolve_precision("fp32", CPU) == torch.float32

    # a pre-Ampere GPU emulates bf16: torch.cuda.is_bf16_supported() says yes unless emulation is excluded
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert not bf16_is_native(torch.device("cuda"))
    assert resolve_precision("auto", torch.device("cuda")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_precision("auto", torch.device("mps")) == torch.float32


class FakeWork:
    """A probe and a clock: each probe call takes ``seconds[dtype]`` of the fake clock's time (or, given lists,
    the next of them)."""

    def __init__(self, fp32, bf16):
        self.seconds = {torch.float32: fp32, torch.bfloat16: bf16}
        self.now, self.calls = 0.0, []

    def probe(self, dtype):
        self.calls.append(dtype)
        took = self.seconds[dtype]
        self.now += took.pop(0) if isinstance(took, list) else took

    def clock(self):
        return self.now


@pytest.mark.parametrize("fp32,bf16,chosen", [
    (1.0, 0.5, torch.bfloat16),  # an AMX CPU: bf16 twice as fast
    (1.0, 1.6, torch.float32),  # AVX512-BF16 without AMX, as measured on a Xeon: bf16 0.63x
    (1.0, 0.97, torch.float32),  # within the margin: fp32, the reference numerics, wins the tie
])
def test_a_cpus_auto_is_the_precision_measured_faster(monkeypatch, fp32, bf16, chosen):
    _native_cpu_bf16(monkeypatch, True)
    work = FakeWork(fp32, bf16)
    choice = measured_cpu_precision(work.probe, {"d_model": 8}, cache_dir=None, clock=work.clock)
    assert choice.dtype == chosen and choice.asked == "auto"
    assert work.calls.count(torch.float32) == work.calls.count(torch.bfloat16) == 4  # a warm-up + 3 rounds each
    assert work.calls[2:] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32, torch.float32,
                              torch.bfloat16]  # interleaved, the order alternating
    record = choice.record()
    assert record["dtype"] == str(chosen).replace("torch.", "") and record["probe"]["seconds"]["float32"] == [fp32] * 3
    assert f"{fp32 * 1e3:.1f} ms in fp32, {bf16 * 1e3:.1f} ms in bf16" in record["reason"]
    assert BF16_MARGIN == 0.95


def test_bf16_has_to_win_every_round(monkeypatch):
    """Rounds disturbed by other processes (seen on a loaded 2-core machine, wall clock) do not make bf16 the
    choice because its luckiest round beat fp32's."""
    _native_cpu_bf16(monkeypatch, True)
    # a warm-up each, then three rounds
    work = FakeWork([0.4, 0.43, 1.4, 0.97], [0.5, 1.48, 1.34, 0.38])
    choice = measured_cpu_precision(work.probe, {"d_model": 8}, cache_dir=None, clock=work.clock)
    assert min(choice.probe["seconds"]["bfloat16"]) < BF16_MARGIN * min(choice.probe["seconds"]["float32"])
    assert choice.dtype == torch.float32 and "not 5% faster in every round" in choice.reason
    work = FakeWork([1.0, 1.0, 3.0, 1.0], [0.5, 0.5, 0.5, 0.5])
    assert measured_cpu_precision(work.probe, {"d_model": 8}, cache_dir=None, clock=work.clock).dtype \
        == torch.bfloat16


def test_a_tiny_workload_repeats_its_probe_within_a_round(monkeypatch):
    _native_cpu_bf16(monkeypatch, True)
    work = FakeWork(0.001, 0.002)  # 1 ms: 50 calls make a round of the probe's minimum 50 ms
    choice = measured_cpu_precision(work.probe, {"d_model": 8}, cache_dir=None, clock=work.clock)
    assert work.calls.count(torch.float32) == 1 + 3 * 50
    assert choice.probe["seconds"]["float32"] == [0.001] * 3 and choice.dtype == torch.float32


def test_a_measured_choice_is_cached_per_machine_and_workload(monkeypatch, tmp_path):
    _native_cpu_bf16(monkeypatch, True)
    fast_bf16 = FakeWork(1.0, 0.5)
    first = measured_cpu_precision(fast_bf16.probe, {"d_model": 8}, tmp_path, clock=fast_bf16.clock)
    assert first.dtype == torch.bfloat16 and not first.probe["cached"]
    slow_bf16 = FakeWork(1.0, 2.0)
    again = measured_cpu_precision(slow_bf16.probe, {"d_model": 8}, tmp_path, clock=slow_bf16.clock)
    assert first.dtype == again.dtype and not slow_bf16.calls  # read, not measured: the same choice
    assert again.probe["cached"] and "read from" in again.reason and again.probe["file"] == first.probe["file"]
    other = measured_cpu_precision(slow_bf16.probe, {"d_model": 16}, tmp_path, clock=slow_bf16.clock)
    assert other.dtype == torch.float32 and slow_bf16.calls  # another workload is measured for itself
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        fresh = FakeWork(1.0, 2.0)
        measured_cpu_precision(fresh.probe, {"d_model": 8}, tmp_path, clock=fresh.clock)
        assert fresh.calls  # another thread count is another machine
    finally:
        torch.set_num_threads(threads)


def test_the_probe_leaves_weights_gradients_and_rng_as_found(monkeypatch, compose, tmp_path):
    _native_cpu_bf16(monkeypatch, True)
    model = GPT(ModelShape(d_model=32, n_layers=2, n_heads=2, dropout=0.1), create("alibi", d_model=32, n_heads=2))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    spec = compose("precision=auto", "train.batch_size=4")
    choice = training_precision(model, spec.train, 16, CPU, cache_dir=tmp_path)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert choice.probe["workload"]["rows"] == 4 and choice.probe["workload"]["encoder"] == "alibi"
    assert (tmp_path / "precision").is_dir()
    resumed = training_precision(model, spec.train, 16, CPU, saved="bfloat16", cache_dir=tmp_path)
    assert resumed.dtype == torch.bfloat16 and "resumed" in resumed.reason  # a resumed run keeps its choice


def test_evaluation_keeps_the_precision_the_run_trained_in(compose, monkeypatch):
    from posexp.evaluation.runner import eval_dtype

    auto, fp32 = compose("precision=auto"), compose("precision=fp32")
    _native_cpu_bf16(monkeypatch, True)
    assert eval_dtype(auto, CPU, "bfloat16") == torch.bfloat16  # measured faster when it trained
    assert eval_dtype(auto, CPU, "float32") == torch.float32
    assert eval_dtype(auto, CPU, None) == torch.float32  # a run that does not say: fp32 without a measurement
    assert eval_dtype(fp32, CPU, "bfloat16") == torch.float32  # asked for: what was asked
    _native_cpu_bf16(monkeypatch, False)
    assert eval_dtype(auto, CPU, "bfloat16") == torch.float32  # a bf16 GPU run, evaluated where bf16 is emulated


def test_auto_stays_fp32_on_a_cpu_without_a_measurement():
    assert resolve_precision("auto", CPU) == torch.float32


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
    fp32 = evaluate_at(model, val, [64], 64, **kw)[0]
    bf16 = evaluate_at(model, val, [64], 64, dtype=torch.bfloat16, **kw)[0]
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


def test_bf16_training_records_its_precision(tiny, tmp_path):
    overrides = [*TINY, "precision=bf16"]
    result = run_train(tiny(*overrides), tmp_path / "bf16", overrides)
    train = result["run"]["train"]
    assert train["precision"] == "bfloat16" and train["processes"] == 1 and train["compile"] is False
    assert np.isfinite(train["final_loss"]) and result["rows"][0]["ppl"] > 1
    fp32 = run_train(tiny(*TINY, "precision=fp32"), tmp_path / "fp32", list(TINY))
    assert fp32["run"]["train"]["precision"] == "float32"
    assert train["precision_choice"] == {"asked": "bf16", "dtype": "bfloat16", "reason": "asked for" + (
        "" if bf16_is_native(CPU) else "; cpu has no native bf16 matmuls, it emulates them")}
    # the same run in bf16: close, not identical (bf16 rounds every matmul's inputs)
    assert train["final_loss"] == pytest.approx(fp32["run"]["train"]["final_loss"], abs=0.05)


def test_auto_trains_and_evaluates_in_the_precision_it_measured_faster(tiny, tmp_path):
    result = run_train(tiny(*TINY, "device=cpu", "precision=auto"), tmp_path / "auto", list(TINY))
    train = result["run"]["train"]
    choice = train["precision_choice"]
    assert choice["asked"] == "auto" and choice["dtype"] == train["precision"]
    if bf16_is_native(CPU):  # measured: bf16 only if faster by the margin in every round, else fp32
        seconds = choice["probe"]["seconds"]
        bf16_wins = all(b <= BF16_MARGIN * f for f, b in zip(seconds["float32"], seconds["bfloat16"]))
        assert train["precision"] == ("bfloat16" if bf16_wins else "float32"), choice["reason"]
    else:
        assert train["precision"] == "float32" and "probe" not in choice


@pytest.mark.slow
def test_compiled_training_matches_eager(tiny, tmp_path):
    overrides = [*TINY, "device=cpu"]
    eager = run_train(tiny(*overrides), tmp_path / "eager", overrides)
    compiled = run_train(tiny(*overrides, "compile=true"), tmp_path / "compiled", [*overrides, "compile=true"])
    assert compiled["run"]["train"]["compile"] is True
    assert compiled["run"]["train"]["final_loss"] == pytest.approx(eager["run"]["train"]["final_loss"], abs=1e-3)
    assert compiled["rows"][0]["loss"] == pytest.approx(eager["rows"][0]["loss"], abs=1e-3)
