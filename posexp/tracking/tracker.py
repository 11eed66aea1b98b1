"""What every experiment tracker is told, in one form: the run's identity, its config, the training
curve, evaluation points and artifacts; and the record in the run folder that lets a later command
(``posexp eval``, ``posexp resume``) append to the same tracked run.

Standard library only: the tracker libraries are imported by their own modules, and only when a
run asks for them.
"""

from __future__ import annotations

import json
import math
import re
import socket
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from posexp.errors import PosexpError
from posexp.registry import MODULE_KEY, Registry, option_params, options_dataclass
from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import (ACCURACY, ACCURACY_PLOT, CURVE_CSV, CURVE_PLOT, DEPTH_PLOT, LOSS_BY_POSITION_PNG, PASSKEY_HEATMAP, PERPLEXITY, PPL_PLOT, RESULTS_CSV, RESULTS_JSON, RESULTS_MD, TRACKERS_JSON, row_metric)

# What a run folder hands its trackers as artifacts, when present: the results and the run's figures.
ARTIFACTS = (RESULTS_JSON, RESULTS_CSV, RESULTS_MD, PPL_PLOT, LOSS_BY_POSITION_PNG, ACCURACY_PLOT, PASSKEY_HEATMAP,
             DEPTH_PLOT, CURVE_CSV, CURVE_PLOT)


@dataclass
class RunIdentity:
    """Who a tracked run is.

    Attributes:
        run_dir: the posexp run folder.
        name: the run's label (its overrides, ``default`` without any).
        group: the sweep folder's name for a sweep job (``multirun/2026-11-22/10-00-00``), else None.
        sweep_dir: the sweep folder of a sweep job, else None.
        config: the resolved config, nested.
        resume_step: the checkpoint step a resumed training continues from (its later steps are logged again).
    """

    run_dir: Path
    name: str
    group: Optional[str] = None
    sweep_dir: Optional[Path] = None
    config: dict = field(default_factory=dict)
    resume_step: Optional[int] = None


@dataclass(frozen=True)
class Point:
    """One evaluation number: ``name`` at ``length`` tokens (the x axis every tracker plots it against)."""

    name: str
    length: int
    value: float


_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ ]")  # what MLflow allows in a metric name; the strictest of the three


# What each kind of results row measures, as the series a tracker draws: a perplexity row its perplexity,
# a task row (posexp/evaluation/accuracy.py) its exact-match and per-token accuracy.
ROW_FIELDS = {PERPLEXITY: ("ppl",), ACCURACY: ("exact_match", "token_accuracy")}


def row_fields(row: dict) -> tuple[str, ...]:
    """The fields of ``row`` that are series (``ppl``; ``exact_match`` and ``token_accuracy``)."""
    return ROW_FIELDS.get(row_metric(row), (row_metric(row),))


def metric_name(row: dict, value: Optional[str] = None) -> str:
    """The series a results row's ``value`` (its first field by default) belongs to: ``eval/<value>/<how>``.

    Everything that tells rows of one run apart besides the length is in ``<how>`` (the protocol with its
    stride or last_k, the scaling with its factor, the window and its sinks, a task and its depth), so one series is one curve over
    length: ``eval/ppl/nonoverlap``, ``eval/ppl/sliding_S64_yarn_x4``, ``eval/exact_match/copy_teacher_forced``.
    Always two slashes: MLflow's file store keeps each name as a file path, where no name may be another's folder.
    """
    value = value or row_fields(row)[0]
    parts = [str(row[key]) for key in ("task", "protocol") if row.get(key)]
    if row.get("stride") is not None:
        parts.append(f"S{row['stride']}")
    if row.get("last_k") is not None:
        parts.append(f"K{row['last_k']}")
    if row.get("scaling") not in (None, "none"):
        factor = row.get("scaling_factor")
        parts.append(f"{row['scaling']}{f'_x{factor:g}' if isinstance(factor, (int, float)) else ''}")
    if row.get("window") is not None:  # a window baseline is its own curve (eval/ppl/nonoverlap_W128_sinks4)
        parts.append(f"W{row['window']}" + (f"_sinks{row['sinks']}" if row.get("sinks") else ""))
    if row.get("depth") is not None:
        depth = row["depth"]
        parts.append(f"depth{depth:g}" if isinstance(depth, (int, float)) else f"depth{depth}")
    how = "_".join(p.replace("/", "_") for p in parts) or "all"
    return _UNSAFE.sub("_", f"eval/{value.replace('/', '_')}/{how}")


