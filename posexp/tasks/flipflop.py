"""``task=flipflop``: flip-flop language modelling.

Liu et al. 2023 ("Exposing Attention Glitches with Flip-Flop Language Modeling", §3): a sequence of
instructions ``w`` (write), ``r`` (read) and ``i`` (ignore), each followed by a bit; the bit after every ``r`` must
be the bit of the latest ``w``. An instance of ``n`` instructions has ``2n`` tokens; the first instruction is
a write, the last a read, the others are ``i``/``w``/``r`` with probabilities 0.8/0.1/0.1 (the paper's
FFL(0.8)); the bits after reads are the answer (an instance always has at least one).

Tokens: ``0`` padding, ``1`` / ``2`` the bits 0 / 1, ``3`` ``w``, ``4`` ``r``, ``5`` ``i``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from posexp.tasks.task import TASKS, Instances, Task

BIT0, WRITE, READ, IGNORE = 1, 3, 4, 5
P_IGNORE, P_WRITE = 0.8, 0.1  # the rest reads


@TASKS.register("flipflop")
class FlipFlop(Task):
    answer_alphabet = 2  # the bits read back
    citation = "Liu et al. 2023 (flip-flop language modelling)"
    size_unit = "instructions"
    smallest = 2

    def __init__(self, min_size: Optional[int] = None):  # no alphabet to size: task.min_size is its one option
        super().__init__(None, min_size)

    @property
    def vocab_size(self) -> int:
        return 6

    def tokens_for(self, size: int) -> int:
        return 2 * size

    @classmethod
    def chance(cls, options: Mapping[str, Any], answer_tokens: float, size: Optional[int] = None,
               version: Optional[int] = None) -> Optional[float]:
        """A uniform guess of each read bit: 1/2 for the last instruction's read, and for each of the ``size - 2``
        between a factor 1 - P(read) / 2, the mean of 2^-reads over instances (not 2^-(mean reads), far below it)."""
        if size is None:
            return super().chance(options, answer_tokens)
        return 0.5 * (1 - (1 - P_IGNORE - P_WRITE) / 2) ** (size - 2)

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        u = rng.random((count, size))
        ops = np.where(u < P_IGNORE, IGNORE, np.where(u < P_IGNORE + P_WRITE, WRITE, READ))
        ops[:, 0], ops[:, -1] = WRITE, READ
        bits = rng.integers(0, 2, size=(count, size), dtype=np.int64)
        # a read returns the latest write: carry the index of the last write forward
        written = np.where(ops == WRITE, np.arange(size)[None, :], -1)
        last_write = np.maximum.accumulate(written, axis=1)
        reads = ops == READ
        bits = np.where(reads, np.take_along_axis(bits, last_write, axis=1), bits)
        tokens = np.stack([ops, bits + BIT0], axis=2).reshape(count, 2 * size).astype(np.int64)
        answer = np.stack([np.zeros_like(reads), reads], axis=2).reshape(count, 2 * size)
        return Instances(tokens, answer)
