"""Training batches of a task: one length per step, drawn uniformly, reproducible from ``(seed, step)``."""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.tasks.task import Task

_TRAIN_STREAM = 3  # apart from the position draws (positions.py) and the language-model batches


class TaskSampler:
    """Step ``s`` draws a length uniformly from the shortest that holds one instance up to the step's length
    (``train_len``, or less under a length curriculum) and ``batch_size`` instances of exactly that length,
    from a generator seeded by ``(seed, s)``: the same batch whether or not the run was interrupted before it.

    Args:
        task: the task.
        batch_size: instances per step.
        seed: the run's seed.
        fingerprint: the task's instances' (:class:`posexp.tasks.source.TrainingSource`), for resumed runs to check.
    """

    def __init__(self, task: Task, batch_size: int, seed: int, fingerprint: Optional[str] = None):
        self.task, self.batch_size, self.seed, self.fingerprint = task, batch_size, seed, fingerprint

    def window(self, step: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens (B, L + 1), answer mask of the targets (B, L))`` for step ``step``, ``L <= length``."""
        rng = np.random.default_rng([self.seed, step, _TRAIN_STREAM])
        shortest = self.task.shortest_length()
        drawn = int(rng.integers(shortest, max(shortest, length) + 1))
        made = self.task.instances(drawn, self.batch_size, rng, split="train")
        return made.tokens, made.answer[:, 1:]
