"""Runs as one long table: every result row of every run, with the run's config beside it.

:func:`load_runs` is what a notebook starts from: one pandas DataFrame, one line per result row of each run's
``results.json``, the columns that say which run it is (encoder, base, seed, train_len, task, ...) joined on, so
that a table for a paper is one pivot::

    import posexp

    df = posexp.load_runs("outputs/multirun/2026-11-22/10-00-00")
    df[df.protocol == "nonoverlap"].pivot_table(index="encoder", columns="length", values="ppl")

Torch-free: it reads run folders only (:mod:`posexp.reporting.runs`), never a model.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.runs import Run, read_runs
from posexp.reporting.selection import ABSENT, config_value, flatten_config, did_you_mean
from posexp.runs.layout import MULTIRUN_YAML, RESULTS_JSON, is_sweep_dir, iter_jobs
from posexp.runs.lock import find_finished_runs
from posexp.runs.row import ROW_KEY

LM_TASK = "lm"  # the task column of a language-modelling run (task=lm)
NO_SCALING = "none"  # the scaling column of a row measured without one, as eval.scaling spells it

# The run's columns, first in the table. ``scaling`` is not among them: it is the row's own (how the row was
# evaluated); a fine-tune's recorded scaling is ``ft_scaling``.
RUN_COLUMNS = ("run", "encoder", "base", "seed", "train_len", "task", "ft_scaling", "ft_scaling_factor", "parent",
               "config_hash", "status", "label")


def run_columns(run: Run) -> dict[str, Any]:
    """The columns every result row of ``run`` gets: which run, which encoding, seed, task and lineage.

    ``ft_scaling``, ``ft_scaling_factor`` and ``parent`` are set for a fine-tune (``posexp finetune``) only.
    """
    task = run.info.get("task")
    finetune = isinstance(run.info.get("finetune"), dict)
    return {"run": str(run.path), "encoder": run.info.get("encoder"), "base": run.info.get("base"),
            "seed": run.info.get("seed"), "train_len": run.info.get("train_len"),
            "task": str(task.get("name")) if isinstance(task, dict) else LM_TASK,
            "ft_scaling": run.info.get("scaling") if finetune else None,
            "ft_scaling_factor": run.info.get("scaling_factor") if finetune else None,
            "parent": run.info.get("parent") if finetune else None,
            "config_hash": run.info.get("config_hash"), "status": run.status, "label": run.info.get("label")}


def run_records(run: Run, columns: Sequence[str] = ()) -> list[dict]:
    """One dict per result row of ``run``: :func:`run_columns`, then the row's own fields, then the dotted config
    keys ``columns`` asks for (None where the run has no such key).

    A run that did not finish (``status`` failed or diverged) has no rows: it gives one record with its columns
    and no measurement, so that a table of a sweep does not lose it without a word. A row's field named like a
    run column (other than ``task``, which means the same in both) is kept as ``row_NAME``.
    """
    base = run_columns(run)
    extra = {key: None if (value := config_value(run, key)) is ABSENT else value
             for key in columns if key not in base}
    records = []
    for row in run.rows or [{}]:
        record = dict(base)
        for key, value in row.items():
            record[key if key not in base or key == "task" else f"row_{key}"] = value
        if row:
            record["scaling"] = NO_SCALING if row.get("scaling") is None else row["scaling"]
        record.update(extra)
        records.append(record)
    return records


def load_runs(paths: str | os.PathLike | Sequence[str | os.PathLike], columns: Optional[Sequence[str]] = None,
              strict: bool = False):
    """Every result row of the runs under ``paths`` as one long pandas DataFrame.

    One line per row of each run's ``results.json`` (length x protocol x scaling x window; for a task,
    length x depth), in the order :func:`~posexp.runs.layout.find_runs` finds the runs. Besides the row's own
    fields (``metric``, ``length``, ``multiple``, ``protocol``, ``stride``, ``last_k``, ``scaling`` and
    ``scaling_factor`` of evaluation, ``window``, ``sinks``, ``ppl``, ``ppl_low``, ``ppl_high``, ``loss``,
    ``exact_match``, ...), each line carries its run's columns:

    - ``run``: the run folder; ``label``: its overrides; ``status``: completed, failed or diverged;
    - ``encoder``, ``base``, ``seed``, ``train_len``, ``config_hash``;
    - ``task``: the task's name, ``lm`` for language modelling;
    - ``ft_scaling``, ``ft_scaling_factor``, ``parent``: what a fine-tune was trained with and from (empty for a
      run trained from scratch). ``scaling`` is the row's own, applied at evaluation (``none`` without one).

    Example::

        df = posexp.load_runs(["outputs/multirun/2026-11-22/10-00-00"], columns=["model.n_layers"])
        plain = df[(df.protocol == "nonoverlap") & (df.scaling == "none") & df.window.isna()]
        plain.pivot_table(index="encoder", columns="length", values="ppl")   # mean over seeds

    Args:
        paths: run folders, sweep folders or any folder above them (searched recursively).
        columns: dotted config keys to add as columns (``model.n_layers``, ``encoder.rotary_fraction``), as
            ``posexp report --by`` reads them; a key already among the columns is not added twice.
        strict: raise on a ``results.json`` that cannot be read; by default such a run is left out, with a warning.

    Returns:
        A ``pandas.DataFrame``.

    Raises:
        PosexpError: no run under ``paths``, or (``strict``) a run's results cannot be read.
        ConfigError: (``columns``) a key no run's config has, with the closest known key.
    """
    runs, problems = read_runs(find_finished_runs(paths), strict)
    for message in [f"left out: {problem}" for problem in problems] + _jobs_without_results(paths):  # as posexp report says of them: absent, not silently
        warnings.warn(message, stacklevel=2)
    keys = list(dict.fromkeys(columns or ()))
    for key in keys:
        _check_key(key, runs)
    return records_table([record for run in runs for record in run_records(run, keys)], keys)


def sweeps_under(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The sweep folders among ``paths`` and under them (``outputs/`` holds ``multirun/DATE/TIME``), each once."""
    found: list[Path] = []
    for root in map(Path, paths):
        found += [root] if is_sweep_dir(root) else []
        found += sorted(p.parent for p in root.rglob(MULTIRUN_YAML) if p.parent != root) if root.is_dir() else []
    return list(dict.fromkeys(found))


