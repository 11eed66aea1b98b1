"""Local corpora: the interpreter's standard library (``data=stdlib``) and a user's text (``data=text``).

Files are split by a hash of each file's relative path, so a file stays on its
side of the split; when that leaves one side empty (one file, or an unlucky
hash) the tail of the text is held out instead.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from posexp.data.tokenizer import ByteTokenizer, TokenizerSpec
from posexp.data.tokens import CACHE_VERSION, DOC_SEPARATOR, Corpus, Log, corpus_fingerprint, make_tokenizer, tokenize
from posexp.errors import ConfigError, PosexpError

_STDLIB_EXCLUDE = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files, sorted; the excluded folders (tests, site-packages) are never walked
    (a walk that filtered afterwards took 0.3 s, most of a smoke run's data loading)."""
    files = []
    for folder, subfolders, names in os.walk(stdlib_root()):
        subfolders[:] = [name for name in subfolders if name not in _STDLIB_EXCLUDE]
        files += [Path(folder) / name for name in names if name.endswith(".py")]
    return sorted(p for p in files if p.is_file())


def text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))


def text_source(path: str) -> tuple[Path, list[Path]]:
    """The root and the files of ``data.path``: a non-empty file, or a folder with files in it (``~`` is the
    user's home, as in a shell).

    Raises:
        ConfigError: the path is missing or a symlink loop, is not a regular file or folder (a device, a pipe, a
            socket), is an empty file, or is a folder without any (non-hidden) files.
    """
    try:
        root = Path(path).expanduser().resolve(strict=False)
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13, OSError ELOOP after)
        raise ConfigError("data.path", f"{path} cannot be followed ({e}); give a UTF-8 text file or a folder of "
                                       "them") from None
    if not root.exists():
        raise ConfigError("data.path", f"{path} does not exist; give a UTF-8 text file or a folder of them")
    if root.is_file():
        if root.stat().st_size == 0:
            raise ConfigError("data.path", f"{path} is empty, it holds no text; it needs UTF-8 text")
        return root, [root]
    if not root.is_dir():
        raise ConfigError("data.path", f"{path} is not a regular file or folder (it is {_file_kind(root)}); "
                                       "give a UTF-8 text file or a folder of them")
    files = text_files(root)
    if not files:
        what = "an empty folder" if not any(root.iterdir()) else \
            "a folder that has no text files (only hidden files or empty subfolders; hidden ones are skipped)"
        raise ConfigError("data.path", f"{path} is {what}; it needs UTF-8 text files")
    return root, files


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "neither"


def _is_val(relpath: str, val_fraction: float) -> bool:
    # A hash of the relative path, not of the content, so a file stays on its
    # side of the split across interpreter patch releases.
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h / 2**64 < val_fraction


def source_key(name: str, root: Path, files: list[Path], val_fraction: float, skip_bad_files: bool = False) -> str:
    """The cache key of a local corpus: its name, root, split share and every file's size and mtime, and
    whether files that are not UTF-8 text were left out (a corpus built so must not answer a run that errs)."""
    skip = "|skip-bad-files" if skip_bad_files else ""  # only then: earlier cache entries keep their key
    h = hashlib.sha256(f"v{CACHE_VERSION}|{name}|{root}|{val_fraction!r}{skip}".encode())
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
                                  "data=text reads UTF-8 text files only (data.on_bad_file=skip leaves such "
                                  "files out)") from None
            continue
        if "\x00" in text:
            if strict:
                raise PosexpError(f"data.path: {f} contains NUL bytes, so it looks binary; "
                                  "data=text reads UTF-8 text files only (data.on_bad_file=skip leaves such "
                                  "files out)")
            continue
        rel = f.name if root.is_file() else str(f.relative_to(root))
        yield {"path": rel, "text": text}


def _join(texts: list[str]) -> np.ndarray:
    sep = bytes([DOC_SEPARATOR])
    return np.frombuffer(sep.join(t.encode("utf-8") for t in texts), dtype=np.uint8).copy()