def point_key(point: "Point") -> str:
    """One point as a name of its own (``eval/ppl/nonoverlap_L512``), for tables of runs with one value per key."""
    return f"{point.name}_L{point.length}"


def row_value(row: dict, field: Optional[str] = None) -> Optional[float]:
    """A row's number (its first series field by default); None when not measured."""
    value = row.get(field or row_fields(row)[0])
    if row.get("applicable") is False or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        return None
    return float(value)


def eval_points(rows: list[dict]) -> list[Point]:
    """The measured rows as points, one per series field, shortest length first within each series (rows not
    applicable are left out)."""
    points = [Point(metric_name(r, f), int(r["length"]), v) for r in rows for f in row_fields(r)
              if (v := row_value(r, f)) is not None and isinstance(r.get("length"), int)]
    return sorted(points, key=lambda p: (p.name, p.length))


# What a curve.csv row (eval.during_training) measures, as series: a language model's perplexity, a task run's
# exact-match and per-token accuracy.
CURVE_FIELDS = ("ppl", "exact_match", "token_accuracy")


def curve_values(rows: list[dict]) -> dict[str, float]:
    """One point of the extrapolation curve as tracker series, ``curve/<value>/<multiple>x`` (``curve/ppl/4x``),
    each drawn against the training step; values not finite are left out."""
    values = {}
    for row in rows:
        for name in CURVE_FIELDS:
            value = row.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                values[f"curve/{name}/{float(row['multiple']):g}x"] = float(value)
    return values


