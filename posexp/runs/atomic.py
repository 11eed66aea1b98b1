"""Atomic file writes.

Every file posexp produces goes through :func:`atomic_write_bytes`, so a crash,
a Ctrl-C or a full disk leaves either the old file or the new one, never a
half-written results.json that breaks the report later.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Iterator, Optional

# how a writer outside Python (safetensors' Rust) names an OS error: "No space left on device (os error 28)"
_OS_ERROR = re.compile(r"\(os error (\d+)\)")
# the errors that mean the disk (or the user's share of it) cannot take the file
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a mix.

    The bytes go to a temporary file in the same folder (``os.replace`` is only
    atomic within one filesystem), are flushed to disk, and then the temporary
    file is renamed over ``path``. Missing parent folders are created.

    Args:
        path: destination file.
        data: the complete new contents.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A hidden, unique name: concurrent writers (e.g. sweep jobs) must not share a temp file,
    # and a leftover after a hard kill should not look like a result.
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # os.open with 0o666 lets the umask decide permissions, like a plain open() would;
    # tempfile would force 0o600 and make results unreadable to collaborators.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        raise _naming(e, path)
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; see :func:`atomic_write_bytes`.

    Args:
        path: destination file.
        text: the complete new contents, written as-is (no newline translation).
        encoding: text encoding.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically; see :func:`atomic_write_bytes`.

    Args:
        path: destination file.
        obj: anything :func:`json.dumps` accepts.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path to write ``path``'s new contents to, renamed over ``path`` on success.

    For writers that insist on a file name (``safetensors.torch.save_model``).
    On an exception the temporary file is removed and ``path`` is left as it was.

    Args:
        path: destination file.

    Yields:
        The temporary path, in the same folder as ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        # created here with umask permissions; a writer that truncates it keeps them
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        yield tmp
        # a writer that replaces the file (safetensors does) makes it 0o600: give it the run's permissions
        os.chmod(tmp, 0o666 & ~_umask())
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        raise _naming(e, path)
    _fsync_dir(path.parent)


def _naming(error: BaseException, path: Path) -> BaseException:
    """``error`` as an :class:`OSError` naming ``path`` (the file being written, not its temporary name): a
    write or flush says only "No space left on device", a writer outside Python raises its own type."""
    if isinstance(error, OSError):
        error.filename, error.filename2 = str(path), None
        return error
    found = _OS_ERROR.search(str(error)) if isinstance(error, Exception) else None
    if found is None:
        return error
    named = OSError(int(found.group(1)), os.strerror(int(found.group(1))), str(path))
    named.__cause__ = error
    return named


def _umask() -> int:
    """The process's umask (read by setting it, then put back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The permissions a plain ``open()`` would give a new file under the process's umask (0o644 under 022)."""
    return 0o666 & ~_umask()


def unwritable(folder: str | os.PathLike) -> Optional[str]:
    """Why no file can be created in ``folder`` (made if missing), or None when one can.

    Tried rather than predicted (``os.access`` says yes to root on a read-only mount):
    a hidden probe file is created and removed.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".posexp-probe.{os.getpid()}.{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def _fsync_dir(folder: Path) -> None:
    """Persist the rename itself; best effort, since not every OS can open a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
