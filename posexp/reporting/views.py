"""Which rows a report shows: ``posexp report --view KEY=VALUE,...``.

A run's results.json can hold several views of the same lengths: the plain ``nonoverlap`` rows, ``sliding`` or
``last_k`` ones, rows under an evaluation-time scaling (``eval.scaling``) and windowed ones (``eval.window``,
``eval.sinks``). A table shows one view, never two in one cell; without ``--view`` it is the plain one (or the
first found), and the others are named under the table. ``--view`` picks another, e.g. ``--view window=128`` for
the window baseline, ``--view protocol=last_k,window=128``, ``--view scaling=yarn``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.formatting import fmt_view
from posexp.reporting.runs import window_key
from posexp.reporting.selection import option_items

MAIN_PROTOCOL = "nonoverlap"  # the protocol of the plain view
VIEW_KEYS = ("protocol", "scaling", "window", "sinks")
PROTOCOLS = ("nonoverlap", "sliding", "last_k")
NONE = ("none", "null", "")

View = tuple[Any, Any, Optional[tuple]]  # (protocol, scaling, (window, sinks) or None)


def _value(key: str, text: str) -> Any:
    if text.lower() in NONE:
        if key == "protocol":
            raise ConfigError("--view", f"protocol needs a value: one of {', '.join(PROTOCOLS)}")
        return None
    if key == "protocol":
        if text not in PROTOCOLS:
            raise ConfigError("--view", f"unknown protocol {text!r}; choose one of {', '.join(PROTOCOLS)}")
        return text
    if key in ("window", "sinks"):
        try:
            number = int(text)
        except ValueError:
            number = 0
        if number < 1:
            raise ConfigError("--view", f"{key}={text}: a positive integer (or none), e.g. {key}=128")
        return number
    return text  # a scaling's name, as results.json records it


def parse_view(view: Sequence[str] | str | None) -> dict[str, Any]:
    """``--view`` values (``KEY=VALUE``, comma-separated or repeated) as {key: value}; {} without any.

    Raises:
        ConfigError: an unknown key, a repeated one, or a value of the wrong kind, naming ``--view``.
    """
    wanted: dict[str, Any] = {}
    for item in filter(None, option_items(view)):
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("eval.")
        if not sep or key not in VIEW_KEYS:
            raise ConfigError("--view", f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(VIEW_KEYS)}, "
                                        "e.g. --view window=128 or --view protocol=last_k,window=128")
        if key in wanted:
            raise ConfigError("--view", f"{key} given twice")
        wanted[key] = _value(key, text.strip())
    if wanted.get("sinks") is not None and wanted.get("window", 0) is None:
        raise ConfigError("--view", "sinks belong to a window: give window=K too")
    return wanted


def pick_view(runs: Sequence[Any], wanted: dict[str, Any]) -> tuple[Optional[View], list[View]]:
    """The view a table shows of ``runs``' rows, and the others they have: of the views matching ``wanted``, the
    plain one (:data:`MAIN_PROTOCOL`, no scaling, no window) first, else the first unscaled and unwindowed one, else
    the first unscaled, else the first; (None, []) when the runs have no rows. A windowed row is a view of its own,
    like a scaled one: never in the same cell as a plain row.

    Raises:
        ConfigError: ``wanted`` matches none of the views, naming those there are.
    """
    views: list[View] = []
    for row in (row for run in runs for row in run.rows):
        if (view := (row.get("protocol"), row.get("scaling"), window_key(row))) not in views:
            views.append(view)

    def matches(view: View) -> bool:
        size, sinks = view[2] if view[2] is not None else (None, None)
        have = {"protocol": view[0], "scaling": view[1], "window": size, "sinks": sinks}
        return all(have[key] == value for key, value in wanted.items())

    candidates = [v for v in views if matches(v)]
    if views and not candidates:
        have = "; ".join(fmt_view(*v) for v in views)
        raise ConfigError("--view", f"no results of the selected runs are {view_text(wanted)}; they have: {have} "
                                    "(posexp eval RUN eval.KEY=VALUE measures another)")
    if not candidates:
        return None, []
    chosen = next((v for v in candidates if v == (MAIN_PROTOCOL, None, None)),
                  next((v for v in candidates if v[1:] == (None, None)),
                       next((v for v in candidates if v[1] is None), candidates[0])))
    return chosen, [v for v in views if v != chosen]


def view_text(wanted: dict[str, Any], sep: str = ", ") -> str:
    """``window=128, scaling=none``: a ``--view`` as the user gave it, in words."""
    return sep.join(f"{k}={'none' if v is None else v}" for k, v in wanted.items())


def view_slug(wanted: dict[str, Any]) -> str:
    """``view-window=128,protocol=last_k``: a folder name for a report of this view."""
    return "view-" + view_text(wanted, ",")


__all__ = ["MAIN_PROTOCOL", "VIEW_KEYS", "View", "parse_view", "pick_view", "view_slug", "view_text"]
