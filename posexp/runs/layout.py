"""The run folder: its file names, how runs are found, and the files every command shares.

A run folder is what ``posexp train`` leaves behind and what ``eval``, ``resume``,
``report`` and ``analyze`` read back::

    results.json            the public contract: "run" (provenance) and "rows" (one per measurement);
                            written last, so a folder with it is a finished (or failed) run
    results.csv / .md       the same rows for people; ppl_vs_length.png their figure (a task run:
                            accuracy_vs_length.png, and for a task with depths passkey_heatmap.png
                            and accuracy_vs_depth.png)
    loss_by_position.csv    mean loss per position in the window, per measurement (and its .png)
    metrics.csv             the training curve; train.log the run's log
    curve.csv / .png        with eval.during_training: perplexity (accuracy) at a few lengths while training went
    trackers.json           the tracked runs (logger=tensorboard/mlflow/wandb) that eval and resume append to
    checkpoint/             model.safetensors + meta.json (and resumable step files while training)
    .hydra/                 config.yaml and overrides.yaml, as Hydra wrote them

A sweep folder holds numbered run folders, Hydra's ``multirun.yaml`` and the
``summary.md``/``summary.csv`` written when the sweep ends.

A run folder belongs to one process at a time. ``posexp train`` claims a fresh one with os.mkdir,
which succeeds for only the first process to ask (two runs started in the same second get ``TIME``
and ``TIME-1``); whatever trains in a folder holds an flock on it, which the kernel releases when
the process ends, however it ends, so a killed run never leaves its folder locked.

This module is the one place that names those files, reads or merges them, and claims run folders.
It must stay torch-free (``posexp report`` and ``posexp list`` import it): it
imports only the standard library, yaml, :mod:`posexp.errors`,
:mod:`posexp.runs.atomic` and :mod:`posexp.runs.row` (what a results row is).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence


from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_write_text
from posexp.runs.row import ACCURACY, PERPLEXITY, POSITION_KEY, ROW_KEY, ResultRow, row_key, row_metric

# -- file names -----------------------------------------------------------------------------------

RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
PPL_PLOT = "ppl_vs_length.png"
ACCURACY_PLOT = "accuracy_vs_length.png"  # task runs
PASSKEY_HEATMAP = "passkey_heatmap.png"  # task=passkey: exact match per length x depth
DEPTH_PLOT = "accuracy_vs_depth.png"  # tasks with depths: exact match per depth, a line per length (lost in the middle)
LOSS_BY_POSITION_CSV = "loss_by_position.csv"
LOSS_BY_POSITION_PNG = "loss_by_position.png"
METRICS_CSV = "metrics.csv"
# eval.during_training: the model measured at a few lengths every N steps while it trained, and its figure
CURVE_CSV = "curve.csv"
CURVE_PLOT = "curve.png"
TRAIN_LOG = "train.log"
# The experiment trackers a run reports to (logger=...) and the ids that find its tracked run again.
TRACKERS_JSON = "trackers.json"
TENSORBOARD_DIR = "tensorboard"  # logger=tensorboard's event files (unless logger.tensorboard.log_dir says otherwise)
WANDB_DIR = "wandb"  # logger=wandb's run files (W&B names the folder)
CHECKPOINT_DIR = "checkpoint"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT = Path(CHECKPOINT_DIR) / WEIGHTS_FILE  # the final weights, relative to the run folder
HYDRA_CONFIG = Path(".hydra") / "config.yaml"
HYDRA_OVERRIDES = Path(".hydra") / "overrides.yaml"
# A sweep folder's own files.
MULTIRUN_YAML = "multirun.yaml"
SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"
# What posexp report writes: into a folder of its own, reports/NAME/ (and the end of a sweep into the sweep folder).
REPORTS_DIR = "reports"
REPORT_MD = "report.md"
REPORT_PLOT = "report_ppl_vs_length.png"
# Not "loss_by_position.png": a report written into a run folder must not replace the run's own figure.
REPORT_POSITION_PLOT = "report_loss_by_position.png"
REPORT_TRAINING_PLOT = "report_training_curves.png"
REPORT_ACCURACY_PLOT = "report_accuracy_vs_length.png"  # task runs
REPORT_DEPTH_PLOT = "report_accuracy_vs_depth.png"  # task runs with depths: the lost-in-the-middle curves
REPORT_CURVE_PLOT = "report_curve.png"  # the runs' curve.csv side by side
# a table standing in for the report's (a parent and its fine-tunes; a pivot, --cols): also at the top of report.md
LEAD_FILES = ("extension.csv", "extension.tex", "pivot.csv", "pivot.tex")
# everything a report may write, so that a report written again leaves no figure of the last one behind
REPORT_FILES = (REPORT_MD, "summary.md", "summary.csv", PPL_PLOT, REPORT_PLOT, REPORT_POSITION_PLOT,
                REPORT_TRAINING_PLOT, REPORT_ACCURACY_PLOT, REPORT_DEPTH_PLOT, REPORT_CURVE_PLOT, *LEAD_FILES)

# The columns of loss_by_position.csv: the row's key (posexp.runs.row.POSITION_KEY, the length last), then the
# position and its loss; and, only in a file with rows of a windowed evaluation (eval.window), the window and its
# sinks; and, only in a file with rows of a position remapping with options (eval.scaling=self_extend, ...), those.
WINDOW_COLUMNS = [n for n in POSITION_KEY if n in ("window", "sinks")]
OPTION_COLUMNS, _LAST = [n for n in POSITION_KEY if n == "scaling_options"], ["length", "position", "loss", "count"]
POSITION_COLUMNS = [n for n in POSITION_KEY if n not in ("length", *WINDOW_COLUMNS, *OPTION_COLUMNS)] + _LAST

# -- finding runs ---------------------------------------------------------------------------------


def natural_key(path: Path) -> list:
    """Sort key under which ``2`` comes before ``10`` (sweep jobs are numbered folders)."""
    # re.split with a capture group alternates text, number, text, ... so positions
    # always hold the same type and the lists compare cleanly: 2 < 10, not "10" < "2".
    return [int(tok) if i % 2 else tok.lower() for i, tok in enumerate(re.split(r"(\d+)", str(path)))]


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks (weights can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_run_dir(path: str | os.PathLike, needs_weights: bool = False) -> bool:
    """Whether ``path`` is a run folder: it holds ``results.json`` (and, if ``needs_weights``, the final weights)."""
    path = Path(path)
    if not (path / RESULTS_JSON).is_file():
        return False
    return not needs_weights or (path / CHECKPOINT).is_file()


def runs_under(root: str | os.PathLike) -> list[Path]:
    """Every folder at or below ``root`` that holds ``results.json``, sorted naturally.

    Hidden folders (``.hydra``, ``.git``) never hold runs and ``checkpoint/`` can be a
    large tree, so neither is searched. Symbolic links to folders are followed (a folder of
    links to the runs one wants to compare is a common way to collect them), each real folder
    once, so a link that points back up cannot loop.
    """
    found, seen = [], set()
    for folder, dirnames, filenames in os.walk(os.fspath(root), followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != CHECKPOINT_DIR]
        if RESULTS_JSON in filenames:
            found.append(Path(folder))
    return sorted(found, key=natural_key)


def find_runs(paths: Sequence[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """Find every run folder (a folder containing ``results.json``) under ``paths``.

    Each path may be a run folder itself, a sweep folder (``0/``, ``1/``, ...), or
    any folder above them; sub-folders are searched recursively, skipping hidden
    ones such as ``.hydra``.

    Args:
        paths: folders to search (a ``results.json`` file is accepted too).

    Returns:
        The run folders, de-duplicated and sorted naturally (``2`` before ``10``).

    Raises:
        PosexpError: a path does not exist, or no run folder was found.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise PosexpError(f"no folders given; pass one or more run or sweep folders (a run folder contains {RESULTS_JSON})")

    found: dict[Path, Path] = {}  # resolved -> as the user spelled it, so overlapping paths count once
    for raw in paths:
        root = Path(raw)
        if not root.exists():
            raise PosexpError(f"{root}: no such folder; pass a run folder (containing {RESULTS_JSON}) or a sweep folder")
        if root.is_file():
            if root.name != RESULTS_JSON:
                raise PosexpError(f"{root}: is a file, not a run folder; pass the folder that contains {RESULTS_JSON}")
            found.setdefault(root.parent.resolve(), root.parent)
            continue
        for folder in runs_under(root):
            found.setdefault(folder.resolve(), folder)

    if not found:
        searched = ", ".join(str(p) for p in paths)
        raise PosexpError(
            f"no runs found in {searched} (searched all sub-folders). A run folder contains {RESULTS_JSON}, "
            "which is written when training and evaluation finish; did the run stop early, or is this the wrong folder?"
        )
    return sorted(found.values(), key=natural_key)


