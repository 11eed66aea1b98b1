"""The trainer: AdamW, linear warmup then cosine decay, gradient clipping, seeded.

Writes ``metrics.csv`` (:mod:`posexp.training.metrics`) while it runs, and resumable checkpoints
(:mod:`posexp.training.checkpoint`) every ``train.checkpoint_every`` steps / ``train.checkpoint_minutes``
minutes, on SIGINT or SIGTERM, and when training ends. A resumed run takes the same steps on the
same batches with the same RNG states as an uninterrupted one, so on the same
machine and thread count it ends with bitwise the same weights.

Devices, precision and the step's settings follow :mod:`posexp.runtime.device`: ``compile=auto`` (the
default) trains through ``torch.compile`` on CUDA and eagerly elsewhere (evaluation stays eager: its
lengths vary); on CUDA fp32 matmuls may use TF32 and batches are copied from pinned memory without
blocking; AdamW is the fused kernel where torch has one (:mod:`posexp.training.optim`). The loop makes
no host sync per step: the loss stays on the device until a logging interval ends (an encoder may still
sync in its own hooks: sandwich sizes its kernel table from the positions). The optimizer and its
schedule are in :mod:`posexp.training.optim`, what a step carries to the next (and
into a checkpoint) in :mod:`posexp.training.state`.

Several processes (``torchrun``, :mod:`posexp.training.distributed`): each rank trains on
its slice of the same global batch under DistributedDataParallel; losses are
averaged over the ranks every step, so every rank logs, checkpoints and stops on
the same numbers, and only rank 0 writes. ``train.parallel=fsdp`` trains an FSDP2 copy instead, whose
every rank writes its shards of each resumable checkpoint (:mod:`posexp.training.setup`,
:mod:`posexp.training.sharding`); ``train.context_parallel`` splits each sequence over the ranks
(:mod:`posexp.training.context`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress

from posexp.config.identity import RunHash
from posexp.config.schema import Config, TrainConfig
from posexp.errors import TrainingDiverged, TrainingInterrupted
from posexp.model.gpt import GPT
from posexp.model.positions import PositionPlan
from posexp.runtime.device import Placement, autocast, resolve_device, step_settings
from posexp.runtime.precision import bf16_is_native
from posexp.runtime.terminal import console as terminal_console
from posexp.runs.layout import CHECKPOINT_DIR, METRICS_CSV, WEIGHTS_FILE
from posexp.training.checkpoint import save_final
from posexp.training.context import sequence_shards
from posexp.runtime.device import world
from posexp.training.distributed import shard
from posexp.training.metrics import MetricsWriter
from posexp.training.optim import lr_at, set_lr
from posexp.training.progress import plain_progress, progress_bar
from posexp.training.state import TrainState
from posexp.training.setup import TrainingSetup, loss_module
from posexp.training.sharding import all_finite, one_process_group

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.train")

__all__ = ["CHECKPOINT_DIR", "WEIGHTS_FILE", "TrainResult", "save_checkpoint", "train"]


class Sampler(Protocol):
    """What the training step draws its batches from."""

    fingerprint: Optional[str]  # of the corpus or task instances drawn from (None: not known)

    def window(self, step: int, length: int) -> tuple[np.ndarray, Optional[np.ndarray]]: ...


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
    tf32: bool = False  # fp32 matmuls on CUDA may use TensorFloat-32
    precision_choice: Optional[dict] = None  # what precision was asked for, what ran and why (PrecisionChoice)


def save_checkpoint(model: GPT, run_dir: Path, meta: dict) -> Path:
    """The final weights, ``checkpoint/model.safetensors``, with ``meta.json``.

    See :func:`posexp.training.checkpoint.save_final`.
    """
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
        self._previous: dict[int, Any] = {}

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


@dataclass
class StepResult:
    """What one optimizer step hands the loop."""

    loss: torch.Tensor  # the global batch's mean loss, still on the device (no host sync)
    lr: float
    tokens: int  # tokens of the global batch
    signum: Optional[int]  # a stop signal that arrived by the end of the step (on any rank)


class TrainStep:
    """One optimizer step: learning rate, batch, forward under autocast, backward, clip, AdamW update.

    Args:
        model: the model being trained (its parameters are clipped).
        net: what computes the token losses (:func:`loss_module`: maybe data-parallel, maybe compiled).
        optimizer: from :func:`posexp.training.optim.make_optimizer`.
        sampler: the batches, a function of (seed, step): ``sampler.window(step, length)`` gives the tokens
            ``(B, L + 1)`` and the answer mask of the targets ``(B, L)`` (None: every target is trained on).
        plan: positions and curriculum length of each step.
        t: the training settings (schedule, batch size, clip).
        placement: where the batch goes (copied from pinned host memory, asynchronously, when the step's settings
            say so: CUDA), the autocast precision of the forward pass, and this process's place among the ranks.
    """

    def __init__(self, model: GPT, net: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: "Sampler",
                 plan: PositionPlan, t: TrainConfig, placement: Placement):
        self.model, self.net, self.optimizer, self.sampler, self.plan = model, net, optimizer, sampler, plan
        self.t, self.device, self.dtype, self.world = t, placement.device, placement.dtype, placement.world
        self.pin_memory = placement.settings.pin_memory
        # this process's slice of every global batch (all of it in one process, or with each sequence split over
        # the processes: train.context_parallel, posexp/training/context.py)
        self.context = t.context_parallel
        self.rows = shard(t.batch_size, placement.world) if self.context == 1 else slice(None)

    def __call__(self, step: int, stop: "StopOnSignal") -> StepResult:
        lr = lr_at(step, self.t)
        set_lr(self.optimizer, lr)
        # a curriculum trains on each window's first tokens; a task draws a length up to it
        tokens, answer = self.sampler.window(step, self.plan.length_at(step))
        batch = torch.from_numpy(tokens[self.rows].astype("int64"))
        if self.pin_memory:  # a copy from pinned memory is asynchronous: the GPU does not wait on the host
            batch = batch.pin_memory()
        batch = batch.to(self.device, non_blocking=True)
        length = batch.shape[1] - 1
        pos = self.plan.train_positions(step, length, self.device)
        inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        mask = None if answer is None else torch.from_numpy(answer[self.rows]).to(self.device, non_blocking=True)
        shards = [inputs, targets, pos] + ([] if mask is None else [mask])
        # under train.context_parallel each process keeps its shard of every one of them (sharded in place)
        with sequence_shards(self.context, self.device, shards, [1, 1, 0, 1][:len(shards)]):
            with autocast(self.device, self.dtype):
                losses = self.net(inputs, targets, pos)  # (B, L) nats
            if mask is None:
                loss = losses.mean()
            else:  # a task trains on its answer tokens only
                loss = (losses * mask).sum() / mask.sum().clamp(min=1)
            loss.backward()
        if self.t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss.detach()
        signum = stop.received
        if self.world.distributed:  # the global batch's mean loss, and a signal to any rank stops them all
            loss, signum = global_loss_and_signal(loss, signum, self.world.size)
        return StepResult(loss, lr, self.t.batch_size * length, signum)


class DivergenceGuard:
    """Notices the first non-finite loss without a host sync per step; raises at the next sync.

    Args:
        run_dir: the run folder, to say where the last good checkpoint is.
        lr_of: the learning rate of a step, for the message.
        device: where the losses are.
    """

    def __init__(self, run_dir: Path, lr_of: Callable[[int], float], device: torch.device):
        self.run_dir, self.lr_of = run_dir, lr_of
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)  # first step with a non-finite loss
        self.bad_value = torch.zeros((), device=device)

    def record(self, done: int, loss: torch.Tensor) -> None:
        """Note step ``done``'s loss; recorded on the device, read at the next host sync: no sync per step."""
        newly_bad = (self.first_bad < 0) & ~torch.isfinite(loss)
        self.first_bad = torch.where(newly_bad, done, self.first_bad)
        self.bad_value = torch.where(newly_bad, loss.float(), self.bad_value)

    def check_loss(self, saved_step: Optional[int]) -> None:
        """Raise :class:`TrainingDiverged` at the first step whose loss was NaN or infinite, if any."""
        bad = int(self.first_bad.item())
        if bad >= 0:
            raise TrainingDiverged(bad, f"training diverged: the loss was {self.bad_value.item()} at step {bad} "
                                        f"(lr {self.lr_of(bad - 1):.3g}); {self._kept(saved_step)}. Try a lower "
                                        "train.lr, or train.grad_clip=1.0 if clipping was off")

    def check_weights(self, model: torch.nn.Module, done: int, saved_step: Optional[int]) -> None:
        """Never save weights a NaN went into: the loss shows a step's update only at the next step."""
        self.check_loss(saved_step)
        if not all_finite(model):  # every rank's shards, when the model is sharded
            raise TrainingDiverged(done, f"training diverged: the weights became NaN or infinite at step {done} "
                                         f"(lr {self.lr_of(done - 1):.3g}); {self._kept(saved_step)}. Try a lower "
                                         "train.lr, or train.grad_clip=1.0 if clipping was off")

    def _kept(self, saved_step: Optional[int]) -> str:
        return (f"the last good checkpoint, step {saved_step}, is kept in {self.run_dir / CHECKPOINT_DIR}"
                if saved_step is not None else "no checkpoint was written before it")


