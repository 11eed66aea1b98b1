"""Compare finished runs: a perplexity-per-length table, summary metrics, report.md with figures.

``posexp report DIR...`` and the end-of-sweep Hydra callback both end up in
:func:`report_main`. Each run folder holds a ``results.json`` written by the
trainer (plus ``loss_by_position.csv`` and ``metrics.csv`` for the figures);
this module only reads those files, so a report can be rebuilt at any time
without touching a model, and without importing torch.

``--by`` groups runs by config keys and averages the runs of a group (seeds)
with a Student-t interval; ``--metric`` adds one-number summaries of each
curve (ratio at k× the training length, the longest length within a tolerance,
the area under log perplexity over log length); ``--where``/``--sort`` choose
and order; ``--format`` prints the table as rich, markdown, csv, json or latex.

Runs are only comparable when they were trained on the same corpus, with the
same training length, and evaluated the same way. Rather than refuse to report
(a sweep may legitimately contain a stray run), runs that differ from the
majority are flagged in every output, and grouping never averages them with
the others: they form groups of their own, flagged "kept apart".
"""

from __future__ import annotations

import csv
import functools
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
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posexp.errors import ConfigError, PosexpError
from posexp.io import atomic_write_text

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.report")

RESULTS_FILE = "results.json"
SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"
PLOT_FILE = "ppl_vs_length.png"
REPORT_MD = "report.md"
REPORT_PLOT_FILE = "report_ppl_vs_length.png"
# Not "loss_by_position.png": a report written into a run folder must not replace the run's own figure.
POSITION_PLOT_FILE = "report_loss_by_position.png"
TRAINING_PLOT_FILE = "report_training_curves.png"
LOSS_BY_POSITION_CSV = "loss_by_position.csv"  # written by posexp.run (not imported: it pulls in torch)
METRICS_CSV = "metrics.csv"
MAIN_PROTOCOL = "nonoverlap"
PPL_LABEL = "perplexity per token"
MISSING = "—"  # the run was not evaluated at this length
NOT_APPLICABLE = "n/a"  # the encoding cannot run at this length (e.g. learned positions)
# Interval bands for more lines than this turn the overlay into a smear.
MAX_BANDS = 6

DEFAULT_TOLERANCE = 0.1
DEFAULT_METRICS = ("ratio", "maxlen", "auc")
FORMATS = ("rich", "markdown", "csv", "json", "latex")
# Settings that change how a run was executed or logged, not what it learned; runs that
# differ only in these (and the seed) are replicates of one configuration.
EXECUTION_KEYS = frozenset({
    "seed", "train.threads", "train.progress", "train.device", "train.log_every", "train.checkpoint_every",
    "train.checkpoint_minutes", "data.cache_dir", "data.description",
})
# Top-level keys of results.json's "run" that a user can group or filter by directly;
# "encoder" and "base" are the effective ones (a per-layer mix's label, null when unused).
RUN_KEYS = ("encoder", "base", "train_len", "seed", "corpus", "corpus_fingerprint", "tokenizer", "status",
            "params", "config_hash", "git_commit")
_ABSENT = object()  # the key is not in this run's config at all (e.g. encoder.rotary_fraction for alibi)
_METRIC_HELP = ("ratio, ratio@Kx (e.g. ratio@8x), ratio@N (N tokens), ppl@Kx, ppl@N, maxlen, maxlen@P% "
                "(e.g. maxlen@10%), auc, auc@Kx")


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
    _config: Optional[dict] = field(default=None, repr=False)

    @property
    def config(self) -> dict:
        """The resolved config: from results.json, else the run's ``.hydra/config.yaml``; {} when neither."""
        if self._config is None:
            self._config = _run_config(self)
        return self._config

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
        by: the ``--by`` keys (empty: one group per run).
        metrics: the summary metrics shown after the lengths.
        groups: the table's lines, in display order.
        filters: the ``--where`` filters applied.
        auc_multiple: the span of plain ``auc`` (multiple of the training length), None when no run has one.
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
    by: list[str] = field(default_factory=list)
    metrics: list["Metric"] = field(default_factory=list)
    groups: list["Group"] = field(default_factory=list)
    filters: list["Filter"] = field(default_factory=list)
    auc_multiple: Optional[float] = None

    @property
    def encoders(self) -> list[str]:
        return list(dict.fromkeys(str(r.run.info.get("encoder") or "?") for r in self.rows))


def build_report(
    run_dirs: Iterable[str | os.PathLike],
    by: Sequence[str] | str | None = None,
    metrics: Sequence[str] | str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    where: Sequence[str] | str | None = None,
    sort: Optional[str] = None,
) -> Report:
    """Load runs and line them up: one column per evaluated length, one line per run or group.

    Args:
        run_dirs: run folders, e.g. from :func:`find_runs`; their order is kept.
        by: dotted config keys to group by (``encoder``, ``base``, ``model.n_layers``); runs with the
            same values are averaged with a 95% t-interval. None: one line per run.
        metrics: summary metrics after the lengths (see :func:`parse_metric`); None: ratio, maxlen, auc.
        tolerance: the tolerance of a plain ``maxlen`` (0.1 = ppl within +10%).
        where: ``KEY=VALUE`` / ``KEY!=VALUE`` filters on config keys, all of which must hold.
        sort: a metric, ``--by`` key or ``n`` to sort the lines by; a leading ``-`` sorts descending.

    Returns:
        The :class:`Report`.

    Raises:
        PosexpError: no run folders, one of them cannot be loaded, or no run passes the filters.
        ConfigError: an unknown ``--by``/``--where`` key, metric or sort column.
    """
    by_keys = parse_by(by)
    chosen = parse_metrics(metrics, tolerance)
    filters = parse_where(where)
    sort_key = parse_sort(sort, chosen, by_keys, tolerance)
    if sort_key is not None and sort_key.metric is not None and sort_key.metric.name not in {m.name for m in chosen}:
        chosen.append(sort_key.metric)
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise PosexpError(f"no runs to report; pass folders containing {RESULTS_FILE}")
    for option, keys in (("--by", by_keys), ("--where", [f.key for f in filters])):
        for key in keys:
            if all(config_value(run, key) is _ABSENT for run in runs):
                raise _unknown_key_error(option, key, runs)
    if filters:
        kept = [run for run in runs if all(f.matches(run) for f in filters)]
        if not kept:
            raise PosexpError(f"no run matches {' and '.join(str(f) for f in filters)} (of {len(runs)} runs); "
                              "values are compared as in results.json, e.g. --where encoder=rope --where base=10000")
        runs = kept
    warnings: list[str] = []

    protocol, scaling, other_views = _pick_view(runs)
    if protocol is not None and protocol != MAIN_PROTOCOL:
        warnings.append(f'no "{MAIN_PROTOCOL}" results in these runs; the table shows protocol "{protocol}" instead')

    labels, shared = _labels(runs)
    rows = [ReportRow(label, run, _cells(run, protocol, scaling), None) for label, run in zip(labels, runs)]
    lengths = sorted({n for row in rows for n in row.cells})

    # Grouping by train_len compares training lengths on purpose: not a stray run to flag.
    train_len, corpus, eval_settings = _flag_outliers(rows, warnings, train_len_varies="train_len" in by_keys)
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

    report = Report(
        rows=rows, lengths=lengths, protocol=protocol, scaling=scaling, train_len=train_len,
        ratio_length=ratio_length, shared_overrides=shared, corpus=corpus, eval_settings=eval_settings,
        warnings=warnings, other_views=other_views, by=by_keys, metrics=chosen, filters=filters,
        auc_multiple=_auc_multiple(rows),
    )
    groups = _group_rows(rows, by_keys, warnings)
    for group in groups:
        _aggregate(group, report)
    report.groups = _sort_groups(groups, sort_key)
    return report


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


