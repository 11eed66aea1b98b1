"""The trainer: AdamW, linear warmup then cosine decay, gradient clipping, seeded.

Writes ``metrics.csv`` (step, tokens, loss, lr, tokens_per_s, elapsed_s) while it
runs, and resumable checkpoints (:mod:`posexp.checkpoint`) every
``train.checkpoint_every`` steps / ``train.checkpoint_minutes`` minutes, on SIGINT
or SIGTERM, and when training ends. A resumed run takes the same steps on the
same batches with the same RNG states as an uninterrupted one, so on the same
machine and thread count it ends with bitwise the same weights.

Devices and precision: ``device=auto|cpu|cuda|mps``; ``precision=auto|fp32|bf16``
runs the forward pass under bf16 autocast (weights, gradients and optimizer state
stay fp32; the loss is computed in fp32), ``auto`` only where the hardware has
native bf16 matmuls (:func:`bf16_is_native`). ``compile=true`` trains through
``torch.compile`` (evaluation stays eager: its lengths vary).

Several processes (``torchrun``, :mod:`posexp.distributed`): each rank trains on
its slice of the same global batch under DistributedDataParallel; losses are
averaged over the ranks every step, so every rank logs, checkpoints and stops on
the same numbers, and only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from posexp.training.checkpoint import CHECKPOINT_DIR, WEIGHTS_FILE, load_resume, rng_states, save_final, save_resume
from posexp.training.checkpoint import set_rng_states
from posexp.config import config_hash
from posexp.data.corpus import BatchSampler, Corpus
from posexp.training.distributed import shard, world
from posexp.errors import ConfigError, TrainingDiverged, TrainingInterrupted
from posexp.io import atomic_write_text
from posexp.model import GPT
from posexp.positions import PositionPlan

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_DIR", "WEIGHTS_FILE", "TrainResult", "lr_at", "save_checkpoint", "train"]


def resolve_device(name: str, key: str = "device") -> torch.device:
    """``auto`` = cuda, else mps, else cpu. Under torchrun each process takes the CUDA device of its ``LOCAL_RANK``.

    Args:
        name: ``auto``, ``cpu``, ``cuda`` or ``mps``.
        key: the config key the name came from, for the error message.

    Raises:
        ConfigError: a device torch cannot see, or fewer CUDA devices than processes on this node.
    """

    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(key, "cuda was asked for but torch sees no CUDA device; use auto or cpu")
        w = world()
        if w.distributed:
            if w.local_rank >= torch.cuda.device_count():
                raise ConfigError(key, f"process LOCAL_RANK={w.local_rank} needs a CUDA device of its own but "
                                       f"torch sees {torch.cuda.device_count()}; start at most that many "
                                       "processes per node (torchrun --nproc_per_node)")
            torch.cuda.set_device(w.local_rank)
            return torch.device("cuda", w.local_rank)
        return torch.device("cuda")
    if name == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise ConfigError(key, "mps was asked for but torch sees no Apple GPU; use auto or cpu")
    return torch.device(name)


def bf16_is_native(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware, so bf16 autocast is faster than fp32.

    CUDA: compute capability 8.0 or newer (Ampere); older GPUs only emulate bf16,
    which ``torch.cuda.is_bf16_supported()`` counts unless told not to. CPU:
    x86 with AVX512-BF16 or AMX; without them (AVX2 machines) oneDNN converts
    every bf16 matmul back and forth, many times slower than fp32. MPS: bf16
    depends on the macOS version and chip and is not fast on M1/M2, so fp32.
    """
    if device.type == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch < 2.3 has no including_emulation and counts native support only
            return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool((probe is not None and probe()) or (amx is not None and amx()))
    return False


