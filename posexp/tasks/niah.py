"""``task=niah``: needle in a haystack, RULER's retrieval family.

Hsieh et al. 2024 ("RULER: What's the Real Context Size of Your Long-Context Language Models?", §3, Retrieval:
needle-in-a-haystack): needles "key → value" hidden in a haystack of repeated noise, then a question about them.
``task.variant`` picks RULER's four kinds of needle:

- ``single`` (S-NIAH): one needle; its key is asked.
- ``multikey`` (MK-NIAH): ``task.needles`` needles of distinct keys, one asked; the others are distractors.
- ``multivalue`` (MV-NIAH): ``task.needles`` needles of one key with distinct values; every value is asked, in
  the order the values appear.
- ``multiquery`` (MQ-NIAH): ``task.needles`` needles of distinct keys; every key is asked, in a random order.

An instance of ``size`` haystack tokens (the repeated filler of :mod:`posexp.tasks.ruler`) is the haystack with
each needle ``NEEDLE k v`` woven in, then the question: ``QUERY k`` followed by its value (``single``,
``multikey``), by all values (``multivalue``), or ``QUERY k v`` once per key (``multiquery``). The values after
the questions are the answer. At a depth (``eval.depths``) one needle, the asked one of ``single`` and
``multikey``, sits at ``round(depth * size)`` as in ``task=passkey``: depth 0 before all the haystack, 1 right
before the question; the other needles, and every needle in training, at uniformly random places.
RULER's needles are sentences with 7-digit numbers and UUIDs; here a key and a value are one symbol each, so that a
small model reads many needles in a short context.

Tokens: ``0`` padding, ``1`` NEEDLE, ``2`` QUERY, ``3 .. 10`` filler, then ``S`` keys and ``S`` values
(``S = task.symbols``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.errors import ConfigError
from posexp.tasks.ruler import FILLER_PERIOD, distinct, filler, weave
from posexp.tasks.task import TASKS, Instances, Task

NEEDLE, QUERY, FIRST_FILLER = 1, 2, 3
FIRST_KEY = FIRST_FILLER + FILLER_PERIOD
VARIANTS = ("single", "multikey", "multivalue", "multiquery")
DEFAULT_NEEDLES = 4  # RULER's multi-needle variants hide four


@TASKS.register("niah")
class NIAH(Task):
    citation = "Hsieh et al. 2024 (RULER, needle in a haystack)"
    size_unit = "haystack tokens"
    default_symbols = 64
    smallest = 0
    has_depth = True

    def __init__(self, symbols: Optional[int] = None, min_size: Optional[int] = None, variant: Optional[str] = None,
                 needles: Optional[int] = None):
        super().__init__(symbols, min_size)
        self.variant = str(variant or "single")
        if self.variant not in VARIANTS:
            raise ConfigError("task.variant", f"unknown variant {self.variant!r}; choose one of: {', '.join(VARIANTS)}")
        if self.variant == "single":
            if needles not in (None, 1):
                raise ConfigError("task.needles", f"task.variant=single hides one needle (got {needles}); drop "
                                                  "task.needles or choose task.variant=multikey|multivalue|multiquery")
            needles = 1
        elif needles is None:
            needles = DEFAULT_NEEDLES
        elif needles < 2:
            raise ConfigError("task.needles", f"must be at least 2 for task.variant={self.variant} (got {needles})")
        if needles > self.symbols:
            raise ConfigError("task.needles", f"{needles} needles need as many distinct keys and values, more than "
                                              f"task.symbols={self.symbols}; raise task.symbols or lower task.needles")
        self.needles = int(needles)

    @property
    def vocab_size(self) -> int:
        return FIRST_KEY + 2 * self.symbols

    def question_tokens(self) -> int:
        """Tokens of the question and its answer."""
        n = self.needles
        return {"multivalue": 2 + n, "multiquery": 3 * n}.get(self.variant, 3)

    def tokens_for(self, size: int) -> int:
        return size + 3 * self.needles + self.question_tokens()

    def generate(self, size: int, count: int, rng: np.random.Generator, depth: Optional[float] = None,
                 **options) -> Instances:
        n = self.needles
        keys = distinct(count, n, self.symbols, rng) + FIRST_KEY  # (count, n)
        if self.variant == "multivalue":
            keys[:] = keys[:, :1]
        values = distinct(count, n, self.symbols, rng) + FIRST_KEY + self.symbols
        at = rng.integers(0, size + 1, size=(count, n))
        if depth is not None:
            at[:, 0] = int(round(float(depth) * size))
        pieces = np.stack([np.full((count, n), NEEDLE), keys, values], axis=2)  # (count, n, 3)
        body = weave(filler(count, size, FIRST_FILLER, rng), pieces, at)
        question, answer = self._question(keys, values, at, rng)
        tokens = np.concatenate([body, question], axis=1)
        mask = np.concatenate([np.zeros(body.shape, dtype=bool), np.broadcast_to(answer, question.shape)], axis=1)
        return Instances(tokens.astype(np.int64), mask)

    def _question(self, keys: np.ndarray, values: np.ndarray, at: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The question tokens ``(count, question_tokens())`` and which of them are the answer."""
        count, n = keys.shape
        query = np.full((count, 1), QUERY)
        if self.variant == "multivalue":  # the values in the order they appear (weave keeps ties in order)
            shown = np.take_along_axis(values, np.argsort(at, axis=1, kind="stable"), axis=1)
            return np.concatenate([query, keys[:, :1], shown], axis=1), np.array([False, False] + [True] * n)
        if self.variant == "multiquery":
            order = np.argsort(rng.random((count, n)), axis=1)
            asked = np.stack([np.full((count, n), QUERY), np.take_along_axis(keys, order, axis=1),
                              np.take_along_axis(values, order, axis=1)], axis=2).reshape(count, 3 * n)
            return asked, np.tile([False, False, True], n)
        return np.concatenate([query, keys[:, :1], values[:, :1]], axis=1), np.array([False, False, True])