class CheckpointSchedule:
    """When to write a resumable checkpoint: every ``every`` steps and/or ``minutes`` minutes (0 turns either off).

    One is also written at the end of training and at the step a signal arrived in
    (:meth:`pending`), unless that step was just saved.

    Args:
        saved_step: the step of the checkpoint a resumed run started from, else None.
    """

    def __init__(self, every: int, minutes: float, total_steps: int, saved_step: Optional[int] = None):
        self.every, self.every_s, self.total = int(every or 0), float(minutes or 0) * 60, total_steps
        self.saved_step = saved_step
        self.last_save = time.perf_counter()

    def due(self, done: int) -> bool:
        """Whether to checkpoint after step ``done`` of a run that goes on."""
        return done < self.total and bool((self.every and done % self.every == 0) or
                                          (self.every_s and time.perf_counter() - self.last_save >= self.every_s))

    def pending(self, done: int) -> bool:
        """Whether step ``done`` is not checkpointed yet."""
        return self.saved_step != done

    def saved(self, done: int) -> None:
        self.saved_step, self.last_save = done, time.perf_counter()
        log.info("checkpoint at step %d", done)


# Called at every logging step with (step, loss, lr, tokens_per_s): how experiment trackers hear of training.
LogHook = Callable[[int, float, float, float], None]


