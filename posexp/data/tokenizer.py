"""Tokenizers: raw UTF-8 bytes (the default) or a byte-level BPE trained on the training split.

``tokenizer=byte`` reads text as its UTF-8 bytes, 256 symbols, and marks the end
of a document with the NUL byte, which never occurs in text. ``tokenizer=bpe``
is byte-level byte-pair encoding (Sennrich et al. 2016, "Neural Machine
Translation of Rare Words with Subword Units", §3.2: repeatedly merge the most
frequent adjacent pair of symbols), over the 256 byte symbols as GPT-2 uses it
(Radford et al. 2019, §2.2), trained with the Hugging Face ``tokenizers``
library on the training split only, so no validation text shapes the
vocabulary. Its vocabulary is the 256 bytes, one document-separator token and
the merges, ``tokenizer.vocab_size`` in all (fewer when the training text runs
out of pairs that occur ``tokenizer.min_frequency`` times).

Perplexity is per token, so runs with different tokenizers (or BPE vocabulary
sizes) are not comparable by perplexity; bits per byte are (see
:func:`bits_per_byte`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import numpy as np

from posexp.errors import ConfigError, PosexpError

TOKENIZERS = ("byte", "bpe")
PRETRAINED = "pretrained"  # a pretrained model's own tokenizer (posexp eval hf:MODEL), never a tokenizer= choice
BYTE_VOCAB_SIZE = 256
DEFAULT_BPE_VOCAB_SIZE = 4096
# 256 byte symbols + the document separator: the smallest BPE vocabulary, with no merges at all
MIN_BPE_VOCAB_SIZE = BYTE_VOCAB_SIZE + 1
DOC_TOKEN = "<|doc|>"
TOKENIZER_JSON = "tokenizer.json"


@dataclass(frozen=True)
class TokenizerSpec:
    """What ``tokenizer=...`` asks for; part of the token cache key and of the corpus fingerprint.

    Args:
        name: ``byte`` or ``bpe``.
        vocab_size: BPE vocabulary size, separator token included (None: 4096); must be None or 256 for ``byte``.
        min_frequency: a BPE merge needs a pair seen at least this often in the training split.
    """

    name: str = "byte"
    vocab_size: Optional[int] = None
    min_frequency: int = 2
    # name "pretrained": a pretrained model's own tokenizer (a transformers tokenizer, loaded by posexp.hf), and the
    # SHA-256 of what it tokenizes with, which keys the token cache
    pretrained: Any = field(default=None, compare=False, hash=False, repr=False)
    fingerprint: Optional[str] = None
    separator: Optional[int] = None  # the id between documents (the model's end-of-sequence token)

    @property
    def is_byte(self) -> bool:
        return self.name == "byte"

    def requested_vocab_size(self) -> int:
        if self.is_byte:
            return BYTE_VOCAB_SIZE
        return int(self.vocab_size) if self.vocab_size is not None else DEFAULT_BPE_VOCAB_SIZE

    def key(self) -> str:
        """A short, stable text of the settings that change the tokens (empty for ``byte``)."""
        if self.is_byte:
            return ""
        if self.name == PRETRAINED:
            return f"pt{self.fingerprint}"  # short: datasets caps its fingerprints (which hold this key) at 64
        return f"bpe-v{self.requested_vocab_size()}-f{self.min_frequency}"


def check_spec(spec: TokenizerSpec) -> None:
    """Raise :class:`ConfigError` for an unknown tokenizer or a vocabulary size it cannot have."""
    if spec.name == PRETRAINED and spec.pretrained is not None and spec.fingerprint:
        return
    if spec.name not in TOKENIZERS:
        raise ConfigError("tokenizer", f"unknown tokenizer {spec.name!r}; choose one of: {', '.join(TOKENIZERS)}")
    if spec.is_byte:
        if spec.vocab_size is not None and spec.vocab_size != BYTE_VOCAB_SIZE:
            raise ConfigError("tokenizer.vocab_size", f"tokenizer=byte always has {BYTE_VOCAB_SIZE} symbols "
                                                      f"(got {spec.vocab_size}); for another vocabulary size use "
                                                      "tokenizer=bpe tokenizer.vocab_size=N")
        return
    v = spec.requested_vocab_size()
    if v < MIN_BPE_VOCAB_SIZE:
        raise ConfigError("tokenizer.vocab_size", f"must be >= {MIN_BPE_VOCAB_SIZE} for tokenizer=bpe (the 256 "
                                                  f"byte symbols + 1 document separator; got {v})")
    if v > 2**31 - 1:
        raise ConfigError("tokenizer.vocab_size", f"must be < 2^31 (got {v})")
    if spec.min_frequency < 1:
        raise ConfigError("tokenizer.min_frequency", f"must be >= 1 (got {spec.min_frequency})")


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every token id: uint8 for bytes, uint16 up to 65,536."""
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    return np.dtype(np.uint32)


