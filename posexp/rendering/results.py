"""One run's results as files: results.json (the public contract), results.csv, results.md, the
perplexity and loss-by-position figures, and the console table. ``posexp train`` and ``posexp eval``
both write through here.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Literal, Optional

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table

from posexp.data.tokenizer import bits_per_byte
from posexp.evaluation.perplexity import loss_by_position_rows
from posexp.plots.perplexity import plot_loss_by_position, plot_ppl_vs_length
from posexp.runs.atomic import atomic_write_text
from posexp.runs.layout import (
    LOSS_BY_POSITION_PNG,
    PPL_PLOT,
    RESULTS_CSV,
    RESULTS_MD,
    finite_results,
    merge_loss_by_position,
    write_loss_by_position_csv,
    window_text,
    write_results_json,
)
from posexp.runs.row import VIEW_KEY, csv_columns, csv_record, factor_text, fixed_factor, view_of
from posexp.rendering.task_results import is_task_results, task_table, write_task_results



def token_unit(run: dict) -> str:
    """What one token is, for labels: ``byte-level token``, or ``bpe token (vocab 4096)``."""
    tokenizer = run.get("tokenizer", "byte")
    return "byte-level token" if tokenizer == "byte" else f"{tokenizer} token (vocab {run.get('vocab_size')})"


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def protocol_text(row: dict) -> str:
    """``nonoverlap``, ``sliding S=64``, ``last_k K=64``; then `` window 128`` (`` + 4 sinks``) of a windowed row."""
    if row.get("stride") is not None:
        text = f"{row['protocol']} S={row['stride']}"
    elif row.get("last_k") is not None:
        text = f"{row['protocol']} K={row['last_k']}"
    else:
        text = str(row["protocol"])
    return text + window_text(row)



def scaling_text(row: dict) -> str:
    """``none`` or ``yarn ×4``."""
    if row.get("scaling") is None:
        return "none"
    factor = row.get("scaling_factor")
    options = f" {row['scaling_options']}" if row.get("scaling_options") else ""  # a position remapping's
    return str(row["scaling"]) + (factor_text(row["scaling"], factor) if factor is not None else "") + options


MAIN_VIEW = tuple("nonoverlap" if name == "protocol" else None for name in VIEW_KEY)  # plain: no scaling, no window


def curve_of(row: dict, train_len: int) -> tuple:
    """(view, fixed factor): rows scaled by the default per-length factor form one curve per view,
    each fixed ``eval.scaling_factor`` its own."""
    return view_of(row), fixed_factor(row, train_len)


def view_label(view: tuple) -> str:
    row = dict(zip(VIEW_KEY, view))
    text = protocol_text(row)
    options = f" {row['scaling_options']}" if row.get("scaling_options") else ""
    return text if row["scaling"] is None else f"{text}, {row['scaling']}{options}"


def display_rows(results: dict) -> list[dict]:
    """Rows grouped by view (the main ``nonoverlap`` without scaling first), each view by length."""
    views = list(dict.fromkeys(view_of(r) for r in results["rows"]))
    views.sort(key=lambda v: v != MAIN_VIEW)  # stable: otherwise first-seen order
    order = {v: i for i, v in enumerate(views)}
    return sorted(results["rows"], key=lambda r: (order[view_of(r)], r["length"], r.get("scaling_factor") or 0))


def reason_notes(rows: list[dict]) -> list[str]:
    """Why rows are not applicable, a note per reason naming its lengths (and their scaling, where scaled):
    ``lengths 256, 512: not applicable (...)``."""
    lengths: dict[str, list[str]] = {}
    for r in rows:
        if r.get("reason"):
            where = str(r["length"]) + (f" ({scaling_text(r)})" if r.get("scaling") else "")
            lengths.setdefault(str(r["reason"]), []).append(where)
    return [f"length{'s' if len(at) > 1 else ''} {', '.join(dict.fromkeys(at))}: not applicable ({reason})"
            for reason, at in lengths.items()]


SCORED_TOKENS_NOTE = {
    "nonoverlap": "consecutive windows, every target scored",
    "sliding": "windows advance by S and score their last S targets (the first window all of them)",
    "last_k": "every window scores its last K targets; the windows end at the same tokens at every length",
}


def results_markdown(results: dict) -> str:
    run = results["run"]
    base = f"{run['base']:g}" if run.get("base") is not None else "none"
    rows = display_rows(results)
    train = run.get("train") or {}  # absent when the run failed after training, its weights kept
    trained = (f"{train['steps']} steps ({train['tokens']:,} tokens)" if "steps" in train and "tokens" in train
               else f"steps not recorded (the run is recorded as {run.get('status', 'unfinished')})")
    params = f"{run['params']:,} parameters" if isinstance(run.get("params"), int) else "parameters not recorded"
    lines = [
        f"# {run.get('label', '')}",
        "",
        f"{_what_was_run(run, base, trained)}, "
        f"{params}, corpus `{run.get('corpus', '?')}` ({run.get('corpus_fingerprint', '?')}). Perplexity per "
        f"{token_unit(run)} on the "
        f"validation split; 95% interval from the standard error over blocks of L consecutive scored tokens "
        f"(the windows, for nonoverlap).",
        "",
    ]
    if isinstance(run.get("finetune"), dict):  # posexp finetune: where the run started
        ft = run["finetune"]
        lines[-1:-1] = ["", f"Fine-tuned from `{ft['parent']}` (trained at {ft['parent_train_len']} tokens, config "
                            f"hash {ft['parent_config_hash']}) with scaling `{ft['scaling']}` ×{ft['scaling_factor']:g}."]
    bpb = run.get("tokenizer", "byte") != "byte" and bool(run.get("tokens_per_byte"))
    if bpb:
        lines[-1:-1] = ["", f"Per-token perplexities are not comparable across tokenizers; bits per byte are "
                            f"(loss / ln 2 × {run['tokens_per_byte']:g} tokens per UTF-8 byte of the validation "
                            "split), in the last column."]
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        spans = sorted({tuple(r["targets"]) for r in rows if r["protocol"] == protocol and r.get("targets")})
        where = "; ".join(f"{a:,}–{b:,}" for a, b in spans) or "none"
        lines.append(f"- `{protocol}`: {SCORED_TOKENS_NOTE.get(protocol, '')}; scored targets (token indices "
                     f"in the validation split): {where}.")
    lines += [
        "",
        "| length | × train | protocol | scaling | ppl | 95% interval | loss (nats/token) | tokens scored "
        "| windows | tokens/s (forward) | peak MiB |" + (" bits/byte |" if bpb else ""),
        "|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if bpb else ""),
    ]
    for r in rows:
        interval = f"{r['ppl_low']:.3f}–{r['ppl_high']:.3f}" if r.get("ppl_low") is not None else "n/a"
        bits = (f" {_fmt(None if r['loss'] is None else bits_per_byte(r['loss'], run['tokens_per_byte']), '.4f')} |"
                if bpb else "")
        lines.append(f"| {r['length']} | {r['multiple']:g} | {protocol_text(r)} | {scaling_text(r)} "
                     f"| {_fmt(r['ppl'], '.3f')} | {interval} | {_fmt(r['loss'], '.4f')} | {r['tokens']:,} "
                     f"| {r.get('windows', 0):,} | {_fmt(r.get('tokens_per_s'), ',.0f')} "
                     f"| {_fmt(r.get('peak_mem_mb'), ',.0f')} |" + bits)
    notes = reason_notes(rows)
    return "\n".join(lines + ([""] + [f"- {note}" for note in notes] if notes else [])) + "\n"


def results_csv(results: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=csv_columns(results["rows"]), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in results["rows"]:
        w.writerow(csv_record(r))
    return buf.getvalue()


# The per-run table's columns: (header, justify, may be dropped on a narrow terminal: the last such first, so the
# interval goes only after the loss, throughput and memory). The headers are
# short so that eight columns of numbers fit 80 characters; results.md spells them out.
RESULT_COLUMNS: list[tuple[str, Literal["left", "right"], bool]] = [("length", "right", False), ("×train", "right", False), ("evaluation", "left", False),
                  ("ppl", "right", False), ("95% CI", "left", True), ("loss", "right", True),
                  ("tok/s", "right", True), ("MiB", "right", True)]


class ResultsTable:
    """The per-run table printed at the end of ``posexp train`` and ``posexp eval``, laid out for the width it gets.

    No number is ever split across lines or cut: every number column is ``no_wrap``, and on a
    terminal too narrow for all of them the throughput and memory columns (in ``results.md`` and
    ``results.csv`` anyway) are left out before anything else; only the evaluation label wraps.
    """

    def __init__(self, results: dict):
        self.results = results
        self.rows = display_rows(results)
        # one "evaluation" column, only when something other than the default protocol was measured
        self.show_view = any(view_of(r) != MAIN_VIEW for r in self.rows)

    def _cells(self, r: dict) -> dict[str, str]:
        interval = f"{r['ppl_low']:.2f}–{r['ppl_high']:.2f}" if r.get("ppl_low") is not None else ""
        return {"length": str(r["length"]), "×train": f"{r['multiple']:g}",
                "evaluation": protocol_text(r) + (f", {scaling_text(r)}" if r.get("scaling") else ""),
                "ppl": _fmt(r["ppl"], ".3f"), "95% CI": interval, "loss": _fmt(r["loss"], ".4f"),
                "tok/s": _fmt(r.get("tokens_per_s"), ",.0f"), "MiB": _fmt(r.get("peak_mem_mb"), ",.0f")}

    def table(self, width: Optional[int] = None) -> Table:
        """The table for a terminal ``width`` characters wide (None: every column)."""
        run = self.results["run"]
        cells = [self._cells(r) for r in self.rows]
        columns = [c for c in RESULT_COLUMNS if c[0] != "evaluation" or self.show_view]

        def needed(cols) -> int:  # content + one space either side + a rule between columns and at the edges
            def widest(name):
                texts = [name, *(c[name] for c in cells)]
                return max(len(w) for t in texts for w in t.split()) if name == "evaluation" else max(map(len, texts))
            return sum(widest(name) + 3 for name, _, _ in cols) + 1

        dropped = []
        while width is not None and needed(columns) > width and any(optional for _, _, optional in columns):
            dropped.append(next(c for c in reversed(columns) if c[2]))
            columns.remove(dropped[-1])
        # the fixed phrase first: Rich wraps a long title to the table's width, and labels can be long
        table = Table(title=f"perplexity by context length — {plot_title(run)}")
        for name, justify, _ in columns:
            if name == "evaluation":  # the one text column: wraps at its spaces, folds only a word wider than itself
                table.add_column(name, justify=justify, overflow="fold")
            else:
                table.add_column(name, justify=justify, no_wrap=True)
        for c in cells:
            table.add_row(*(c[name] for name, _, _ in columns))
        notes = [f"length {r['length']}: {r['note']}" for r in self.rows if r.get("note")] + reason_notes(self.rows)
        if dropped:
            names = [n for n, _, _ in reversed(dropped)]
            listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            notes.append(f"{listed} left out at this width; "
                         f"all columns are in {RESULTS_MD}")
        if notes:
            table.caption = "; ".join(notes)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)


def results_table(results: dict) -> ResultsTable | Table:
    """The per-run table (a Rich renderable that fits the terminal it is printed on); a task run's accuracy."""
    return task_table(results) if is_task_results(results) else ResultsTable(results)


