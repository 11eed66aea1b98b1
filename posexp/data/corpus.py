"""Corpora as token arrays, split into train and validation, cached.

``data=stdlib`` (the default) is the running interpreter's standard-library
source, so every machine has it and nothing is downloaded; ``data=text`` is a
user's own UTF-8 file or folder; ``data=hf`` is any data set ``datasets`` can
load (a Hub id, or a local folder), with ``data=wikitext103`` and ``data=pg19``
as presets. Documents are loaded into a ``datasets.Dataset``, tokenized with
``Dataset.map`` (batched) by the tokenizer of ``tokenizer=...``
(:mod:`posexp.data.tokenizer`), joined with a document separator (the NUL byte for
byte tokens, which never occurs in text), and cached as token arrays keyed by
the sources and the tokenizer settings, so a second run reads the arrays back
without network or ``datasets``.

This module is the entry point (:func:`load_corpus`, :func:`corpus_from_config`)
and what reads a finished :class:`Corpus` (:func:`check_fits`,
:class:`BatchSampler`). The rest lives beside it: :mod:`posexp.data.tokens` (the
corpus, its token cache and fingerprint, tokenizing), :mod:`posexp.data.local`
(``stdlib`` and ``text``, split by a hash of each file's relative path) and
:mod:`posexp.data.hub` (``hf``: a data set keeps its own validation split, or,
when it has none, its last ``data.val_fraction`` of training rows are held out,
and the run says so).
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Optional

import numpy as np

from posexp.config.schema import Config, DataConfig
from posexp.data.hub import HubSource, build_hub, hub_key
from posexp.data.local import build_local, local_source, source_key, stdlib_files, stdlib_root
from posexp.data.tokenizer import TokenizerSpec, check_spec
from posexp.data.tokens import DOC_SEPARATOR, VOCAB_SIZE, Corpus, Log, cache_root, read_cache, write_cache
from posexp.errors import ConfigError

KINDS = ("stdlib", "text", "hf")
log = logging.getLogger("posexp.data")


def data_kind(data: DataConfig) -> str:
    """The loader of a ``data`` config: its ``kind`` key, else its name (configs written before ``kind``)."""
    return str(data.kind or data.name)


def tokenizer_spec(cfg: Config) -> TokenizerSpec:
    """The :class:`TokenizerSpec` of a run's config (``byte`` for a saved config from before tokenizers, which
    the schema fills in)."""
    t = cfg.tokenizer
    return TokenizerSpec(name=t.name, vocab_size=t.vocab_size, min_frequency=t.min_frequency)


def hub_source(data: DataConfig) -> HubSource:
    return HubSource(name=str(data.name), config=data.config, revision=data.revision, train_split=data.train_split,
                     validation_split=data.validation_split, text_column=data.text_column,
                     separate_rows=data.separate_rows, max_train_docs=data.max_train_docs)


# data.on_bad_file: what data=text does with a file that is not UTF-8 text
BAD_FILE_CHOICES = ("error", "skip")


def corpus_from_config(cfg: Config, log: Log = None, warn: Log = None) -> Corpus:
    """Load (or build and cache) the corpus of a run's config: ``cfg.data`` tokenized by ``cfg.tokenizer``."""
    return load_corpus(cfg.data, tokenizer_spec(cfg), log=log, warn=warn)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip("/"))[-60:]


# ---------------------------------------------------------------------------- entry point