def unfinished_jobs(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[Path, list[str]]]:
    """(sweep folder, its jobs that wrote no ``results.json`` yet: still running, or failed) for each sweep folder
    of ``paths`` and under them (:func:`sweeps_under`) with such jobs."""
    sweeps = sweeps_under([paths] if isinstance(paths, (str, os.PathLike)) else paths)
    return [(sweep, missing) for sweep in sweeps
            if (missing := [d.name for d in iter_jobs(sweep) if not (d / RESULTS_JSON).is_file()])]


def _jobs_without_results(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """A line per sweep folder under ``paths`` with jobs that wrote no ``results.json`` yet, whose rows the
    DataFrame therefore lacks."""
    return [f"{sweep}: sweep job{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'have' if len(missing) > 1 else 'has'} no {RESULTS_JSON} yet (still running, or failed), so "
            f"{'their' if len(missing) > 1 else 'its'} rows are not in the DataFrame"
            for sweep, missing in unfinished_jobs(paths)]


def records_table(records: list[dict], columns: Sequence[str] = ()):
    """:func:`run_records` of one or many runs as the pandas DataFrame :func:`load_runs` returns."""
    import pandas as pd

    df = pd.DataFrame.from_records(records)
    # the keys that say how a row was measured are columns even where no run has them (no windowed row: window)
    wanted = [*RUN_COLUMNS, "metric", *ROW_KEY, *columns]
    df = df.reindex(columns=[*df.columns, *(name for name in wanted if name not in df.columns)])
    for name in _integer_columns(records, list(df.columns)):
        df[name] = df[name].astype("Int64")
    return df


def _check_key(key: str, runs: list[Run]) -> None:
    if key in RUN_COLUMNS or any(config_value(run, key) is not ABSENT for run in runs):
        return
    known = sorted({*(k for run in runs for k, v in run.info.items() if not isinstance(v, (dict, list))),
                    *(k for run in runs[:20] for k in flatten_config(run.config_data))})
    raise ConfigError("columns", f"unknown config key {key!r}: no run has it{did_you_mean(key, known)}")


def _integer_columns(records: list[dict], names: list[str]) -> list[str]:
    """Counts that a record without them (a run without rows) would turn into floats (``length`` 128.0): they
    become pandas' nullable ``Int64`` (128, and <NA> in the gap)."""
    out = []
    for name in names:
        values = [r.get(name) for r in records]
        present = [v for v in values if v is not None]
        if present and len(present) < len(values) and all(type(v) is int for v in present):
            out.append(name)
    return out