class ByteTokenizer:
    """UTF-8 bytes as tokens; the NUL byte separates documents."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE
    separator = 0
    dtype = np.dtype(np.uint8)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def save(self, folder: Path) -> Optional[Path]:
        return None  # nothing learned, nothing to save


class PretrainedTokenizer:
    """A pretrained model's own tokenizer (a transformers tokenizer) as the corpus reads it: the text of each
    document without special tokens, documents joined by ``separator``, the model's end-of-sequence token (chosen by
    the caller, :func:`posexp.commands.pretrained.document_separator`), as such models were trained on concatenated
    documents."""

    name = PRETRAINED

    def __init__(self, tokenizer, fingerprint: str, separator: Optional[int]):
        self._tok = tokenizer
        self.fingerprint = fingerprint
        self.vocab_size = int(len(tokenizer))
        if separator is None:
            raise PosexpError("the pretrained model names no end- or beginning-of-sequence token (in its tokenizer "
                              "or its config) to separate documents")
        self.separator = int(separator)
        self.dtype = token_dtype(self.vocab_size)

    def to_str(self) -> str:
        return self.fingerprint  # what the corpus fingerprint hashes besides the tokens

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        ids = self._tok(list(texts), add_special_tokens=False)["input_ids"]
        return [np.asarray(i, dtype=np.int64).astype(self.dtype) for i in ids]

    def save(self, folder: Path) -> Optional[Path]:
        return None  # the model's folder holds it


class BPETokenizer:
    """A trained byte-level BPE (``tokenizers.Tokenizer``) with a document-separator token.

    Build one with :meth:`train` or :meth:`load`.
    """

    name = "bpe"

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.vocab_size = int(tokenizer.get_vocab_size())
        sep = tokenizer.token_to_id(DOC_TOKEN)
        if sep is None:
            raise PosexpError(f"the BPE tokenizer has no {DOC_TOKEN} token; delete its cache folder to retrain it")
        self.separator = int(sep)
        self.dtype = token_dtype(self.vocab_size)

    @classmethod
    def train(cls, texts: Iterable[list[str]], spec: TokenizerSpec, length: Optional[int] = None,
              show_progress: bool = False) -> "BPETokenizer":
        """Learn merges from batches of training documents.

        Args:
            texts: batches (lists) of documents, the training split only.
            spec: vocabulary size and minimum pair frequency.
            length: number of documents, for the progress bar.
            show_progress: let ``tokenizers`` draw its progress bar.
        """
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        # GPT-2's byte-to-unicode mapping and pre-tokenization regex (Radford et al. 2019, §2.2):
        # merges never cross a word/space/punctuation boundary, and every byte is in the alphabet.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=spec.requested_vocab_size(), min_frequency=spec.min_frequency,
                                      special_tokens=[DOC_TOKEN], show_progress=show_progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer, length=length)
        return cls(tok)

    @classmethod
    def load(cls, path: Path) -> "BPETokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def to_str(self) -> str:
        return self._tok.to_str()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=self.dtype) for e in self._tok.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, folder: Path) -> Optional[Path]:
        from posexp.runs.atomic import atomic_write_text

        return atomic_write_text(Path(folder) / TOKENIZER_JSON, self.to_str())


def batches(texts: Iterator[str], size: int = 1000) -> Iterator[list[str]]:
    """Group an iterator of documents into lists, as ``tokenizers`` trains fastest on batches."""
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def bits_per_byte(loss_nats: float, tokens_per_byte: float) -> float:
    """Tokenizer-independent loss: nats per token → bits per UTF-8 byte of the text.

    ``loss / ln 2`` is bits per token; times tokens per byte of the validation
    split gives bits per byte, the unit in which runs with different tokenizers
    can be compared (Gao et al. 2020, "The Pile", report language models in bits
    per UTF-8 byte for this reason).

    Args:
        loss_nats: mean loss per token, in nats.
        tokens_per_byte: validation tokens per UTF-8 byte of the validation text (1 for ``byte``).

    Returns:
        Bits per byte.
    """
    return loss_nats / math.log(2) * tokens_per_byte
