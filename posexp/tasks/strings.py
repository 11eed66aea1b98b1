"""What copy, reverse and sort share: a string of symbols, a separator, then the answer string.

Tokens: ``0`` padding, ``1`` the separator, ``2 .. 2 + symbols - 1`` the symbols. An instance of size ``n`` is
``x_1 .. x_n SEP y_1 .. y_n`` (``2n + 1`` tokens), the ``y`` the answer.
"""

from __future__ import annotations

import numpy as np

from posexp.tasks.task import Instances, Task, fill, with_answer

SEP = 1
FIRST_SYMBOL = 2


class StringTask(Task):
    """A string-to-string task; subclasses say what the answer of each input string is."""

    size_unit = "symbols"

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.symbols

    def tokens_for(self, size: int) -> int:
        return 2 * size + 1

    def answer_of(self, strings: np.ndarray) -> np.ndarray:
        """The answer strings ``(count, n)`` of input strings ``(count, n)``."""
        raise NotImplementedError

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        x = fill(count, size, FIRST_SYMBOL + self.symbols, rng, low=FIRST_SYMBOL)
        return with_answer([(x, False), (np.full((count, 1), SEP), False), (self.answer_of(x), True)])