def _flag_outliers(rows: list[ReportRow], warnings: list[str],
                   train_len_varies: bool = False) -> tuple[Optional[int], tuple, Any]:
    """Flag runs whose corpus, eval settings or training length differ from the majority.

    Args:
        rows: the report's rows; flags are appended to them.
        warnings: the report's warnings; one is appended per flagged run.
        train_len_varies: the training length is a compared variable (``--by train_len``): do not flag it.

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
    # A run that stopped before it read its data or evaluated has no fingerprint or eval settings:
    # unknown is not different (its status is flagged already), so it neither votes nor is flagged.
    unknown = [row.run.status != "completed" for row in rows]

    def majority_known(key: str) -> tuple[Any, list[str]]:
        values = [i.get(key) for i in infos]
        known = [v for v, u in zip(values, unknown) if not (u and v is None)] or values
        value, _ = majority(known)
        top = json.dumps(value, sort_keys=True, default=str)
        keys = [top if u and v is None else json.dumps(v, sort_keys=True, default=str)
                for v, u in zip(values, unknown)]
        return value, keys

    corpus_fp, fp_keys = majority_known("corpus_fingerprint")
    corpus_name = next((i.get("corpus") for i in infos if i.get("corpus_fingerprint") == corpus_fp), None)
    eval_settings, eval_keys = majority_known("eval_settings")
    train_len, len_keys = majority([row.run.train_len for row in rows])

    checks = [
        (fp_keys, "different corpus", lambda i: f"corpus {i.get('corpus')} ({_short(i.get('corpus_fingerprint'))}) "
                                                f"vs {corpus_name} ({_short(corpus_fp)}) for the others"),
        (eval_keys, "different eval settings", lambda i: f"eval settings {_fmt_settings(i.get('eval_settings'))} "
                                                         f"vs {_fmt_settings(eval_settings)} for the others"),
        (len_keys, "different train length", lambda i: f"trained at {i.get('train_len')} tokens vs {train_len} for the others"),
    ][:2 if train_len_varies else 3]
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
# Choosing runs, grouping them, summary metrics


def config_value(run: Run, key: str) -> Any:
    """A run's value for a dotted config key, as ``--by``/``--where`` see it.

    Top-level keys of results.json's ``run`` object come first (``encoder``, ``base``,
    ``train_len``, ``seed``, ``corpus``, ``status``...), then the resolved config stored
    with the results, then the run's ``.hydra/config.yaml`` (for runs that failed before
    their config was recorded).

    Args:
        run: the loaded run.
        key: e.g. ``encoder``, ``model.n_layers``, ``encoder.rotary_fraction``.

    Returns:
        The value, or a sentinel (never None) when the run's config has no such key.
    """
    if "." not in key and key in run.info and not isinstance(run.info[key], (dict, list)):
        return run.info[key]
    if key in ("encoder", "base"):
        return run.info.get(key)
    node: Any = run.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _run_config(run: Run) -> dict:
    config = run.info.get("config")
    if isinstance(config, dict):
        return config
    hydra_file = run.path / ".hydra" / "config.yaml"
    if hydra_file.is_file():
        import yaml

        try:
            loaded = yaml.safe_load(hydra_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}


def _flatten(node: dict, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"n_layers": 2}}`` -> ``{"model.n_layers": 2}``."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _known_keys(runs: list[Run]) -> list[str]:
    keys = dict.fromkeys(k for k in RUN_KEYS if any(k in r.info for r in runs))
    for run in runs[:20]:  # enough to name the keys; every run's config has the same shape
        keys.update(dict.fromkeys(_flatten(run.config)))
    return list(keys)


def _unknown_key_error(option: str, key: str, runs: list[Run]) -> ConfigError:
    import difflib

    known = _known_keys(runs)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(option, f"unknown config key {key!r}: no run has it{hint}. Known keys: {', '.join(known)}")


def _canon(value: Any) -> str:
    """A hashable, type-stable spelling of a config value: 10000 and 10000.0 are one group."""
    if value is _ABSENT:
        return "<absent>"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, default=str)


def _show(value: Any) -> str:
    """A config value as a person reads it in a table or label."""
    if value is _ABSENT or value is None:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def parse_by(by: Sequence[str] | str | None) -> list[str]:
    """``--by encoder,base`` (repeatable) -> ``["encoder", "base"]``."""
    if by is None:
        return []
    if isinstance(by, str):
        by = [by]
    keys = [k.strip() for item in by for k in str(item).split(",")]
    if any(not k for k in keys):
        raise ConfigError("--by", "empty key; give dotted config keys separated by commas, e.g. --by encoder,base")
    return list(dict.fromkeys(keys))


@dataclass(frozen=True)
class Filter:
    """One ``--where KEY=VALUE`` (or ``KEY!=VALUE``); a comma in VALUE means any of them."""

    key: str
    values: tuple[str, ...]
    negate: bool = False

    def matches(self, run: Run) -> bool:
        value = config_value(run, self.key)
        hit = any(_same_value(value, want) for want in self.values)
        return hit != self.negate

    def __str__(self) -> str:
        return f"{self.key}{'!=' if self.negate else '='}{','.join(self.values)}"


def _same_value(value: Any, text: str) -> bool:
    if value is _ABSENT:
        return False
    if text.lower() in ("null", "none", "~"):
        return value is None
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return _show(value) == text


def parse_where(where: Sequence[str] | str | None) -> list[Filter]:
    """``--where encoder=rope --where base!=100`` -> filters."""
    if where is None:
        return []
    if isinstance(where, str):
        where = [where]
    filters = []
    for item in where:
        match = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*(!?=)\s*(.*?)\s*", str(item))
        if not match or not match.group(3):
            raise ConfigError("--where", f"{item!r} is not KEY=VALUE; e.g. --where encoder=rope, --where base!=100, "
                                         "--where encoder=rope,alibi (any of)")
        filters.append(Filter(match.group(1), tuple(v.strip() for v in match.group(3).split(",")),
                              match.group(2) == "!="))
    return filters


@dataclass(frozen=True)
class Metric:
    """A one-number summary of a perplexity-vs-length curve, named as the user typed it.

    Attributes:
        name: e.g. ``ratio@8x``, ``maxlen@10%``, ``auc``.
        kind: ``ratio`` (at the common length of the table), ``ratio_at``, ``ppl_at``, ``maxlen`` or ``auc``.
        multiple: the length as a multiple of each run's own training length (``@8x``).
        length: the length in tokens (``@1024``).
        tolerance: for ``maxlen``: the allowed relative rise over the training-length perplexity.
    """

    name: str
    kind: str
    multiple: Optional[float] = None
    length: Optional[int] = None
    tolerance: Optional[float] = None

    def at(self, train_len: Optional[int]) -> Optional[int]:
        """The length this metric looks at for a run trained at ``train_len``."""
        if self.length is not None:
            return self.length
        if self.multiple is not None and train_len is not None:
            return int(round(self.multiple * train_len))
        return None

    @property
    def decimals(self) -> int:
        return 0 if self.kind == "maxlen" else 2

    def describe(self, report: "Report") -> str:
        """One sentence for the notes under the table."""
        if self.length is not None:
            where = f"{self.length} tokens"
        else:
            where = f"{self.multiple or 1:g}× the training length"
        if self.kind == "ratio":
            return _ratio_note(report)
        if self.kind == "ratio_at":
            return f"{self.name} = ppl at {where} / ppl at the training length (lower is better; 1 = no loss)."
        if self.kind == "ppl_at":
            return f"{self.name} = perplexity at {where}."
        if self.kind == "maxlen":
            return (f"{self.name} = the longest evaluated length (tokens) up to which every evaluated length keeps "
                    f"ppl within +{self.tolerance:.0%} of the training-length ppl (higher is better; capped at the "
                    "longest length evaluated).")
        upper = self.multiple if self.multiple is not None else report.auc_multiple
        span = f"1× to {upper:g}× the training length" if upper else "1× to the longest common multiple (none here)"
        return (f"{self.name} = area under ln(ppl) over log2(context length), trapezoid rule over the evaluated "
                f"lengths from {span} (nats × octaves; lower is better; n/a when a length in the span is n/a).")


def parse_metric(text: str, tolerance: float = DEFAULT_TOLERANCE) -> Metric:
    """Parse ``ratio``, ``ratio@8x``, ``ratio@1024``, ``ppl@8x``, ``maxlen``, ``maxlen@10%``, ``auc``, ``auc@16x``.

    Raises:
        ConfigError: for ``--metric`` (or ``--tolerance``), naming the allowed forms.
    """
    raw = str(text).strip()
    match = re.fullmatch(r"(ratio|ppl|maxlen|auc)(?:@(.+))?", raw)
    if not match:
        raise ConfigError("--metric", f"unknown metric {raw!r}; choose from {_METRIC_HELP}")
    kind, arg = match.group(1), match.group(2)

    def at_length() -> tuple[Optional[float], Optional[int]]:
        if arg is None:
            raise ConfigError("--metric", f"{kind} needs a length: {kind}@8x (8× the training length) or "
                                          f"{kind}@1024 (tokens)")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)x", arg)
        if m and float(m.group(1)) > 0:
            return float(m.group(1)), None
        if re.fullmatch(r"\d+", arg) and int(arg) > 0:
            return None, int(arg)
        raise ConfigError("--metric", f"{raw!r}: {arg!r} is not a length; use a multiple like 8x or tokens like "
                                      "1024")

    if kind == "ratio":
        if arg is None:
            return Metric("ratio", "ratio")
        multiple, length = at_length()
        return Metric(raw, "ratio_at", multiple, length)
    if kind == "ppl":
        multiple, length = at_length()
        return Metric(raw, "ppl_at", multiple, length)
    if kind == "maxlen":
        if arg is None:
            check_tolerance(tolerance)
            return Metric(f"maxlen@{tolerance * 100:g}%", "maxlen", tolerance=tolerance)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%", arg)
        if not m or float(m.group(1)) <= 0:
            raise ConfigError("--metric", f"{raw!r}: the tolerance is a percentage, e.g. maxlen@10% "
                                          "(ppl within +10% of the training-length value)")
        return Metric(raw, "maxlen", tolerance=float(m.group(1)) / 100)
    if arg is None:
        return Metric("auc", "auc")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)x", arg)
    if not m or float(m.group(1)) <= 1:
        raise ConfigError("--metric", f"{raw!r}: auc takes the upper end of its span as a multiple above 1, "
                                      "e.g. auc@16x")
    return Metric(raw, "auc", multiple=float(m.group(1)))


def check_tolerance(tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise ConfigError("--tolerance", f"must be a positive fraction, e.g. 0.1 for +10% (got {tolerance})")


def parse_metrics(metrics: Sequence[str] | str | None, tolerance: float = DEFAULT_TOLERANCE) -> list[Metric]:
    """``--metric ratio@8x,auc`` (repeatable); the defaults are ratio, maxlen at ``tolerance`` and auc."""
    check_tolerance(tolerance)
    if metrics is None or (not isinstance(metrics, str) and not list(metrics)):
        metrics = list(DEFAULT_METRICS)
    if isinstance(metrics, str):
        metrics = [metrics]
    names = [m.strip() for item in metrics for m in str(item).split(",") if m.strip()]
    parsed = [parse_metric(n, tolerance) for n in names]
    return list({m.name: m for m in parsed}.values())


@dataclass(frozen=True)
class SortKey:
    """``--sort METRIC`` (ascending) or ``--sort=-METRIC`` (descending); a metric, a ``--by`` key or ``n``."""

    name: str
    descending: bool
    metric: Optional[Metric] = None


def parse_sort(sort: Optional[str], metrics: list[Metric], by: list[str], tolerance: float) -> Optional[SortKey]:
    if sort is None or not str(sort).strip():
        return None
    text = str(sort).strip()
    descending = text.startswith("-")
    name = text.lstrip("-+")
    if name in by or name == "n":
        return SortKey(name, descending)
    shown = {m.name: m for m in metrics}
    if name in shown:
        return SortKey(name, descending, shown[name])
    try:
        metric = parse_metric(name, tolerance)
    except ConfigError:
        keys = ", ".join([*shown, *by, "n"])
        raise ConfigError("--sort", f"cannot sort by {name!r}; use a shown column ({keys}) or a metric "
                                    f"({_METRIC_HELP}); prefix - for descending, e.g. --sort=-maxlen") from None
    return SortKey(metric.name, descending, metric)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Student (1908), "The probable error of a mean", Biometrika 6(1): the density
    f(t) = Γ((ν+1)/2) / (√(νπ) Γ(ν/2)) · (1 + t²/ν)^(-(ν+1)/2). Substituting
    t = √ν·tan θ turns P(0 < T < t) into C·∫₀^θ cos^(ν-1)φ dφ with
    C = Γ((ν+1)/2) / (√π Γ(ν/2)), a smooth integrand on [0, π/2) that Simpson's
    rule integrates accurately; θ is then found by bisection. No scipy needed.

    Args:
        p: probability in (0.5, 1), e.g. 0.975 for a two-sided 95% interval.
        df: degrees of freedom, at least 1.

    Returns:
        t such that P(T ≤ t) = p.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (got p={p}, df={df})")
    return _t_quantile(float(p), int(df))


@functools.lru_cache(maxsize=256)
def _t_quantile(p: float, df: int) -> float:
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    target = p - 0.5
    steps = 256  # even, for Simpson's rule

    def mass(theta: float) -> float:
        h = theta / steps
        total = 1.0 + math.cos(theta) ** (df - 1)  # the ends; cos(0) = 1
        for i in range(1, steps):
            total += (4 if i % 2 else 2) * math.cos(i * h) ** (df - 1)
        return scale * total * h / 3

    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if mass(mid) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan((lo + hi) / 2)


@dataclass
class Stat:
    """A value over the runs of a group: their mean and 95% interval.

    With two or more runs the interval is mean ± t(0.975, n-1)·s/√n over the runs
    (seeds); for one run it is the run's own evaluation interval where there is one.

    Attributes:
        applicable: None when no run has this value (not evaluated), False when not applicable.
        mean, low, high: the value and its interval (None when unknown).
        n: how many runs the mean is over.
    """

    applicable: Optional[bool] = None
    mean: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    n: int = 0

    @property
    def spread(self) -> Optional[float]:
        """Half-width of the interval over runs (None for a single run)."""
        if self.n < 2 or self.low is None or self.high is None or self.mean is None:
            return None
        return (self.high - self.low) / 2

    def text(self, decimals: int = 2, plus_minus: str = " ± ", of: int = 0) -> str:
        """``3.10 ± 0.12``; ``of``: the group's size, to say when fewer of its runs have this value."""
        if self.applicable is None:
            return MISSING
        if not self.applicable or self.mean is None:
            return NOT_APPLICABLE
        out = _fmt_fixed(self.mean, decimals)
        if self.spread is not None:
            out += plus_minus + _fmt_fixed(self.spread, decimals)
        if 0 < self.n < of:
            out += f" (n={self.n})"
        return out

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n,
                "applicable": self.applicable}


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, Optional[float], Optional[float]]:
    """Mean and two-sided t-interval (Student 1908) of independent replicates such as seeds.

    Args:
        values: one value per run.
        confidence: interval coverage.

    Returns:
        ``(mean, low, high)``; low/high are None for a single value.
    """
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None, None
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def _stat(values: list[tuple[Optional[bool], Optional[float]]], single_interval: tuple = (None, None)) -> Stat:
    """Aggregate per-run (applicable, value) pairs; the n/a and missing ones are not averaged."""
    numbers = [v for ok, v in values if ok and v is not None and math.isfinite(v)]
    if not numbers:
        states = [ok for ok, _ in values]
        return Stat(applicable=False if any(s is not None for s in states) else None)
    mean, low, high = mean_interval(numbers)
    if len(numbers) == 1:
        low, high = single_interval
    return Stat(True, mean, low, high, len(numbers))


