"""``posexp export RUN DIR``: a trained run as a transformers model folder.

    from posexp.commands.export import export_run

    export = export_run("outputs/2026-11-22/10-00-00", "exported/rope")
    export.max_abs_diff   # |logits| of the exported model minus posexp's, measured while exporting

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("exported/rope")      # no remote code
    tokenizer = AutoTokenizer.from_pretrained("exported/rope")         # the run's ids

The folder holds ``config.json``, ``model.safetensors`` (and ``generation_config.json``), the tokenizer files
(:mod:`posexp.hf.tokenizer_export`) and ``posexp_export.json``: the run folder, its config hash, the mapping and
whether it is exact, and the largest logit difference measured. learned maps onto GPT-2, rope onto GPT-NeoX and alibi
onto MPT (:mod:`posexp.hf.architectures` says why and where each is exact); every other encoding is refused in one
line. Nothing is half-written: the folder is built beside ``DIR`` under a temporary name and renamed into place
once it loads back with posexp's logits.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from posexp.hf.loading import EXPORT_JSON
from posexp.errors import PosexpError
from posexp.hf.architectures import Mapping, build, plan
from posexp.hf.tokenizer_export import export_tokenizer

# the largest |logit difference| an export may show on its check (fp32): more is a wrong mapping, not rounding
TOLERANCE = 1e-4
CHECK_SEED = 0
EXPORTING = "exporting"  # what the process holding an export's destination does there (posexp.runs.lock)


@dataclass
class Export:
    """What :func:`export_loaded` wrote.

    Attributes:
        folder: the transformers model folder.
        architecture: its transformers class (``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``, ``MptForCausalLM``).
        description: the mapping in one line.
        max_abs_diff: the largest ``|logit|`` difference between the reloaded folder and posexp's model, fp32,
            over the lengths checked.
        checked_lengths: the sequence lengths of that check (the training length, and twice it where the
            encoding reads past its training length).
    """

    folder: Path
    architecture: str
    description: str
    max_abs_diff: float
    checked_lengths: list[int]


def export_loaded(run: Any, run_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> Export:
    """Write ``run`` (:func:`posexp.load_run` of ``run_dir``; :func:`posexp.commands.export.export_run` loads it) as a
    transformers model folder ``out_dir``.

    ``AutoModelForCausalLM.from_pretrained(out_dir)`` then loads it with no remote code and gives the run's logits
    (fp32, up to float rounding; checked before the folder is put in place), and ``AutoTokenizer`` gives the run's
    token ids.

    Args:
        run: the run, as :func:`posexp.load_run` reads it (its model, config and info).
        run_dir: its folder (a destination inside it is refused).
        out_dir: the folder to write; it must not exist or be empty, unless ``overwrite``.
        overwrite: replace ``out_dir`` when it holds a model folder (a ``config.json``), e.g. an earlier export.

    Returns:
        What was written, with the logit difference measured.

    Raises:
        PosexpError: the run's encoding (or an option of it) has no exact transformers counterpart, the run
            cannot be read, ``out_dir`` may not be written, another export is writing it, or the disk filled up.
    """
    out = Path(out_dir).expanduser()
    with claim_destination(out):
        check_destination(Path(run_dir), out, overwrite)
        return write_claimed(run, out)


@contextlib.contextmanager
def claim_destination(out: Path) -> Iterator[None]:
    """Hold ``out`` for this export, as a run holds its folder (:func:`posexp.runs.lock.lock_run`): the folder is
    made (if new) and locked before anything is checked or written, so a second export into it at the same time is
    refused in one line instead of replacing the first one's. A folder made here and left unused goes again.

    Raises:
        PosexpError: another process holds ``out``, or it cannot be made.
    """
    from posexp.runs.lock import lock_run, unlock_run

    if out.exists() and not out.is_dir():
        raise PosexpError(f"{out} is a file; the export writes a folder: name a new one")
    created: list[Path] = []
    for folder in [*reversed(out.parents), out]:
        if folder.is_dir():
            continue
        try:
            folder.mkdir()
            created.append(folder)
        except FileExistsError:
            if not folder.is_dir():
                _remove_empty(created)
                raise PosexpError(f"{out}: cannot create the export folder ({folder} is a file); name another") \
                    from None
        except OSError as e:
            _remove_empty(created)
            raise PosexpError(f"{out}: cannot create the export folder ({e.strerror or e}); name another") from None
    try:
        took = lock_run(out, doing=EXPORTING)
    except PosexpError:
        _remove_empty([p for p in created if p != out])
        raise
    _remove_stale(out)
    try:
        yield
    finally:
        if took:
            unlock_run(out)
        _remove_empty(created)  # only what is still empty: a finished export is not


def _remove_stale(out: Path) -> None:
    """The temporary folders of exports into ``out`` that were killed while writing: no other export of ``out`` can
    be running while this one holds it, so each is left over."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.\d+\.[0-9a-f]{{8}}\.tmp")
    with contextlib.suppress(OSError):
        for stale in out.parent.iterdir():
            if pattern.fullmatch(stale.name) and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)