def _what_was_run(run: dict, base: str, trained: str) -> str:
    """A trained run's encoding and training; a pretrained model's (``posexp eval hf:MODEL``) class, weights and
    context length."""
    model = run.get("pretrained")
    if isinstance(model, dict):
        return (f"pretrained `{model.get('name')}` ({model.get('architecture')}, revision {model.get('revision')}, "
                f"weights sha256 {str(model.get('weights_sha256'))[:16]}), rope base {base}, context "
                f"{run.get('train_len')} tokens")
    return f"encoder `{run.get('encoder')}`, base {base}, trained at {run.get('train_len')} tokens for {trained}"


def plot_title(run: dict) -> str:
    """A run's figure title: its encoding first (``rope, base 10000``), then what its overrides set, then its
    training length; never the bare ``default`` of a run started without overrides."""
    base = f", base {run['base']:g}" if isinstance(run.get("base"), (int, float)) else ""
    label = str(run.get("label") or "")
    shown = "" if label in ("", "default") else f" — {label}"
    context = "context" if isinstance(run.get("pretrained"), dict) else "trained at"
    return f"{run.get('encoder') or '?'}{base}{shown} ({context} {run['train_len']} tokens)"


def write_results(run_dir: Path, results: dict) -> None:
    """``results.json`` (the public contract), ``results.csv``, ``results.md`` and ``ppl_vs_length.png``.

    A NaN or infinite number (a diverging evaluation) is replaced by None in ``results``
    itself first, its row saying so in ``note`` (:func:`posexp.runs.layout.finite_results`),
    so that every file and the console table show n/a there and ``results.json`` is
    always written.
    """
    clean = finite_results(results)
    results.clear()
    results.update(clean)
    if is_task_results(results):
        write_task_results(run_dir, results)
        return
    run = results["run"]
    series = []
    shown = display_rows(results)
    for curve in dict.fromkeys(curve_of(r, run["train_len"]) for r in shown):
        rows = [r for r in shown if curve_of(r, run["train_len"]) == curve]
        view, fixed = curve
        label = view_label(view) + (factor_text(view[3], fixed) if fixed is not None else "")
        series.append((label, [r["length"] for r in rows], [r["ppl"] for r in rows],
                       [r.get("ppl_low") for r in rows], [r.get("ppl_high") for r in rows]))
    plot_ppl_vs_length(series, run_dir / PPL_PLOT, train_len=run["train_len"],
                       title=plot_title(run),
                       ylabel=f"perplexity (per {token_unit(run)})")
    atomic_write_text(run_dir / RESULTS_CSV, results_csv(results))
    atomic_write_text(run_dir / RESULTS_MD, results_markdown(results))
    # written last: a folder with results.json is a finished run
    write_results_json(run_dir, results)


