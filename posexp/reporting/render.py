"""The report as text: summary.md and report.md's perplexity report (one builder), summary.csv, and the grouped
table in five formats.

``--format`` prints the grouped table as rich (terminal), markdown, csv, json or latex;
:data:`RENDERERS` maps each machine-readable format to its renderer.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from functools import partial
from typing import Mapping, Optional, Sequence

from rich.console import Console
from rich.text import Text

from posexp.reporting.compare import (Comparison, best_cells, comparison_json, comparison_markdown, comparison_table,
                                      sweep_keys, verdict_lines)
from posexp.reporting.lm_report import Group, Report, group_and_compare
from posexp.reporting.formatting import (MAX_BANDS, MISSING, NOT_APPLICABLE, csv_cell, display_path, fmt_int, fmt_num,
                                         fmt_settings, fmt_value, fmt_view, md_escape, plural, short_id)
from posexp.reporting.selection import ABSENT, canon, parse_metric, show_value, config_value
from posexp.reporting.stats import CUT_NOTE, Stat
from posexp.reporting.tables import Column, Section, TableCell, rich_tables, to_markdown
from posexp.reporting import tables
from posexp.runs.layout import PPL_PLOT, SUMMARY_CSV
from posexp.runtime import terminal


PPL_LABEL = "perplexity per token"


FORMATS = ("rich", "markdown", "csv", "json", "latex")


CSV_COLUMNS = [
    "label", "run_dir", "encoder", "base", "seed", "length", "multiple", "protocol", "scaling",
    "ppl", "ppl_low", "ppl_high", "loss", "applicable", "flags",
]


def plot_series(report: Report, groups: bool = False) -> list[tuple]:
    """(label, lengths, values, lows, highs) per run (per group with ``groups``: its mean), the lows and highs None
    when there are more lines than :data:`MAX_BANDS`."""
    # the flags themselves are in summary.md
    lines = [(legend_label(report, g), g.cells) for g in report.groups] if groups else \
        [(legend_label(report, Group({}, row.label, [row], flags=row.flags)), row.cells) for row in report.rows]
    # A line with nothing applicable would only add an empty legend entry; the table explains it.
    lines = [(label, cells) for label, cells in lines if any(c.applicable for c in cells.values())]
    return [stat_series(label, cells, bands=len(lines) <= MAX_BANDS) for label, cells in lines]


def stat_series(label: str, cells: Mapping[int, Stat], bands: bool = True, per: float = 1.0) -> tuple:
    """(label, lengths, values, lows, highs) of one line of a figure: its cells' means, divided by ``per``; no lows
    and highs without ``bands``. Only lengths it was evaluated at: a None value means "not applicable", which would
    be wrong for a length never tried."""
    lengths = sorted(cells)
    shown = [cells[n] for n in lengths]
    scaled = lambda v: None if v is None else v / per  # noqa: E731
    return (label, lengths, [scaled(c.mean) if c.applicable else None for c in shown],
            [scaled(c.low) for c in shown] if bands else None, [scaled(c.high) for c in shown] if bands else None)


def plot_groups(report: Report, runs: Optional[list] = None) -> list[str]:
    """Per run (of ``runs``; default: those :func:`plot_series` draws), what colours its line: the values of the
    keys a sweep varies, so that its seeds share a colour, or the run itself when nothing varies but the seed."""
    if runs is None:
        runs = [row.run for row in report.rows if any(c.applicable for c in row.cells.values())]
    keys = sweep_keys([row.run for row in report.rows])
    return [" ".join(show_value(config_value(run, k)) for k in keys) or str(run.path) for run in runs]


def sweep_comparison(report: Report) -> Optional[Comparison]:
    """The comparison of a report built without ``--by``, grouped by what its runs' overrides vary (not the seed).

    What a sweep's own ``summary.md`` shows: ``base=100,1000,10000 seed=0,1,2`` compares the bases.
    """
    if report.by:
        return report.comparison
    keys = sweep_keys([row.run for row in report.rows])
    if not keys:
        return None
    grouped = replace(report, by=keys, warnings=[], comparison=None)
    group_and_compare(grouped)
    return grouped.comparison


def render_markdown(report: Report, out_dir: str | os.PathLike | None = None,
                    figures: Optional[Sequence[tuple[str, str, str]]] = None) -> str:
    """The text of ``summary.md``: a line per run, its figure, the comparison over what a sweep varies and the
    runs. With ``figures`` (file, title, caption), the text of ``report.md``: the grouped table with its notes, the
    comparison with the reference group, a section per figure and the runs with their groups. Folders are shown
    relative to ``out_dir`` when inside it."""
    grouped = figures is not None
    n_runs = len(report.rows)
    compared = f"{n_runs} run{'s' if n_runs != 1 else ''}"
    if grouped:
        title = "Positional encodings: perplexity vs context length"
        compared += f" in {len(report.groups)} groups by {', '.join(report.by)}" if report.by else ""
        comparison = report.comparison
        blocks = [to_markdown(lm_table(report)).rstrip("\n")]  # the table and its notes
    else:
        title = "Perplexity vs context length"
        comparison = sweep_comparison(report)
        columns = [Column("run", label=True), *(Column(_length_header(report, n)) for n in report.lengths),
                   Column("ratio"), Column("flags", label=True)]
        blocks = [to_markdown(tables.Table("", columns, [Section([[
            TableCell(row.label), *(TableCell(row.cells.get(n, Stat()).text()) for n in report.lengths),
            TableCell(fmt_value(row.ratio)), TableCell("; ".join(row.flags))] for row in report.rows])])).rstrip("\n"),
            f"Values are {ppl_label(report)} on held-out text, lower is better; "
            f'"{NOT_APPLICABLE}" = the encoding cannot run at that length, "{MISSING}" = not evaluated. '
            + parse_metric("ratio").describe(report)]
        if report.other_views:
            views = "; ".join(fmt_view(*view) for view in report.other_views)
            blocks.append(f"Also in the results but not in this table (see {SUMMARY_CSV}): {views}.")
        blocks.append(f"![perplexity vs context length]({PPL_PLOT})")
    blocks += ["\n".join(comparison_markdown(comparison))] if comparison is not None else []
    blocks += [f"## {name}\n\n![{name.lower()}]({file})\n\n{caption}" for file, name, caption in figures or ()]
    blocks += ["## Runs", to_markdown(runs_table(report, out_dir, groups=grouped)).rstrip("\n")]
    return "\n".join([f"# {title}", "", *head_lines(report, compared), "\n\n".join(blocks)]) + "\n"


def runs_table(report: Report, out_dir: str | os.PathLike | None, groups: bool = False) -> tables.Table:
    """The ``## Runs`` table of summary.md and (with each run's group) report.md: a line per run, its folder
    relative to ``out_dir``, its settings and its training."""
    names = ["run", *(["group"] if groups else []), "folder", "encoder", "base", "train len", "seed", "params",
             "steps", "final loss", "status"]
    columns = [Column(name, label=name in ("run", "group", "folder", "encoder", "status"), code=name == "folder")
               for name in names]
    rows = []
    for group in report.groups if groups else [Group({}, "", report.rows)]:
        for row in group.rows:
            info, train = row.run.info, row.run.info.get("train") or {}
            rows.append([TableCell(str(text)) for text in (
                row.label, *([group.label] if groups else []), display_path(row.run.path, out_dir),
                info.get("encoder", ""), fmt_num(info.get("base")), fmt_num(info.get("train_len")),
                fmt_num(info.get("seed")), fmt_int(info.get("params")), fmt_int(train.get("steps")),
                fmt_num(train.get("final_loss"), ".3f"), row.run.status)])
    return tables.Table("", columns, [Section(rows)])


def head_lines(report: Report, compared: str) -> list[str]:
    """The lines a summary.md and a report.md start with after their title: what was compared, the shared
    overrides (and filters), the settings and the warnings."""
    lines = [f"Compared {compared} ({plural('encoder', report.encoders)}: {', '.join(report.encoders)})."]
    if report.filters:
        lines.append(f"Only runs with {' and '.join(f'`{f}`' for f in report.filters)}.")
    if report.shared_overrides:
        lines.append(f"Overrides shared by all runs: {', '.join(f'`{o}`' for o in report.shared_overrides)}.")
    lines += ["", *(f"- {item}" for item in settings_note(report)), ""]
    for warning in report.warnings:
        lines += [f"> **Warning:** {md_escape(warning)}", ">"]
    if report.warnings:
        lines[-1] = ""
    return lines


def render_csv(report: Report, out_dir: str | os.PathLike | None = None) -> str:
    """The text of ``summary.csv``: one line per run and evaluated row, every protocol included.

    Besides the fixed columns, one per ``--by`` key (without ``--by``: per key a sweep varies), so a
    spreadsheet can group the rows as the report did.
    """
    keys = [k for k in (report.by or sweep_keys([row.run for row in report.rows])) if k not in CSV_COLUMNS]
    # a windowed row (eval.window) says so in two more columns, only in a file that has one
    windowed = any(r.get("window") is not None for row in report.rows for r in row.run.rows)
    scaling_at = CSV_COLUMNS.index("scaling") + 1
    columns = CSV_COLUMNS[:scaling_at] + (["window", "sinks"] if windowed else []) + CSV_COLUMNS[scaling_at:]
    records = [[*columns[:5], *keys, *columns[5:]]]
    for row in report.rows:
        key_cells = [csv_cell(None if (v := config_value(row.run, k)) is ABSENT else v) for k in keys]
        for r in sorted(row.run.rows, key=lambda r: (float(r["length"]), str(r.get("protocol")), str(r.get("scaling")),
                                                     r.get("window") or 0, r.get("sinks") or 0)):
            run = {"label": row.label, "run_dir": display_path(row.run.path, out_dir), "length": int(r["length"]),
                   **{k: row.run.info.get(k) for k in ("encoder", "base", "seed")}, "flags": "; ".join(row.flags),
                   "applicable": bool(r.get("applicable", r.get("ppl") is not None))}
            line = [csv_cell(run[c] if c in run else r.get(c)) for c in columns]
            records.append([*line[:5], *key_cells, *line[5:]])
    return tables.to_csv(tables.Table("summary.csv", [], [], csv=records))


def table_notes(report: Report) -> list[str]:
    notes = [f"Values are {ppl_label(report)} on held-out text (lower is better); "
             f'"{NOT_APPLICABLE}" = the encoding cannot run at that length, "{MISSING}" = not evaluated.']
    if report.by:
        notes.append("With n ≥ 2: mean over the group's runs ± the half-width of its 95% t-interval "
                     "(Student 1908, n − 1 degrees of freedom); n = 1 shows the run's value.")
    if len(report.groups) > 1:
        notes.append("Bold: the best value of its column (lowest perplexity, ratio and auc; highest maxlen and "
                     "gain); ties are all bold.")
    if any(s.cut for g in report.groups for s in g.metrics.values()):
        notes.append(CUT_NOTE.format(bounds="0 tokens (a length)"))
    notes += [m.describe(report) for m in report.metrics]
    return notes


def print_report(report: Report, console: Console | None = None) -> None:
    """Print the comparison as a Rich table, followed by the notes and any warnings.

    No number is split across lines or cut: number cells never wrap, and when the lengths
    and metrics do not fit the terminal side by side the table is printed in parts, each
    repeating the run (or ``--by``) columns.
    """
    console = console or terminal.console()
    for table in rich_tables(lm_table(report), console.width):
        console.print(table)
    for note in table_notes(report)[1:] if report.by or report.metrics else []:
        console.print(Text(note, style="dim"))
    if report.comparison is not None:
        print_comparison(report.comparison, console)
    elif (comparison := sweep_comparison(report)) is not None:
        print_comparison(comparison, console, grouped=True)
    for warning in report.warnings:
        # one line each, however narrow the terminal: a warning is read (and grepped) whole
        console.print(Text.assemble(("warning: ", "bold yellow"), warning), soft_wrap=True)


def print_comparison(comparison: Comparison, console: Console, what: str = "", grouped: bool = False) -> None:
    """The comparison with the reference group: a table of differences (its title after ``what``: ``task copy:
    ``), then one plain line per metric. ``grouped``: a report of a sweep's runs, one line each, compared over what
    the sweep varies (as summary.md has it): which keys grouped them, then the lines alone."""
    if grouped:
        keys = ",".join(comparison.by)
        console.print(Text(f"{what}Grouped by {keys} (what the runs' overrides vary); the table per group: posexp "
                           f"report ... --by {keys}", style="dim"))
    else:
        table = comparison_table(comparison, method=False)  # the method goes in the title: 80 columns
        for part in rich_tables(replace(table, title=what + table.title[0].lower() + table.title[1:]) if what
                                else table, console.width):
            console.print(part)
    for line in verdict_lines(comparison):
        console.print(Text(line))


def _csv_rows(report: Report, keys: list[str], stats: list[str], numbers: list[list[Stat]],
              best: list[list[str]]) -> list[list[str]]:
    """The grouped table's csv: value, 95% low/high and n per length and metric (``stats``: their names;
    ``numbers``: per group, its statistics; ``best``: per group, the columns where it has the best value). A metric
    named as a length's column (``--metric ppl@1024`` where 1024 is evaluated) is that column, written once."""
    keep = [j for j, name in enumerate(stats) if name not in stats[:j]]
    stats, numbers = [stats[j] for j in keep], [[line[j] for j in keep] for line in numbers]
    rows = [[*keys, *(f"{s}{suffix}" for s in stats for suffix in ("", "_low", "_high", "_n")),
             "flags", "runs", "seeds", "best"]]
    for g, group in enumerate(report.groups):
        key_cells = [csv_cell(None if (v := group.key.get(k)) is ABSENT else v) for k in report.by] + \
            [str(group.n)] if report.by else [group.label]
        values = []
        for stat in numbers[g]:
            ok = bool(stat.applicable)
            values += [csv_cell(stat.mean if ok else None), csv_cell(stat.low if ok else None),
                       csv_cell(stat.high if ok else None), str(stat.n)]
        rows.append([*key_cells, *values, "; ".join(group.flags),
                     " ".join(row.run.path.as_posix() for row in group.rows),
                     " ".join(csv_cell(row.run.info.get("seed")) for row in group.rows), " ".join(best[g])])
    return rows


