"""Corpora as token arrays, split into train and validation, cached.

``data=stdlib`` (the default) is the running interpreter's standard-library
source, so every machine has it and nothing is downloaded; ``data=text`` is a
user's own UTF-8 file or folder; ``data=hf`` is any data set ``datasets`` can
load (a Hub id, or a local folder), with ``data=wikitext103`` and ``data=pg19``
as presets. Documents are loaded into a ``datasets.Dataset``, tokenized with
``Dataset.map`` (batched) by the tokenizer of ``tokenizer=...``
(:mod:`posexp.tokenizer`), joined with a document separator (the NUL byte for
byte tokens, which never occurs in text), and cached as token arrays keyed by
the sources and the tokenizer settings, so a second run reads the arrays back
without network or ``datasets``.

Local corpora are split by a hash of each file's relative path; a Hub data set
keeps its own validation split, or, when it has none, its last
``data.val_fraction`` of training rows are held out (and the run says so).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import sys
import sysconfig
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from posexp.errors import ConfigError, PosexpError
from posexp.io import atomic_write_bytes, atomic_write_text
from posexp.data.tokenizer import (BYTE_VOCAB_SIZE, TOKENIZER_JSON, BPETokenizer, ByteTokenizer, TokenizerSpec,
                              check_spec)

VOCAB_SIZE = BYTE_VOCAB_SIZE  # byte-level, the default tokenizer
DOC_SEPARATOR = 0
_STDLIB_EXCLUDE = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_CACHE_VERSION = 1
KINDS = ("stdlib", "text", "hf")
# a quick look at the Hub before datasets' own requests, which retry for ~30 s when offline
HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}
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
        }


@dataclass(frozen=True)
class HubSource:
    """Which data set ``data=hf`` loads and how its rows become documents.

    Args:
        name: a Hub id (``Salesforce/wikitext``) or a local folder (``save_to_disk`` output, or data files).
        config: the data set's configuration (subset), e.g. ``wikitext-103-raw-v1``.
        revision: a Hub branch, tag or commit, for reproducible downloads.
        train_split: split to train on.
        validation_split: split to evaluate on; None or absent: carved from the end of the training split.
        text_column: the string column holding the text.
        separate_rows: put the document separator between rows (False: rows are lines of one text, e.g. wikitext).
        max_train_docs: train on the first N training rows only.
    """

    name: str
    config: Optional[str] = None
    revision: Optional[str] = None
    train_split: str = "train"
    validation_split: Optional[str] = "validation"
    text_column: str = "text"
    separate_rows: bool = True
    max_train_docs: Optional[int] = None

    def label(self) -> str:
        return self.name + (f" ({self.config})" if self.config else "")


def data_kind(data: Any) -> str:
    """The loader of a ``data`` config: its ``kind`` key, else its name (configs written before ``kind``)."""
    kind = data.get("kind") if hasattr(data, "get") else None
    return str(kind or data.name)


def tokenizer_spec(cfg: Any) -> TokenizerSpec:
    """The :class:`TokenizerSpec` of a run's config; ``byte`` for configs without a ``tokenizer`` group."""
    t = cfg.get("tokenizer") if hasattr(cfg, "get") else None
    if t is None:
        return TokenizerSpec()
    return TokenizerSpec(name=str(t.name), vocab_size=t.get("vocab_size"), min_frequency=int(t.get("min_frequency", 2)))


def hub_source(data: Any) -> HubSource:
    return HubSource(name=str(data.name), config=data.get("config"), revision=data.get("revision"),
                     train_split=str(data.get("train_split", "train")), validation_split=data.get("validation_split"),
                     text_column=str(data.get("text_column", "text")),
                     separate_rows=bool(data.get("separate_rows", True)), max_train_docs=data.get("max_train_docs"))


