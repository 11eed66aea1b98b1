"""``task=cwe``: common words extraction, RULER's aggregation.

Hsieh et al. 2024 ("RULER: What's the Real Context Size of Your Long-Context Language Models?", §3, Aggregation:
common words extraction): a list of words in which a few common words each appear many times and every other word
appears a few times; the question asks for the common words, a proxy of summarising what runs through a long text.
RULER repeats its 10 common words 30 times and the others 3 times; here ``task.top_k`` common words (default 3)
appear :data:`COMMON_REPEATS` times each and the others :data:`UNCOMMON_REPEATS` times, so that small models meet
the task at short contexts. A word is one symbol.

An instance of ``size`` uncommon words is every occurrence of the ``top_k + size`` distinct words in a random
order, then ``QUERY`` and the ``top_k`` common words in the order they first appear, the answer.

Tokens: ``0`` padding, ``1`` QUERY, then ``task.symbols`` words.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.errors import ConfigError
from posexp.tasks.ruler import distinct
from posexp.tasks.task import TASKS, Instances, Task

QUERY, FIRST_WORD = 1, 2
COMMON_REPEATS, UNCOMMON_REPEATS = 5, 2
DEFAULT_TOP_K = 3


def check_top_k(task: Task, top_k: Optional[int]) -> int:
    """``task.top_k`` (None: :data:`DEFAULT_TOP_K`), at least 1 and below ``task.symbols``.

    Raises:
        ConfigError: naming ``task.top_k``.
    """
    k = int(DEFAULT_TOP_K if top_k is None else top_k)
    if not 1 <= k < task.symbols:
        raise ConfigError("task.top_k", f"must be a number of words from 1 to task.symbols - 1 = {task.symbols - 1} "
                                        f"(got {k})")
    return k


@TASKS.register("cwe")
class CommonWords(Task):
    citation = "Hsieh et al. 2024 (RULER, common words extraction)"
    size_unit = "uncommon words"
    default_symbols = 512  # distinct words an instance can draw: 8x train_len 128 holds ~500

    def __init__(self, symbols: Optional[int] = None, min_size: Optional[int] = None, top_k: Optional[int] = None):
        super().__init__(symbols, min_size)
        self.top_k = check_top_k(self, top_k)

    @property
    def vocab_size(self) -> int:
        return FIRST_WORD + self.symbols

    def tokens_for(self, size: int) -> int:
        return COMMON_REPEATS * self.top_k + UNCOMMON_REPEATS * size + 1 + self.top_k

    def largest_size(self) -> Optional[int]:
        return self.symbols - self.top_k  # the words are distinct

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        k = self.top_k
        words = distinct(count, k + size, self.symbols, rng) + FIRST_WORD  # the first k are the common ones
        listed = np.concatenate([np.repeat(words[:, :k], COMMON_REPEATS, axis=1),
                                 np.repeat(words[:, k:], UNCOMMON_REPEATS, axis=1)], axis=1)
        listed = np.take_along_axis(listed, np.argsort(rng.random(listed.shape), axis=1), axis=1)
        first = (listed[:, :, None] == words[:, None, :k]).argmax(axis=1)  # (count, k): where each first appears
        common = np.take_along_axis(words[:, :k], np.argsort(first, axis=1), axis=1)
        tokens = np.concatenate([listed, np.full((count, 1), QUERY), common], axis=1)
        answer = np.zeros(tokens.shape, dtype=bool)
        answer[:, -k:] = True
        return Instances(tokens.astype(np.int64), answer)
