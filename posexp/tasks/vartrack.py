"""``task=vartrack``: variable tracking, RULER's multi-hop tracing.

Hsieh et al. 2024 ("RULER: What's the Real Context Size of Your Long-Context Language Models?", §3, Multi-hop
tracing: variable tracking): chains of assignments ``VAR X1 = V``, ``VAR X2 = X1``, ... ``VAR X(h+1) = Xh`` hidden in
repeated noise, a proxy of following a coreference chain; the question gives a value and asks for every variable
that holds it. ``task.chains`` chains of ``task.hops`` hops each (``h + 1`` variables), every chain with its own
value; the first chain is asked, the others are distractors. The statements of all chains are interleaved in a random
order that keeps each chain's own order (a variable is assigned before it is read), and woven into the haystack
at uniformly random places. RULER's default is one chain of four hops; two chains of two hops fit the short
contexts small models train at, and a distractor chain makes the question one of tracking, not of listing every
variable.

An instance of ``size`` haystack tokens is the haystack with the statements ``VAR x rhs`` (``rhs`` a value or the
previous variable of the chain) woven in, then ``QUERY v`` and the ``h + 1`` variables of ``v``'s chain in the
order they were assigned (the order they appear), the answer.

Tokens: ``0`` padding, ``1`` VAR, ``2`` QUERY, ``3 .. 10`` filler, then ``S`` variables and ``S`` values
(``S = task.symbols``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.errors import ConfigError
from posexp.tasks.ruler import FILLER_PERIOD, distinct, filler, weave
from posexp.tasks.task import TASKS, Instances, Task

VAR, QUERY, FIRST_FILLER = 1, 2, 3
FIRST_NAME = FIRST_FILLER + FILLER_PERIOD
DEFAULT_CHAINS, DEFAULT_HOPS = 2, 2


@TASKS.register("vartrack")
class VariableTracking(Task):
    citation = "Hsieh et al. 2024 (RULER, variable tracking)"
    size_unit = "haystack tokens"
    default_symbols = 32
    smallest = 0

    def __init__(self, symbols: Optional[int] = None, min_size: Optional[int] = None, chains: Optional[int] = None,
                 hops: Optional[int] = None):
        super().__init__(symbols, min_size)
        self.chains = int(DEFAULT_CHAINS if chains is None else chains)
        self.hops = int(DEFAULT_HOPS if hops is None else hops)
        if self.chains < 1:
            raise ConfigError("task.chains", f"must be at least 1 chain of assignments (got {self.chains})")
        if self.hops < 1:
            raise ConfigError("task.hops", f"must be at least 1 assignment of one variable to another "
                                           f"(got {self.hops})")
        names = self.chains * (self.hops + 1)
        if names > self.symbols:
            raise ConfigError("task.symbols", f"task.chains={self.chains} x (task.hops={self.hops} + 1) = {names} "
                                              f"distinct variables, more than task.symbols={self.symbols}; raise "
                                              "task.symbols or lower task.chains / task.hops")

    @property
    def vocab_size(self) -> int:
        return FIRST_NAME + 2 * self.symbols

    def tokens_for(self, size: int) -> int:
        return size + 3 * self.chains * (self.hops + 1) + 2 + self.hops + 1

    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        c, v = self.chains, self.hops + 1  # chains, variables per chain
        names = distinct(count, c * v, self.symbols, rng).reshape(count, c, v) + FIRST_NAME
        values = distinct(count, c, self.symbols, rng) + FIRST_NAME + self.symbols  # (count, c)
        rhs = np.concatenate([values[:, :, None], names[:, :, :-1]], axis=2)  # X1 = V, X2 = X1, ...
        statements = np.stack([np.full(names.shape, VAR), names, rhs], axis=3)  # (count, c, v, 3)
        # a random interleaving that keeps each chain's order: random slots, sorted within a chain
        slot = np.argsort(rng.random((count, c * v)), axis=1).reshape(count, c, v)
        slot.sort(axis=2)
        ordered = np.empty((count, c * v, 3), dtype=np.int64)
        ordered[np.arange(count)[:, None], slot.reshape(count, c * v)] = statements.reshape(count, c * v, 3)
        at = np.sort(rng.integers(0, size + 1, size=(count, c * v)), axis=1)
        body = weave(filler(count, size, FIRST_FILLER, rng), ordered, at)
        question = np.concatenate([np.full((count, 1), QUERY), values[:, :1], names[:, 0, :]], axis=1)
        tokens = np.concatenate([body, question], axis=1)
        answer = np.zeros(tokens.shape, dtype=bool)
        answer[:, -v:] = True
        return Instances(tokens, answer)