def metric_value(metric: Metric, row: ReportRow, report: "Report") -> tuple[Optional[bool], Optional[float]]:
    """One run's value of ``metric``: (True, value), (False, None) = n/a, (None, None) = not evaluated."""
    if metric.kind == "ratio":
        if report.ratio_length is None or row.ratio is None:
            return False, None
        return True, row.ratio
    cells, train_len = row.cells, row.run.train_len
    if train_len is None:
        return None, None
    at_train = cells.get(train_len)
    if metric.kind == "ppl_at":
        cell = cells.get(metric.at(train_len))
        return (None, None) if cell is None else (bool(cell.applicable), cell.ppl if cell.applicable else None)
    if at_train is None:
        return None, None
    if not at_train.applicable or not at_train.ppl:
        return False, None
    if metric.kind == "ratio_at":
        cell = cells.get(metric.at(train_len))
        if cell is None:
            return None, None
        return (True, cell.ppl / at_train.ppl) if cell.applicable else (False, None)
    if metric.kind == "maxlen":
        limit = (1 + metric.tolerance) * at_train.ppl
        best = train_len
        for length in sorted(n for n in cells if n > train_len):
            cell = cells[length]
            if not cell.applicable or cell.ppl is None or cell.ppl > limit:
                break
            best = length
        return True, float(best)
    # auc
    multiple = metric.multiple if metric.multiple is not None else report.auc_multiple
    if not multiple or multiple <= 1:
        return False, None
    upper = int(round(multiple * train_len))
    if upper not in cells:
        return None, None
    span = [n for n in sorted(cells) if train_len <= n <= upper]
    if any(not cells[n].applicable or not cells[n].ppl or cells[n].ppl <= 0 for n in span):
        return False, None
    xs = [math.log2(n) for n in span]
    ys = [math.log(cells[n].ppl) for n in span]
    return True, sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(span) - 1))