def _json_document(report: Report, best: list[list[str]]) -> dict:
    """The report as JSON: settings, metric definitions, groups with their runs."""
    name, fingerprint = report.corpus
    return {
        "by": list(report.by),
        "protocol": report.protocol, "scaling": report.scaling,
        **({} if report.window is None else {"window": report.window[0], "sinks": report.window[1]}),
        "train_len": report.train_len,
        "corpus": name, "corpus_fingerprint": fingerprint, "eval_settings": report.eval_settings,
        "lengths": report.lengths,
        "metrics": {m.name: m.describe(report) for m in report.metrics},
        "groups": [{
            "label": group.label, "key": {k: (None if v is ABSENT else v) for k, v in group.key.items()},
            "n": group.n, "train_len": group.train_len,
            "ppl": {str(n): group.cells[n].as_dict() for n in report.lengths if n in group.cells},
            "metrics": {k: v.as_dict() for k, v in group.metrics.items()},
            "flags": group.flags,
            "runs": [row.run.path.as_posix() for row in group.rows],
            "seeds": [row.run.info.get("seed") for row in group.rows],
            "best": best[g],
        } for g, group in enumerate(report.groups)],
        "comparison": None if report.comparison is None else comparison_json(report.comparison),
        "warnings": report.warnings,
    }


