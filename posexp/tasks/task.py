"""What every task is: a seeded generator of token sequences whose answer tokens are marked.

A task instance is one sequence of tokens, the model reads all but its last token and predicts each next
one, as in language modelling; only the tokens marked as the answer are trained on and scored. Lengths are
counted as for perplexity: an instance "of length ``L``" is read as ``L`` tokens (it has ``L + 1``, the last
one only ever a target), so ``train_len`` and ``eval.lengths`` mean the same for a task and for ``task=lm``.

An instance of a length is the largest instance of the task that fits in it (``size_for``), with the tokens
it leaves over filled by the task's padding token at the start, so every requested length is met exactly.
Training draws each step's length uniformly from the shortest length that holds one instance of
``task.min_size`` up to ``train_len`` (one length per step, shared by the batch, as Ruoss et al. 2023 draw one
length per batch), so the instance sizes of training are (close to) uniform up to the largest that fits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from posexp.errors import ConfigError, PosexpError
from posexp.registry import Registry, option_params

PAD = 0  # every task's token 0: fills a length an instance does not use; never an answer
GENERATOR_VERSION = 1  # a task's generator_version() unless it bumps its own: its output for the same seed changed


@dataclass
class Instances:
    """``count`` instances of one length: ``tokens (count, L + 1)`` and ``answer (count, L + 1)``, true where a
    token is part of the answer (scored and trained on; never the first token)."""

    tokens: np.ndarray
    answer: np.ndarray

    @property
    def length(self) -> int:
        """The length the model reads: ``L``."""
        return int(self.tokens.shape[1]) - 1


class Task(ABC):
    """A generated task. Subclasses say how many tokens an instance of a size has and build instances.

    Args:
        symbols: the task's alphabet or key vocabulary (None: its default; ignored by tasks without one).
        min_size: the smallest instance size training draws (None: the smallest the task is defined for, at
            least 1).
    """

    name: str = ""
    description: str = ""  # what posexp list says the task is, where its yaml says nothing of it (a plugin's)
    citation: str = ""
    size_unit: str = "items"  # what a size counts, for messages
    default_symbols: Optional[int] = None
    smallest: int = 1  # the smallest size the task is defined for
    answer_alphabet: Optional[int] = None  # the values one answer token can take; None: the task's symbols
    has_depth = False  # generate() takes a depth in [0, 1] (where the needle sits): scored per eval.depths
    # __init__ takes data's token splits as ``train`` and ``val`` (the filler of passkey, babilong); its other keyword
    # arguments are the task's options, the task.* keys a config may set (posexp.tasks.option_names)
    uses_data = False

    def __init__(self, symbols: Optional[int] = None, min_size: Optional[int] = None):
        if symbols is not None and self.default_symbols is None:
            raise ConfigError("task.symbols", f"task={self.name} has no alphabet to size; drop task.symbols")
        self.symbols = int(symbols if symbols is not None else (self.default_symbols or 0))
        if self.default_symbols is not None and self.symbols < 2:
            raise ConfigError("task.symbols", f"must be at least 2 (got {self.symbols})")
        if min_size is None:
            min_size = max(1, self.smallest)
        if min_size < self.smallest:
            raise ConfigError("task.min_size", f"task={self.name} needs at least {self.counted(self.smallest)} "
                                               f"per instance (got {min_size})")
        self.min_size = int(min_size)

    # -- what subclasses define ---------------------------------------------------------------

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Tokens of the task's own vocabulary (the model's embedding follows it)."""

    @abstractmethod
    def tokens_for(self, size: int) -> int:
        """Tokens of an instance of ``size`` (increasing in ``size``), answer included."""

    @abstractmethod
    def generate(self, size: int, count: int, rng: np.random.Generator, **options) -> Instances:
        """``count`` instances of ``size``, exactly ``tokens_for(size)`` tokens each, from ``rng`` alone."""

    def largest_size(self) -> Optional[int]:
        """The largest size the task can build (e.g. distinct keys), None if unbounded."""
        return None

    def options(self) -> dict:
        """What, besides its name, defines the task's instances (provenance and the task's fingerprint): each option
        of ``__init__`` the task holds under its own name, but ``min_size`` (recorded apart) and ``symbols`` of a task
        without an alphabet. A task whose instances some of its options do not shape lists its own."""
        held = [p.name for p in option_params(type(self).__init__, ("train", "val", "min_size")) if hasattr(self, p.name)]
        return {name: getattr(self, name) for name in held if name != "symbols" or self.default_symbols is not None}

    @classmethod
    def answer_values(cls, options: Mapping[str, Any]) -> Optional[int]:
        """How many values one answer token can take, for a task of recorded ``options`` (:meth:`options`): its
        fixed answer alphabet (digits, bits), else its ``symbols``; None when neither is known."""
        if cls.answer_alphabet is not None:
            return cls.answer_alphabet
        symbols = options.get("symbols", cls.default_symbols)
        return int(symbols) if isinstance(symbols, (int, float)) and symbols >= 2 else None

    @classmethod
    def chance(cls, options: Mapping[str, Any], answer_tokens: float, size: Optional[int] = None,
               version: Optional[int] = None) -> Optional[float]:
        """The exact match of a guess drawing each answer token uniformly from :meth:`answer_values`, for instances
        of ``answer_tokens`` answer tokens (their mean) at instance ``size``: ``values ** -answer_tokens``, exact
        where every instance of the size has as many; a task whose answers vary in length says its own mean.
        ``version``: the :meth:`generator_version` of the instances a run was scored on (None: the current one),
        for a task whose chance changed with its instances."""
        values = cls.answer_values(options)
        return None if values is None or answer_tokens <= 0 else float(values) ** -float(answer_tokens)

    def generator_version(self) -> int:
        """The version of the instances the task makes with its options: the fingerprint of a run's task holds it
        (:func:`posexp.tasks.task_fingerprint`), so a run trained and scored on other instances is refused by
        ``posexp eval`` and set apart by reports. Bumped, by a task, where its output for the same seed changes."""
        return GENERATOR_VERSION

    def check_filler(self, size: int, split: str) -> None:
        """A task that ``uses_data``: refuse instances of ``size`` the data's ``split`` cannot fill; the others read
        no data, and refuse nothing here."""

    # -- lengths ------------------------------------------------------------------------------

    def size_for(self, length: int) -> int:
        """The largest size whose instance is read in at most ``length`` tokens (0 if none is)."""
        lo, hi = 0, max(1, length + 1)
        while lo < hi:  # tokens_for increases with size
            mid = (lo + hi + 1) // 2
            if self.tokens_for(mid) <= length + 1:
                lo = mid
            else:
                hi = mid - 1
        limit = self.largest_size()
        return lo if limit is None else min(lo, limit)

    def shortest_length(self, size: Optional[int] = None) -> int:
        """The shortest length holding one instance of ``size`` (default ``task.min_size``)."""
        return self.tokens_for(self.min_size if size is None else size) - 1

    def counted(self, size: int) -> str:
        """``1 background token``, ``2 background tokens``, ``1 digit per operand``: a size in its unit."""
        noun, per, rest = self.size_unit.partition(" per ")
        return f"{size} {noun[:-1] if size == 1 and noun.endswith('s') else noun}{per}{rest}"

    def check_length(self, length: int, key: str) -> None:
        """Refuse a length no instance of ``task.min_size`` fits in, or one past what the task can build.

        Raises:
            ConfigError: naming ``key``.
        """
        shortest = self.shortest_length()
        if length < shortest:
            raise ConfigError(key, f"length {length} is too short for one instance of task={self.name}: "
                                   f"an instance of {self.counted(self.min_size)} (task.min_size) takes "
                                   f"{shortest + 1} tokens, read as {shortest}; use lengths >= {shortest}")
        limit = self.largest_size()
        if limit is not None and self.tokens_for(limit + 1) <= length + 1:
            raise ConfigError(key, f"length {length} needs more than the {self.counted(limit)} task={self.name} "
                                   f"can build with task.symbols={self.symbols}; raise task.symbols or use lengths "
                                   f"<= {self.tokens_for(limit) - 1}")

    def instances(self, length: int, count: int, rng: np.random.Generator, **options) -> Instances:
        """``count`` instances read in exactly ``length`` tokens: the largest size that fits, padded at the start."""
        size = self.size_for(length)
        made = self.generate(size, count, rng, **options)
        self._check_generated(made, size, count)
        pad = length + 1 - made.tokens.shape[1]
        if pad == 0:
            return made
        tokens = np.concatenate([np.full((count, pad), PAD, dtype=np.int64), made.tokens], axis=1)
        answer = np.concatenate([np.zeros((count, pad), dtype=bool), made.answer], axis=1)
        return Instances(tokens, answer)


    def _check_generated(self, made: Instances, size: int, count: int) -> None:
        """What :meth:`generate` returned is what its contract says (a task of the user's may not hold to it):
        ``count`` rows of ``tokens_for(size)`` tokens in ``0 .. vocab_size - 1`` and an answer mask of that shape,
        never on the first token.

        Raises:
            PosexpError: in one line naming the task, the size and what is wrong, where the model would otherwise
                fail on it far from the generator (a negative padding, an embedding index out of range).
        """
        tokens, answer, want = np.asarray(made.tokens), np.asarray(made.answer), (count, self.tokens_for(size))
        if tokens.shape != want or answer.shape != want:
            wrong = f"tokens {tokens.shape} and answer {answer.shape}"
        elif not np.issubdtype(tokens.dtype, np.integer) or answer.dtype != np.bool_:
            wrong = f"tokens of {tokens.dtype} and an answer of {answer.dtype} (integers and bools)"
        elif tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            wrong = f"tokens {tokens.min()}..{tokens.max()}, outside its vocab_size {self.vocab_size}"
        elif answer[:, :1].any():
            wrong = "an answer on the first token, which no model reads before it"
        else:
            return
        raise PosexpError(f"task={self.name}: {type(self).__name__}.generate(size={size}, count={count}) returned "
                          f"{wrong}; the contract (posexp/tasks/task.py): {want} tokens (count, tokens_for(size)) "
                          f"in 0..{self.vocab_size - 1}, an answer mask of that shape, never on the first token")


def fill(count: int, width: int, high: int, rng: np.random.Generator, low: int = 0) -> np.ndarray:
    """``(count, width)`` integers drawn uniformly from ``low .. high - 1``."""
    return rng.integers(low, high, size=(count, width), dtype=np.int64)


def with_answer(parts: list[tuple[np.ndarray, bool]]) -> Instances:
    """Instances from column blocks ``(tokens (count, w), is_answer)``, joined left to right."""
    tokens = np.concatenate([p for p, _ in parts], axis=1).astype(np.int64)
    answer = np.concatenate([np.full(p.shape, flag, dtype=bool) for p, flag in parts], axis=1)
    return Instances(tokens, answer)


# Every task by name, found as encoders and trackers are (posexp.registry): a Task subclass in a module of this
# package decorated with @TASKS.register("name"); source.py holds none (and reads data).
TASKS: Registry[Task] = Registry("task", "task", "posexp.tasks", skip=("source",))
