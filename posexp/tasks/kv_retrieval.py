"""``task=kv_retrieval``: key-value retrieval, whose accuracy by depth is the "lost in the middle" curve.

Liu et al. 2023 ("Lost in the Middle: How Language Models Use Long Contexts", §4, synthetic key-value retrieval):
a list of key-value pairs of random strings (UUIDs there), then one key of the list; the answer is its value. The
gold pair's place in the list is swept: models retrieve best when it is first or last and worst in the middle
(a U-curve). Here a key and a value are strings of :data:`KEY_LEN` symbols from ``task.symbols`` each (16: 256
distinct keys), keys distinct within an instance.

An instance of ``size`` pairs is ``k k v v`` per pair, then ``QUERY k k`` and the gold pair's ``v v``, the answer.
At a depth (``eval.depths``) the gold pair is pair ``round(depth * (size - 1))``: depth 0 the first pair, 1 the
last, right before the question; training draws it uniformly. Per-depth exact match at each length is the
paper's curve; a run draws it as its length x depth heatmap.

Tokens: ``0`` padding, ``1`` QUERY, then ``S`` key symbols and ``S`` value symbols (``S = task.symbols``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.tasks.ruler import distinct
from posexp.tasks.task import TASKS, Instances, Task

QUERY, FIRST_KEY = 1, 2
KEY_LEN = 2  # symbols of a key, and of a value


@TASKS.register("kv_retrieval")
class KVRetrieval(Task):
    citation = "Liu et al. 2023 (lost in the middle, key-value retrieval)"
    size_unit = "key-value pairs"
    default_symbols = 16
    has_depth = True

    @property
    def vocab_size(self) -> int:
        return FIRST_KEY + 2 * self.symbols

    def tokens_for(self, size: int) -> int:
        return 2 * KEY_LEN * size + 1 + 2 * KEY_LEN

    def largest_size(self) -> Optional[int]:
        return self.symbols ** KEY_LEN  # keys are distinct

    def _strings(self, index: np.ndarray) -> np.ndarray:
        """``(..., KEY_LEN)`` symbols ``0 .. S - 1`` spelling each number of ``index`` in base ``S``."""
        powers = self.symbols ** np.arange(KEY_LEN - 1, -1, -1)
        return (index[..., None] // powers) % self.symbols

    def generate(self, size: int, count: int, rng: np.random.Generator, depth: Optional[float] = None,
                 **options) -> Instances:
        keys = self._strings(distinct(count, size, self.symbols ** KEY_LEN, rng)) + FIRST_KEY  # (count, size, 2)
        values = rng.integers(0, self.symbols, size=(count, size, KEY_LEN)) + FIRST_KEY + self.symbols
        if depth is None:
            gold = rng.integers(0, size, size=count)
        else:
            gold = np.full(count, int(round(float(depth) * (size - 1))))
        rows = np.arange(count)
        pairs = np.concatenate([keys, values], axis=2).reshape(count, 2 * KEY_LEN * size)
        tokens = np.concatenate([pairs, np.full((count, 1), QUERY), keys[rows, gold], values[rows, gold]], axis=1)
        answer = np.zeros(tokens.shape, dtype=bool)
        answer[:, -KEY_LEN:] = True
        return Instances(tokens.astype(np.int64), answer)