def corpus_from_config(cfg: Any, log: Log = None) -> Corpus:
    """Load (or build and cache) the corpus of a run's config: ``cfg.data`` tokenized by ``cfg.tokenizer``."""
    d = cfg.data
    kind = data_kind(d)
    return load_corpus(kind, d.get("path"), float(d.val_fraction), d.get("cache_dir"), tokenizer=tokenizer_spec(cfg),
                       hub=hub_source(d) if kind == "hf" else None, log=log)


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


# ---------------------------------------------------------------------------- the token cache

def _read_cache(cdir: Path) -> Optional[Corpus]:
    meta_path = cdir / "meta.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        train = np.load(cdir / "train.npy", mmap_mode="r")
        val = np.load(cdir / "val.npy", mmap_mode="r")
        if meta.get("tokenizer", "byte") != "byte":
            meta["tokenizer_file"] = str(cdir / TOKENIZER_JSON)
        return Corpus(train=np.asarray(train), val=np.asarray(val), **meta)
    except (OSError, ValueError, TypeError, KeyError):
        return None  # a damaged cache is rebuilt


def _write_cache(cdir: Path, corpus: Corpus, tokenizer) -> None:
    meta = {f.name: getattr(corpus, f.name) for f in fields(corpus) if f.name not in ("train", "val", "tokenizer_file")}
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
    except OSError:
        pass  # a read-only cache folder only costs the rebuild next time


def _fingerprint(train: np.ndarray, val: np.ndarray, tokenizer) -> str:
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


def _make_tokenizer(spec: TokenizerSpec, train_ds, column: str, show_progress: bool, log: Log):
    if spec.is_byte:
        return ByteTokenizer()
    if log is not None:
        log(f"training a byte-level BPE tokenizer (vocab {spec.requested_vocab_size()}) on the training split "
            f"({len(train_ds):,} documents)")
    return BPETokenizer.train(_texts(train_ds, column), spec, length=len(train_ds), show_progress=show_progress)


