"""How far training is, where a person will read it: a Rich bar on a terminal, and a plain line every tenth of
training anywhere else (a pipe, ``nohup``, a scheduler's log file), where a bar would show nothing until the end.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# A plain progress line every 1/PARTS of training (and of evaluation, posexp.evaluation.runner).
PARTS = 10


def progress_bar(console: Console, shown: bool) -> Progress:
    """The training bar; drawn only when ``shown`` and ``console`` is a terminal (see :class:`PlainProgress`)."""
    return Progress(
        TextColumn("[bold]train[/] {task.fields[encoder]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, disable=not shown or not console.is_terminal, transient=False,
    )


def clock_time(seconds: float) -> str:
    """``seconds`` as ``h:mm:ss``, the way Rich's bar shows times."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class PlainProgress:
    """A plain line each time training passes another tenth of its steps, for output that is not a terminal:
    ``train rope step 300/3,000 (10%)  loss 5.412  48,211 tokens/s  eta 0:01:05``.

    Called at every logging step, so the lines come at the first logging step past each tenth (every
    ``train.log_every`` steps when that is longer). Tokens per second are over the steps since the previous line;
    the ETA assumes the rest runs as fast as this session so far.

    Args:
        console: where the lines go.
        encoder: the run's encoding, named on each line.
        steps: the run's ``train.steps``.
        step, tokens: where training starts (a resumed run's step and tokens so far).
        clock: seconds, monotonic (a fake one in tests).
    """

    def __init__(self, console: Console, encoder: str, steps: int, step: int, tokens: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.console, self.encoder, self.steps, self.clock = console, encoder, steps, clock
        self.every = max(1, math.ceil(steps / PARTS))
        self.next = (step // self.every + 1) * self.every
        self.first_step, self.started = step, clock()
        self.last_tokens, self.last_time = tokens, self.started

    def __call__(self, step: int, loss: float, tokens: int) -> None:
        if step < self.next and step < self.steps:
            return
        now = self.clock()
        tps = (tokens - self.last_tokens) / (now - self.last_time) if now > self.last_time else 0.0
        per_step = (now - self.started) / max(1, step - self.first_step)
        self.console.print(f"train {self.encoder} step {step:,}/{self.steps:,} ({100 * step // self.steps}%)  "
                           f"loss {loss:.3f}  {tps:,.0f} tokens/s  eta {clock_time(per_step * (self.steps - step))}",
                           highlight=False, soft_wrap=True)
        self.next = (step // self.every + 1) * self.every
        self.last_tokens, self.last_time = tokens, now


def plain_progress(console: Console, encoder: str, steps: int, step: int, tokens: int) -> Optional[PlainProgress]:
    """:class:`PlainProgress` where :func:`progress_bar` draws nothing: ``console`` is not a terminal."""
    return None if console.is_terminal else PlainProgress(console, encoder, steps, step, tokens)