def lm_table(report: Report) -> tables.Table:
    """The grouped perplexity table as a :class:`~posexp.reporting.tables.Table`: a line per group (or run), its
    perplexity at every length and its metrics, each cell a statistic; the table's notes define them. Bold: the
    best mean of each number column (the lowest perplexity, ratio and auc, the highest maxlen and gain); ties are
    all marked, lines kept apart never."""
    keys = [*report.by, "n"] if report.by else ["run"]
    names = [*keys, *(_length_header(report, n) for n in report.lengths), *(m.name for m in report.metrics), "flags"]
    columns = [Column(c, label=i < len(keys) and c != "n" or c == "flags", min_width=12, last=c == "flags")
               for i, c in enumerate(names)]
    stats = [[*(group.cells.get(n, Stat()) for n in report.lengths),
              *(group.metrics.get(m.name, Stat()) for m in report.metrics)] for group in report.groups]
    decimals = [2] * len(report.lengths) + [m.decimals for m in report.metrics]
    higher = [False] * len(report.lengths) + [m.higher_is_better for m in report.metrics]
    best = best_cells(report.groups, stats, higher, decimals)
    stat_names = [f"ppl@{n}" for n in report.lengths] + [m.name for m in report.metrics]
    # a metric named as a length's column (--metric ppl@1024) is marked once
    marks = [list(dict.fromkeys(stat_names[j] for j in range(len(higher)) if (g, j) in best))
             for g in range(len(report.groups))]
    rows = []
    for g, group in enumerate(report.groups):
        text = lambda stat, d, plus_minus=" ± ": stat.text(d, plus_minus, of=group.n)  # noqa: E731
        key_texts = [*(show_value(group.key.get(k)) for k in report.by), str(group.n)] if report.by else [group.label]
        rows.append([*(TableCell(k) for k in key_texts),
                     *(TableCell(text(s, d), s, (g, j) in best,
                                 text(s, d, r" \pm ") if s.applicable and s.mean is not None else None,
                                 text(s, d, " ±"), text(s, d, "\n±")) for j, (s, d) in enumerate(zip(stats[g], decimals))),
                     TableCell("; ".join(group.flags))])
    flagged = {g for g, group in enumerate(report.groups) if group.flags}
    return tables.Table(_title(report), columns, [Section(rows, flagged=flagged)], notes=table_notes(report),
                        csv=_csv_rows(report, keys, stat_names, stats, marks), json=_json_document(report, marks),
                        keys=len(keys), compact=True)