class Probe(Protocol):
    """A measurement of the model taken while it trains (``eval.during_training``, the extrapolation curve).

    It leaves the model as it found it (train mode, weights, RNG streams), so training goes on as without it.
    """

    def due(self, step: int) -> bool:
        """Whether to measure after step ``step`` (1-based, as in ``metrics.csv``)."""
        ...

    def __call__(self, step: int, dtype: torch.dtype) -> None:
        """Measure the model as it is after ``step``, in the training precision ``dtype``."""
        ...


class TrainingLog:
    """The report of each logging interval: a ``metrics.csv`` row (rank 0), a ``train.log`` line, the progress bar
    (or, when the output is not a terminal, a plain line every tenth of training), and the ``on_log`` hook
    (experiment trackers); and the ``probe`` of every step it is due at, whose time the training clock leaves out.
    The bar (with ``t.progress``), the hook and the probe are rank 0's alone."""

    def __init__(self, metrics: Optional[MetricsWriter], progress: Progress, state: TrainState, t: TrainConfig,
                 encoder: str, placement: Placement, on_log: Optional[LogHook] = None, probe: Optional[Probe] = None):
        is_main = placement.world.is_main
        self.metrics, self.progress, self.state = metrics, progress, state
        self.on_log = on_log if is_main else None
        self.probe, self.dtype = probe if is_main else None, placement.dtype  # it measures in the training precision
        # off a terminal the bar draws nothing: plain lines instead
        self.plain = plain_progress(progress.console, encoder, t.steps, state.step, state.tokens) \
            if t.progress and is_main else None
        self.task = progress.add_task("train", total=t.steps, completed=state.step, encoder=encoder, loss="-",
                                      tps="-")
        self.interval_tokens = 0  # tokens trained since the last metrics row
        self.start = self.last_time = time.perf_counter()

    def elapsed_s(self) -> float:
        """The run's training wall time: earlier sessions' and this one's (without the probe's)."""
        return self.state.elapsed_s + time.perf_counter() - self.start

    def stepped(self, tokens: int) -> None:
        """A step of ``tokens`` tokens is done: count them, and run the probe if it is due. The probe's time is
        kept off the clock, so tokens/s and the wall time are training's alone."""
        self.interval_tokens += tokens
        if self.probe is None or not self.probe.due(self.state.step):
            return
        began = time.perf_counter()
        self.probe(self.state.step, self.dtype)
        spent = time.perf_counter() - began
        self.start += spent
        self.last_time += spent

    def row(self, lr: float) -> None:
        loss = self.state.close_interval()
        now = time.perf_counter()
        tps = self.interval_tokens / (now - self.last_time)
        done = self.state.step
        if self.metrics is not None:
            self.metrics.write(step=done, tokens=self.state.tokens, loss=f"{loss:.6f}", lr=f"{lr:.6g}",
                               tokens_per_s=f"{tps:.1f}", elapsed_s=f"{self.state.elapsed_s + now - self.start:.3f}")
        log.info("step %d loss %.4f lr %.3g tokens/s %.0f", done, loss, lr, tps)
        if self.on_log is not None:
            self.on_log(done, loss, lr, tps)
        self.progress.update(self.task, completed=done, loss=f"{loss:.3f}", tps=f"{tps:,.0f}")
        if self.plain is not None:
            self.plain(done, loss, self.state.tokens)
        self.last_time, self.interval_tokens = now, 0


