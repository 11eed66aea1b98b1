"""Zero-shot passkey retrieval for a pretrained model, in its own tokenizer (``posexp eval hf:MODEL task.name=passkey``).

Mohtashami & Jaggi 2023 ("Landmark Attention", §4.2 and its appendix prompt): a pretrained model reads an
instruction, filler text with a key sentence hidden at a depth, and a question, and is scored on the key's tokens::

    PROMPT  filler[:d]  "The pass key is 71432. Remember it. 71432 is the pass key."  filler[d:]
    "What is the pass key? The pass key is"  " 71432"

The wording is the paper's; the filler is posexp's data (the validation split, in the model's tokens), as
``task=passkey`` uses it for posexp's own models (:mod:`posexp.tasks.passkey`, whose shorter byte-level wording fits
models trained from scratch at 128 tokens). Each piece is tokenized on its own and the filler takes the rest, so every
instance is exactly ``L + 1`` tokens however the tokenizer splits the key's digits (a BPE may join two or three
digits in one token); ``d = round(depth * filler)``. Scoring is posexp's teacher-forced exact match over the answer
tokens: the same as greedy decoding of the key, since every answer token must be the argmax given the true prefix.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from posexp.errors import ConfigError
from posexp.tasks.passkey import Passkey
from posexp.tasks.task import Instances

PROMPT = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
          "I will quiz you about the important information there.\n")
QUESTION = "\nWhat is the pass key? The pass key is"


def _needle(key: str) -> str:
    return f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n"


class TextPasskey(Passkey):
    """:class:`~posexp.tasks.passkey.Passkey` in a pretrained tokenizer's tokens.

    Args:
        encode: text -> token ids of the model's tokenizer, without special tokens.
        val: the validation split in those tokens (the filler).
        vocab: the tokenizer's vocabulary size.
        digits: decimal digits of the key (``task.digits``).
    """

    citation = "Mohtashami & Jaggi 2023 (landmark attention, passkey retrieval), zero-shot with the model's tokenizer"

    def __init__(self, encode: Callable[[str], list[int]], val: np.ndarray, vocab: int, digits: int = 5):
        super().__init__(np.zeros(0, dtype=np.int64), val, digits=digits, min_size=None)
        self.encode, self.vocab = encode, int(vocab)
        widest = "9" * self.digits
        self._fixed = len(encode(PROMPT)) + len(encode(QUESTION))
        self._widest = len(encode(_needle(widest))) + len(encode(f" {widest}"))

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def options(self) -> dict:
        """``task.digits``: the tokenizer's ``encode`` and vocabulary are the model's, not options of the task."""
        return {"digits": self.digits}

    def overhead(self) -> int:
        """Tokens of an instance besides its filler, for the widest key: the prompt, needle, question, answer."""
        return self._fixed + self._widest

    def instances(self, length: int, count: int, rng: np.random.Generator, depth: Optional[float] = None,
                  split: str = "val", **options) -> Instances:
        """``count`` instances of exactly ``length + 1`` tokens, the key at ``depth`` of the filler (drawn when
        None)."""
        source = self.filler[split]
        tokens = np.empty((count, length + 1), dtype=np.int64)
        answer = np.zeros(tokens.shape, dtype=bool)
        for i in range(count):
            key = "".join(str(d) for d in rng.integers(0, 10, size=self.digits))
            parts = [self.encode(PROMPT), self.encode(_needle(key)), self.encode(QUESTION), self.encode(f" {key}")]
            size = length + 1 - sum(len(p) for p in parts)
            if size < 0:
                raise ConfigError("eval.lengths", f"{length} tokens cannot hold task passkey's prompt, key sentence "
                                                  f"and question, {length + 1 - size} tokens in this tokenizer; use "
                                                  "longer eval.lengths")
            if source.size < size:
                raise ConfigError("eval.lengths", f"task passkey at length {length} needs {size} filler tokens, but "
                                                  f"the validation split of data has {source.size}; use more text "
                                                  "or shorter eval.lengths")
            start = int(rng.integers(0, source.size - size + 1))
            filler = source[start:start + size].astype(np.int64)
            at = int(rng.integers(0, size + 1)) if depth is None else int(round(float(depth) * size))
            row = np.concatenate([parts[0], filler[:at], parts[1], filler[at:], parts[2], parts[3]]).astype(np.int64)
            tokens[i] = row
            answer[i, -len(parts[3]):] = True
        return Instances(tokens, answer)


__all__ = ["PROMPT", "QUESTION", "TextPasskey"]