def _remove_empty(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break


def write_claimed(run: Any, out: Path) -> Export:
    """:func:`export_loaded` into a destination this process claimed and checked: built beside ``out`` under a
    temporary name, checked, then renamed into place; a write that fails (a full disk) leaves nothing."""
    model = run.model.float()
    mapping = plan(model, run.config)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        tmp.mkdir(parents=True)
        with _quiet():
            written = _write(tmp, run, model, mapping)
        _replace(tmp, out)
    except Exception as exc:  # noqa: BLE001 - a write that failed: one line, after the temporary folder is gone
        shutil.rmtree(tmp, ignore_errors=True)
        failure = _write_failure(out, exc)
        if failure is None:
            raise
        raise failure from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Export(out, mapping.architecture, mapping.description, written["max_abs_diff"], written["lengths"])


def _write_failure(out: Path, exc: BaseException) -> Optional[PosexpError]:
    """One line for a write that failed (an OSError, or safetensors' own error carrying one); None for anything
    else."""
    import errno as errnos

    code: Optional[int] = exc.errno if isinstance(exc, OSError) else None
    if code is None and type(exc).__name__ == "SafetensorError":
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else None
        if code is None:
            return None
    elif not isinstance(exc, OSError):
        return None
    if code in (errnos.ENOSPC, errnos.EDQUOT, errnos.EFBIG):
        why = {errnos.ENOSPC: "no space left on the device", errnos.EDQUOT: "the disk quota is used up",
               errnos.EFBIG: "a file grew past the size this process may write"}[code]
        return PosexpError(f"{out}: the export could not be written ({why}); nothing of it was left there: free "
                           "some space or export to another disk")
    reason = os.strerror(code) if code is not None else str(exc)
    return PosexpError(f"{out}: the export could not be written ({reason}); nothing of it was left there")


def check_destination(run_dir: Path, out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that would lose something: a file, a non-empty folder without ``overwrite``, a folder
    that is not a model folder, or the run itself (or a folder holding it).

    Raises:
        PosexpError: one line naming the folder and what to do.
    """
    if out.exists() and not out.is_dir():
        raise PosexpError(f"{out} is a file; the export writes a folder: name a new one")
    if not out.is_dir() or _claimed_empty(out):
        return
    if not overwrite:
        raise PosexpError(f"{out} exists and is not empty; name a new folder or add --overwrite to replace it")
    resolved, run = out.resolve(), run_dir.expanduser().resolve()
    if resolved == run or resolved in run.parents:
        raise PosexpError(f"{out} holds the run being exported; name another folder")
    if not (out / "config.json").is_file():
        raise PosexpError(f"{out} is not a model folder (no config.json), so --overwrite leaves it alone; "
                          "name a new folder or empty it yourself")


def _write(folder: Path, run: Any, model: Any, mapping: Mapping) -> dict:
    """The model, tokenizer and ``posexp_export.json`` in ``folder``, checked by loading them back."""
    from posexp.runs.atomic import atomic_write_json, file_mode

    separator = export_tokenizer(run.config, run.info, folder, mapping.max_length)
    hf = build(mapping, model)
    hf.config.eos_token_id = separator["document_separator_id"]
    hf.generation_config.eos_token_id = separator["document_separator_id"]
    hf.save_pretrained(str(folder), safe_serialization=True)
    mode = file_mode()
    for written in folder.glob("*.safetensors*"):  # safetensors writes its files 0o600; the rest follow the umask
        os.chmod(written, mode)
    diff, lengths = check_logits(model, folder, int(run.config.train_len))
    if not diff <= TOLERANCE:
        raise PosexpError(f"internal: the exported {mapping.architecture} differs from the run by up to {diff:.3g} "
                          f"in its logits (more than {TOLERANCE:g}); nothing was written")
    record = {
        "run": str(Path(run.path).resolve()),
        "config_hash": run.info.get("config_hash"),
        "encoder": str(run.config.encoder["name"]),
        "train_len": int(run.config.train_len),  # what posexp eval hf:DIR reads its multiples of
        "architecture": mapping.architecture,
        "mapping": mapping.description,
        "exact": True,  # an encoding without an exact counterpart is refused
        "max_abs_logit_diff": diff,
        "checked_lengths": lengths,
        **separator,
    }
    atomic_write_json(folder / EXPORT_JSON, record)
    return {"max_abs_diff": diff, "lengths": lengths}


def check_lengths(model: Any, train_len: int) -> list[int]:
    """The lengths an export is checked at: the training length, and twice it where the encoding reads that far
    (not a learned table, whose rows end at the training length)."""
    limit = getattr(model.encoder, "max_length", None)
    return [n for n in (train_len, 2 * train_len) if limit is None or n <= limit]


def check_logits(model: Any, folder: Path, train_len: int, seed: int = CHECK_SEED) -> tuple[float, list[int]]:
    """The largest ``|logit|`` difference between ``AutoModelForCausalLM.from_pretrained(folder)`` and ``model``,
    in fp32 on random tokens, over :func:`check_lengths`.

    Returns:
        The difference and the lengths it was measured at.
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, trust_remote_code=False).eval()
    generator = torch.Generator().manual_seed(seed)
    lengths, diff = check_lengths(model, train_len), 0.0
    with torch.no_grad():
        for n in lengths:
            tokens = torch.randint(0, model.shape.vocab_size, (1, n), generator=generator)
            theirs = hf(tokens).logits
            diff = max(diff, float((theirs - model(tokens)).abs().max()))
    return diff, lengths


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' progress bars off while exporting (a save and a load of a few files), as they were after."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def _claimed_empty(out: Path) -> bool:
    """``out`` holds nothing but this export's claim note."""
    from posexp.runs.lock import LOCK_NOTE

    return all(p.name == LOCK_NOTE for p in out.iterdir())


def _replace(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out``; an old ``out`` (an export being replaced) goes only then. An
    empty claimed ``out`` is replaced in one rename, while this process still holds its claim."""
    from posexp.runs.lock import LOCK_NOTE

    if out.is_dir() and _claimed_empty(out):
        (out / LOCK_NOTE).unlink(missing_ok=True)
        os.replace(tmp, out)  # rename(2) onto an empty folder
        return
    old: Optional[Path] = None
    if out.exists():
        old = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.old"
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        if old is not None:
            old.rename(out)  # the earlier export stays as it was
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["EXPORT_JSON", "Export", "check_destination", "check_logits", "claim_destination", "export_loaded",
           "write_claimed"]