def flat_config(config: dict, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys with scalar values (lists and None as text): what hyperparameter
    tables take."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, dotted + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[dotted] = value
        else:
            out[dotted] = json.dumps(value, default=str)
    return out


def artifacts(run_dir: Path) -> list[Path]:
    return [run_dir / name for name in ARTIFACTS if (run_dir / name).is_file()]


REACH_TIMEOUT_S = 5.0


def check_reachable(url: str, key: str, timeout: float = REACH_TIMEOUT_S) -> None:
    """Fail in seconds, in one line, when the tracking server at ``url`` (http or https) cannot be reached.

    The trackers' own clients retry with back-off for minutes before they give up, silently; a run should
    not train for nothing, nor wait that long to be told. Other schemes (files, databases) are left to them.

    Raises:
        PosexpError: no connection to the server's host and port within ``timeout`` seconds.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        reason = "no answer" if isinstance(e, socket.timeout) else (e.strerror or type(e).__name__)
        raise PosexpError(f"{key}: cannot reach the tracking server {url} ({reason} within {timeout:g} s); "
                          "start it or fix the address, or train without this logger") from None


class Tracker:
    """One tracker's side of a run. Subclasses implement each call for their library.

    ``record()`` is what the run folder keeps (:data:`TRACKERS_JSON`) to reopen the same tracked run. The
    tracker's options (``logger.NAME.KEY``, ``configs/logger/NAME.yaml``) are the keyword arguments of its
    :meth:`start` after ``run``, typed by their hints, with their defaults: :func:`options_schema`.
    """

    name = ""
    needs_module = ""  # the module it needs, installed by the extra of its name (pip install 'posexp[NAME]')
    description = ""  # what it is, one line, for posexp list where its yaml's header comment says nothing

    @classmethod
    def start(cls, run: RunIdentity, **options: Any) -> "Tracker":
        """A new tracked run for ``run``, with this tracker's ``logger.NAME`` options."""
        raise NotImplementedError

    @classmethod
    def check(cls, **options: Any) -> None:
        """Refuse options that cannot work, before a run starts (a :class:`~posexp.errors.ConfigError` naming the
        key); nothing to check by default."""

    @classmethod
    def reopen(cls, record: dict, run: RunIdentity) -> "Tracker":
        """The tracked run that ``record`` (the run folder's trackers.json) names, to append to."""
        raise NotImplementedError

    def log_train(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def log_curve(self, step: int, values: dict[str, float]) -> None:
        """A point of the extrapolation curve (:func:`curve_values`: full series names) at training step ``step``."""
        raise NotImplementedError

    def log_eval(self, points: list[Point], rows: list[dict]) -> None:
        raise NotImplementedError

    def log_artifacts(self, files: list[Path]) -> None:
        raise NotImplementedError

    def finish(self, status: str) -> None:
        """``status``: ``completed``, ``failed`` or ``interrupted``."""
        raise NotImplementedError

    def record(self) -> dict:
        raise NotImplementedError

    def where(self) -> str:
        """One line for the terminal: where the tracked run is and how to look at it."""
        raise NotImplementedError


# The calls a run makes of each of its trackers: a tracker implements every one (posexp eval reopens it)
CALLS = ("start", "reopen", "log_train", "log_curve", "log_eval", "log_artifacts", "finish", "record", "where")


def unimplemented(cls: type[Tracker]) -> list[str]:
    """The calls of :data:`CALLS` that ``cls`` leaves to :class:`Tracker`, which implements none of them."""
    return [call for call in CALLS if getattr(cls, call).__qualname__ == f"Tracker.{call}"]


# Every tracker by name (the logger=... options), found as encoders and tasks are (posexp.registry): a Tracker
# subclass in a module of this package decorated with @TRACKERS.register("name"). Those modules import their
# library only when a run uses them, so finding them costs nothing.
TRACKERS: Registry[Tracker] = Registry("tracker", "logger", "posexp.tracking", skip=("tracker",), nested=True)


def option_names(cls: type[Tracker]) -> list[str]:
    """The tracker's options: the keyword arguments of its :meth:`Tracker.start` after ``run``."""
    return [p.name for p in option_params(cls.start, ("run",))]


def options_schema(cls: type[Tracker]) -> type:
    """A dataclass of the ``logger.NAME`` keys of ``cls`` (its :meth:`Tracker.start` options; ``module`` for a tracker
    of the user's), for Hydra's ConfigStore as ``schema/logger/NAME``."""
    first = [] if TRACKERS.own(cls) else [(MODULE_KEY, str, cls.__module__)]
    return options_dataclass(f"{cls.__name__}Options", cls.start, ("run",), first)


def read_records(folder: Path) -> dict:
    """The trackers a folder's runs were reported to (:data:`TRACKERS_JSON`), or {} when it has none or it
    cannot be read (:func:`records_problem` says why)."""
    return _records(folder)[0]


def records_problem(folder: Path) -> Optional[str]:
    """Why the folder's :data:`TRACKERS_JSON` cannot be used (damaged, not JSON, not a mapping of trackers to
    their records), or None where it is fine or absent."""
    return _records(folder)[1]


def _records(folder: Path) -> tuple[dict, Optional[str]]:
    """The usable records of :data:`TRACKERS_JSON` and what is wrong with the file, if anything."""
    path = folder / TRACKERS_JSON
    if not path.exists():
        return {}, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return {}, f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    usable = {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}
    if not isinstance(data, dict) or len(usable) != len(data):
        return usable, f"{path} is not what posexp writes (a tracker name -> its run's record)"
    return usable, None


def write_records(folder: Path, records: dict) -> None:
    atomic_write_text(folder / TRACKERS_JSON, json.dumps(records, indent=2, sort_keys=True) + "\n")
