"""Token arrays and their provenance, the token cache, and tokenizing documents.

A :class:`Corpus` is what every later stage reads: the train and validation
token arrays and where they came from. Building one tokenizes a
``datasets.Dataset`` of documents with ``Dataset.map`` (batched) and caches the
arrays (with the BPE ``tokenizer.json``) under a key of the sources and the
tokenizer settings, so a second run reads them back without network or
``datasets``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from posexp.data.tokenizer import (BYTE_VOCAB_SIZE, PRETRAINED, TOKENIZER_JSON, BPETokenizer, ByteTokenizer,
                                     PretrainedTokenizer, TokenizerSpec)
from posexp.runs.atomic import atomic_write_bytes, atomic_write_text

VOCAB_SIZE = BYTE_VOCAB_SIZE  # byte-level, the default tokenizer
DOC_SEPARATOR = 0
CACHE_VERSION = 1  # part of every cache key: bump it when the arrays of the same sources change
Log = Optional[Callable[[str], None]]


@dataclass
class Corpus:
    """Token arrays and their provenance."""

    name: str
    train: np.ndarray  # (N_train,) token ids: uint8 for bytes, uint16/uint32 for BPE
    val: np.ndarray  # (N_val,)
    fingerprint: str  # sha256 of the tokens (and the BPE vocabulary), first 16 hex digits
    files: int  # documents (files, or data set rows)
    val_files: int
    split: str  # "by_file", "by_tail", "hub" (the data set's own validation split) or "carved_from_train"
    source: str
    vocab_size: int = VOCAB_SIZE
    tokenizer: str = "byte"
    val_bytes: Optional[int] = None  # UTF-8 bytes of the validation text, separators included
    tokenizer_file: Optional[str] = None  # the BPE tokenizer.json beside the cached arrays
    text_fingerprint: Optional[str] = None  # the text whatever its tokenizer (set by load_corpus, never cached)
    val_documents: Optional[list[str]] = None  # the validation files in the order their tokens are joined (by_file)

    def info(self) -> dict:
        val_bytes = self.val_bytes if self.val_bytes is not None else (
            int(self.val.size) if self.tokenizer == "byte" else None)
        return {
            "corpus": self.name,
            "corpus_fingerprint": self.fingerprint,
            "corpus_source": self.source,
            "train_tokens": int(self.train.size),
            "val_tokens": int(self.val.size),
            "files": self.files,
            "val_files": self.val_files,
            "split": self.split,
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
            "val_bytes": val_bytes,
            # bits per byte = loss (nats/token) / ln 2 * tokens_per_byte: comparable across tokenizers
            "tokens_per_byte": round(self.val.size / val_bytes, 6) if val_bytes else None,
            "unigram_ppl": unigram_perplexity(self.train, self.val, self.vocab_size),
            **({"text_fingerprint": self.text_fingerprint} if self.text_fingerprint else {}),
            **({"val_documents": list(self.val_documents)} if self.val_documents else {}),
        }


def unigram_perplexity(train: np.ndarray, val: np.ndarray, vocab_size: int) -> Optional[float]:
    """Perplexity on ``val`` of the unigram model of ``train`` (token frequencies, add-one smoothed): what a model
    that ignores every context scores, the floor a trained model must beat to have learned anything (the report's
    "did not learn at 1×"). None for an empty split."""
    if train.size == 0 or val.size == 0:
        return None
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return round(float(np.exp(-log_p[val].mean())), 4)


def cache_root(cache_dir: Optional[str]) -> Path:
    """Where token arrays are cached: ``cache_dir``, else ``$POSEXP_CACHE``, else ``$XDG_CACHE_HOME/posexp``
    or ``~/.cache/posexp``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("POSEXP_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "posexp"


# ---------------------------------------------------------------------------- the token cache

def read_cache(cdir: Path) -> Optional[Corpus]:
    """The corpus cached in ``cdir``, or None when there is none (or it is damaged)."""
    meta_path = cdir / "meta.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("split") == "by_file" and not meta.get("val_documents"):
            return None  # cached before the validation files were recorded: rebuilt once, to the same tokens
        train = np.load(cdir / "train.npy", mmap_mode="r")
        val = np.load(cdir / "val.npy", mmap_mode="r")
        if meta.get("tokenizer", "byte") == "bpe":
            meta["tokenizer_file"] = str(cdir / TOKENIZER_JSON)
        return Corpus(train=np.asarray(train), val=np.asarray(val), **meta)
    except (OSError, ValueError, TypeError, KeyError):
        return None  # a damaged cache is rebuilt


def write_cache(cdir: Path, corpus: Corpus, tokenizer) -> Optional[str]:
    """Cache ``corpus`` (and a BPE tokenizer's ``tokenizer.json``) in ``cdir``; best effort.

    Returns:
        Why the cache could not be written, for the user; None when it was.
    """
    meta = {f.name: getattr(corpus, f.name) for f in fields(corpus)
            if f.name not in ("train", "val", "tokenizer_file", "text_fingerprint")}
    try:
        cdir.mkdir(parents=True, exist_ok=True)
        saved = tokenizer.save(cdir)
        if saved is not None:
            corpus.tokenizer_file = str(saved)
        for fname, arr in (("train.npy", corpus.train), ("val.npy", corpus.val)):
            buf = io.BytesIO()
            np.save(buf, arr)
            atomic_write_bytes(cdir / fname, buf.getvalue())
        atomic_write_text(cdir / "meta.json", json.dumps(meta, indent=2))  # written last: marks the cache complete
    except OSError as e:
        # a read-only cache folder only costs the rebuild next time
        return (f"the token cache {cdir.parent} cannot be written ({e.strerror or e}): every run tokenizes the "
                "corpus again; set data.cache_dir (or POSEXP_CACHE) to a writable folder")
    return None


def corpus_fingerprint(train: np.ndarray, val: np.ndarray, tokenizer) -> str:
    """16 hex digits of SHA-256 over the tokens (and a BPE tokenizer's vocabulary)."""
    h = hashlib.sha256()
    if tokenizer.name != "byte":
        # the vocabulary too: two tokenizers never share a fingerprint, so `posexp report` never mixes them
        h.update(f"{tokenizer.name}|".encode() + tokenizer.to_str().encode() + b"|")
    h.update(np.ascontiguousarray(train).tobytes() + b"|" + np.ascontiguousarray(val).tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- tokenization

@contextlib.contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """``datasets``' progress bars on for large Hub data sets, off for the local corpora (built in seconds)."""
    from datasets.utils import logging as ds_logging

    was_on = ds_logging.is_progress_bar_enabled()
    (ds_logging.enable_progress_bar if show else ds_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (ds_logging.enable_progress_bar if was_on else ds_logging.disable_progress_bar)()


def _texts(ds, column: str) -> Iterator[list[str]]:
    for batch in ds.iter(batch_size=1000):
        yield [t for t in batch[column] if t]


def make_tokenizer(spec: TokenizerSpec, train_ds, column: str, show_progress: bool, log: Log):
    if spec.is_byte:
        return ByteTokenizer()
    if spec.name == PRETRAINED:
        return PretrainedTokenizer(spec.pretrained, str(spec.fingerprint), spec.separator)
    if log is not None:
        log(f"training a byte-level BPE tokenizer (vocab {spec.requested_vocab_size()}) on the training split "
            f"({len(train_ds):,} documents)")
    return BPETokenizer.train(_texts(train_ds, column), spec, length=len(train_ds), show_progress=show_progress)


def tokenize(ds, column: str, tokenizer, separate_rows: bool, fingerprint: str,
              show_progress: bool) -> tuple[np.ndarray, int]:
    """Tokens of every row of ``ds[column]`` in order, and the UTF-8 bytes they encode.

    With ``separate_rows`` each row is followed by the separator, and the last one is
    dropped: the same array as joining the rows with it.
    """
    from datasets import Features, Value

    try:
        from datasets import List  # datasets >= 4
    except ImportError:  # pragma: no cover - older datasets
        from datasets import Sequence as List

    sep = np.asarray([tokenizer.separator], dtype=tokenizer.dtype)

    def encode(batch: dict) -> dict:
        texts = [t or "" for t in batch[column]]
        ids = tokenizer.encode_batch(texts)
        if separate_rows:
            ids = [np.concatenate([a, sep]) for a in ids]
        return {"ids": ids, "n_bytes": [len(t.encode("utf-8")) + int(separate_rows) for t in texts]}

    features = Features({"ids": List(Value(tokenizer.dtype.name)), "n_bytes": Value("int64")})
    with _progress_bars(show_progress):
        mapped = ds.map(encode, batched=True, batch_size=1000, remove_columns=ds.column_names, features=features,
                        new_fingerprint=fingerprint, desc=f"tokenizing ({tokenizer.name})")
    chunks = [c.flatten().to_numpy(zero_copy_only=False) for c in mapped.data.column("ids").chunks]
    tokens = np.concatenate(chunks).astype(tokenizer.dtype, copy=False) if chunks else np.zeros(0, tokenizer.dtype)
    n_bytes = int(np.sum(mapped.data.column("n_bytes").to_numpy())) if len(mapped) else 0
    if separate_rows and len(mapped):
        tokens, n_bytes = tokens[:-1], n_bytes - 1
    return np.ascontiguousarray(tokens), n_bytes
