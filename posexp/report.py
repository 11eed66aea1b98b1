"""Compare finished runs: a perplexity-per-length table, a CSV and an overlay plot.

``posexp report DIR...`` and the end-of-sweep Hydra callback both end up in
:func:`report_main`. Each run folder holds a ``results.json`` written by the
trainer; this module only reads those files, so a report can be rebuilt at any
time without touching a model.

Runs are only comparable when they were trained on the same corpus, with the
same training length, and evaluated the same way. Rather than refuse to report
(a sweep may legitimately contain a stray run), runs that differ from the
majority are flagged in every output.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from hydra.experimental.callback import Callback
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posexp.errors import PosexpError
from posexp.io import atomic_write_text

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"
PLOT_FILE = "ppl_vs_length.png"
MAIN_PROTOCOL = "nonoverlap"
PPL_LABEL = "perplexity (per byte)"
MISSING = "—"  # the run was not evaluated at this length
NOT_APPLICABLE = "n/a"  # the encoding cannot run at this length (e.g. learned positions)
# Interval bands for more lines than this turn the overlay into a smear.
MAX_BANDS = 6

CSV_COLUMNS = [
    "label", "run_dir", "encoder", "base", "length", "multiple", "protocol", "scaling",
    "ppl", "ppl_low", "ppl_high", "loss", "applicable", "flags",
]


# ---------------------------------------------------------------------------
# Loading runs


@dataclass
class Run:
    """One run folder's ``results.json``.

    Attributes:
        path: the run folder.
        info: the ``run`` object (label, encoder, config, ...).
        rows: the ``rows`` list, one per evaluated (length, protocol, scaling).
        overrides: the Hydra overrides the run was launched with, or None when unknown.
    """

    path: Path
    info: dict
    rows: list[dict]
    overrides: Optional[list[str]]

    @property
    def status(self) -> str:
        return str(self.info.get("status") or "unknown")

    @property
    def train_len(self) -> Optional[int]:
        value = self.info.get("train_len")
        return int(value) if isinstance(value, (int, float)) else None


def _natural_key(path: Path) -> list:
    # re.split with a capture group alternates text, number, text, ... so positions
    # always hold the same type and the lists compare cleanly: 2 < 10, not "10" < "2".
    return [int(tok) if i % 2 else tok.lower() for i, tok in enumerate(re.split(r"(\d+)", str(path)))]


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
        raise PosexpError(f"no folders given; pass one or more run or sweep folders (a run folder contains {RESULTS_FILE})")

    found: dict[Path, Path] = {}  # resolved -> as the user spelled it, so overlapping paths count once
    for raw in paths:
        root = Path(raw)
        if not root.exists():
            raise PosexpError(f"{root}: no such folder; pass a run folder (containing {RESULTS_FILE}) or a sweep folder")
        if root.is_file():
            if root.name != RESULTS_FILE:
                raise PosexpError(f"{root}: is a file, not a run folder; pass the folder that contains {RESULTS_FILE}")
            found.setdefault(root.parent.resolve(), root.parent)
            continue
        for folder, dirnames, filenames in os.walk(root):
            # .hydra, .git etc. never hold runs, and checkpoints can be large trees.
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if RESULTS_FILE in filenames:
                found.setdefault(Path(folder).resolve(), Path(folder))

    if not found:
        searched = ", ".join(str(p) for p in paths)
        raise PosexpError(
            f"no runs found in {searched} (searched all sub-folders). A run folder contains {RESULTS_FILE}, "
            "which is written when training and evaluation finish; did the run stop early, or is this the wrong folder?"
        )
    return sorted(found.values(), key=_natural_key)


def load_run(path: str | os.PathLike) -> Run:
    """Read one run folder's ``results.json``.

    Args:
        path: the run folder (or its ``results.json``).

    Returns:
        The parsed :class:`Run`.

    Raises:
        PosexpError: the file is missing, unreadable, not JSON, or not shaped like results.
    """
    path = Path(path)
    file = path if path.name == RESULTS_FILE and path.is_file() else path / RESULTS_FILE
    folder = file.parent
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PosexpError(f"{file}: not found; a run folder must contain {RESULTS_FILE}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PosexpError(f"{file}: cannot be read ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PosexpError(
            f"{file}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); the run may have been "
            "interrupted while writing it. Re-run it, or leave its folder out of the report."
        ) from None

    def bad(what: str) -> PosexpError:
        return PosexpError(f"{file}: {what}; expected an object with \"run\" (an object) and \"rows\" (a list)")

    if not isinstance(data, dict):
        raise bad(f"top level is a {type(data).__name__}")
    info, rows = data.get("run"), data.get("rows")
    if not isinstance(info, dict):
        raise bad('"run" is missing or not an object')
    if not isinstance(rows, list):
        raise bad('"rows" is missing or not a list')
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("length"), (int, float)):
            raise bad(f'row {i} has no numeric "length"')
    return Run(path=folder, info=info, rows=rows, overrides=_read_overrides(folder, info))


def _read_overrides(folder: Path, info: dict) -> Optional[list[str]]:
    """Overrides from results.json, else from Hydra's own record of the launch."""
    overrides = info.get("overrides")
    if isinstance(overrides, list):
        return [str(o) for o in overrides]
    hydra_file = folder / ".hydra" / "overrides.yaml"
    if hydra_file.is_file():
        import yaml  # only needed for results written without overrides

        try:
            loaded = yaml.safe_load(hydra_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None  # the label falls back to run.label; not worth failing the report over
        if isinstance(loaded, list):
            return [str(o) for o in loaded]
        if loaded is None:
            return []
    return None


# ---------------------------------------------------------------------------
# Building the report


@dataclass
class Cell:
    """One table cell. ``applicable`` is None when the run has no row for this length."""

    applicable: Optional[bool] = None
    ppl: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None

    def text(self) -> str:
        if self.applicable is None:
            return MISSING
        if not self.applicable or self.ppl is None:
            return NOT_APPLICABLE
        return _fmt_ppl(self.ppl)


@dataclass
class ReportRow:
    """One run's line in the table."""

    label: str
    run: Run
    cells: dict[int, Cell]
    ratio: Optional[float]
    flags: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything the writers need; built by :func:`build_report`.

    Attributes:
        rows: one per run, in run order.
        lengths: every evaluated length in the table, ascending.
        protocol: evaluation protocol shown in the table.
        scaling: context-extension scaling shown in the table (None = none).
        train_len: the (majority) training length.
        ratio_length: the length used for ``ratio``, or None when no ratio can be computed.
        shared_overrides: overrides common to every run, left out of the labels.
        corpus: (majority) corpus name and fingerprint.
        eval_settings: (majority) evaluation settings.
        warnings: human-readable problems, repeated in every output.
        other_views: (protocol, scaling) pairs present in the results but not in the table.
    """

    rows: list[ReportRow]
    lengths: list[int]
    protocol: Optional[str]
    scaling: Any
    train_len: Optional[int]
    ratio_length: Optional[int]
    shared_overrides: list[str]
    corpus: tuple[Optional[str], Optional[str]]
    eval_settings: Any
    warnings: list[str]
    other_views: list[tuple[Any, Any]]

    @property
    def encoders(self) -> list[str]:
        return list(dict.fromkeys(str(r.run.info.get("encoder") or "?") for r in self.rows))


def build_report(run_dirs: Iterable[str | os.PathLike]) -> Report:
    """Load runs and line them up: one row per run, one column per evaluated length.

    Args:
        run_dirs: run folders, e.g. from :func:`find_runs`; their order is kept.

    Returns:
        The :class:`Report`.

    Raises:
        PosexpError: no run folders, or one of them cannot be loaded.
    """
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise PosexpError(f"no runs to report; pass folders containing {RESULTS_FILE}")
    warnings: list[str] = []

    protocol, scaling, other_views = _pick_view(runs)
    if protocol is not None and protocol != MAIN_PROTOCOL:
        warnings.append(f'no "{MAIN_PROTOCOL}" results in these runs; the table shows protocol "{protocol}" instead')

    labels, shared = _labels(runs)
    rows = [ReportRow(label, run, _cells(run, protocol, scaling), None) for label, run in zip(labels, runs)]
    lengths = sorted({n for row in rows for n in row.cells})

    train_len, corpus, eval_settings = _flag_outliers(rows, warnings)
    for row in rows:
        if row.run.status != "completed":
            row.flags.append(f"status: {row.run.status}")
            error = row.run.info.get("error")
            reason = f": {error['message']}" if isinstance(error, dict) and error.get("message") else ""
            warnings.append(f"{row.label}: status is \"{row.run.status}\", not completed; its numbers may be partial or missing{reason}")
        if not row.cells and protocol is not None:
            row.flags.append(f"no {protocol} results")

    ratio_length = _ratio_length(rows, lengths, train_len)
    if ratio_length is not None:
        for row in rows:
            row.ratio = _ratio(row, ratio_length)

    return Report(
        rows=rows, lengths=lengths, protocol=protocol, scaling=scaling, train_len=train_len,
        ratio_length=ratio_length, shared_overrides=shared, corpus=corpus, eval_settings=eval_settings,
        warnings=warnings, other_views=other_views,
    )


def _pick_view(runs: list[Run]) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """Choose the (protocol, scaling) the table shows: nonoverlap without scaling if any run has it."""
    views: list[tuple[Any, Any]] = []
    for run in runs:
        for row in run.rows:
            view = (row.get("protocol"), row.get("scaling"))
            if view not in views:
                views.append(view)
    if not views:
        return None, None, []
    chosen = next(
        (v for v in views if v == (MAIN_PROTOCOL, None)),
        next((v for v in views if v[1] is None), views[0]),  # otherwise the first protocol found, unscaled if possible
    )
    return chosen[0], chosen[1], [v for v in views if v != chosen]


def _labels(runs: list[Run]) -> tuple[list[str], list[str]]:
    """Label each run by the overrides that set it apart; make duplicates unique by folder.

    Overrides shared by every run (``train.steps=50`` given to a whole sweep) say
    nothing about the difference between rows, so they move to the header.
    """
    known = [r.overrides for r in runs if r.overrides is not None]
    shared: list[str] = []
    if len(runs) > 1 and len(known) == len(runs):
        shared = [o for o in known[0] if all(o in other for other in known[1:])]
    labels = []
    for run in runs:
        if run.overrides is None:
            labels.append(str(run.info.get("label") or run.path.name))
        else:
            labels.append(" ".join(o for o in run.overrides if o not in shared) or "default")

    counts = Counter(labels)
    if max(counts.values()) > 1:
        root = Path(os.path.commonpath([str(r.path.resolve()) for r in runs]))
        for i, run in enumerate(runs):
            if counts[labels[i]] > 1:
                where = run.path.resolve().relative_to(root).as_posix() if run.path.resolve() != root else run.path.name
                labels[i] = f"{labels[i]} [{where or run.path.name}]"
        # Still clashing (same folder names in different places): a counter is the last resort.
        seen: Counter = Counter()
        for i, label in enumerate(labels):
            seen[label] += 1
            if seen[label] > 1:
                labels[i] = f"{label} #{seen[label]}"
    return labels, shared


def _cells(run: Run, protocol: Any, scaling: Any) -> dict[int, Cell]:
    cells: dict[int, Cell] = {}
    for row in run.rows:
        if row.get("protocol") != protocol or row.get("scaling") != scaling:
            continue
        length = int(row["length"])
        if length in cells:
            continue  # duplicate rows: the trainer's first one wins
        ppl = _num(row.get("ppl"))
        applicable = bool(row.get("applicable", ppl is not None)) and ppl is not None
        cells[length] = Cell(applicable, ppl if applicable else None, _num(row.get("ppl_low")), _num(row.get("ppl_high")))
    return cells


def _flag_outliers(rows: list[ReportRow], warnings: list[str]) -> tuple[Optional[int], tuple, Any]:
    """Flag runs whose corpus, eval settings or training length differ from the majority.

    Returns:
        The majority training length, (corpus, fingerprint) and eval settings.
    """

    def majority(values: list[Any]) -> Any:
        # Compare through canonical JSON so dicts (eval settings) can be counted;
        # ties go to the value seen first, i.e. the first run.
        keys = [json.dumps(v, sort_keys=True, default=str) for v in values]
        top = Counter(keys).most_common(1)[0][0]
        return values[keys.index(top)], keys

    infos = [row.run.info for row in rows]
    corpus_fp, fp_keys = majority([i.get("corpus_fingerprint") for i in infos])
    corpus_name = next((i.get("corpus") for i in infos if i.get("corpus_fingerprint") == corpus_fp), None)
    eval_settings, eval_keys = majority([i.get("eval_settings") for i in infos])
    train_len, len_keys = majority([row.run.train_len for row in rows])

    checks = [
        (fp_keys, "different corpus", lambda i: f"corpus {i.get('corpus')} ({_short(i.get('corpus_fingerprint'))}) "
                                                f"vs {corpus_name} ({_short(corpus_fp)}) for the others"),
        (eval_keys, "different eval settings", lambda i: f"eval settings {_fmt_settings(i.get('eval_settings'))} "
                                                         f"vs {_fmt_settings(eval_settings)} for the others"),
        (len_keys, "different train length", lambda i: f"trained at {i.get('train_len')} tokens vs {train_len} for the others"),
    ]
    for keys, flag, detail in checks:
        top = Counter(keys).most_common(1)[0][0]
        for row, key in zip(rows, keys):
            if key != top:
                row.flags.append(flag)
                warnings.append(f"{row.label}: {flag}, {detail(row.run.info)}; not comparable with the other runs")
    return train_len, (corpus_name, corpus_fp), eval_settings


def _ratio_length(rows: list[ReportRow], lengths: list[int], train_len: Optional[int]) -> Optional[int]:
    """The longest length beyond training where every run that extrapolates at all has a perplexity.

    Using one common length keeps the ratio comparable across runs: a run that
    cannot go past 512 tokens would otherwise be compared at 512 against others at 8k.
    A run with no perplexity past the training length (learned positions at their
    table size) has no ratio, and does not take the others' away.
    """
    if train_len is None:
        return None
    usable = [row for row in rows if any(c.applicable for n, c in row.cells.items() if n > train_len)]
    for length in reversed(lengths):
        if length <= train_len:
            return None
        if usable and all(row.cells.get(length, Cell()).applicable for row in usable):
            return length
    return None


def _ratio(row: ReportRow, length: int) -> Optional[float]:
    at_len = row.cells.get(length, Cell())
    at_train = row.cells.get(row.run.train_len, Cell()) if row.run.train_len is not None else Cell()
    if not (at_len.applicable and at_train.applicable) or not at_train.ppl:
        return None
    return at_len.ppl / at_train.ppl


# ---------------------------------------------------------------------------
# Writers


def write_summary(report: Report, out_dir: str | os.PathLike) -> Path:
    """Write ``summary.md``, ``summary.csv`` and the ``ppl_vs_length.png`` overlay to ``out_dir``.

    Args:
        report: from :func:`build_report`.
        out_dir: destination folder; created if missing.

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    out_dir = Path(out_dir)
    from posexp.plots import plot_ppl_vs_length  # pulls in matplotlib; only now that we draw

    try:
        if out_dir.exists() and not out_dir.is_dir():
            raise PosexpError(f"{out_dir}: is a file; the summary needs a folder to write into")
        out_dir.mkdir(parents=True, exist_ok=True)
        plot_ppl_vs_length(
            _plot_series(report), out_dir / PLOT_FILE, train_len=report.train_len,
            title=f"protocol: {_fmt_view(report.protocol, report.scaling)}", ylabel=PPL_LABEL,
        )
        atomic_write_text(out_dir / SUMMARY_CSV, render_csv(report, out_dir))
        return atomic_write_text(out_dir / SUMMARY_MD, render_markdown(report, out_dir))
    except OSError as e:
        raise PosexpError(f"cannot write the summary into {out_dir}: {e.strerror or e}") from None


def _plot_series(report: Report) -> list[tuple]:
    # A run with nothing applicable would only add an empty legend entry; the table explains it.
    rows = [row for row in report.rows if any(c.applicable for c in row.cells.values())]
    bands = len(rows) <= MAX_BANDS
    series = []
    for row in rows:
        # Only lengths the run was evaluated at: a None in the series means "not applicable",
        # which would be wrong for a length the run simply never tried.
        lengths = [n for n in report.lengths if n in row.cells]
        cells = [row.cells[n] for n in lengths]
        label = row.label + (" (!)" if row.flags else "")  # the flags themselves are in summary.md
        series.append((
            label,
            lengths,
            [c.ppl for c in cells],
            [c.low for c in cells] if bands else None,
            [c.high for c in cells] if bands else None,
        ))
    return series


def render_markdown(report: Report, out_dir: str | os.PathLike | None = None) -> str:
    """The text of ``summary.md``; folders are shown relative to ``out_dir`` when inside it."""
    lines = ["# Perplexity vs context length", ""]
    lines.append(
        f"Compared {len(report.rows)} run{'s' if len(report.rows) != 1 else ''} "
        f"({_plural('encoder', report.encoders)}: {', '.join(report.encoders)})."
    )
    if report.shared_overrides:
        lines.append(f"Overrides shared by all runs: {', '.join(f'`{o}`' for o in report.shared_overrides)}.")
    lines += ["", *(f"- {item}" for item in _settings(report)), ""]
    for warning in report.warnings:
        lines.append(f"> **Warning:** {_md(warning)}")
        lines.append(">")
    if report.warnings:
        lines[-1] = ""

    header = ["run", *(_length_header(report, n) for n in report.lengths), "ratio", "flags"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join([" --- "] + [" ---: "] * (len(report.lengths) + 1) + [" --- "]) + "|")
    for row in report.rows:
        cells = [_md(row.label), *(row.cells.get(n, Cell()).text() for n in report.lengths),
                 _fmt_ratio(row.ratio), _md("; ".join(row.flags))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Values are {PPL_LABEL} on held-out text, lower is better; "
                  f'"{NOT_APPLICABLE}" = the encoding cannot run at that length, "{MISSING}" = not evaluated. '
                  + _ratio_note(report)]
    if report.other_views:
        views = "; ".join(_fmt_view(p, s) for p, s in report.other_views)
        lines += ["", f"Also in the results but not in this table (see {SUMMARY_CSV}): {views}."]
    lines += ["", f"![perplexity vs context length]({PLOT_FILE})", "", "## Runs", ""]

    lines.append("| run | folder | encoder | base | train len | seed | params | steps | final loss | status |")
    lines.append("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in report.rows:
        info, train = row.run.info, row.run.info.get("train") or {}
        cells = [
            _md(row.label), f"`{_display_path(row.run.path, out_dir)}`", _md(str(info.get("encoder", ""))),
            _fmt_num(info.get("base")), _fmt_num(info.get("train_len")), _fmt_num(info.get("seed")),
            _fmt_int(info.get("params")), _fmt_int(train.get("steps")), _fmt_num(train.get("final_loss"), ".3f"),
            _md(row.run.status),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_csv(report: Report, out_dir: str | os.PathLike | None = None) -> str:
    """The text of ``summary.csv``: one line per run and evaluated row, every protocol included."""
    buf = StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.rows:
        info, flags = row.run.info, "; ".join(row.flags)
        for r in sorted(row.run.rows, key=lambda r: (float(r["length"]), str(r.get("protocol")), str(r.get("scaling")))):
            writer.writerow([
                row.label, _display_path(row.run.path, out_dir), _csv(info.get("encoder")), _csv(info.get("base")),
                int(r["length"]), _csv(r.get("multiple")), _csv(r.get("protocol")), _csv(r.get("scaling")),
                _csv(r.get("ppl")), _csv(r.get("ppl_low")), _csv(r.get("ppl_high")), _csv(r.get("loss")),
                _csv(bool(r.get("applicable", r.get("ppl") is not None))), flags,
            ])
    return buf.getvalue()


def print_report(report: Report, console: Console | None = None) -> None:
    """Print the comparison as a Rich table, followed by the ratio note and any warnings."""
    console = console or Console()
    table = Table(title=_title(report), title_style="bold", header_style="bold")
    table.add_column("run", overflow="fold")
    for n in report.lengths:
        table.add_column(_length_header(report, n), justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("flags", style="yellow", overflow="fold")
    for row in report.rows:
        cells = [row.cells.get(n, Cell()) for n in report.lengths]
        # Text(), not str: labels like "model=[a,b]" would otherwise be parsed as Rich markup.
        table.add_row(
            Text(row.label),
            *(Text(c.text(), style="" if c.applicable else "dim") for c in cells),
            Text(_fmt_ratio(row.ratio), style="" if row.ratio is not None else "dim"),
            Text("; ".join(row.flags)),
            style="yellow" if row.flags else None,
        )
    console.print(table)
    console.print(Text(_ratio_note(report), style="dim"))
    for warning in report.warnings:
        console.print(Text.assemble(("warning: ", "bold yellow"), warning))


def report_main(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    out: str | os.PathLike | None = None,
    console: Console | None = None,
) -> Path:
    """``posexp report DIR...``: find runs, print the table, write the summary files.

    Args:
        paths: run folders, sweep folders, or folders above them.
        out: where to write the summary. Default: the folder given, when exactly one
            was given (for a sweep that is the sweep root), else the current folder.
        console: Rich console to print to; a new one by default.

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: bad paths, no runs, an unreadable run, or an unwritable output folder.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    report = build_report(find_runs(paths))
    report.warnings += _unfinished_sweep_jobs(paths)
    console = console or Console()
    print_report(report, console)
    if out is not None:
        out_dir = Path(out)
    elif len(paths) == 1:
        given = Path(paths[0])
        out_dir = given.parent if given.is_file() else given
    else:
        out_dir = Path.cwd()
    summary = write_summary(report, out_dir)
    console.print(Text(f"wrote {summary}, {SUMMARY_CSV} and {PLOT_FILE}"))
    return summary


def _unfinished_sweep_jobs(paths: Sequence[str | os.PathLike]) -> list[str]:
    """Warn about sweep jobs without results, which would otherwise just be absent from the table."""
    warnings = []
    for raw in paths:
        root = Path(raw)
        if not (root / "multirun.yaml").is_file():
            continue
        jobs = sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))
        missing = [d.name for d in jobs if not (d / RESULTS_FILE).is_file()]
        if missing:
            warnings.append(
                f"{root}: sweep job{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"{'have' if len(missing) > 1 else 'has'} no {RESULTS_FILE} (failed or still running) and "
                f"{'are' if len(missing) > 1 else 'is'} not in the table"
            )
    return warnings


class SweepSummaryCallback(Callback):
    """Hydra callback: write the sweep summary into the sweep folder when a multirun ends.

    Enable it in the primary config::

        hydra:
          callbacks:
            sweep_summary:
              _target_: posexp.report.SweepSummaryCallback
    """

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """Summarise ``config.hydra.sweep.dir``; never raises, since the runs themselves are already safe."""
        sweep_dir = "<unknown sweep dir>"
        try:
            sweep_dir = str(config.hydra.sweep.dir)
            report_main([sweep_dir])
        except PosexpError as e:
            log.warning("sweep summary not written: %s", e)
        except Exception:  # a bug here must not turn a finished sweep into a failed one
            log.warning("sweep summary not written; the runs are intact, retry with `posexp report %s`",
                        sweep_dir, exc_info=True)


# ---------------------------------------------------------------------------
# Formatting helpers


def _title(report: Report) -> str:
    parts = [f"protocol {_fmt_view(report.protocol, report.scaling)}"]
    if report.train_len is not None:
        parts.append(f"train length {report.train_len}")
    return "Perplexity vs context length (" + ", ".join(parts) + ")"


def _settings(report: Report) -> list[str]:
    name, fingerprint = report.corpus
    return [
        f"Corpus: {_md(name or 'unknown')} (fingerprint `{_short(fingerprint)}`)",
        f"Protocol: {_md(_fmt_view(report.protocol, report.scaling))}",
        f"Eval settings: {_md(_fmt_settings(report.eval_settings))}",
        f"Training length: {report.train_len if report.train_len is not None else 'unknown'} tokens",
    ]


def _ratio_note(report: Report) -> str:
    if report.ratio_length is None:
        return ("ratio = ppl at the longest length / ppl at the training length; n/a here because no length beyond "
                "the training length has a perplexity for every run.")
    return (f"ratio = ppl at {report.ratio_length} / ppl at the training length ({report.train_len}); "
            f"{report.ratio_length} is the longest length every run that goes past its training length reaches.")


def _length_header(report: Report, length: int) -> str:
    return f"{length} (train)" if length == report.train_len else str(length)


def _fmt_view(protocol: Any, scaling: Any) -> str:
    return f"{protocol}" + (f" with scaling {scaling}" if scaling is not None else "")


def _fmt_settings(settings: Any) -> str:
    if isinstance(settings, dict):
        return ", ".join(f"{k}={v}" for k, v in settings.items()) or "none"
    return "unknown" if settings is None else str(settings)


def _fmt_ppl(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else str(value)


def _fmt_ratio(value: Optional[float]) -> str:
    return NOT_APPLICABLE if value is None else f"{value:.2f}"


def _fmt_num(value: Any, spec: str = "g") -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def _fmt_int(value: Any) -> str:
    return f"{int(value):,}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _csv(value: Any) -> str:
    """None as an empty cell, booleans lowercase like JSON, dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _short(fingerprint: Any) -> str:
    return "none" if fingerprint is None else str(fingerprint)[:12]


def _plural(word: str, items: list) -> str:
    return word if len(items) == 1 else word + "s"


def _md(text: str) -> str:
    """Escape what would break a markdown table cell or turn into emphasis."""
    text = str(text).replace("\n", " ")
    return re.sub(r"([\\|*_`\[\]<>])", r"\\\1", text)


def _display_path(path: Path, out_dir: str | os.PathLike | None) -> str:
    """Relative to the summary when the run lives under it, so a sweep folder can be moved."""
    if out_dir is not None:
        try:
            rel = path.resolve().relative_to(Path(out_dir).resolve())
            return rel.as_posix() or "."
        except ValueError:
            pass
    return path.as_posix()