def render_lm(report: Report, fmt: str) -> str:
    """The grouped table in ``fmt`` (``--format``): markdown without its notes (``report.md`` gives them), LaTeX
    with the settings as its first comment; csv: value, 95% low/high and n per length and metric; json: the whole
    report (settings, metric definitions, groups with their runs, the comparison)."""
    table = lm_table(report)
    if fmt == "markdown":
        table = replace(table, notes=[])
    elif fmt == "latex":
        others = report.other_train_lens()
        head = (f"posexp report: {ppl_label(report)}, protocol "
                f"{fmt_view(report.protocol, report.scaling, report.window)}, training length {report.train_len}"
                + (f" ({others})" if others else ""))
        table = replace(table, notes=[head, *table.notes[1:]])
    return tables.render(table, fmt)


RENDERERS = {fmt: partial(render_lm, fmt=fmt) for fmt in FORMATS[1:]}
render_table_markdown, render_table_csv, render_json, render_latex = (
    RENDERERS[fmt] for fmt in ("markdown", "csv", "json", "latex"))


def legend_label(report: Report, group: Group) -> str:
    """Name a line by its encoding and base first; the table has the rest."""
    encoders = {str(row.run.info.get("encoder")) for row in group.rows}
    bases = {canon(row.run.info.get("base")) for row in group.rows}
    parts = []
    if len(encoders) == 1:
        parts.append(encoders.pop())
    if len(bases) == 1 and group.rows[0].run.info.get("base") is not None:
        parts.append(f"base {show_value(group.rows[0].run.info.get('base'))}")
    rest = [tok for tok in group.label.split(" ") if not re.match(r"(encoder|base)=", tok)]
    label = ", ".join(parts + ([" ".join(rest)] if rest and " ".join(rest) != "default" else []))
    if group.n > 1:
        label += f" (n={group.n})"
    return label + (" (!)" if group.flags else "")