def resolve_precision(name: str, device: torch.device) -> torch.dtype:
    """``fp32``, ``bf16``, or ``auto`` = bf16 where the hardware runs it natively, else fp32."""
    if name == "bf16" or (name == "auto" and bf16_is_native(device)):
        return torch.bfloat16
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the forward pass: matmuls in ``dtype``, the weights and optimizer state stay fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class TokenLosses(torch.nn.Module):
    """``model.token_losses`` as a module's forward, so DistributedDataParallel and torch.compile can wrap it."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.model.token_losses(idx, targets, pos)  # (B, L) nats, fp32


def loss_module(model: GPT, device: torch.device, compiled: bool = False) -> torch.nn.Module:
    """What the training step calls: the model's token losses, data-parallel under torchrun, compiled on request.

    Raises:
        ConfigError: ``compile=true`` where torch.compile cannot run.
    """

    net: torch.nn.Module = TokenLosses(model)
    if world().distributed:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    if compiled:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            raise ConfigError("compile", "torch.compile does not support this Python / torch build; "
                                         "drop compile=true")
        net = torch.compile(net)  # compiled at the first step (about 20 s on a CPU), then reused
    return net


def lr_at(step: int, cfg: DictConfig) -> float:
    """Linear warmup to ``train.lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    floor = t.lr * t.min_lr_ratio
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: DictConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters, on the device they are on (move the model first).

    The fused kernel (one pass per tensor) where this torch has it for the device, else the
    foreach one: the same update up to float rounding, about 4x less optimizer time on CPU
    (7 vs 30 ms CPU per step at d_model 256, 4 layers). scripts/bench.py gives the models it
    compares this same optimizer.
    """
    # No weight decay on gains, biases and embeddings of positions (GPT-2 / nanoGPT convention).
    # An encoder's parameters take its lr_mult: one group per multiplier, the schedule scales each.
    from posexp.encoders.base import PositionalEncoder

    owners = {name: m.lr_mult for name, m in model.named_modules() if isinstance(m, PositionalEncoder)}
    decay: list = []
    by_mult: dict[float, list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.startswith("encoder."):
            # the innermost encoder holding the parameter decides (a mixed encoder's parts keep theirs)
            prefix = max((o for o in owners if name.startswith(o + ".")), key=len)
            by_mult.setdefault(float(owners[prefix]), []).append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            by_mult.setdefault(1.0, []).append(p)
    groups = [{"params": decay, "weight_decay": cfg.train.weight_decay, "lr_mult": 1.0}]
    groups += [{"params": ps, "weight_decay": 0.0, "lr_mult": mult} for mult, ps in sorted(by_mult.items())]
    hyper = {"lr": cfg.train.lr, "betas": (cfg.train.beta1, cfg.train.beta2)}
    try:
        return torch.optim.AdamW(groups, fused=True, **hyper)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this torch or device
        return torch.optim.AdamW(groups, foreach=True, **hyper)


@dataclass
class TrainResult:
    steps: int
    tokens: int
    final_loss: float
    wall_s: float
    tokens_per_s: float
    precision: str
    device: str
    resumed_at: list[int] = field(default_factory=list)  # steps a resumed run continued from
    processes: int = 1  # data-parallel ranks (torchrun); the batch is the global one
    compiled: bool = False


class MetricsWriter:
    """Appends rows to ``metrics.csv`` and flushes each one, so a killed run keeps its curve.

    Args:
        path: the CSV file.
        resume_step: when resuming, the step of the checkpoint: rows after it (they will be
            trained again) and a half-written last line are dropped first, so the file ends up
            with one row per logged step, as if the run had never stopped.
    """

    COLUMNS = ["step", "tokens", "loss", "lr", "tokens_per_s", "elapsed_s"]

    def __init__(self, path: Path, resume_step: Optional[int] = None):
        self.path = path
        if resume_step is not None and path.exists():
            atomic_write_text(path, self._rows_through(path, resume_step))
        new = not path.exists() or path.stat().st_size == 0
        self._f = open(path, "a", newline="")
        self._w = csv.writer(self._f)
        if new:
            self._w.writerow(self.COLUMNS)

    @classmethod
    def _rows_through(cls, path: Path, step: int) -> str:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()  # the write a kill interrupted
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cls.COLUMNS)
        for row in csv.reader(lines[1:]):
            if len(row) == len(cls.COLUMNS) and row[0].isdigit() and int(row[0]) <= step:
                w.writerow(row)
        return buf.getvalue()

    def write(self, **row) -> None:
        self._w.writerow([row[c] for c in self.COLUMNS])
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def save_checkpoint(model: GPT, run_dir: Path, meta: dict) -> Path:
    """The final weights, ``checkpoint/model.safetensors``, with ``meta.json``; see :func:`posexp.checkpoint.save_final`."""
    return save_final(model, run_dir, meta)


class StopOnSignal:
    """Turn the first SIGINT/SIGTERM into a request to stop after the current step.

    The handlers are the previous ones again after the first signal, so a second
    Ctrl-C stops at once. Outside the main thread (where Python cannot install
    handlers) this does nothing.
    """

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                signum = getattr(signal, name, None)
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __exit__(self, *exc) -> None:
        self._restore()


def train(model: GPT, corpus: Corpus, cfg: DictConfig, run_dir: Path,
          console: Optional[Console] = None, resume: bool = False) -> TrainResult:
    """Train ``model`` on ``corpus.train`` for ``cfg.train.steps`` steps of ``batch_size x train_len`` tokens.

    Args:
        resume: continue from the run folder's latest resumable checkpoint (from step 0 if it has none).

    Raises:
        TrainingDiverged: the loss became NaN or infinite; the last checkpoint before it is kept.
        TrainingInterrupted: SIGINT or SIGTERM; the finished step was checkpointed.
        PosexpError: a resumable checkpoint that cannot be used.
    """
    t = cfg.train
    w = world()
    device = resolve_device(t.device)
    dtype = resolve_precision(t.precision, device)
    rows = shard(t.batch_size, w)  # this process's slice of every global batch (all of it in one process)
    model.to(device).train()
    net = loss_module(model, device, compiled=bool(cfg.get("compile", False)))
    opt = make_optimizer(model, cfg)
    sampler = BatchSampler(corpus.train, cfg.train_len, t.batch_size, cfg.seed)
    plan = PositionPlan(cfg)  # randomized positions / length curriculum; both off by default
    console = console or Console(stderr=True)
    if t.precision == "bf16" and not bf16_is_native(device) and w.is_main:
        note = (f"precision=bf16 on {device}, which has no native bf16 matmul: expect it to be much slower than "
                "fp32 (precision=auto picks the faster one)")
        log.warning(note)
        console.print(f"[yellow]{note}[/]", highlight=False)
    chash = config_hash(cfg)
    every = int(t.get("checkpoint_every", 0) or 0)
    every_s = float(t.get("checkpoint_minutes", 0) or 0) * 60

    running = torch.zeros((), device=device)  # loss summed since the last metrics row
    first_bad = torch.full((), -1, dtype=torch.long, device=device)  # first step with a non-finite loss
    bad_value = torch.zeros((), device=device)
    start_step, seen, last_step, loss_value, elapsed_before, resumed_at = 0, 0, 0, float("nan"), 0.0, []
    saved = load_resume(run_dir, model, opt, chash, device) if resume else None
    if saved is not None:
        start_step, seen, last_step = int(saved["step"]), int(saved["tokens"]), int(saved["last_logged_step"])
        loss_value, elapsed_before = float(saved["loss"]), float(saved["elapsed_s"])
        running = saved["running_loss"].to(device)
        resumed_at = [*saved.get("resumed_at", []), start_step]
        if saved.get("threads") not in (None, torch.get_num_threads()):
            log.warning("resuming with %d threads, the run started with %s: the numbers may differ in the "
                        "last digits from an uninterrupted run", torch.get_num_threads(), saved["threads"])
        set_rng_states(saved["rng"])
        log.info("resumed at step %d of %d", start_step, t.steps)
    elif resume:
        resumed_at = [0]
        log.info("no resumable checkpoint yet; training from step 0")
    # only rank 0 writes; the others keep the same numbers, and so take the same decisions
    metrics = MetricsWriter(run_dir / "metrics.csv", resume_step=start_step if resume else None) if w.is_main else None

    def check_finite() -> None:
        bad = int(first_bad.item())
        if bad >= 0:
            raise TrainingDiverged(bad, f"training diverged: the loss was {bad_value.item()} at step {bad} "
                                        f"(lr {lr_at(bad - 1, cfg):.3g}); {kept_text()}. Try a lower train.lr, or "
                                        "train.grad_clip=1.0 if clipping was off")

    def kept_text() -> str:
        return (f"the last good checkpoint, step {saved_step}, is kept in {run_dir / CHECKPOINT_DIR}"
                if saved_step is not None else "no checkpoint was written before it")

    def checkpoint(done: int) -> None:
        nonlocal saved_step, last_save
        # never save weights a NaN went into: the loss shows this step's update only at the next step
        check_finite()
        if not torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all().item():
            raise TrainingDiverged(done, f"training diverged: the weights became NaN or infinite at step {done} "
                                         f"(lr {lr_at(done - 1, cfg):.3g}); {kept_text()}. Try a lower "
                                         "train.lr, or train.grad_clip=1.0 if clipping was off")
        state = {"step": done, "tokens": seen, "last_logged_step": last_step, "loss": loss_value,
                 "running_loss": running.detach().cpu(), "optimizer": opt.state_dict(), "rng": rng_states(),
                 "elapsed_s": elapsed_before + time.perf_counter() - start, "resumed_at": resumed_at,
                 "threads": torch.get_num_threads()}
        if w.is_main:
            save_resume(run_dir, model, state, chash)
        saved_step, last_save = done, time.perf_counter()
        log.info("checkpoint at step %d", done)

    progress = Progress(
        TextColumn("[bold]train[/] {task.fields[encoder]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, disable=not t.progress or not w.is_main, transient=False,
    )
    saved_step: Optional[int] = start_step if saved is not None else None
    interval_tokens = 0  # tokens trained since the last metrics row
    start = last_time = last_save = time.perf_counter()
    done, signum = start_step, None
    try:
        with progress, StopOnSignal() as stop:
            task = progress.add_task("train", total=t.steps, completed=start_step, encoder=cfg.encoder.name,
                                     loss="-", tps="-")
            for step in range(start_step, t.steps):
                lr = lr_at(step, cfg)
                for group in opt.param_groups:
                    group["lr"] = lr * group.get("lr_mult", 1.0)
                length = plan.length_at(step)
                batch = sampler.batch(step)[rows, :length + 1]  # a curriculum trains on each window's first tokens
                batch = torch.from_numpy(batch.astype("int64")).to(device, non_blocking=True)
                pos = plan.train_positions(step, length, device)
                with autocast(device, dtype):
                    loss = net(batch[:, :-1], batch[:, 1:], pos).mean()
                loss.backward()
                if t.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss = loss.detach()
                signum = stop.received
                if w.distributed:  # the global batch's mean loss, and a signal to any rank stops them all
                    loss, signum = global_loss_and_signal(loss, signum, w.size)
                # recorded on the device, read at the next host sync: no sync per step
                newly_bad = (first_bad < 0) & ~torch.isfinite(loss)
                first_bad = torch.where(newly_bad, step + 1, first_bad)
                bad_value = torch.where(newly_bad, loss.float(), bad_value)
                running += loss
                seen += t.batch_size * length
                interval_tokens += t.batch_size * length
                done = step + 1
                if done % t.log_every == 0 or done == t.steps:
                    check_finite()
                    loss_value = (running / (done - last_step)).item()  # the one host sync per interval
                    now = time.perf_counter()
                    tps = interval_tokens / (now - last_time)
                    if metrics is not None:
                        metrics.write(step=done, tokens=seen, loss=f"{loss_value:.6f}", lr=f"{lr:.6g}",
                                      tokens_per_s=f"{tps:.1f}", elapsed_s=f"{elapsed_before + now - start:.3f}")
                    log.info("step %d loss %.4f lr %.3g tokens/s %.0f", done, loss_value, lr, tps)
                    progress.update(task, completed=done, loss=f"{loss_value:.3f}", tps=f"{tps:,.0f}")
                    running.zero_()
                    last_step, last_time, interval_tokens = done, now, 0
                if signum is not None:
                    break  # checkpointed below
                if done < t.steps and ((every and done % every == 0) or
                                       (every_s and time.perf_counter() - last_save >= every_s)):
                    checkpoint(done)
            if saved_step != done:
                checkpoint(done)  # the end of training, or the step a signal arrived in
            if not w.distributed:
                signum = stop.received  # also one that arrived during the last checkpoint
    finally:
        if metrics is not None:
            metrics.close()
    if signum is not None:
        name = signal.Signals(signum).name
        raise TrainingInterrupted(f"{name} at step {done} of {t.steps}: checkpoint saved in "
                                  f"{run_dir / CHECKPOINT_DIR}; continue with: posexp resume {run_dir}",
                                  exit_code=128 + signum)
    wall = elapsed_before + time.perf_counter() - start
    model.eval()
    return TrainResult(steps=t.steps, tokens=seen, final_loss=loss_value, wall_s=wall,
                       tokens_per_s=seen / wall if wall > 0 else 0.0, precision=str(dtype).replace("torch.", ""),
                       device=str(device), resumed_at=resumed_at, processes=w.size,
                       compiled=bool(cfg.get("compile", False)))


def global_loss_and_signal(loss: torch.Tensor, signum: Optional[int], processes: int) -> tuple[torch.Tensor, Optional[int]]:
    """The mean of every rank's loss (the global batch's loss: the slices are equal), and the signal any rank got.

    All ranks then hold the same numbers, so they log, detect divergence and stop at the same step.
    Costs an all-reduce, an all-gather of one number and one host sync per step, only with several processes.
    """
    import torch.distributed as dist

    total = loss.float().clone()
    dist.all_reduce(total)
    flag = torch.tensor(signum or 0, device=loss.device)
    flags = [torch.zeros_like(flag) for _ in range(processes)]
    dist.all_gather(flags, flag)  # the signal any rank got (0: none)
    received = max(int(f.item()) for f in flags)
    return total / processes, (received or None)
