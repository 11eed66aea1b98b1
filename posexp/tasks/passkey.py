"""``task=passkey``: retrieve a number hidden at a chosen depth inside filler text.

Mohtashami & Jaggi 2023 ("Landmark Attention: Random-Access Infinite Context Length for Transformers", §4.2,
the passkey retrieval task), as in needle-in-a-haystack grids of context length x depth. The filler is text
of ``data`` (its byte tokens: the training split for training, the validation split for evaluation), the
key ``task.digits`` random decimal digits. An instance of ``size`` filler tokens is::

    filler[:d]  "pass key 71432. "  filler[d:]  "pass key? "  71432

``d = round(depth * size)``; depth 0 puts the key before all the filler, depth 1 right before the question.
The digits after the question are the answer. Training draws the depth uniformly; ``eval.depths`` lists
the depths measured at every length. The wording is shorter than the paper's ("The pass key is 71432.
Remember it.") so that an instance fits the short contexts small models train at.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from posexp.errors import ConfigError
from posexp.tasks.task import TASKS, Instances, Task

NEEDLE_START, NEEDLE_END, QUESTION = b"pass key ", b". ", b"pass key? "
DIGIT0 = ord("0")


def _bytes(text: bytes, count: int) -> np.ndarray:
    return np.tile(np.frombuffer(text, dtype=np.uint8).astype(np.int64), (count, 1))


@TASKS.register("passkey")
class Passkey(Task):
    answer_alphabet = 10  # the key's decimal digits
    citation = "Mohtashami & Jaggi 2023 (landmark attention, passkey retrieval)"
    size_unit = "filler tokens"
    smallest = 0
    uses_data = True
    has_depth = True

    def __init__(self, train: np.ndarray, val: np.ndarray, digits: int = 5, min_size: Optional[int] = None):
        super().__init__(None, min_size)
        if digits < 1:
            raise ConfigError("task.digits", f"must be a positive number of digits (got {digits})")
        self.digits = int(digits)
        self.filler = {"train": np.asarray(train), "val": np.asarray(val)}

    @property
    def vocab_size(self) -> int:
        return 256  # bytes

    def overhead(self) -> int:
        """Tokens of an instance besides its filler: the needle, the question and the answer."""
        return len(NEEDLE_START) + self.digits + len(NEEDLE_END) + len(QUESTION) + self.digits

    def tokens_for(self, size: int) -> int:
        return size + self.overhead()

    def check_filler(self, size: int, split: str) -> None:
        """Refuse instances of ``size`` filler tokens when the data's ``split`` has fewer tokens.

        Raises:
            ConfigError: naming ``train_len`` (training split) or ``eval.lengths`` (validation split).
        """
        have = int(self.filler[split].size)
        if have < size:
            raise ConfigError("eval.lengths" if split == "val" else "train_len",
                              f"task={self.name} needs {size} filler tokens, but the {split} split of data has {have}; "
                              "use more text or shorter lengths")

    def generate(self, size: int, count: int, rng: np.random.Generator, depth: float | None = None,
                 split: str = "train", **options) -> Instances:
        self.check_filler(size, split)
        source = self.filler[split]
        starts = rng.integers(0, source.size - size + 1, size=count)
        filler = source[starts[:, None] + np.arange(size)[None, :]].astype(np.int64)  # (count, size)
        key = rng.integers(0, 10, size=(count, self.digits), dtype=np.int64) + DIGIT0
        if depth is None:
            at = rng.integers(0, size + 1, size=count)  # uniform over every place in the filler
        else:
            at = np.full(count, int(round(float(depth) * size)))
        needle = np.concatenate([_bytes(NEEDLE_START, count), key, _bytes(NEEDLE_END, count)], axis=1)
        body = np.empty((count, size + needle.shape[1]), dtype=np.int64)
        for i in range(count):  # the needle goes at a different place in each row
            body[i] = np.concatenate([filler[i, :at[i]], needle[i], filler[i, at[i]:]])
        tokens = np.concatenate([body, _bytes(QUESTION, count), key], axis=1)
        answer = np.zeros(tokens.shape, dtype=bool)
        answer[:, -self.digits:] = True
        return Instances(tokens, answer)