def _tokenize(ds, column: str, tokenizer, separate_rows: bool, fingerprint: str,
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


def _documents(texts: list[str]):
    from datasets import Dataset

    return Dataset.from_dict({"text": texts})


# ---------------------------------------------------------------------------- local corpora

def _build_local(name: str, root: Path, files: list[Path], strict: bool, path: Optional[str], source: str,
                 val_fraction: float, spec: TokenizerSpec, key: str, log: Log) -> tuple[Corpus, Any]:
    from datasets import Dataset  # heavy import, only when building

    docs = Dataset.from_list(list(_read_documents(root, files, strict)))
    if len(docs) == 0 or sum(len(t) for t in docs["text"]) == 0:
        raise PosexpError(f"data.path: {path or root} holds no text")
    is_val = [_is_val(p, val_fraction) for p in docs["path"]]
    val_docs = docs.select([i for i, v in enumerate(is_val) if v])
    train_docs = docs.select([i for i, v in enumerate(is_val) if not v])
    if len(val_docs) > 0 and len(train_docs) > 0:
        split = "by_file"
    else:
        # One file (or an unlucky hash): hold out the tail of the text instead.
        split = "by_tail"
        joined = _join(docs["text"])
        cut = int(round(joined.size * (1 - val_fraction)))
        if spec.is_byte:
            train, val = joined[:cut].copy(), joined[cut:].copy()
            tokenizer = ByteTokenizer()
            meta = dict(name=name, fingerprint=_fingerprint(train, val, tokenizer), files=len(docs), val_files=0,
                        split=split, source=source, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.name,
                        val_bytes=int(val.size))
            return Corpus(train=train, val=val, **meta), tokenizer
        while cut < joined.size and (joined[cut] & 0xC0) == 0x80:
            cut += 1  # a BPE split must not cut a character in two
        sep = chr(DOC_SEPARATOR)
        train_docs = _documents(joined[:cut].tobytes().decode("utf-8").split(sep))
        val_docs = _documents(joined[cut:].tobytes().decode("utf-8").split(sep))
    tokenizer = _make_tokenizer(spec, train_docs, "text", False, log)
    train, _ = _tokenize(train_docs, "text", tokenizer, True, f"posexp-{key}-train", False)
    val, val_bytes = _tokenize(val_docs, "text", tokenizer, True, f"posexp-{key}-val", False)
    meta = dict(name=name, fingerprint=_fingerprint(train, val, tokenizer), files=len(docs),
                val_files=len(val_docs) if split == "by_file" else 0, split=split, source=source,
                vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.name, val_bytes=val_bytes)
    return Corpus(train=train, val=val, **meta), tokenizer


# ---------------------------------------------------------------------------- Hub data sets

def _env_true(name: str) -> bool:
    return (os.environ.get(name) or "").upper() in _TRUE


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_requested() -> bool:
    """The user asked ``datasets`` / ``huggingface_hub`` not to use the network."""
    return any(_env_true(v) for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hub answers at all within ``timeout`` seconds (any HTTP status counts as an answer)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(hub_endpoint(), method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _hub_offline(offline: bool) -> Iterator[None]:
    """Make ``datasets`` read only its local cache (no retries against an unreachable Hub)."""
    if not offline:
        yield
        return
    import datasets.config as ds_config
    import huggingface_hub.constants as hub_constants

    saved = (ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    ds_config.HF_HUB_OFFLINE = ds_config.HF_DATASETS_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


# plain .txt is data=text's: datasets' text builder would make every line a row and drop its newline
_FILE_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def _open_local(hub: HubSource, p: Path):
    import datasets

    try:
        if p.is_dir() and ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file()):
            return datasets.load_from_disk(str(p))
        if p.is_file():
            builder = _FILE_BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise ConfigError("data.name", f"{p} is a {p.suffix or 'suffix-less'} file; a local data set is a "
                                               f"folder, or a {', '.join(sorted(_FILE_BUILDERS))} file "
                                               "(plain text: data=text data.path=...)")
            return datasets.load_dataset(builder, data_files=str(p))
        return datasets.load_dataset(str(p), hub.config)
    except PosexpError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types; the user needs the gist
        raise PosexpError(f"data.name: cannot read {p} as a data set ({_first_line(e)})") from None


def _not_cached(hub: HubSource, why: str) -> PosexpError:
    fix = (f"run this command once with network access (later runs need no network), or pre-download it with "
           f"`hf download {hub.name} --repo-type dataset` (or load it once on a machine with network and copy its "
           "HF_HOME here) and set HF_HUB_OFFLINE=1, or train on local text with data=text data.path=FILE_OR_DIR")
    return PosexpError(f"data.name: the data set {hub.label()} is not cached (neither posexp's token cache nor "
                       f"the Hugging Face datasets cache has it) and {why}; {fix}")


def _open_hub(hub: HubSource):
    """The data set's splits (a ``DatasetDict``), from the Hugging Face cache when the Hub is out of reach."""
    import datasets

    if offline_requested():
        offline, why = True, "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)"
    else:
        offline = not hub_reachable()
        why = f"the Hub ({hub_endpoint()}) cannot be reached"
    try:
        with _hub_offline(offline):
            return datasets.load_dataset(hub.name, hub.config, revision=hub.revision)
    except ConnectionError as e:
        raise _not_cached(hub, why if offline else f"the Hub could not be reached ({_first_line(e)})") from None
    except datasets.exceptions.DatasetNotFoundError as e:
        if offline:
            raise _not_cached(hub, why) from None
        raise ConfigError("data.name", f"no data set {hub.name!r} on the Hub, or it is private/gated (log in with "
                                       f"`hf auth login`): {_first_line(e)}") from None
    except FileNotFoundError as e:
        if offline:
            raise _not_cached(hub, why) from None
        raise PosexpError(f"data.name: {hub.label()}: {_first_line(e)}") from None
    except RuntimeError as e:
        if "script" in str(e).lower():
            raise ConfigError("data.name", f"{hub.name} is a loading-script data set, which datasets >= 4 no longer "
                                           "runs; use a copy in plain files (data=pg19 loads the Parquet copy "
                                           "emozilla/pg19)") from None
        raise PosexpError(f"data.name: {hub.label()}: {_first_line(e)}") from None
    except ValueError as e:
        if "config" in str(e).lower():
            raise ConfigError("data.config", f"{hub.name}: {_first_line(e)}") from None
        raise PosexpError(f"data.name: {hub.label()}: {_first_line(e)}") from None


def _open_dataset(hub: HubSource) -> dict:
    """``{split name: Dataset}`` of a local folder/file or a Hub data set."""
    import datasets

    p = Path(hub.name).expanduser()
    loaded = _open_local(hub, p) if p.exists() else _open_hub(hub)
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def _local_stamp(name: str) -> str:
    p = Path(name).expanduser()
    if not p.exists():
        return ""
    # not the cache-*.arrow files datasets' map writes beside a saved data set: they change on every build
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith(
        ("cache-", "tmp", ".")))
    return "".join(f"{f}|{f.stat().st_size}|{f.stat().st_mtime_ns}\n" for f in files)


def _hub_key(hub: HubSource, val_fraction: float) -> str:
    h = hashlib.sha256(f"v{_CACHE_VERSION}|hf|{json.dumps(asdict(hub), sort_keys=True)}|{val_fraction!r}".encode())
    h.update(_local_stamp(hub.name).encode())
    return h.hexdigest()[:24]


def _build_hub(hub: HubSource, val_fraction: float, spec: TokenizerSpec, key: str, log: Log) -> tuple[Corpus, Any]:
    if log is not None:
        log(f"loading {hub.label()} with datasets and caching its tokens (once; later runs read the cache)")
    splits = _open_dataset(hub)
    names = ", ".join(splits) or "none"
    if hub.train_split not in splits:
        raise ConfigError("data.train_split", f"{hub.label()} has no split {hub.train_split!r}; its splits: {names}")
    train_ds = splits[hub.train_split]
    column = hub.text_column
    if column not in train_ds.column_names:
        strings = [c for c, f in train_ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
        raise ConfigError("data.text_column", f"{hub.label()} has no column {column!r}; its columns: "
                                              f"{', '.join(train_ds.column_names)} (text columns: "
                                              f"{', '.join(strings) or 'none'})")
    dtype = getattr(train_ds.features[column], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise ConfigError("data.text_column", f"{hub.label()} column {column!r} holds {dtype or 'non-text'} values, "
                                              "not text; choose a string column")
    if hub.validation_split and hub.validation_split in splits:
        val_ds, split = splits[hub.validation_split], "hub"
        if column not in val_ds.column_names:
            raise ConfigError("data.text_column", f"{hub.label()} split {hub.validation_split!r} has no column "
                                                  f"{column!r}; its columns: {', '.join(val_ds.column_names)}")
    else:
        n = len(train_ds)
        if n < 2:
            raise PosexpError(f"data.validation_split: {hub.label()} has no validation split and only {n} training "
                              "row(s) to hold one out from; name a split with data.validation_split=NAME")
        n_val = min(n - 1, max(1, int(round(n * val_fraction))))
        val_ds = train_ds.select(range(n - n_val, n))
        train_ds = train_ds.select(range(n - n_val))
        split = "carved_from_train"
        missing = f"no {hub.validation_split!r} split" if hub.validation_split else "data.validation_split=null"
        if log is not None:
            log(f"{hub.label()} has {missing} (splits: {names}): holding out its last {n_val:,} of {n:,} "
                f"{hub.train_split} rows as validation (data.val_fraction={val_fraction:g})")
    if hub.max_train_docs is not None and hub.max_train_docs < len(train_ds):
        train_ds = train_ds.select(range(int(hub.max_train_docs)))
    train_ds = train_ds.select_columns([column])
    val_ds = val_ds.select_columns([column])
    tokenizer = _make_tokenizer(spec, train_ds, column, True, log)
    train, _ = _tokenize(train_ds, column, tokenizer, hub.separate_rows, f"posexp-{key}-train", True)
    val, val_bytes = _tokenize(val_ds, column, tokenizer, hub.separate_rows, f"posexp-{key}-val", True)
    if train.size == 0 or val.size == 0:
        raise PosexpError(f"data.text_column: {hub.label()} column {column!r} holds no text in the "
                          f"{'training' if train.size == 0 else 'validation'} split")
    p = Path(hub.name).expanduser()
    where = str(p.resolve()) if p.exists() else f"{hub_endpoint()}/datasets/{hub.name}"
    source = (f"{where}" + (f" config {hub.config}" if hub.config else "") +
              (f" revision {hub.revision}" if hub.revision else "") + f", column {column!r}")
    meta = dict(name=hub.name + (f"/{hub.config}" if hub.config else ""),
                fingerprint=_fingerprint(train, val, tokenizer), files=len(train_ds) + len(val_ds),
                val_files=len(val_ds), split=split, source=source, vocab_size=tokenizer.vocab_size,
                tokenizer=tokenizer.name, val_bytes=val_bytes)
    return Corpus(train=train, val=val, **meta), tokenizer


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip("/"))[-60:]


# ---------------------------------------------------------------------------- entry point

def load_corpus(name: str, path: Optional[str] = None, val_fraction: float = 0.05,
                cache_dir: Optional[str] = None, *, tokenizer: Optional[TokenizerSpec] = None,
                hub: Optional[HubSource] = None, log: Log = None) -> Corpus:
    """Load (or build and cache) a tokenized corpus.

    Args:
        name: ``stdlib``, ``text`` or ``hf`` (the ``data.kind`` of the config).
        path: file or folder for ``text``.
        val_fraction: share of files (by hash of their path) held out for validation; for ``hf`` without a
            validation split, the share of training rows (the last ones) held out.
        cache_dir: where token arrays are cached (default ``$POSEXP_CACHE`` or ``~/.cache/posexp``).
        tokenizer: ``byte`` (default) or a BPE spec; part of the cache key.
        hub: the data set of ``hf``.
        log: called with a line for the user when something is built or a split is carved.

    Raises:
        PosexpError: missing or unreadable path, non-UTF-8 or binary files, no text at all, a Hub data set
            neither cached nor reachable.
        ConfigError: an unknown kind or tokenizer, a missing split or text column.
    """
    spec = tokenizer or TokenizerSpec()
    check_spec(spec)
    if name == "hf":
        if hub is None or not str(hub.name or "").strip():
            raise ConfigError("data.name", "data=hf needs a data set: data.name=OWNER/NAME (a Hub id) or a local "
                                           "folder (datasets' save_to_disk output, or data files)")
        key = _hub_key(hub, val_fraction)
        cdir = cache_root(cache_dir) / (f"hf-{_slug(hub.name)}-{key}" + (f"-{spec.key()}" if spec.key() else ""))
        cached = _read_cache(cdir)
        if cached is not None:
            return cached
        corpus, tok = _build_hub(hub, val_fraction, spec, key + spec.key(), log)
        _write_cache(cdir, corpus, tok)
        return corpus

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
        raise ConfigError("data", f"unknown data set {name!r}; choose one of: {', '.join(KINDS)}")

    # byte-level caches keep the key they had before tokenizers existed
    key = _source_key(name, root, files, val_fraction)
    cdir = cache_root(cache_dir) / (f"{name}-{key}" + (f"-{spec.key()}" if spec.key() else ""))
    cached = _read_cache(cdir)
    if cached is not None:
        return cached
    corpus, tok = _build_local(name, root, files, strict, path, source, val_fraction, spec, key + spec.key(), log)
    _write_cache(cdir, corpus, tok)
    return corpus


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