def is_sweep_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Hydra sweep folder (it holds ``multirun.yaml``)."""
    return (Path(path) / MULTIRUN_YAML).is_file()


# -- results.json ---------------------------------------------------------------------------------


def results_file(path: str | os.PathLike) -> Path:
    """The ``results.json`` of a run folder (``path`` may name the file itself)."""
    path = Path(path)
    return path if path.name == RESULTS_JSON and path.is_file() else path / RESULTS_JSON


def read_results(path: str | os.PathLike) -> dict:
    """A run's ``results.json``, checked to be shaped like results.

    Args:
        path: the run folder (or its ``results.json``).

    Returns:
        The parsed object, with ``run`` (an object) and ``rows`` (a list of rows with a numeric ``length``).

    Raises:
        PosexpError: the file is missing, unreadable, not JSON, or not shaped like results.
    """
    file = results_file(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PosexpError(f"{file}: not found; a run folder must contain {RESULTS_JSON}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PosexpError(f"{file}: cannot be read ({e})") from None
    try:
        # NaN and Infinity are not JSON, but Python wrote them before results.json held nulls in their place
        # (and a hand-edit may add them): read them, then turn them into the nulls written today.
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PosexpError(
            f"{file}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); the run may have been "
            "interrupted while writing it. Re-run it, or leave its folder out."
        ) from None

    def bad(what: str) -> PosexpError:
        return PosexpError(f"{file}: {what}; expected an object with \"run\" (an object) and \"rows\" (a list)")

    if not isinstance(data, dict):
        raise bad(f"top level is a {type(data).__name__}")
    if not isinstance(data.get("run"), dict):
        raise bad('"run" is missing or not an object')
    if not isinstance(data.get("rows"), list):
        raise bad('"rows" is missing or not a list')
    evaluations = data.get("evaluations", [])
    if not isinstance(evaluations, list) or not all(isinstance(e, dict) for e in evaluations):
        raise PosexpError(f"{file}: \"evaluations\" is {evaluations!r:.40}, not the list of objects posexp eval "
                          "writes (one per evaluation); restore the file")
    rows = []
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, dict) or not isinstance(row.get("length"), (int, float)) \
                or not math.isfinite(row["length"]):
            raise bad(f'row {i} has no numeric "length"')
        typed = ResultRow.from_dict(row, data["run"], where=f"{file}: row {i}")  # the declared fields' types
        _check_row_values(file, i, row)
        rows.append(typed.to_dict())
    data["rows"] = rows
    return finite_results(data)


# the numbers a row may hold, with the range a measurement can have (None: not measured, or not finite)
_ROW_RANGES = {"ppl": (0.0, math.inf, False), "loss": (-math.inf, math.inf, True),
               "exact_match": (0.0, 1.0, True), "token_accuracy": (0.0, 1.0, True)}


def _check_row_values(file: Path, i: int, row: dict) -> None:
    """A hand-edited value of the wrong type or out of range is named here, before anything reads or rewrites it."""
    for key, (low, high, closed) in _ROW_RANGES.items():
        value = row.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PosexpError(f"{file}: row {i} ({key}) is {value!r}, not a number; restore the file "
                              "(or evaluate the run again with posexp eval)")
        inside = (low <= value <= high) if closed else (low < value <= high)
        if not inside and not math.isinf(value):
            bounds = f"[{low:g}, {high:g}]" if closed else f"> {low:g}"
            raise PosexpError(f"{file}: row {i} ({key}) is {value!r}, impossible for a measurement ({key} "
                              f"{bounds}); restore the file (or evaluate the run again with posexp eval)")


def run_status(run_dir: str | os.PathLike) -> Optional[str]:
    """The ``status`` recorded in a run's ``results.json``; None when absent or unreadable."""
    try:
        return json.loads((Path(run_dir) / RESULTS_JSON).read_text(encoding="utf-8")).get("run", {}).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def write_results_json(run_dir: str | os.PathLike, results: dict, *, default: Any = None) -> Path:
    """Write ``results.json`` atomically: a folder with it is a finished (or failed) run.

    A number JSON cannot hold (NaN, infinity) never stops the file from being written:
    it is written as ``null`` and its row says so in ``note`` (see :func:`finite_results`),
    which the report and the tables show as n/a.

    Args:
        run_dir: the run folder.
        results: ``{"run": ..., "rows": [...]}``.
        default: passed to :func:`json.dumps` (``str`` where a failed run records whatever it has).
    """
    text = json.dumps(finite_results(results), indent=2, allow_nan=False, default=default) + "\n"
    return atomic_write_text(Path(run_dir) / RESULTS_JSON, text)


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (at any depth) replaced by None."""
    if _non_finite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def finite_results(results: dict) -> dict:
    """A copy of ``results`` that JSON can hold: each NaN or infinity becomes None.

    A row that had one keeps ``applicable`` as it was and says which fields were not
    finite in ``note`` (``"non-finite loss (nan), ppl (nan)"``): its ``ppl`` is null,
    which the report, ``results.md`` and the console table all show as n/a.
    """
    out = {k: _finite(v) for k, v in results.items() if k != "rows"}
    if "rows" not in results:
        return out
    rows = []
    for row in results["rows"]:
        if not isinstance(row, dict):
            rows.append(_finite(row))
            continue
        bad = [f"{k} ({row[k]})" for k in sorted(row) if _non_finite(row[k])]
        fixed = _finite(row)
        if bad:
            note = f"non-finite {', '.join(bad)}"
            fixed["note"] = f"{row['note']}; {note}" if row.get("note") else note
        rows.append(fixed)
    out["rows"] = rows
    return out


# -- identity of a row, for replacing re-evaluated rows ------------------------------------------

def window_text(row: dict) -> str:
    """`` window 128``, `` window 128 + 4 sinks``, or nothing for a row that attended to its whole past."""
    if row.get("window") is None:
        return ""
    return f" window {row['window']}" + (f" + {row['sinks']} sinks" if row.get("sinks") else "")


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with each row that ``new`` re-measures replaced in place, and the rest of ``new`` appended."""
    fresh = {row_key(r): r for r in new}
    merged = [fresh.pop(row_key(r), r) for r in old]
    return merged + [r for r in new if row_key(r) in fresh]