def _documents(texts: list[str]):
    from datasets import Dataset

    return Dataset.from_dict({"text": texts})


@dataclass(frozen=True)
class LocalSource:
    """The files of ``data=stdlib`` or ``data=text``, found (:func:`local_source`).

    Attributes:
        name: ``stdlib`` or ``text``.
        root: the folder (or the one file) they are under.
        files: the files, sorted.
        strict: a file that is not UTF-8 text stops the build (``text`` without ``data.on_bad_file=skip``).
        description: what the corpus records as its ``source``.
        path: ``data.path`` as given, for messages (``text``).
    """

    name: str
    root: Path
    files: list[Path]
    strict: bool
    description: str
    path: Optional[str] = None


def local_source(name: str, path: Optional[str], skip_bad_files: bool) -> LocalSource:
    """The files of ``data=stdlib`` (the running interpreter's standard library) or ``data=text`` (``path``).

    Raises:
        PosexpError: no ``.py`` files in the standard library.
        ConfigError: ``text`` without a ``path``, or one that is not usable (:func:`text_source`).
    """
    if name == "stdlib":
        root, files = stdlib_root(), stdlib_files()
        if not files:
            raise PosexpError(f"data=stdlib: no .py files found under {root}; use data=text data.path=...")
        return LocalSource(name, root, files, False, f"python {sys.version.split()[0]} stdlib at {root}")
    if not path:
        raise ConfigError("data.path", "data=text needs the text to train on: data.path=FILE_OR_DIR")
    root, files = text_source(path)
    return LocalSource(name, root, files, not skip_bad_files, str(root), path)


def build_local(local: LocalSource, val_fraction: float, spec: TokenizerSpec, key: str,
                log: Log) -> tuple[Corpus, Any]:
    """Tokenize the files of ``stdlib`` or ``text`` into a :class:`Corpus`; also returns the tokenizer to cache."""
    from datasets import Dataset  # heavy import, only when building

    name, root, files, source = local.name, local.root, local.files, local.description
    read = list(_read_documents(root, files, local.strict))
    docs = Dataset.from_list(read)
    if len(docs) == 0 or sum(len(t) for t in docs["text"]) == 0:
        skipped = len(files) - len(read)
        if skipped:  # data.on_bad_file=skip left every file out: they are not empty, they are not text
            what = (f"{skipped} of its {len(files)} files are not UTF-8 text (binary, or another encoding) and were "
                    "skipped (data.on_bad_file=skip)" + ("; the rest are empty" if read else ""))
        else:
            what = "its files are all empty" if root.is_dir() else "it is empty"
        raise PosexpError(f"data.path: {local.path or root} holds no text ({what})")
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
            meta: dict[str, Any] = dict(name=name, fingerprint=corpus_fingerprint(train, val, tokenizer), files=len(docs), val_files=0,
                        split=split, source=source, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.name,
                        val_bytes=int(val.size))
            return Corpus(train=train, val=val, **meta), tokenizer
        while cut < joined.size and (joined[cut] & 0xC0) == 0x80:
            cut += 1  # a BPE split must not cut a character in two
        sep = chr(DOC_SEPARATOR)
        train_docs = _documents(joined[:cut].tobytes().decode("utf-8").split(sep))
        val_docs = _documents(joined[cut:].tobytes().decode("utf-8").split(sep))
    tokenizer = make_tokenizer(spec, train_docs, "text", False, log)
    train, _ = tokenize(train_docs, "text", tokenizer, True, f"posexp-{key}-train", False)
    val, val_bytes = tokenize(val_docs, "text", tokenizer, True, f"posexp-{key}-val", False)
    meta = dict(name=name, fingerprint=corpus_fingerprint(train, val, tokenizer), files=len(docs),
                val_files=len(val_docs) if split == "by_file" else 0, split=split, source=source,
                vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.name, val_bytes=val_bytes,
                val_documents=list(val_docs["path"]) if split == "by_file" else None)
    return Corpus(train=train, val=val, **meta), tokenizer