def _auc_multiple(rows: list[ReportRow]) -> Optional[float]:
    """The span of plain ``auc``: the largest multiple of its training length that every run was evaluated at."""
    reach = []
    for row in rows:
        train_len = row.run.train_len
        if train_len and row.cells:
            reach.append(max(row.cells) / train_len)
    return min(reach) if reach else None


@dataclass
class Group:
    """One line of the grouped table: runs with the same ``--by`` values (or one run, without ``--by``).

    Attributes:
        key: ``--by`` key -> value (empty without ``--by``).
        label: how the group is named in warnings, plots and without ``--by``.
        rows: its runs.
        cells: length -> perplexity over the runs.
        metrics: metric name -> value over the runs.
        flags: why its numbers need care (different corpus, pooled configs, failed...).
    """

    key: dict[str, Any]
    label: str
    rows: list[ReportRow]
    cells: dict[int, Stat] = field(default_factory=dict)
    metrics: dict[str, Stat] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def train_len(self) -> Optional[int]:
        return self.rows[0].run.train_len if self.rows else None


def _group_rows(rows: list[ReportRow], by: list[str], warnings: list[str]) -> list[Group]:
    """Split runs into groups by ``by``; never pool different corpora, eval settings, train lengths or failures."""
    if not by:
        return [Group({}, row.label, [row], flags=list(row.flags)) for row in rows]
    buckets: dict[tuple, Group] = {}
    for row in rows:
        info = row.run.info
        values = {k: config_value(row.run, k) for k in by}
        # Numbers measured on different text, or scored differently, are different quantities.
        guard = (
            _canon(info.get("corpus_fingerprint")),
            _canon(info.get("eval_settings")),
            "" if "train_len" in by else _canon(row.run.train_len),
            "" if row.run.status == "completed" else str(row.run.path),  # a failure stays visible on its own
        )
        bucket = (tuple(_canon(v) for v in values.values()), guard)
        if bucket not in buckets:
            label = " ".join(f"{k}={_show(v)}" for k, v in values.items())
            buckets[bucket] = Group(values, label, [])
        buckets[bucket].rows.append(row)
    groups = list(buckets.values())

    # Same --by values in several groups: name what separates them, in the label and the flags.
    by_values = Counter(_canon(list(g.key.values())) for g in groups)
    for group in groups:
        first = group.rows[0]
        group.flags = list(dict.fromkeys(f for row in group.rows for f in row.flags))
        if by_values[_canon(list(group.key.values()))] > 1:
            info = first.run.info
            parts = []
            if first.run.status != "completed":
                parts.append(first.label)
            if "different corpus" in group.flags:
                parts.append(f"corpus {info.get('corpus')} {_short(info.get('corpus_fingerprint'))}")
            if "different eval settings" in group.flags:
                parts.append(f"eval {_fmt_settings(info.get('eval_settings'))}")
            if "different train length" in group.flags:
                parts.append(f"train_len={first.run.train_len}")
            if parts:
                group.label += f" [{'; '.join(parts)}]"
            group.flags.append("kept apart: not comparable")
        pooled = _pooled_keys(group, by)
        if pooled:
            group.flags.append("averaged over " + ", ".join(pooled))
            warnings.append(f"{group.label}: averages runs that differ in {', '.join(pooled)}, not only in seed; "
                            f"add {', '.join(k for k, _ in zip(pooled, range(3)))} to --by to separate them")
    split = [g for g in groups if "kept apart: not comparable" in g.flags]
    if split:
        warnings.append(f"{len(split)} groups have the same --by values but a different corpus, eval settings, "
                        "train length or status; they are shown apart, never averaged together")
    return groups


