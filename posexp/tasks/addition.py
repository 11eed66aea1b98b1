"""``task=addition``: add two ``n``-digit numbers.

Multi-digit addition as in Kazemnejad et al. 2023 (§4) and the binary addition of Delétang et al. 2023 /
Ruoss et al. 2023 (Table 1), here in base 10. Operands and sum are written least-significant digit first
(the "reversed" format of Lee et al. 2023, "Teaching Arithmetic to Small Transformers", §4), so each sum
digit depends only on digits already read: ``a_0 .. a_{n-1} + b_0 .. b_{n-1} = s_0 .. s_n`` (``3n + 3`` tokens),
the ``n + 1`` sum digits the answer; operands keep their leading zeros, the sum its last (carry) digit.

Tokens: ``0`` padding, ``1 .. 10`` the digits 0-9, ``11`` ``+``, ``12`` ``=``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.tasks.task import TASKS, Instances, Task, with_answer

DIGIT0, PLUS, EQUALS = 1, 11, 12


@TASKS.register("addition")
class Addition(Task):
    answer_alphabet = 10  # the sum's digits
    citation = "Kazemnejad et al. 2023; Lee et al. 2023 (reversed digits)"
    size_unit = "digits per operand"

    def __init__(self, min_size: Optional[int] = None):  # no alphabet to size: task.min_size is its one option
        super().__init__(None, min_size)

    @property
    def vocab_size(self) -> int:
        return 13

    def tokens_for(self, size: int) -> int:
        return 3 * size + 3

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        a = rng.integers(0, 10, size=(count, size), dtype=np.int64)  # digit i has weight 10**i
        b = rng.integers(0, 10, size=(count, size), dtype=np.int64)
        total = np.zeros((count, size + 1), dtype=np.int64)
        carry = np.zeros(count, dtype=np.int64)
        for i in range(size):  # schoolbook addition, column by column: exact at any number of digits
            column = a[:, i] + b[:, i] + carry
            total[:, i], carry = column % 10, column // 10
        total[:, size] = carry
        return with_answer([(a + DIGIT0, False), (np.full((count, 1), PLUS), False), (b + DIGIT0, False),
                            (np.full((count, 1), EQUALS), False), (total + DIGIT0, True)])
