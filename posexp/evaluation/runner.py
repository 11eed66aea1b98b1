"""A run's perplexity evaluation as its ``eval`` group configures it: the lengths, the protocol, the
scaling, the dtype the run trained in, and a progress line for evaluations that take a while.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from posexp.config.schema import Config, eval_lengths
from posexp.encoders.extension import NONE
from posexp.evaluation.perplexity import EvalHooks, evaluate
from posexp.model.positions import PositionPlan
from posexp.runtime.precision import bf16_is_native, resolve_precision
from posexp.training.progress import PARTS, clock_time


def evaluate_config(model, val, cfg: Config, device: torch.device,
                    console: Optional[Console] = None,
                    trained_in: Optional[str] = None,
                    key_tokens=None) -> tuple[list[dict], Optional[list[dict]]]:
    """Rows (and per-position records, unless ``eval.loss_by_position`` is off) for the ``eval`` group of ``cfg``.

    ``trained_in`` is the dtype the run trained in (results.json's ``train.precision``), which evaluation
    keeps; without it, what ``train.precision`` resolves to without a measurement. ``key_tokens``: the selector of
    key-token perplexity (:class:`posexp.evaluation.key_tokens.KeySelector`), None without.
    """
    e = cfg.eval
    positions: Optional[list[dict]] = [] if e.loss_by_position else None
    log = (lambda msg: console.print(f"[yellow]{msg}[/]", highlight=False)) if console is not None else None
    progress = EvalProgress(console, eval_lengths(cfg)) if console is not None else None
    try:
        rows = evaluate(model, val, e, int(cfg.train_len), device, position_plan=PositionPlan(cfg),
                        dtype=eval_dtype(cfg, device, trained_in),  # losses accumulate in fp32 anyway
                        hooks=EvalHooks(log=log, progress=progress, positions=positions, key_tokens=key_tokens))
    finally:
        if progress is not None:
            progress.close()
    return with_model_scaling(rows, *run_model_scaling(cfg)), positions


def run_model_scaling(cfg: Config) -> tuple[Optional[str], Optional[float]]:
    """The scaling a run's model carries (a fine-tune's ``finetune.scaling`` and its factor), or ``(None, None)``."""
    ft = cfg.finetune
    if ft is None or str(ft.scaling) == NONE:
        return None, None
    return str(ft.scaling), float(ft.scaling_factor)


def with_model_scaling(rows: list[dict], scaling: Optional[str], factor: Optional[float]) -> list[dict]:
    """``rows`` each saying the scaling the model carried when measured (:class:`~posexp.runs.row.ResultRow`'s
    ``model_scaling``), apart from their evaluation-time ``scaling``; unchanged for a model that carries none."""
    if scaling is None:
        return rows
    return [{**row, "model_scaling": scaling, "model_scaling_factor": factor} for row in rows]


def eval_dtype(cfg: Config, device: torch.device, trained_in: Optional[str]) -> torch.dtype:
    """The autocast dtype of an evaluation: for ``precision=auto``, the one the run trained in (which a probe
    may have chosen) unless that is bf16 and ``device`` would only emulate it; else what ``train.precision``
    resolves to on ``device``."""
    if cfg.train.precision == "auto" and (trained_in == "float32" or
                                          (trained_in == "bfloat16" and bf16_is_native(device))):
        return getattr(torch, trained_in)
    return resolve_precision(cfg.train.precision, device)


# An evaluation shorter than this prints nothing more than before; a longer one says how far it is.
PROGRESS_AFTER_S = 3.0


class EvalProgress:
    """How far an evaluation is, once it has run for more than :data:`PROGRESS_AFTER_S` seconds.

    On a terminal, a transient Rich progress line for the length being measured (windows done
    of its windows), gone when the length is; anywhere else (a pipe, a log file), a plain line
    each time the evaluation passes another tenth (each length counted as an equal share: every
    length reads the same ``eval.tokens``), with the time so far and an ETA. A short
    evaluation, the smoke runs included, prints nothing.
    Called as ``progress(length, windows_done, windows)`` by :func:`posexp.evaluation.perplexity.evaluate`.

    Args:
        console: where the progress goes.
        lengths: every length of the evaluation (for "length 3 of 6").
        clock: seconds, monotonic (a fake one in tests).
        after: seconds of evaluation before anything is shown.
    """

    def __init__(self, console: Console, lengths: list[int], clock: Callable[[], float] = time.monotonic,
                 after: float = PROGRESS_AFTER_S):
        self.console, self.lengths, self.clock, self.after = console, sorted(set(lengths)), clock, after
        self.started = clock()
        self.length_started = self.started
        self.bar: Optional[Progress] = None
        self.task: Optional[TaskID] = None
        self.tenths = 0  # of the evaluation, the last plain line said

    def __call__(self, length: int, done: int, total: int) -> None:
        now = self.clock()
        if done == 0:
            self.length_started = now
        if now - self.started < self.after:
            return
        which = f"length {length} ({self.lengths.index(length) + 1 if length in self.lengths else '?'} of " \
                f"{len(self.lengths)})"
        if not self.console.is_terminal:
            self._plain_line(length, done, total, which, now)
            return
        if self.bar is None:
            self.bar = Progress(TextColumn("eval {task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("windows"), TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
        if done == 0 or self.task is None:
            if self.task is not None:
                self.bar.remove_task(self.task)
            self.task = self.bar.add_task(which, total=total, completed=done)
        self.bar.update(self.task, completed=done)
        if done == total:
            self.bar.remove_task(self.task)
            self.task = None

    def _plain_line(self, length: int, done: int, total: int, which: str, now: float) -> None:
        index = self.lengths.index(length) if length in self.lengths else 0
        share = (index + (done / total if total else 1.0)) / len(self.lengths)
        tenths = int(share * PARTS + 1e-9)
        if tenths <= self.tenths:
            return
        self.tenths = tenths
        elapsed = now - self.started
        self.console.print(f"eval {100 * share:.0f}%  {which}: {done:,}/{total:,} windows  "
                           f"{clock_time(elapsed)} so far  eta {clock_time(elapsed * (1 - share) / share)}",
                           highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Take the progress line off the terminal (transient), whether the evaluation finished or not."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
