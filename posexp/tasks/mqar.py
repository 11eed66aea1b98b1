"""``task=mqar``: multi-query associative recall.

Arora et al. 2023 ("Zoology: Measuring and Improving Recall in Efficient Language Models", §3.1): a list of
key-value pairs, then queries of the keys, each to be answered with its value. An instance of ``D`` pairs is
``k_1 v_1 .. k_D v_D`` followed by every key once, in a random order, each followed by its value
(``4D`` tokens), the queried values the answer. Keys are distinct within an instance, values drawn with
replacement, from separate vocabularies of ``task.symbols`` each. Zoology scatters its queries among noise
tokens at power-law gaps; here they follow the pairs directly, so the distance from a pair to its query
grows with the instance, which is what a test of longer contexts needs.

Tokens: ``0`` padding, ``1 .. S`` keys, ``S + 1 .. 2S`` values (``S = task.symbols``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.tasks.task import TASKS, Instances, Task, with_answer

FIRST_KEY = 1


@TASKS.register("mqar")
class MQAR(Task):
    citation = "Arora et al. 2023 (Zoology)"
    size_unit = "key-value pairs"
    default_symbols = 64

    @property
    def vocab_size(self) -> int:
        return FIRST_KEY + 2 * self.symbols

    def tokens_for(self, size: int) -> int:
        return 4 * size

    def largest_size(self) -> Optional[int]:
        return self.symbols  # keys are distinct

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        keys = np.argsort(rng.random((count, self.symbols)), axis=1)[:, :size] + FIRST_KEY  # distinct per row
        values = rng.integers(0, self.symbols, size=(count, size), dtype=np.int64) + FIRST_KEY + self.symbols
        order = np.argsort(rng.random((count, size)), axis=1)  # the order keys are queried in
        q_keys = np.take_along_axis(keys, order, axis=1)
        q_values = np.take_along_axis(values, order, axis=1)
        pairs = np.stack([keys, values], axis=2).reshape(count, 2 * size)
        queries = np.stack([q_keys, q_values], axis=2).reshape(count, 2 * size)
        is_value = np.tile([False, True], size)
        made = with_answer([(pairs, False), (queries, True)])
        made.answer[:, 2 * size:] = is_value  # only the queried values are the answer
        return made