def _pooled_keys(group: Group, by: list[str]) -> list[str]:
    """Config keys (other than seed and execution settings) on which a group's runs disagree."""
    if group.n < 2:
        return []
    flats = []
    for row in group.rows:
        flat = {k: v for k, v in _flatten(row.run.config).items() if not k.startswith("eval.")}
        for k in ("encoder", "base"):  # the effective values: base is null where an encoding ignores it
            flat[k] = row.run.info.get(k)
        flat.pop("encoder.name", None)
        flats.append(flat)
    keys = dict.fromkeys(k for flat in flats for k in flat)
    differ = [k for k in keys if k not in EXECUTION_KEYS and k not in by
              and len({_canon(flat.get(k, _ABSENT)) for flat in flats}) > 1]
    return differ


def _aggregate(group: Group, report: "Report") -> None:
    lengths = sorted({n for row in group.rows for n in row.cells})
    for n in lengths:
        pairs = [(c.applicable, c.ppl) for row in group.rows if (c := row.cells.get(n)) is not None]
        single = next(((c.low, c.high) for row in group.rows if (c := row.cells.get(n)) is not None
                       and c.applicable), (None, None))
        group.cells[n] = _stat(pairs, single)
    for metric in report.metrics:
        group.metrics[metric.name] = _stat([metric_value(metric, row, report) for row in group.rows])