def load_corpus(data: Optional[DataConfig] = None, tokenizer: Optional[TokenizerSpec] = None, *, log: Log = None,
                warn: Log = None) -> Corpus:
    """Load (or build and cache) a tokenized corpus.

    Args:
        data: the ``data`` config (default: ``stdlib``). Its loader (``data.kind``, else its name) is ``stdlib``,
            ``text`` (``data.path``, a file or folder; ``data.on_bad_file=skip`` leaves out files that are not
            UTF-8 text, or hold NUL bytes, instead of failing) or ``hf`` (the data set ``data.name`` and its
            splits and columns, :func:`hub_source`). ``data.val_fraction``: share of files (by hash of their path)
            held out for validation; for ``hf`` without a validation split, the share of training rows (the last
            ones) held out. ``data.cache_dir``: where token arrays are cached (default ``$POSEXP_CACHE`` or
            ``~/.cache/posexp``).
        tokenizer: ``byte`` (default) or a BPE spec; part of the cache key.
        log: called with a line for the user when something is built or a split is carved.
        warn: called with a warning for the user (the token cache cannot be written, ``text`` files left out);
            also logged.

    Raises:
        PosexpError: missing or unreadable path, non-UTF-8 or binary files, no text at all, a Hub data set
            neither cached nor reachable.
        ConfigError: an unknown kind or tokenizer, a missing split or text column.
    """
    data = data or DataConfig()
    name, val_fraction = data_kind(data), data.val_fraction
    spec = tokenizer or TokenizerSpec()
    check_spec(spec)
    if name == "hf":
        return _load_hub(hub_source(data), val_fraction, data.cache_dir, spec, log, warn)
    if name not in ("stdlib", "text"):
        raise ConfigError("data", f"unknown data set {name!r}; choose one of: {', '.join(KINDS)}")
    skip_bad_files = data.on_bad_file == "skip"
    local = local_source(name, data.path, skip_bad_files)

    # byte-level caches keep the key they had before tokenizers existed
    key = source_key(name, local.root, local.files, val_fraction, skip_bad_files=name == "text" and skip_bad_files)
    cdir = cache_root(data.cache_dir) / (f"{name}-{key}" + (f"-{spec.key()}" if spec.key() else ""))
    corpus = read_cache(cdir)
    if corpus is None:
        corpus, tok = build_local(local, val_fraction, spec, key + spec.key(), log)
        _warn(warn, write_cache(cdir, corpus, tok))
    corpus.text_fingerprint = text_fingerprint(name, key)
    if name == "text" and corpus.files < len(local.files):  # every file read is a document: the rest were left out
        _warn(warn, f"data.on_bad_file=skip: left out {len(local.files) - corpus.files} of {len(local.files)} files "
                    f"under {local.root} that are not UTF-8 text")
    return corpus


def _load_hub(hub: HubSource, val_fraction: float, cache_dir: Optional[str], spec: TokenizerSpec,
              log: Log, warn: Log) -> Corpus:
    """``data=hf``: the cached token arrays of the Hub (or local) data set, built and cached on first use."""
    if not str(hub.name or "").strip():
        raise ConfigError("data.name", "data=hf needs a data set: data.name=OWNER/NAME (a Hub id) or a local "
                                       "folder (datasets' save_to_disk output, or data files)")
    key = hub_key(hub, val_fraction)
    cdir = cache_root(cache_dir) / (f"hf-{_slug(hub.name)}-{key}" + (f"-{spec.key()}" if spec.key() else ""))
    corpus = read_cache(cdir)
    if corpus is None:
        corpus, tok = build_hub(hub, val_fraction, spec, key + spec.key(), log)
        _warn(warn, write_cache(cdir, corpus, tok))
    corpus.text_fingerprint = text_fingerprint("hf", key)
    return corpus


def text_fingerprint(kind: str, key: str) -> str:
    """16 hex digits naming the text of a corpus (its documents and split) whatever tokenizer reads it, so that
    ``posexp report`` can put runs read through different tokenizers side by side, per byte."""
    return hashlib.sha256(f"{kind}|{key}".encode()).hexdigest()[:16]


def _warn(warn: Log, message: Optional[str]) -> None:
    if message is not None:
        log.warning(message)
        if warn is not None:
            warn(message)


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

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, fingerprint: Optional[str] = None):
        self.tokens = tokens
        self.fingerprint = fingerprint  # the corpus's, for resumed runs to check
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self._offsets = np.arange(seq_len + 1)

    def batch(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.tokens.size - self.seq_len, size=self.batch_size)
        return self.tokens[starts[:, None] + self._offsets[None, :]]  # (B, seq_len + 1)

    def window(self, step: int, length: int) -> tuple[np.ndarray, None]:
        """Step ``step``'s windows cut to their first ``length + 1`` tokens (a length curriculum), every target
        scored (no answer mask)."""
        return self.batch(step)[:, :length + 1], None


__all__ = ["DOC_SEPARATOR", "KINDS", "VOCAB_SIZE", "BatchSampler", "Corpus", "HubSource", "check_fits",
           "corpus_from_config", "data_kind", "hub_source", "load_corpus", "stdlib_files", "stdlib_root",
           "tokenizer_spec"]
