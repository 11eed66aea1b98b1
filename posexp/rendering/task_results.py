"""A task run's results as files: results.md, results.csv, accuracy_vs_length.png, passkey_heatmap.png and
accuracy_vs_depth.png (tasks with depths), and the console table. :mod:`posexp.rendering.results` hands a run here when its rows are accuracy rows.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional

from rich.table import Table

from posexp.plots.accuracy import plot_accuracy_vs_depth, plot_accuracy_vs_length, plot_passkey_heatmap
from posexp.runs.atomic import atomic_write_text
from posexp.runs.row import csv_columns
from posexp.runs.layout import (ACCURACY, ACCURACY_PLOT, DEPTH_PLOT, PASSKEY_HEATMAP, RESULTS_CSV, RESULTS_MD,
                                row_metric, window_text, write_results_json)



def is_task_results(results: dict) -> bool:
    """Whether a run's results are a task's (accuracy rows), not perplexity."""
    task = results.get("run", {}).get("task")
    return isinstance(task, dict) or any(row_metric(r) == ACCURACY for r in results.get("rows", []))


def accuracy_rows(results: dict) -> list[dict]:
    """The accuracy rows, by scaling (none first), length and depth."""
    rows = [r for r in results["rows"] if row_metric(r) == ACCURACY]
    return sorted(rows, key=lambda r: (r.get("window") is not None, r.get("window") or 0, r.get("sinks") or 0,
                                       r.get("scaling") is not None, str(r.get("scaling")),
                                       r.get("scaling_factor") or 0, r["length"], r.get("depth") or 0))


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _interval(row: dict, key: str) -> str:
    low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
    return "n/a" if low is None or high is None else f"{100 * low:.1f}–{100 * high:.1f}"


def _scaling(row: dict) -> str:
    """``none``, ``yarn ×4``, and after either the window of a windowed row: ``none window 16 + 4 sinks``."""
    if row.get("scaling") is None:
        return "none" + window_text(row)
    factor = row.get("scaling_factor")
    return str(row["scaling"]) + (f" ×{factor:g}" if factor is not None else "") + window_text(row)


def task_description(run: dict) -> str:
    task = run.get("task") or {}
    options = ", ".join(f"{k} {v}" for k, v in (task.get("options") or {}).items())
    return f"task `{task.get('name', '?')}`" + (f" ({options})" if options else "") + \
        (f", after {task['citation']}" if task.get("citation") else "")


def _trained(run: dict) -> str:
    model = run.get("pretrained")
    if isinstance(model, dict):  # posexp eval hf:MODEL task.name=passkey: zero-shot
        return f"pretrained `{model.get('name')}` ({model.get('architecture')}), zero-shot, context {run['train_len']} tokens"
    steps = (run.get("train") or {}).get("steps", "?")
    return f"encoder `{run['encoder']}`, trained on lengths up to {run['train_len']} tokens for {steps} steps"


def task_markdown(results: dict) -> str:
    run = results["run"]
    rows = accuracy_rows(results)
    depth = any(r.get("depth") is not None for r in rows)
    lines = [
        f"# {run['label']}",
        "",
        f"{task_description(run)}; {_trained(run)}, {run['params']:,} parameters. Each row scores fresh instances of "
        "exactly that length (the same instances for every run), teacher-forced: exact match = every answer "
        "token is the argmax; token accuracy = share of answer tokens right. 95% Wilson intervals over the "
        "instances: of those solved (exact match), and at the instances' effective sample size (token accuracy: "
        "the tokens of one instance are no independent trials).",
        "",
        "| length | × train |" + (" depth |" if depth else "") + " size | scaling | exact match % | 95% interval "
        "| token accuracy % | 95% interval | answer loss (nats) | instances |",
        "|---:|---:|" + ("---:|" if depth else "") + "---:|---|---:|---|---:|---|---:|---:|",
    ]
    for r in rows:
        loss = "n/a" if r.get("answer_loss") is None else f"{r['answer_loss']:.4f}"
        lines.append(f"| {r['length']} | {r['multiple']:g} |" + (f" {r.get('depth', 0):g} |" if depth else "") +
                     f" {r.get('size', '')} | {_scaling(r)} | {_pct(r.get('exact_match'))} "
                     f"| {_interval(r, 'exact_match')} | {_pct(r.get('token_accuracy'))} "
                     f"| {_interval(r, 'token_accuracy')} | {loss} | {r.get('examples', 0)} |")
    notes = [f"- length {r['length']}: not applicable ({r['reason']})" for r in rows if r.get("reason")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def task_csv(results: dict) -> str:
    buf = io.StringIO()
    rows = accuracy_rows(results)
    w = csv.DictWriter(buf, fieldnames=csv_columns(rows, ACCURACY), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def task_table(results: dict) -> Table:
    """The console table of a task run."""
    run = results["run"]
    rows = accuracy_rows(results)
    depth = any(r.get("depth") is not None for r in rows)
    trained = "context" if isinstance(run.get("pretrained"), dict) else "trained at up to"
    table = Table(title=f"accuracy by context length — {run['label']} ({trained} {run['train_len']} tokens)")
    for name in ["length", "×train"] + (["depth"] if depth else []) + ["exact %", "95% CI", "token %", "loss"]:
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        loss = "n/a" if r.get("answer_loss") is None else f"{r['answer_loss']:.3f}"
        table.add_row(str(r["length"]) + ("" if _scaling(r) == "none" else f" {_scaling(r)}"),
                      f"{r['multiple']:g}", *([f"{r.get('depth'):g}"] if depth else []), _pct(r.get("exact_match")),
                      _interval(r, "exact_match"), _pct(r.get("token_accuracy")), loss)
    notes = [f"length {r['length']}: {r['reason']}" for r in rows if r.get("reason")]
    if notes:
        table.caption = "; ".join(dict.fromkeys(notes))
    return table


def write_task_results(run_dir: Path, results: dict) -> None:
    """results.csv, results.md, accuracy_vs_length.png (and passkey_heatmap.png), then results.json."""
    run = results["run"]
    rows = [r for r in accuracy_rows(results) if r.get("scaling") is None and r.get("window") is None]
    depths = sorted({r["depth"] for r in rows if r.get("depth") is not None})
    series = []
    for depth in depths or [None]:
        sel = [r for r in rows if r.get("depth") == depth]
        label = "exact match" if depth is None else f"depth {depth:g}"
        series.append((label, [r["length"] for r in sel], [r.get("exact_match") for r in sel],
                       [r.get("exact_match_low") for r in sel], [r.get("exact_match_high") for r in sel]))
    if depth_free := [r for r in rows if r.get("depth") is None]:
        series.append(("per token", [r["length"] for r in depth_free], [r.get("token_accuracy") for r in depth_free],
                       [r.get("token_accuracy_low") for r in depth_free],
                       [r.get("token_accuracy_high") for r in depth_free]))
    title = f"{run['label']} ({(run.get('task') or {}).get('name', 'task')}, trained up to {run['train_len']} tokens)"
    plot_accuracy_vs_length(series, run_dir / ACCURACY_PLOT, train_len=run["train_len"], title=title,
                            ylabel="accuracy (%)")
    if depths:
        lengths = sorted({r["length"] for r in rows})
        cell = {(r["depth"], r["length"]): r.get("exact_match") for r in rows}
        plot_passkey_heatmap(lengths, depths, [[cell.get((d, n)) for n in lengths] for d in depths],
                             run_dir / PASSKEY_HEATMAP, train_len=run["train_len"], title=title)
        # Liu et al. 2023's curve: accuracy by the depth of what is asked, a line per length
        plot_accuracy_vs_depth([(f"L = {n}" + (" (train)" if n == run["train_len"] else ""), depths,
                                 [cell.get((d, n)) for d in depths]) for n in lengths],
                               run_dir / DEPTH_PLOT, title=f"exact match by depth: {title}")
    atomic_write_text(run_dir / RESULTS_CSV, task_csv(results))
    atomic_write_text(run_dir / RESULTS_MD, task_markdown(results))
    write_results_json(run_dir, results)  # last: a folder with results.json is a finished run
