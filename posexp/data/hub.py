"""Hub data sets (``data=hf``): finding out whether the Hub is reachable, opening a data set, building its corpus.

Any data set ``datasets`` can load works: a Hub id, or a local folder
(``save_to_disk`` output, or data files). A data set keeps its own validation
split, or, when it has none, its last ``data.val_fraction`` of training rows are
held out (and the run says so). When the Hub does not answer, only the local
Hugging Face cache is read, and a data set it lacks is one clear message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from posexp.data.tokenizer import TokenizerSpec
from posexp.data.tokens import CACHE_VERSION, Corpus, Log, corpus_fingerprint, make_tokenizer, tokenize
from posexp.errors import ConfigError, PosexpError

# a quick look at the Hub before datasets' own requests, which retry for ~30 s when offline
HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}


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


# plain .txt (a file, or a folder of them) is data=text's: datasets' text builder would make every line a row and
# drop its newline
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
        if datasets.load_dataset_builder(str(p), hub.config).name == "text":  # a folder of plain text files
            raise ConfigError("data.name", f"{p} holds plain text files, which datasets reads a line a row with the "
                                           f"newlines dropped; train on them with data=text data.path={hub.name}")
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


def _is_hub_id(name: str) -> bool:
    """Whether ``name`` has a Hub id's form, ``NAME`` or ``OWNER/NAME``: ``./data``, ``/data/sets`` or ``a/b/c`` can
    only be local paths."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _open_dataset(hub: HubSource) -> dict:
    """``{split name: Dataset}`` of a local folder/file or a Hub data set."""
    import datasets

    p = Path(hub.name).expanduser()
    if not p.exists() and not _is_hub_id(hub.name):
        raise ConfigError("data.name", f"{hub.name} does not exist; give a local data set (a folder, or a "
                                       f"{', '.join(sorted(_FILE_BUILDERS))} file) or a Hub id, OWNER/NAME")
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


def hub_key(hub: HubSource, val_fraction: float) -> str:
    """The cache key of a Hub data set: its settings, the split share, and a local folder's files."""
    h = hashlib.sha256(f"v{CACHE_VERSION}|hf|{json.dumps(asdict(hub), sort_keys=True)}|{val_fraction!r}".encode())
    h.update(_local_stamp(hub.name).encode())
    return h.hexdigest()[:24]


def build_hub(hub: HubSource, val_fraction: float, spec: TokenizerSpec, key: str, log: Log) -> tuple[Corpus, Any]:
    """Open, check and tokenize a data set into a :class:`Corpus`; also returns the tokenizer to cache."""
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
    tokenizer = make_tokenizer(spec, train_ds, column, True, log)
    train, _ = tokenize(train_ds, column, tokenizer, hub.separate_rows, f"posexp-{key}-train", True)
    val, val_bytes = tokenize(val_ds, column, tokenizer, hub.separate_rows, f"posexp-{key}-val", True)
    if train.size == 0 or val.size == 0:
        raise PosexpError(f"data.text_column: {hub.label()} column {column!r} holds no text in the "
                          f"{'training' if train.size == 0 else 'validation'} split")
    p = Path(hub.name).expanduser()
    where = str(p.resolve()) if p.exists() else f"{hub_endpoint()}/datasets/{hub.name}"
    source = (f"{where}" + (f" config {hub.config}" if hub.config else "") +
              (f" revision {hub.revision}" if hub.revision else "") + f", column {column!r}")
    meta = dict(name=hub.name + (f"/{hub.config}" if hub.config else ""),
                fingerprint=corpus_fingerprint(train, val, tokenizer), files=len(train_ds) + len(val_ds),
                val_files=len(val_ds), split=split, source=source, vocab_size=tokenizer.vocab_size,
                tokenizer=tokenizer.name, val_bytes=val_bytes)
    return Corpus(train=train, val=val, **meta), tokenizer
