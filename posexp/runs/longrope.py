"""LongRoPE's factors file: what ``posexp search`` writes and ``eval.longrope_file`` / ``longrope_file`` read.

A search (Ding et al. 2024, "LongRoPE", §3.2) finds one rescale factor ``lambda_i`` per rotary frequency and the
number ``n^`` of first positions left unscaled, for one target length. It writes them as ``factors.json`` in its
folder (``RUN/longrope/<target_len>/`` for a run), beside the search's resumable state::

    {"format": 1, "method": "longrope", "factors": [1.0, 1.02, ...], "start": 4, "target_len": 512,
     "train_len": 128, "rot_dim": 32, "objective": "ppl", "ppl": 31.2, "initial": {...}, "model": "RUN"}

``posexp eval RUN eval.scaling=longrope eval.longrope_file=RUN/longrope/512`` and ``posexp finetune RUN
scaling=longrope longrope_file=RUN/longrope/512`` read it (the folder or the file itself): the same as giving
``longrope_factors=[...]`` and ``longrope_start=N`` by hand. A row records them in its ``scaling_options``
(:func:`options_text`): a fingerprint of the factors and ``n^``. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from posexp.errors import ConfigError

FACTORS_FILE = "factors.json"
STATE_FILE = "state.json"
FORMAT = 1


def factors_path(path: str | Path) -> Path:
    """The factors file a folder holds, or ``path`` itself if it is a file."""
    p = Path(path).expanduser()
    return p / FACTORS_FILE if p.is_dir() else p


def read_factors(path: str | Path, key: str = "eval.longrope_file") -> tuple[list[float], int, dict]:
    """``(factors, start, everything the file says)`` of a factors file (or a folder holding one).

    Raises:
        ConfigError: on ``key``: no such file, not JSON, or without a list of factors > 0 and a start >= 0.
    """
    p = factors_path(path)
    if not p.is_file():
        raise ConfigError(key, f"no LongRoPE factors file at {p}; posexp search RUN --target-len N writes one "
                               f"(RUN/longrope/N/{FACTORS_FILE})")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(key, f"{p} is not a LongRoPE factors file ({e.__class__.__name__}: {e})") from None
    factors = data.get("factors") if isinstance(data, dict) else None
    start = data.get("start", 0) if isinstance(data, dict) else None
    if (not isinstance(factors, list) or not factors
            or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors)
            or isinstance(start, bool) or not isinstance(start, int) or start < 0):
        raise ConfigError(key, f"{p} holds no LongRoPE factors: it needs \"factors\" (numbers > 0) and "
                               f"\"start\" (a whole number >= 0)")
    return [float(f) for f in factors], int(start), data


def write_factors(folder: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` (with ``factors`` and ``start``) as the folder's factors file, atomically."""
    from posexp.runs.atomic import atomic_write_text

    path = folder / FACTORS_FILE
    atomic_write_text(path, json.dumps({"format": FORMAT, "method": "longrope", **record}, indent=2) + "\n")
    return path


def longrope_settings(settings: Any, prefix: str = "eval.") -> tuple[Optional[list[float]], int]:
    """The LongRoPE factors and ``n^`` a group of settings asks for: ``longrope_file``'s, else ``longrope_factors``
    and ``longrope_start`` as given (``prefix`` names the group in messages: ``eval.`` or none for a fine-tune).

    Raises:
        ConfigError: a file given with factors or a start beside it, or a file that cannot be read.
    """
    file = getattr(settings, "longrope_file", None)
    factors = getattr(settings, "longrope_factors", None)
    start = getattr(settings, "longrope_start", None) or 0
    if file is None:
        return (None if factors is None else [float(f) for f in factors]), start
    if factors is not None or start:
        raise ConfigError(f"{prefix}longrope_file", f"gives the factors and n^ itself; drop {prefix}longrope_factors "
                                                    f"and {prefix}longrope_start, or drop {prefix}longrope_file")
    read, start, _ = read_factors(file, f"{prefix}longrope_file")
    return read, start


def fingerprint(factors: Any) -> str:
    """A short stable name of the rescale factors ``lambda_i``: the first 8 hex digits of the SHA-256 of their values
    as JSON floats, so that ``[1, 2]`` and ``[1.0, 2.0]`` agree and a search's file and the same list typed by hand
    do too."""
    text = json.dumps([float(f) for f in factors])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def options_text(factors: Any, start: int) -> Optional[str]:
    """What a LongRoPE row keeps as ``scaling_options`` beside its factor ``s``: its factors ``lambda_i`` (their
    :func:`fingerprint`) and ``n^``, e.g. ``"factors=3f2a9c1e start=4"``, whether typed or read from a search's file
    (the same factors, the same measurement); None without factors (a pretrained model's own)."""
    if factors is None:
        return None
    return f"factors={fingerprint(factors)} start={int(start)}"


__all__ = ["FACTORS_FILE", "STATE_FILE", "factors_path", "fingerprint", "longrope_settings", "options_text",
           "read_factors", "write_factors"]