def write_loss_by_position(run_dir: Path, records: list[dict], train_len: int, label: str) -> None:
    """Merge new per-position losses into ``loss_by_position.csv`` and redraw ``loss_by_position.png``.

    Columns: the row key (protocol, stride, last_k, scaling, scaling_factor, length), then
    ``position`` (0-based index of the predicting token in the window: the prediction saw
    ``position + 1`` tokens), ``loss`` (mean nats over the windows that score that position)
    and ``count`` (how many windows did). Rows of re-measured keys are replaced.
    """
    new = loss_by_position_rows(records)
    rows = merge_loss_by_position(run_dir, new)
    # the main view if measured, else the one just evaluated
    curves = [curve_of(r, train_len) for r in rows]
    main = (MAIN_VIEW, None)
    chosen = main if main in curves else (curve_of(new[0], train_len) if new else None)
    series = []
    for length in sorted({r["length"] for r, c in zip(rows, curves) if c == chosen}):
        pts = [r for r, c in zip(rows, curves) if c == chosen and r["length"] == length]
        series.append((length, [r["position"] for r in pts], [r["loss"] for r in pts], [r["count"] for r in pts]))
    if chosen is None:
        view = "nothing measured"
    else:
        view = view_label(chosen[0]) + (factor_text(chosen[0][3], chosen[1]) if chosen[1] is not None else "")
    plot_loss_by_position(series, run_dir / LOSS_BY_POSITION_PNG, train_len=train_len,
                          title=f"{label}: loss by position ({view})")
    write_loss_by_position_csv(run_dir, rows)
