"""Corpora as byte-level token arrays, split into train and validation by file.

``data=stdlib`` (the default) is the running interpreter's standard-library
source, so every machine has it and nothing is downloaded; ``data=text`` is a
user's own UTF-8 file or folder. Documents are loaded into a
``datasets.Dataset`` (``path``, ``text``), split deterministically by a hash of
each file's relative path, and cached as ``uint8`` token arrays keyed by the
content of the sources. Documents are joined with a NUL byte, which never
occurs in text, so a model can see where one file ends.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from posexp.errors import ConfigError, PosexpError
from posexp.io import atomic_write_bytes, atomic_write_text

VOCAB_SIZE = 256  # byte-level
DOC_SEPARATOR = 0
_STDLIB_EXCLUDE = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_CACHE_VERSION = 1


@dataclass
class Corpus:
    """Token arrays and their provenance."""

    name: str
    train: np.ndarray  # uint8 (N_train,)
    val: np.ndarray  # uint8 (N_val,)
    fingerprint: str  # sha256 of the tokens, first 16 hex digits
    files: int
    val_files: int
    split: str  # "by_file" or "by_tail"
    source: str
    vocab_size: int = VOCAB_SIZE

    def info(self) -> dict:
        return {
            "corpus": self.name,
            "corpus_fingerprint": self.fingerprint,
            "corpus_source": self.source,
            "train_tokens": int(self.train.size),
            "val_tokens": int(self.val.size),
            "files": self.files,
            "val_files": self.val_files,
            "split": self.split,
            "tokenizer": "byte",
            "vocab_size": self.vocab_size,
        }


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_files() -> list[Path]:
    root = stdlib_root()
    files = [p for p in root.rglob("*.py")
             if not (set(p.relative_to(root).parts[:-1]) & _STDLIB_EXCLUDE) and p.is_file()]
    return sorted(files)


def text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))


def _is_val(relpath: str, val_fraction: float) -> bool:
    # A hash of the relative path, not of the content, so a file stays on its
    # side of the split across interpreter patch releases.
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h / 2**64 < val_fraction


def _source_key(name: str, root: Path, files: list[Path], val_fraction: float) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION}|{name}|{root}|{val_fraction!r}".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def _read_documents(root: Path, files: list[Path], strict: bool) -> Iterator[dict]:
    for f in files:
        raw = f.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if strict:
                raise PosexpError(f"data.path: {f} is not UTF-8 text ({e.reason} at byte {e.start}); "
                                  "data=text reads UTF-8 text files only") from None
            continue
        if "\x00" in text:
            if strict:
                raise PosexpError(f"data.path: {f} contains NUL bytes, so it looks binary; "
                                  "data=text reads UTF-8 text files only")
            continue
        rel = f.name if root.is_file() else str(f.relative_to(root))
        yield {"path": rel, "text": text}


def _join(texts: list[str]) -> np.ndarray:
    sep = bytes([DOC_SEPARATOR])
    return np.frombuffer(sep.join(t.encode("utf-8") for t in texts), dtype=np.uint8).copy()


def cache_root(cache_dir: Optional[str]) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("POSEXP_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "posexp"


def load_corpus(name: str, path: Optional[str] = None, val_fraction: float = 0.05,
                cache_dir: Optional[str] = None) -> Corpus:
    """Load (or build and cache) a byte-level corpus.

    Args:
        name: ``stdlib`` or ``text``.
        path: file or folder for ``text``.
        val_fraction: share of files (by hash of their path) held out for validation.
        cache_dir: where token arrays are cached (default ``$POSEXP_CACHE`` or ``~/.cache/posexp``).

    Raises:
        PosexpError: missing or unreadable path, non-UTF-8 or binary files, no text at all.
    """
    if name == "stdlib":
        root, files, strict = stdlib_root(), stdlib_files(), False
        source = f"python {sys.version.split()[0]} stdlib at {root}"
        if not files:
            raise PosexpError(f"data=stdlib: no .py files found under {root}; use data=text data.path=...")
    elif name == "text":
        if not path:
            raise ConfigError("data.path", "data=text needs the text to train on: data.path=FILE_OR_DIR")
        root = Path(path).expanduser().resolve()
        if not root.exists():
            raise ConfigError("data.path", f"{path} does not exist; give a UTF-8 text file or a folder of them")
        files, strict = text_files(root), True
        source = str(root)
        if not files:
            raise ConfigError("data.path", f"{path} is an empty folder; it needs UTF-8 text files")
    else:
        raise ConfigError("data", f"unknown data set {name!r}; choose one of: stdlib, text")

    key = _source_key(name, root, files, val_fraction)
    cdir = cache_root(cache_dir) / f"{name}-{key}"
    meta_path = cdir / "meta.json"
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            train = np.load(cdir / "train.npy", mmap_mode="r")
            val = np.load(cdir / "val.npy", mmap_mode="r")
            return Corpus(train=np.asarray(train), val=np.asarray(val), **meta)
        except (OSError, ValueError, TypeError, KeyError):
            pass  # a damaged cache is rebuilt below

    from datasets import Dataset  # heavy import, only when building

    docs = Dataset.from_list(list(_read_documents(root, files, strict)))
    if len(docs) == 0 or sum(len(t) for t in docs["text"]) == 0:
        raise PosexpError(f"data.path: {path or root} holds no text")
    is_val = [_is_val(p, val_fraction) for p in docs["path"]]
    val_docs = docs.select([i for i, v in enumerate(is_val) if v])
    train_docs = docs.select([i for i, v in enumerate(is_val) if not v])
    if len(val_docs) > 0 and len(train_docs) > 0:
        train, val, split = _join(train_docs["text"]), _join(val_docs["text"]), "by_file"
    else:
        # One file (or an unlucky hash): hold out the tail of the text instead.
        tokens = _join(docs["text"])
        cut = int(round(tokens.size * (1 - val_fraction)))
        train, val, split = tokens[:cut].copy(), tokens[cut:].copy(), "by_tail"
    fingerprint = hashlib.sha256(train.tobytes() + b"|" + val.tobytes()).hexdigest()[:16]
    meta = {"name": name, "fingerprint": fingerprint, "files": len(docs),
            "val_files": len(val_docs) if split == "by_file" else 0, "split": split, "source": source}

    try:
        cdir.mkdir(parents=True, exist_ok=True)
        for fname, arr in (("train.npy", train), ("val.npy", val)):
            buf = io.BytesIO()
            np.save(buf, arr)
            atomic_write_bytes(cdir / fname, buf.getvalue())
        atomic_write_text(meta_path, json.dumps(meta, indent=2))  # written last: marks the cache complete
    except OSError:
        pass  # a read-only cache folder only costs the rebuild next time
    return Corpus(train=train, val=val, **meta)


def check_fits(corpus: Corpus, train_len: int, longest_eval: int) -> None:
    """Refuse a corpus too small for one training window or one window of the longest eval length."""
    if corpus.train.size < train_len + 1:
        raise ConfigError("train_len", f"the training split has {corpus.train.size} tokens, fewer than one "
                                       f"window of train_len + 1 = {train_len + 1}; use more text or a smaller train_len")
    if corpus.val.size < longest_eval + 1:
        raise ConfigError("eval.lengths", f"the validation split has {corpus.val.size} tokens, fewer than one "
                                          f"window of the longest eval length + 1 = {longest_eval + 1}; use more "
                                          "text, a larger data.val_fraction, or shorter eval.lengths")


class BatchSampler:
    """Random training windows, reproducible from a seed and resumable from a step count.

    Each step draws ``batch_size`` start offsets uniformly from the training split
    with its own generator seeded by ``(seed, step)``, so step ``s`` sees the same
    batch whether or not the run was interrupted before it.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self._offsets = np.arange(seq_len + 1)

    def batch(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.tokens.size - self.seq_len, size=self.batch_size)
        return self.tokens[starts[:, None] + self._offsets[None, :]]  # (B, seq_len + 1)
