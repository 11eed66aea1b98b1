"""``task=fwe``: frequent words extraction, RULER's aggregation.

Hsieh et al. 2024 ("RULER: What's the Real Context Size of Your Long-Context Language Models?", §3, Aggregation:
frequent words extraction): words drawn from a Zipf distribution, ``p(rank r) ∝ r^-α`` with α = 2, and the
question asks for the ``task.top_k`` (RULER: 3) most frequent. The ranks are given to ``task.symbols`` words
in a random order per instance, so which word is frequent must be counted, not remembered. Draws whose top-k is
not clear (the k-th count tied with the next) are drawn again, so every instance has one answer. A word is one
symbol.

An instance of ``size`` words is the words, then ``QUERY`` and the ``top_k`` most frequent words in the order they
first appear, the answer.

Tokens: ``0`` padding, ``1`` QUERY, then ``task.symbols`` words.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.tasks.cwe import DEFAULT_TOP_K, check_top_k
from posexp.tasks.ruler import distinct, first_appearance
from posexp.tasks.task import TASKS, Instances, Task

QUERY, FIRST_WORD = 1, 2
ALPHA = 2.0  # RULER's Zipf exponent
MAX_DRAWS = 10_000  # redraws of unclear instances: 256 instances took at most 25 rounds (at 3 words)


@TASKS.register("fwe")
class FrequentWords(Task):
    citation = "Hsieh et al. 2024 (RULER, frequent words extraction)"
    size_unit = "words"
    default_symbols = 64

    def __init__(self, symbols: Optional[int] = None, min_size: Optional[int] = None, top_k: Optional[int] = None):
        self.smallest = DEFAULT_TOP_K if top_k is None else max(1, int(top_k))  # k words, each once
        super().__init__(symbols, min_size)
        self.top_k = check_top_k(self, top_k)
        ranks = np.arange(1, self.symbols + 1, dtype=float)
        self.zipf = ranks ** -ALPHA / np.sum(ranks ** -ALPHA)

    @property
    def vocab_size(self) -> int:
        return FIRST_WORD + self.symbols

    def tokens_for(self, size: int) -> int:
        return size + 1 + self.top_k

    def _draw_ranks(self, size: int, count: int, rng: np.random.Generator) -> np.ndarray:
        """``(count, size)`` Zipf ranks ``0 ..`` whose top-k counts are clear: the k-th above the (k+1)-th."""
        ranks = np.empty((count, size), dtype=np.int64)
        todo = np.arange(count)
        for _ in range(MAX_DRAWS):
            drawn = rng.choice(self.symbols, size=(todo.size, size), p=self.zipf)
            counts = np.zeros((todo.size, self.symbols), dtype=np.int64)
            np.add.at(counts, (np.arange(todo.size)[:, None], drawn), 1)
            top = -np.sort(-counts, axis=1)
            clear = top[:, self.top_k - 1] > top[:, self.top_k]
            ranks[todo[clear]] = drawn[clear]
            todo = todo[~clear]
            if todo.size == 0:
                return ranks
        raise RuntimeError(f"task=fwe drew no clear top-{self.top_k} of {size} words in {MAX_DRAWS} draws")

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        k = self.top_k
        ranks = self._draw_ranks(size, count, rng)
        word_of = distinct(count, self.symbols, self.symbols, rng) + FIRST_WORD  # rank -> word, per instance
        words = np.take_along_axis(word_of, ranks, axis=1)
        answers = np.empty((count, k), dtype=np.int64)
        for i in range(count):
            counts = np.bincount(words[i], minlength=FIRST_WORD + self.symbols)
            answers[i] = first_appearance(words[i], np.argsort(-counts, kind="stable")[:k])
        tokens = np.concatenate([words, np.full((count, 1), QUERY), answers], axis=1)
        answer = np.zeros(tokens.shape, dtype=bool)
        answer[:, -k:] = True
        return Instances(tokens, answer)
