"""The report as text: the per-run summary (markdown, csv) and the grouped table in five formats.

``--format`` prints the grouped table as rich (terminal), markdown, csv, json or latex;
:data:`RENDERERS` maps each machine-readable format to its renderer.
"""

from __future__ import annotations

import csv
import json
import os
import re
from io import StringIO
from typing import Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posexp.reporting.lm_report import Cell, Group, Report
from posexp.reporting.formatting import (MAX_BANDS, MISSING, NOT_APPLICABLE, _csv, _display_path, _fmt_int, _fmt_num,
                                         _fmt_ratio, _fmt_settings, _fmt_view, _md, _plural, _short)
from posexp.reporting.selection import _ABSENT, _canon, _ratio_note, _show
from posexp.reporting.stats import Stat
from posexp.runs.layout import PPL_PLOT, SUMMARY_CSV


PPL_LABEL = "perplexity per token"


FORMATS = ("rich", "markdown", "csv", "json", "latex")


CSV_COLUMNS = [
    "label", "run_dir", "encoder", "base", "length", "multiple", "protocol", "scaling",
    "ppl", "ppl_low", "ppl_high", "loss", "applicable", "flags",
]


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
    lines += ["", f"![perplexity vs context length]({PPL_PLOT})", "", "## Runs", ""]

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


def _columns(report: Report) -> list[str]:
    keys = list(report.by) + ["n"] if report.by else ["run"]
    return [*keys, *(_length_header(report, n) for n in report.lengths), *(m.name for m in report.metrics), "flags"]


def _group_cells(report: Report, group: Group) -> list[tuple[str, Optional[Stat], int]]:
    """(text when not a number, stat, decimals) for every column of a group's line."""
    keys: list[tuple[str, Optional[Stat], int]]
    if report.by:
        keys = [(_show(group.key.get(k)), None, 0) for k in report.by]
        keys.append((str(group.n), None, 0))
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
    """Print the comparison as a Rich table, followed by the notes and any warnings.

    No number is split across lines or cut: number cells never wrap, and when the lengths
    and metrics do not fit the terminal side by side the table is printed in parts, each
    repeating the run (or ``--by``) columns.
    """
    console = console or Console()
    columns = _columns(report)
    n_keys = len(report.by) + 1 if report.by else 1
    lines = [_group_cells(report, group) for group in report.groups]
    numbers = list(range(n_keys, len(columns) - 1))  # lengths and metrics; the last column is the flags
    parts: list[list[int]] = []
    for i in numbers:
        if parts and _ReportTable(report, columns, lines, n_keys, parts[-1] + [i]).width_fits(console):
            parts[-1].append(i)
        else:
            parts.append([i])
    parts = parts or [[]]  # no lengths or metrics at all: the keys and flags still make a table
    for k, part in enumerate(parts):
        console.print(_ReportTable(report, columns, lines, n_keys, part, title=k == 0,
                                   flags=k == len(parts) - 1).table)
    for note in _table_notes(report)[1:] if report.by or report.metrics else []:
        console.print(Text(note, style="dim"))
    for warning in report.warnings:
        # one line each, however narrow the terminal: a warning is read (and grepped) whole
        console.print(Text.assemble(("warning: ", "bold yellow"), warning), soft_wrap=True)


class _ReportTable:
    """The report's Rich table with the key columns and the number columns ``shown`` (and the flags)."""

    def __init__(self, report: Report, columns: list[str], lines: list, n_keys: int, shown: list[int],
                 title: bool = True, flags: bool = False):
        keep = [*range(n_keys), *shown, *([len(columns) - 1] if flags else [])]
        # No vertical rules: a dozen columns of "4.92 ±0.10" fit a normal terminal that way.
        self.table = Table(title=_title(report) if title else None, title_style="bold", header_style="bold",
                           box=box.SIMPLE_HEAD)
        for i in keep:
            name = columns[i]
            if i < n_keys and name != "n":
                # Keys keep their width (up to a point) on a narrow terminal; they wrap, the numbers never do.
                widest = max([len(name), *(len(line[i][0]) for line in lines)])
                self.table.add_column(name, overflow="fold", min_width=min(widest, 12))
            elif name == "flags":
                self.table.add_column(name, style="yellow", overflow="fold")
            else:
                self.table.add_column(name, justify="right", no_wrap=True)
        for group, line in zip(report.groups, lines):
            texts = []
            for i in keep:
                text, stat, decimals = line[i]
                # Text(), not str: labels like "model=[a,b]" would otherwise be parsed as Rich markup.
                texts.append(Text(text) if stat is None else
                             Text(_stat_text(stat, decimals, group, plus_minus=" ±"),
                                  style="" if stat.applicable else "dim"))
            self.table.add_row(*texts, style="yellow" if group.flags else None)

    def width_fits(self, console: Console) -> bool:
        """Whether the table fits ``console`` with its text columns at their narrowest and every number whole."""
        # Rich's own measure takes a number's narrowest as its longest word ("±0.12"), not the whole cell.
        needed = 1  # SIMPLE_HEAD: a one-space edge, then per column its content, two pads and a one-space divider
        for column in self.table.columns:
            texts = [str(column.header), *(str(cell) for cell in column.cells)]
            if column.no_wrap:
                width = max(len(t) for t in texts)
            else:
                width = max([column.min_width or 0, *(len(w) for t in texts for w in t.split())])
            needed += width + 3
        return needed <= console.width


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


def _length_header(report: Report, length: int) -> str:
    return f"{length} (train)" if length == report.train_len else str(length)


def _ppl_label(report: Report) -> str:
    """The y label and table unit; byte-level tokens are named as such so nobody reads them as words."""
    tokenizers = {row.run.info.get("tokenizer") for row in report.rows} - {None}
    if tokenizers == {"byte"}:
        return f"{PPL_LABEL} (byte-level tokens)"
    return PPL_LABEL