# -- loss_by_position.csv -------------------------------------------------------------------------


def _parse_position_row(raw: dict) -> dict:
    def opt(value: str, cast):
        return None if value in ("", None) else cast(value)

    casts = {"protocol": str, "scaling": str, "scaling_factor": float, "scaling_options": str}  # the other key fields are integers
    row = {name: opt(raw[name], casts.get(name, int)) for name in POSITION_COLUMNS[:-3]}
    row.update(position=int(raw["position"]), loss=float(raw["loss"]), count=int(raw["count"]))
    if raw.get("window"):  # a windowed evaluation's row (eval.window); a plain row has no such fields
        row.update({name: opt(raw.get(name), int) for name in WINDOW_COLUMNS})
    row.update({"scaling_options": str(raw["scaling_options"])} if raw.get("scaling_options") else {})
    return row


def read_loss_by_position(run_dir: str | os.PathLike) -> list[dict]:
    """The rows of a run's ``loss_by_position.csv``; empty if it has none (or an unreadable one)."""
    path = Path(run_dir) / LOSS_BY_POSITION_CSV
    if not path.is_file():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [_parse_position_row(r) for r in csv.DictReader(f)]
    except (OSError, KeyError, ValueError):
        return []  # rebuilt from what this evaluation measured


def merge_loss_by_position(run_dir: str | os.PathLike, new: list[dict]) -> list[dict]:
    """The run's per-position rows with every key that ``new`` re-measures replaced by ``new``'s rows."""
    fresh = {row_key(r) for r in new}
    return [r for r in read_loss_by_position(run_dir) if row_key(r) not in fresh] + new