def _sort_groups(groups: list[Group], sort: Optional[SortKey]) -> list[Group]:
    if sort is None:
        return groups

    def value(group: Group) -> Any:
        if sort.metric is not None:
            stat = group.metrics.get(sort.metric.name, Stat())
            return stat.mean if stat.applicable else None
        if sort.name == "n":
            return group.n
        return group.key.get(sort.name)

    present = [g for g in groups if value(g) not in (None, _ABSENT)]
    absent = [g for g in groups if value(g) in (None, _ABSENT)]  # n/a and missing stay last either way

    def order(group: Group) -> tuple:
        v = value(group)
        return (0, float(v), "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0.0, _show(v))

    return sorted(present, key=order, reverse=sort.descending) + absent


# ---------------------------------------------------------------------------
# Writers


def write_summary(report: Report, out_dir: str | os.PathLike, plot: bool = True) -> Path:
    """Write ``summary.md``, ``summary.csv`` and the ``ppl_vs_length.png`` overlay to ``out_dir``.

    The summary has one line per run whatever the grouping: it is the sweep's record.

    Args:
        report: from :func:`build_report`.
        out_dir: destination folder; created if missing.
        plot: draw ``ppl_vs_length.png`` (False when the caller has just drawn it).

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    out_dir = Path(out_dir)
    from posexp.reporting.plots import plot_ppl_vs_length  # pulls in matplotlib; only now that we draw

    try:
        _writable_folder(out_dir, "summary")
        if plot:
            plot_ppl_vs_length(
                _plot_series(report), out_dir / PLOT_FILE, train_len=report.train_len,
                title=f"protocol: {_fmt_view(report.protocol, report.scaling)}", ylabel=_ppl_label(report),
            )
        atomic_write_text(out_dir / SUMMARY_CSV, render_csv(report, out_dir))
        return atomic_write_text(out_dir / SUMMARY_MD, render_markdown(report, out_dir))
    except OSError as e:
        raise PosexpError(f"cannot write the summary into {out_dir}: {e.strerror or e}") from None


def _writable_folder(out_dir: Path, what: str) -> None:
    """Create ``out_dir`` (and parents); a file in its place is a :class:`PosexpError` naming ``what``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PosexpError(f"{out_dir}: is a file; the {what} needs a folder to write into")
    out_dir.mkdir(parents=True, exist_ok=True)


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
        # the flags themselves are in summary.md
        label = _legend(report, Group({}, row.label, [row], flags=row.flags))
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
    lines += ["", f"Values are {_ppl_label(report)} on held-out text, lower is better; "
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


# ---------------------------------------------------------------------------
# The grouped table in every format


def _columns(report: Report) -> list[str]:
    keys = list(report.by) + ["n"] if report.by else ["run"]
    return [*keys, *(_length_header(report, n) for n in report.lengths), *(m.name for m in report.metrics), "flags"]


def _group_cells(report: Report, group: Group) -> list[tuple[str, Optional[Stat], int]]:
    """(text when not a number, stat, decimals) for every column of a group's line."""
    keys: list[tuple[str, Optional[Stat], int]]
    if report.by:
        keys = [(_show(group.key.get(k)), None, 0) for k in report.by] + [(str(group.n), None, 0)]
    else:
        keys = [(group.label, None, 0)]
    cells = [("", group.cells.get(n, Stat()), 2) for n in report.lengths]
    metrics = [("", group.metrics.get(m.name, Stat()), m.decimals) for m in report.metrics]
    return [*keys, *cells, *metrics, ("; ".join(group.flags), None, 0)]


def _stat_text(stat: Stat, decimals: int, group: Group, plus_minus: str = " ± ") -> str:
    return stat.text(decimals, plus_minus, of=group.n)


def _table_notes(report: Report) -> list[str]:
    notes = [f"Values are {_ppl_label(report)} on held-out text (lower is better); "
             f'"{NOT_APPLICABLE}" = the encoding cannot run at that length, "{MISSING}" = not evaluated.']
    if report.by:
        notes.append("With n ≥ 2: mean over the group's runs ± the half-width of its 95% t-interval "
                     "(Student 1908, n − 1 degrees of freedom); n = 1 shows the run's value.")
    notes += [m.describe(report) for m in report.metrics]
    return notes


def print_report(report: Report, console: Console | None = None) -> None:
    """Print the comparison as a Rich table, followed by the notes and any warnings."""
    console = console or Console()
    # No vertical rules: a dozen columns of "4.92 ±0.10" fit a normal terminal that way.
    table = Table(title=_title(report), title_style="bold", header_style="bold", box=box.SIMPLE_HEAD)
    columns = _columns(report)
    n_keys = len(report.by) + 1 if report.by else 1
    lines = [_group_cells(report, group) for group in report.groups]
    for i, name in enumerate(columns):
        if i < n_keys and name != "n":
            # Keys keep their width (up to a point) on a narrow terminal; the numbers wrap instead.
            widest = max([len(name), *(len(line[i][0]) for line in lines)])
            table.add_column(name, overflow="fold", min_width=min(widest, 12))
        elif name == "flags":
            table.add_column(name, style="yellow", overflow="fold")
        else:
            table.add_column(name, justify="right", no_wrap=name == "n", overflow="fold")
    for group, line in zip(report.groups, lines):
        texts = []
        for text, stat, decimals in line:
            # Text(), not str: labels like "model=[a,b]" would otherwise be parsed as Rich markup.
            # "±0.12" in one piece: a narrow terminal wraps the cell before it, not inside it.
            texts.append(Text(text) if stat is None else
                         Text(_stat_text(stat, decimals, group, plus_minus=" ±"),
                              style="" if stat.applicable else "dim"))
        table.add_row(*texts, style="yellow" if group.flags else None)
    console.print(table)
    for note in _table_notes(report)[1:] if report.by or report.metrics else []:
        console.print(Text(note, style="dim"))
    for warning in report.warnings:
        console.print(Text.assemble(("warning: ", "bold yellow"), warning))


def render_table_markdown(report: Report) -> str:
    """The grouped table as a markdown table (``--format markdown``; the table in ``report.md``)."""
    columns = _columns(report)
    n_keys = len(report.by) + 1 if report.by else 1
    lines = ["| " + " | ".join(_md(c) for c in columns) + " |",
             "|" + "|".join(" --- " if i < n_keys and c != "n" or c == "flags" else " ---: "
                            for i, c in enumerate(columns)) + "|"]
    for group in report.groups:
        cells = [_md(text) if stat is None else _stat_text(stat, decimals, group)
                 for text, stat, decimals in _group_cells(report, group)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_table_csv(report: Report) -> str:
    """The grouped table as CSV (``--format csv``): value, 95% low/high and n per length and metric."""
    buf = StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    keys = [*report.by, "n"] if report.by else ["run"]
    stats = [f"ppl@{n}" for n in report.lengths] + [m.name for m in report.metrics]
    writer.writerow([*keys, *(f"{s}{suffix}" for s in stats for suffix in ("", "_low", "_high", "_n")),
                     "flags", "runs"])
    for group in report.groups:
        key_cells = [_csv(group.key.get(k)) for k in report.by] + [str(group.n)] if report.by else [group.label]
        values = []
        for stat in [group.cells.get(n, Stat()) for n in report.lengths] + \
                    [group.metrics.get(m.name, Stat()) for m in report.metrics]:
            ok = bool(stat.applicable)
            values += [_csv(stat.mean if ok else None), _csv(stat.low if ok else None),
                       _csv(stat.high if ok else None), str(stat.n)]
        writer.writerow([*key_cells, *values, "; ".join(group.flags),
                         " ".join(row.run.path.as_posix() for row in group.rows)])
    return buf.getvalue()


def render_json(report: Report) -> str:
    """The report as JSON (``--format json``): settings, metric definitions, groups with their runs."""
    name, fingerprint = report.corpus
    data = {
        "by": list(report.by),
        "protocol": report.protocol, "scaling": report.scaling, "train_len": report.train_len,
        "corpus": name, "corpus_fingerprint": fingerprint, "eval_settings": report.eval_settings,
        "lengths": report.lengths,
        "metrics": {m.name: m.describe(report) for m in report.metrics},
        "groups": [{
            "label": group.label, "key": {k: (None if v is _ABSENT else v) for k, v in group.key.items()},
            "n": group.n, "train_len": group.train_len,
            "ppl": {str(n): group.cells[n].as_dict() for n in report.lengths if n in group.cells},
            "metrics": {k: v.as_dict() for k, v in group.metrics.items()},
            "flags": group.flags,
            "runs": [row.run.path.as_posix() for row in group.rows],
        } for group in report.groups],
        "warnings": report.warnings,
    }
    return json.dumps(data, indent=2, default=str) + "\n"


def render_latex(report: Report) -> str:
    """The grouped table as a booktabs ``tabular`` for a paper (``--format latex``)."""
    columns = _columns(report)
    n_keys = len(report.by) + 1 if report.by else 1
    if not any(g.flags for g in report.groups):
        columns = columns[:-1]  # an empty flags column only takes width in a paper
    spec = "".join("l" if i < n_keys and c != "n" or c == "flags" else "r" for i, c in enumerate(columns))
    lines = [
        f"% posexp report: {_ppl_label(report)}, protocol {_fmt_view(report.protocol, report.scaling)}, "
        f"training length {report.train_len}",
        *(f"% {_latex_comment(note)}" for note in _table_notes(report)[1:]),
        "% needs \\usepackage{booktabs}",
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
        " & ".join(_latex(c) for c in columns) + r" \\",
        "\\midrule",
    ]
    for group in report.groups:
        cells = []
        for text, stat, decimals in _group_cells(report, group)[:len(columns)]:
            if stat is None:
                cells.append(_latex(text))
            elif stat.applicable and stat.mean is not None:
                cells.append(_stat_text(stat, decimals, group, plus_minus=r" \pm ").join("$$"))
            else:
                cells.append(_latex(stat.text(decimals)))
        lines.append(" & ".join(cells) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


RENDERERS = {"markdown": render_table_markdown, "csv": render_table_csv, "json": render_json,
             "latex": render_latex}


def _latex(text: str) -> str:
    special = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
               "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
               "—": "---", "×": r"$\times$", "±": r"$\pm$"}
    return "".join(special.get(ch, ch) for ch in str(text))


def _latex_comment(text: str) -> str:
    return " ".join(str(text).split())


# ---------------------------------------------------------------------------
# report.md and its figures


def _legend(report: Report, group: Group) -> str:
    """Name a line by its encoding and base first; the table has the rest."""
    encoders = {str(row.run.info.get("encoder")) for row in group.rows}
    bases = {_canon(row.run.info.get("base")) for row in group.rows}
    parts = []
    if len(encoders) == 1:
        parts.append(encoders.pop())
    if len(bases) == 1 and group.rows[0].run.info.get("base") is not None:
        parts.append(f"base {_show(group.rows[0].run.info.get('base'))}")
    rest = [tok for tok in group.label.split(" ") if not re.match(r"(encoder|base)=", tok)]
    label = ", ".join(parts + ([" ".join(rest)] if rest and " ".join(rest) != "default" else []))
    if group.n > 1:
        label += f" (n={group.n})"
    return label + (" (!)" if group.flags else "")


def _group_plot_series(report: Report) -> list[tuple]:
    groups = [g for g in report.groups if any(c.applicable for c in g.cells.values())]
    bands = len(groups) <= MAX_BANDS
    series = []
    for group in groups:
        lengths = [n for n in report.lengths if n in group.cells]
        stats = [group.cells[n] for n in lengths]
        series.append((_legend(report, group), lengths, [s.mean if s.applicable else None for s in stats],
                       [s.low for s in stats] if bands else None, [s.high for s in stats] if bands else None))
    return series


def _read_positions(run: Run, protocol: Any, scaling: Any, length: int) -> dict[int, tuple[float, int]]:
    """position -> (mean loss, windows) of one window length, from a run's loss_by_position.csv.

    The file (written by ``posexp.run``) has every position of every evaluated length,
    thousands of lines per run; a substring test skips other lengths before any parsing.
    """
    path = run.path / LOSS_BY_POSITION_CSV
    out: dict[int, tuple[float, int]] = {}
    want_scaling = "" if scaling is None else str(scaling)
    needle, want_length = f",{length},", str(length)
    try:
        with open(path, encoding="utf-8") as f:
            header = f.readline().strip().split(",")
            col = {name: i for i, name in enumerate(header)}
            ip, isc, il, ipos, iloss, icount = (col["protocol"], col["scaling"], col["length"], col["position"],
                                                col["loss"], col["count"])
            ifac = col.get("scaling_factor")
            for line in f:
                if needle not in line:
                    continue
                rec = line.rstrip("\r\n").split(",")
                if rec[il] != want_length or rec[ip] != protocol or rec[isc] != want_scaling:
                    continue
                if scaling is None and ifac is not None and rec[ifac]:
                    continue  # a fixed scaling factor is its own curve
                out[int(rec[ipos])] = (float(rec[iloss]), int(rec[icount]))
    except (OSError, KeyError, ValueError, IndexError):
        return {}
    return out


def _position_series(report: Report) -> list[tuple]:
    """Each group at the longest window where it is applicable; its runs pooled per position, weighted by windows."""
    series = []
    for group in report.groups:
        usable = [n for n, s in group.cells.items() if s.applicable]
        if not usable:
            continue
        length = max(usable)
        sums: dict[int, float] = {}
        weights: dict[int, int] = {}
        for row in group.rows:
            for position, (loss, count) in _read_positions(row.run, report.protocol, report.scaling, length).items():
                sums[position] = sums.get(position, 0.0) + loss * count
                weights[position] = weights.get(position, 0) + count
        positions = sorted(p for p in sums if weights[p] > 0)
        if positions:
            series.append((f"{_legend(report, group)}, L={length}", length, positions,
                           [sums[p] / weights[p] for p in positions], [weights[p] for p in positions]))
    return series


def _read_training_curve(run: Run) -> tuple[list[float], list[float]]:
    path = run.path / METRICS_CSV
    steps: list[float] = []
    losses: list[float] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for rec in csv.DictReader(f):
                steps.append(float(rec["step"]))
                losses.append(float(rec["loss"]))
    except (OSError, KeyError, ValueError, TypeError):
        return [], []
    return steps, losses


def _training_series(report: Report) -> list[tuple]:
    """Mean training loss per logged step over each group's runs."""
    series = []
    for group in report.groups:
        by_step: dict[float, list[float]] = {}
        for row in group.rows:
            for step, loss in zip(*_read_training_curve(row.run)):
                by_step.setdefault(step, []).append(loss)
        if by_step:
            steps = sorted(by_step)
            series.append((_legend(report, group), steps, [math.fsum(by_step[s]) / len(by_step[s]) for s in steps]))
    return series


def write_report(report: Report, out_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` with its figures, plus ``summary.md``/``summary.csv``, into ``out_dir``.

    Figures: perplexity vs length per group with interval bands (``ppl_vs_length.png``
    without ``--by``, ``report_ppl_vs_length.png`` with it), loss by position
    (``report_loss_by_position.png``) and training curves (``report_training_curves.png``).

    Args:
        report: from :func:`build_report`.
        out_dir: destination folder; created if missing.

    Returns:
        The path of ``report.md``.

    Raises:
        PosexpError: the folder cannot be written to.
    """
    from posexp.reporting.plots import plot_position_overlay, plot_ppl_vs_length, plot_training_curves

    out_dir = Path(out_dir)
    try:
        _writable_folder(out_dir, "report")
        view = _fmt_view(report.protocol, report.scaling)
        # Without --by the groups are the runs, and the summary's figure is this one.
        ppl_file = REPORT_PLOT_FILE if report.by else PLOT_FILE
        plot_ppl_vs_length(_group_plot_series(report), out_dir / ppl_file, train_len=report.train_len,
                           title=f"protocol: {view}", ylabel=_ppl_label(report))
        write_summary(report, out_dir, plot=bool(report.by))
        figures = [(ppl_file, "Perplexity vs context length",
                    "Lines: " + ("mean over each group's runs; bands: 95% t-interval over runs (the run's own "
                                 "evaluation interval where n = 1)" if report.by else
                                 "one per run; bands: 95% evaluation interval")
                    + f", drawn when there are at most {MAX_BANDS} lines."
                    + " Dashed: the training length. x: not applicable at that length.")]
        positions = _position_series(report)
        if positions:
            plot_position_overlay(positions, out_dir / POSITION_PLOT_FILE, train_len=report.train_len,
                                  title=f"loss by position in the window ({view})")
            figures.append((POSITION_PLOT_FILE, "Loss by position",
                            "Each line: one group's mean loss per position, in its longest applicable window "
                            "(L in the legend), binned 2 per doubling of the context. A line that rises right of "
                            "the dashed training length is the encoding failing to extrapolate."))
        curves = _training_series(report)
        if curves:
            plot_training_curves(curves, out_dir / TRAINING_PLOT_FILE, title="training loss (mean over runs)")
            figures.append((TRAINING_PLOT_FILE, "Training curves",
                            "Training loss per logged step (metrics.csv), mean over each group's runs."))
        return atomic_write_text(out_dir / REPORT_MD, render_report_markdown(report, out_dir, figures))
    except OSError as e:
        raise PosexpError(f"cannot write the report into {out_dir}: {e.strerror or e}") from None


def render_report_markdown(report: Report, out_dir: str | os.PathLike | None = None,
                           figures: Sequence[tuple[str, str, str]] = ()) -> str:
    """The text of ``report.md``: settings, the grouped table, metric notes, figures, the runs."""
    n_runs = len(report.rows)
    lines = ["# Positional encodings: perplexity vs context length", ""]
    what = (f"{n_runs} run{'s' if n_runs != 1 else ''}" +
            (f" in {len(report.groups)} groups by {', '.join(report.by)}" if report.by else ""))
    lines.append(f"Compared {what} ({_plural('encoder', report.encoders)}: {', '.join(report.encoders)}).")
    if report.filters:
        lines.append(f"Only runs with {' and '.join(f'`{f}`' for f in report.filters)}.")
    if report.shared_overrides:
        lines.append(f"Overrides shared by all runs: {', '.join(f'`{o}`' for o in report.shared_overrides)}.")
    lines += ["", *(f"- {item}" for item in _settings(report)), ""]
    for warning in report.warnings:
        lines += [f"> **Warning:** {_md(warning)}", ">"]
    if report.warnings:
        lines[-1] = ""
    lines.append(render_table_markdown(report))
    lines += [f"- {_md(note)}" for note in _table_notes(report)]
    for file, title, caption in figures:
        lines += ["", f"## {title}", "", f"![{title.lower()}]({file})", "", caption]
    lines += ["", "## Runs", "", "| run | group | folder | encoder | base | train len | seed | params | steps "
              "| final loss | status |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for group in report.groups:
        for row in group.rows:
            info, train = row.run.info, row.run.info.get("train") or {}
            lines.append("| " + " | ".join([
                _md(row.label), _md(group.label), f"`{_display_path(row.run.path, out_dir)}`",
                _md(str(info.get("encoder", ""))), _fmt_num(info.get("base")), _fmt_num(info.get("train_len")),
                _fmt_num(info.get("seed")), _fmt_int(info.get("params")), _fmt_int(train.get("steps")),
                _fmt_num(train.get("final_loss"), ".3f"), _md(row.run.status)]) + " |")
    return "\n".join(lines) + "\n"


def report_main(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    out: str | os.PathLike | None = None,
    console: Console | None = None,
    *,
    by: Sequence[str] | str | None = None,
    metrics: Sequence[str] | str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    where: Sequence[str] | str | None = None,
    sort: Optional[str] = None,
    fmt: str = "rich",
    err_console: Console | None = None,
) -> Path:
    """``posexp report DIR...``: find runs, print the table, write report.md, summary.md and figures.

    Args:
        paths: run folders, sweep folders, or folders above them.
        out: where to write the files. Default: the folder given, when exactly one
            was given (for a sweep that is the sweep root), else the current folder.
        console: where the table goes (stdout by default).
        by, metrics, tolerance, where, sort: see :func:`build_report`.
        fmt: ``rich`` (terminal), ``markdown``, ``csv``, ``json`` or ``latex``. The last four print only
            the table to ``console``, so the output can be redirected; notes and warnings go to ``err_console``.
        err_console: where notes go for machine-readable formats (stderr by default).

    Returns:
        The path of ``summary.md``.

    Raises:
        PosexpError: bad paths, no runs, an unreadable run, or an unwritable output folder.
        ConfigError: a bad option, naming it and the allowed values.
    """
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    report = build_report(find_runs(paths), by=by, metrics=metrics, tolerance=tolerance, where=where, sort=sort)
    report.warnings += _unfinished_sweep_jobs(paths)
    console = console or Console()
    if fmt == "rich":
        print_report(report, console)
        notes = console
    else:
        console.file.write(RENDERERS[fmt](report))
        console.file.flush()
        notes = err_console or Console(stderr=True)
        for warning in report.warnings:
            notes.print(Text.assemble(("warning: ", "bold yellow"), warning))
    if out is not None:
        out_dir = Path(out)
    elif len(paths) == 1:
        given = Path(paths[0])
        out_dir = given.parent if given.is_file() else given
    else:
        out_dir = Path.cwd()
    full = write_report(report, out_dir)
    summary = out_dir / SUMMARY_MD
    notes.print(Text(f"wrote {full} (with figures), {SUMMARY_MD} and {SUMMARY_CSV}"))
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
              _target_: posexp.reporting.report.SweepSummaryCallback
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


def _ppl_label(report: Report) -> str:
    """The y label and table unit; byte-level tokens are named as such so nobody reads them as words."""
    tokenizers = {row.run.info.get("tokenizer") for row in report.rows} - {None}
    if tokenizers == {"byte"}:
        return f"{PPL_LABEL} (byte-level tokens)"
    return PPL_LABEL


def _fmt_fixed(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}" if math.isfinite(value) else str(value)


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