def _title(report: Report) -> str:
    parts = [f"protocol {fmt_view(report.protocol, report.scaling, report.window)}"]
    if report.train_len is not None:
        parts.append(f"train length {report.train_len}")
    return "Perplexity vs context length (" + ", ".join(parts) + ")"


def settings_note(report: Report) -> list[str]:
    name, fingerprint = report.corpus
    return [
        f"Corpus: {md_escape(name or 'unknown')} (fingerprint `{short_id(fingerprint)}`)",
        f"Protocol: {md_escape(fmt_view(report.protocol, report.scaling, report.window))}",
        f"Eval settings: {md_escape(fmt_settings(report.eval_settings))}",
        f"Training length: {report.train_len if report.train_len is not None else 'unknown'} tokens"
        + (f" ({md_escape(others)}: trained at another length, each ratio taken at its own)"
           if (others := report.other_train_lens())
           else ""),
    ]


def _length_header(report: Report, length: int) -> str:
    return f"{length} (train)" if length == report.train_len else str(length)


def ppl_label(report: Report) -> str:
    """The y label and table unit; byte-level tokens are named as such so nobody reads them as words."""
    tokenizers = {row.run.info.get("tokenizer") for row in report.rows} - {None}
    if any(row.per_byte for row in report.rows):
        return "perplexity per UTF-8 byte (2^bits per byte; the runs' tokenizers differ)"
    if tokenizers == {"byte"}:
        return f"{PPL_LABEL} (byte-level tokens)"
    return PPL_LABEL