def write_loss_by_position_csv(run_dir: str | os.PathLike, rows: list[dict]) -> Path:
    """Write ``loss_by_position.csv`` atomically (losses to 6 decimals)."""
    buf = io.StringIO()
    windowed = any(r.get("window") is not None for r in rows)
    optioned = any(r.get("scaling_options") is not None for r in rows)
    w = csv.DictWriter(buf, fieldnames=POSITION_COLUMNS + (WINDOW_COLUMNS if windowed else [])
                       + (OPTION_COLUMNS if optioned else []), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "loss": f"{r['loss']:.6f}"})
    return atomic_write_text(Path(run_dir) / LOSS_BY_POSITION_CSV, buf.getvalue())


def read_position_curve(run_dir: str | os.PathLike, protocol: Any, scaling: Any,
                        length: int, window: Optional[tuple] = None) -> dict[int, tuple[float, int]]:
    """position -> (mean loss, windows) of one window length, from a run's ``loss_by_position.csv``; ``window``
    is the (window, sinks) of a windowed evaluation's curve, None for the plain one.

    The file has every position of every evaluated length, thousands of lines per
    run; a substring test skips other lengths before any parsing.
    """
    path = Path(run_dir) / LOSS_BY_POSITION_CSV
    out: dict[int, tuple[float, int]] = {}
    want_scaling = "" if scaling is None else str(scaling)
    needle, want_length = f",{length},", str(length)
    want_window = ("", "") if window is None else (str(window[0]), "" if not window[1] else str(window[1]))
    try:
        with open(path, encoding="utf-8") as f:
            header = f.readline().strip().split(",")
            col = {name: i for i, name in enumerate(header)}
            ip, isc, il, ipos, iloss, icount = (col["protocol"], col["scaling"], col["length"], col["position"],
                                                col["loss"], col["count"])
            ifac = col.get("scaling_factor")
            iw, isk = col.get("window"), col.get("sinks")  # only in a file with windowed rows
            for line in f:
                if needle not in line:
                    continue
                rec = line.rstrip("\r\n").split(",")
                if rec[il] != want_length or rec[ip] != protocol or rec[isc] != want_scaling:
                    continue
                if scaling is None and ifac is not None and rec[ifac]:
                    continue  # a fixed scaling factor is its own curve
                if (("", "") if iw is None else (rec[iw], rec[isk])) != want_window:
                    continue  # a windowed evaluation is its own curve too
                out[int(rec[ipos])] = (float(rec[iloss]), int(rec[icount]))
    except (OSError, KeyError, ValueError, IndexError):
        return {}
    return out