def warn_if_slow_bf16(precision: str, device: torch.device, console: Console, is_main: bool = True) -> None:
    if is_main and precision == "bf16" and not bf16_is_native(device):
        note = (f"precision=bf16 on {device}, which has no native bf16 matmul: expect it to be much slower than "
                "fp32 (precision=auto picks the faster one)")
        log.warning(note)
        console.print(f"[yellow]{note}[/]", highlight=False)


def _train_steps(setup: TrainingSetup, spec: Config, sampler: Sampler, run_dir: Path, run_hash: RunHash,
                 placement: Placement, on_log: Optional[LogHook], probe: Optional[Probe]) -> float:
    """Train from ``setup.state`` to ``spec.train.steps``, logging and checkpointing; returns the run's training
    wall time (every session's)."""
    t, w, model, opt, state = spec.train, placement.world, setup.model, setup.optimizer, setup.state
    console = terminal_console(stderr=True)  # its warnings and progress, whatever COLUMNS says
    warn_if_slow_bf16(t.precision, placement.device, console, w.is_main)
    take_step = TrainStep(model, setup.net, opt, sampler, PositionPlan(spec), t, placement)
    # only rank 0 writes; the others keep the same numbers, and so take the same decisions
    metrics = MetricsWriter(run_dir / METRICS_CSV, resume_step=state.step if setup.resumed else None) \
        if w.is_main else None
    guard = DivergenceGuard(run_dir, lambda step: lr_at(step, t), placement.device)
    schedule = CheckpointSchedule(t.checkpoint_every, t.checkpoint_minutes, t.steps,
                                  saved_step=state.step if setup.resumed else None)
    progress = progress_bar(console, t.progress and w.is_main)

    def checkpoint() -> None:
        guard.check_weights(model, state.step, schedule.saved_step)
        if w.is_main or setup.sharded is not None:  # a sharded model's ranks each write their shards
            state.save(run_dir, model, opt, run_hash, report.elapsed_s())
        schedule.saved(state.step)

    try:
        with progress, StopOnSignal() as stop:
            report = TrainingLog(metrics, progress, state, t, model.encoder.name, placement, on_log, probe)
            signum = _run_steps(take_step, stop, t, state, guard, report, schedule, checkpoint)
            if schedule.pending(state.step):
                checkpoint()  # the end of training, or the step a signal arrived in
            if not w.distributed:
                signum = stop.received  # also one that arrived during the last checkpoint
    finally:
        if metrics is not None:
            metrics.close()
    if signum is not None:
        raise interrupted(signum, state.step, t.steps, run_dir)
    return report.elapsed_s()


