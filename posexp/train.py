"""The trainer: AdamW, linear warmup then cosine decay, gradient clipping, seeded.

Writes ``metrics.csv`` (step, tokens, loss, lr, tokens_per_s, elapsed_s) while it
runs and a safetensors checkpoint at the end.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from posexp.data import BatchSampler, Corpus
from posexp.encoders import create
from posexp.io import atomic_write_text
from posexp.model import GPT, ModelShape

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoint"
WEIGHTS_FILE = "model.safetensors"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from posexp.errors import ConfigError

        raise ConfigError("train.device", "cuda was asked for but torch sees no CUDA device; use auto or cpu")
    return torch.device(name)


def bf16_is_native(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        probe = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
        return "AVX512" in probe.upper() and torch.cpu._is_avx512_bf16_supported()
    return False


def resolve_precision(name: str, device: torch.device) -> torch.dtype:
    """``fp32``, ``bf16``, or ``auto`` = bf16 where the hardware runs it natively, else fp32."""
    if name == "bf16" or (name == "auto" and bf16_is_native(device)):
        return torch.bfloat16
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def model_shape(cfg: DictConfig, vocab_size: int) -> ModelShape:
    m = cfg.model
    return ModelShape(vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                      mlp_ratio=m.mlp_ratio, dropout=m.dropout, attn_block_size=m.attn_block_size)


def build_model(cfg: DictConfig, vocab_size: int) -> GPT:
    """The encoder from ``cfg.encoder`` inside a GPT of shape ``cfg.model``, initialised from ``cfg.seed``."""
    options = {k: v for k, v in cfg.encoder.items() if k != "name"}
    torch.manual_seed(cfg.seed)
    encoder = create(cfg.encoder.name, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, **options)
    return GPT(model_shape(cfg, vocab_size), encoder)


def lr_at(step: int, cfg: DictConfig) -> float:
    """Linear warmup to ``train.lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    floor = t.lr * t.min_lr_ratio
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: GPT, cfg: DictConfig) -> torch.optim.Optimizer:
    # No weight decay on gains, biases and embeddings of positions (GPT-2 / nanoGPT convention).
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and not name.startswith("encoder.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.train.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2),
                             foreach=True)


@dataclass
class TrainResult:
    steps: int
    tokens: int
    final_loss: float
    wall_s: float
    tokens_per_s: float
    precision: str
    device: str


class MetricsWriter:
    """Appends rows to ``metrics.csv`` and flushes each one, so a killed run keeps its curve."""

    COLUMNS = ["step", "tokens", "loss", "lr", "tokens_per_s", "elapsed_s"]

    def __init__(self, path: Path):
        self.path = path
        new = not path.exists()
        self._f = open(path, "a", newline="")
        self._w = csv.writer(self._f)
        if new:
            self._w.writerow(self.COLUMNS)

    def write(self, **row) -> None:
        self._w.writerow([row[c] for c in self.COLUMNS])
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def save_checkpoint(model: GPT, run_dir: Path, meta: dict) -> Path:
    from safetensors.torch import save_model

    ckpt = run_dir / CHECKPOINT_DIR
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / f".{WEIGHTS_FILE}.tmp"
    save_model(model, str(tmp))  # handles the tied embedding / output weights
    tmp.replace(ckpt / WEIGHTS_FILE)
    atomic_write_text(ckpt / "meta.json", json.dumps(meta, indent=2))
    return ckpt


def train(model: GPT, corpus: Corpus, cfg: DictConfig, run_dir: Path,
          console: Optional[Console] = None) -> TrainResult:
    """Train ``model`` on ``corpus.train`` for ``cfg.train.steps`` steps of ``batch_size x train_len`` tokens."""
    t = cfg.train
    device = resolve_device(t.device)
    dtype = resolve_precision(t.precision, device)
    model.to(device).train()
    opt = make_optimizer(model, cfg)
    sampler = BatchSampler(corpus.train, cfg.train_len, t.batch_size, cfg.seed)
    metrics = MetricsWriter(run_dir / "metrics.csv")
    tokens_per_step = t.batch_size * cfg.train_len
    console = console or Console(stderr=True)

    progress = Progress(
        TextColumn("[bold]train[/] {task.fields[encoder]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, disable=not t.progress, transient=False,
    )
    running = torch.zeros((), device=device)
    seen = 0
    start = last_time = time.perf_counter()
    last_step = 0
    loss_value = float("nan")
    with progress:
        task = progress.add_task("train", total=t.steps, encoder=cfg.encoder.name, loss="-", tps="-")
        for step in range(t.steps):
            lr = lr_at(step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            batch = torch.from_numpy(sampler.batch(step).astype("int64")).to(device, non_blocking=True)
            with autocast(device, dtype):
                loss = model.token_losses(batch[:, :-1], batch[:, 1:]).mean()
            loss.backward()
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            running += loss.detach()
            seen += tokens_per_step
            done = step + 1
            if done % t.log_every == 0 or done == t.steps:
                loss_value = (running / (done - last_step)).item()  # the one host sync per interval
                if not math.isfinite(loss_value):
                    from posexp.errors import PosexpError

                    metrics.close()
                    raise PosexpError(f"training diverged: loss is {loss_value} at step {done}; "
                                      "try a lower train.lr or train.grad_clip=1.0")
                now = time.perf_counter()
                tps = (done - last_step) * tokens_per_step / (now - last_time)
                metrics.write(step=done, tokens=seen, loss=f"{loss_value:.6f}", lr=f"{lr:.6g}",
                              tokens_per_s=f"{tps:.1f}", elapsed_s=f"{now - start:.3f}")
                log.info("step %d loss %.4f lr %.3g tokens/s %.0f", done, loss_value, lr, tps)
                progress.update(task, completed=done, loss=f"{loss_value:.3f}", tps=f"{tps:,.0f}")
                running.zero_()
                last_step, last_time = done, now
    metrics.close()
    wall = time.perf_counter() - start
    model.eval()
    return TrainResult(steps=t.steps, tokens=seen, final_loss=loss_value, wall_s=wall,
                       tokens_per_s=seen / wall, precision=str(dtype).replace("torch.", ""), device=str(device))