def read_training_curve(run_dir: str | os.PathLike) -> tuple[list[float], list[float]]:
    """(steps, losses) from a run's ``metrics.csv``; empty lists when it has none (or an unreadable one)."""
    steps: list[float] = []
    losses: list[float] = []
    try:
        with open(Path(run_dir) / METRICS_CSV, newline="", encoding="utf-8") as f:
            for rec in csv.DictReader(f):
                steps.append(float(rec["step"]))
                losses.append(float(rec["loss"]))
    except (OSError, KeyError, ValueError, TypeError):
        return [], []
    return steps, losses


# -- the saved config and overrides ---------------------------------------------------------------


def read_config_dict(run_dir: str | os.PathLike) -> dict:
    """A run's ``.hydra/config.yaml`` as plain data, {} when missing or unreadable (for reports, not for rebuilding)."""
    import yaml

    path = Path(run_dir) / HYDRA_CONFIG
    if not path.is_file():
        return {}
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def read_overrides(run_dir: str | os.PathLike) -> Optional[list[str]]:
    """The overrides Hydra recorded for the launch; None when there is no readable record of them."""
    import yaml

    path = Path(run_dir) / HYDRA_OVERRIDES
    if not path.is_file():
        return None
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if isinstance(loaded, list):
        return [str(o) for o in loaded]
    return [] if loaded is None else None


def load_overrides(run_dir: str | os.PathLike) -> list[str]:
    """The overrides the run was launched with (its label), empty when Hydra did not record them."""
    return read_overrides(run_dir) or []


def iter_jobs(sweep_dir: str | os.PathLike) -> Iterator[Path]:
    """A sweep folder's job folders (``0/``, ``1/``, ...) in job order."""
    root = Path(sweep_dir)
    yield from sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))