def _run_steps(take_step: TrainStep, stop: StopOnSignal, t: TrainConfig, state: TrainState, guard: DivergenceGuard,
               report: TrainingLog, schedule: CheckpointSchedule, checkpoint: Callable[[], None]) -> Optional[int]:
    """The steps from ``state.step`` to ``t.steps``, each logged and checkpointed when due. Returns the signal that
    arrived during a step (which stopped them; that step is checkpointed by the caller), or None."""
    for step in range(state.step, t.steps):
        out = take_step(step, stop)
        guard.record(step + 1, out.loss)
        state.advance(out.loss, out.tokens)
        report.stepped(out.tokens)  # and the probe (eval.during_training), when it is due
        if state.step % t.log_every == 0 or state.step == t.steps:
            guard.check_loss(schedule.saved_step)
            report.row(out.lr)
        if out.signum is not None:
            return out.signum
        if schedule.due(state.step):
            checkpoint()
    return None


def train(model: GPT, spec: Config, sampler: Sampler, run_dir: Path, run_hash: RunHash, *, resume: bool = False,
          on_log: Optional[LogHook] = None, probe: Optional[Probe] = None) -> TrainResult:
    """Train ``model`` for ``spec.train.steps`` steps of ``spec.train.batch_size x spec.train_len`` tokens.

    Args:
        spec: the run's typed config: its ``train`` settings, ``train_len``, the positions and curriculum
            (:class:`~posexp.model.positions.PositionPlan`) and ``compile`` (true, false or ``auto``:
            :func:`posexp.runtime.device.step_settings`).
        sampler: the batches: windows of the corpus (:class:`~posexp.data.corpus.BatchSampler`) or a task's
            ``TaskSampler``.
        run_hash: the hash checkpoints record.
        resume: continue from the latest resumable checkpoint (step 0 if none).
        on_log: called with (step, loss, lr, tokens/s) at every logging step, on the rank that writes.
        probe: measured after every step it is due at, on the rank that writes (before that step's checkpoint).

    Raises:
        TrainingDiverged, TrainingInterrupted, PosexpError: the loss became NaN or infinite (the checkpoint before
            it is kept); SIGINT or SIGTERM (the step was checkpointed); a resumable checkpoint that cannot be used.
    """
    t = spec.train
    w, device = world(), resolve_device(t.device)
    settings = step_settings(device, spec.compile).apply()
    model.to(device).train()
    with one_process_group(device) if t.parallel == "fsdp" else contextlib.nullcontext():
        setup = TrainingSetup.build(model, spec, run_dir, run_hash, resume, device, settings.compile)
        setup.state.data_fingerprint = sampler.fingerprint  # for posexp.training.checkpoint.check_same_data
        placement = Placement(device, w, settings, setup.precision)
        wall = _train_steps(setup, spec, sampler, run_dir, run_hash, placement, on_log, probe)
        if setup.sharded is not None:
            setup.sharded.consolidate()  # the trained shards into the whole model, which rank 0 evaluates
    model.eval()
    return _result(setup.state, t.steps, wall, placement)


def _result(state: TrainState, steps: int, wall: float, placement: Placement) -> TrainResult:
    """What results.json records of a finished training: its size, speed, precision and where it ran."""
    choice, settings = placement.precision, placement.settings
    return TrainResult(steps=steps, tokens=state.tokens, final_loss=state.loss, wall_s=wall,
                       tokens_per_s=state.tokens / wall if wall > 0 else 0.0,
                       precision=str(choice.dtype).replace("torch.", ""), device=str(placement.device),
                       resumed_at=state.resumed_at, processes=placement.world.size, compiled=settings.compile,
                       tf32=settings.tf32, precision_choice=choice.record())


def interrupted(signum: int, done: int, steps: int, run_dir: Path) -> TrainingInterrupted:
    """The error a stop signal ends training with: where the checkpoint is and how to continue."""
    name = signal.Signals(signum).name
    return TrainingInterrupted(f"{name} at step {done} of {steps}: checkpoint saved in "
                               f"{run_dir / CHECKPOINT_DIR}; continue with: posexp resume {run_dir}",
                               exit_code=128 + signum)


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
