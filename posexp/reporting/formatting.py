"""Small formatters shared by every output: numbers, perplexities, markdown and LaTeX escaping, csv cells, paths."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Optional


MISSING = "—"  # the run was not evaluated at this length


NOT_APPLICABLE = "n/a"  # the encoding cannot run at this length (e.g. learned positions)


# Interval bands for more lines than this turn the overlay into a smear.
MAX_BANDS = 6


def fmt_view(protocol: Any, scaling: Any, window: Any = None) -> str:
    """``nonoverlap``, ``nonoverlap with scaling yarn``, ``nonoverlap with window 128 + 4 sinks``."""
    text = f"{protocol}" + (f" with scaling {scaling}" if scaling is not None else "")
    if window is not None:
        size, sinks = window
        text += f" with window {size}" + (f" + {sinks} sinks" if sinks else "")
    return text


def fmt_settings(settings: Any) -> str:
    if isinstance(settings, dict):
        return ", ".join(f"{k}={v}" for k, v in settings.items()) or "none"
    return "unknown" if settings is None else str(settings)


def fmt_fixed(value: float, decimals: int) -> str:
    """``value`` to ``decimals`` places, a negative one with a minus sign as :func:`fmt_signed` writes it
    (``−0.050``, not a hyphen); one that rounds to zero is ``0.000``, never ``−0.000`` (a flat slope of −0.0001 is
    not a negative one)."""
    return (_unsigned_zero(f"{value:.{decimals}f}") if math.isfinite(value) else str(value)).replace("-", "−")


def fmt_value(value: Optional[float], decimals: int = 2, signed: bool = False) -> str:
    """``3.10`` (``signed``: ``+0.12``, :func:`fmt_signed`); n/a for None or a value that is not finite."""
    if value is None or not math.isfinite(value):
        return NOT_APPLICABLE
    return fmt_signed(value, decimals) if signed else fmt_fixed(value, decimals)


def fmt_signed(value: Optional[float], decimals: int = 2, keep_sign: bool = False) -> str:
    """``+0.12`` / ``−0.12`` (a minus sign, not a hyphen); :data:`MISSING` for None. One that rounds to zero is
    ``+0.00``, unless ``keep_sign``: ``−0.000`` for a difference whose percentage beside it shows its sign."""
    if value is None:
        return MISSING
    text = f"{value:+.{decimals}f}"
    return (text if keep_sign else _unsigned_zero(text, "+")).replace("-", "−")


def _unsigned_zero(text: str, sign: str = "") -> str:
    """A formatted number that rounds to zero without its minus sign (``-0.00`` -> ``0.00``; ``sign``: what
    stands there instead, ``+`` for a signed number)."""
    return sign + text[1:] if text.startswith("-") and float(text) == 0 else text


def fmt_num(value: Any, spec: str = "g") -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def fmt_int(value: Any) -> str:
    return f"{int(value):,}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def as_number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def csv_cell(value: Any) -> str:
    """None as an empty cell, booleans lowercase like JSON, dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def short_id(fingerprint: Any) -> str:
    return "none" if fingerprint is None else str(fingerprint)[:12]


def plural(word: str, items: list) -> str:
    return word if len(items) == 1 else word + "s"


def joined(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def md_escape(text: str) -> str:
    """Escape what would break a markdown table cell or turn into emphasis or math (GitHub reads ``$...$`` as TeX)."""
    text = str(text).replace("\n", " ")
    return re.sub(r"([\\|*_`\[\]<>$])", r"\\\1", text)


def display_path(path: Path, out_dir: str | os.PathLike | None) -> str:
    """Relative to the summary when the run lives under it, or under the folder whose ``reports/NAME/`` holds the
    summary (``../../0``), so a sweep folder can be moved with its reports."""
    if out_dir is not None:
        out = Path(out_dir).resolve()
        home = out.parent.parent if out.parent.name == "reports" else out
        try:
            path.resolve().relative_to(home)
            return Path(os.path.relpath(path.resolve(), out)).as_posix() or "."
        except ValueError:
            pass
    return path.as_posix()


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (and ×, ±, −, Δ, ≥, ≤, — as LaTeX writes them): the one
    escaper of every LaTeX table."""
    special = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
               "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
               # in text mode LaTeX's default (OT1) font prints < > | as ¡ ¿ —
               "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
               "—": "---", "×": r"$\times$", "±": r"$\pm$", "−": "$-$", "Δ": r"$\Delta$", "≥": r"$\geq$",
               "≤": r"$\leq$"}
    return "".join(special.get(ch, ch) for ch in str(text))

