"""``task=parity``: is the number of ones in a bit string odd?

The "parity check" task of Delétang et al. 2023 (§4, regular) and Ruoss et al. 2023 (Table 1), and the
parity task of Kazemnejad et al. 2023 (§4): ``b_1 .. b_n = p`` (``n + 2`` tokens), the one answer token ``p``
the sum of the bits mod 2.

Tokens: ``0`` padding, ``1`` / ``2`` the bits 0 / 1, ``3`` ``=``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.tasks.task import TASKS, Instances, Task, with_answer

BIT0, EQUALS = 1, 3


@TASKS.register("parity")
class Parity(Task):
    answer_alphabet = 2  # one bit
    citation = "Delétang et al. 2023; Ruoss et al. 2023; Kazemnejad et al. 2023"
    size_unit = "bits"

    def __init__(self, min_size: Optional[int] = None):  # no alphabet to size: task.min_size is its one option
        super().__init__(None, min_size)

    @property
    def vocab_size(self) -> int:
        return 4

    def tokens_for(self, size: int) -> int:
        return size + 2

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        bits = rng.integers(0, 2, size=(count, size), dtype=np.int64)
        parity = bits.sum(axis=1, keepdims=True) % 2
        return with_answer([(bits + BIT0, False), (np.full((count, 1), EQUALS), False), (parity + BIT0, True)])
