"""One table model for every table a report prints, and each output format rendered once.

A report's tables (the perplexity table, the pivot, the context-extension table, the task tables, the
training-curve table and the comparison; see :mod:`.render`, :mod:`.pivot`, :mod:`.extension`, :mod:`.task_report`,
:mod:`.curve_report`, :mod:`.compare`) are each built as one :class:`Table`: columns, sections of lines of
:class:`TableCell` (a cell's text and, for a number, the statistic behind it), a caption, notes and the
records its csv and json carry. :func:`render` prints any of them as markdown, csv, json or latex, and
:func:`rich_tables` as terminal tables, each with one escaper per format (:func:`md_escape`,
:func:`latex_escape`; Rich's ``Text`` for the terminal).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

from posexp.reporting.formatting import latex_escape, md_escape
from posexp.reporting.stats import Stat

@dataclass(frozen=True)
class Column:
    """A column: ``label`` columns are left-aligned, escaped, and wrap on a terminal (at ``min_width`` at the
    narrowest); the others hold numbers, right-aligned and never cut (``wrap``: may break at a space)."""

    name: str
    label: bool = False
    min_width: int = 0
    wrap: bool = False
    short: Optional[str] = None  # the header on a terminal, where width is scarce
    last: bool = False  # on a terminal: in the last part only, and not counted when fitting the others (flags)
    code: bool = False  # a label set as code (a folder): in markdown a code span, not escaped
    escape: bool = False  # a number column escaped in markdown too (an interval's brackets)


@dataclass
class TableCell:
    """One cell: its text and, for a number, the statistic it shows; ``best``: the best of its column."""

    text: str
    stat: Optional[Stat] = None
    best: bool = False
    math: Optional[str] = None  # the number in LaTeX math (``3.44 \\pm 0.34``), when it is set as math
    beside: Optional[str] = None  # on a terminal: the number with its interval beside it (``3.44 ±0.34``)
    under: Optional[str] = None  # on a terminal: with the interval under it (``3.44\n±0.34``), where width is short


@dataclass
class Section:
    """Lines of a table. A section with a ``heading`` is a table of its own (under that heading; ``preamble``:
    lines of markdown before it); sections without one are groups of lines, set apart by a rule in LaTeX."""

    rows: list[list[TableCell]]
    heading: Optional[str] = None
    preamble: list[str] = field(default_factory=list)
    title: Optional[str] = None  # the terminal table's title, when not the heading
    columns: Optional[list[Column]] = None  # a section with a heading: its own columns, when not the table's
    flagged: set[int] = field(default_factory=set)  # lines marked (yellow on a terminal), by index


@dataclass
class Table:
    """A report's table, whatever it shows.

    Attributes:
        title: the terminal table's title.
        columns: the columns, the leading ``keys`` of them repeated in each part of a terminal table too wide for
            the terminal.
        sections: the lines.
        caption: what the table shows, in a sentence or two (above the markdown, the terminal table's caption with
            its notes, a LaTeX float's ``\\caption``).
        notes: more sentences (definitions, verdicts): under the markdown, comments above the LaTeX.
        warnings: under the markdown table; printed apart on a terminal.
        csv: the csv's header and rows (a record per value: the numbers unrounded).
        json: the json document.
        keys: how many leading columns name the line.
    """

    title: str
    columns: list[Column]
    sections: list[Section]
    caption: str = ""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    csv: list[list[Any]] = field(default_factory=list)
    json: Any = None
    keys: int = 1
    compact: bool = False  # on a terminal: no vertical rules, bold title and headers, intervals under their means
    # where they do not fit beside them
    whole: bool = False  # on a terminal: never in parts, its labels folding anywhere instead; intervals under their
    # values when the lines do not fit one each


def render(table: Table, fmt: str) -> str:
    """``table`` as ``markdown``, ``csv``, ``json`` or ``latex`` text."""
    return {"markdown": to_markdown, "csv": to_csv, "json": to_json, "latex": to_latex}[fmt](table)


def to_csv(table: Table) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(table.csv)
    return buf.getvalue()


def to_json(table: Table) -> str:
    return json.dumps(table.json, indent=2, default=str) + "\n"


def _md_cell(cell: TableCell, column: Column) -> str:
    text = f"`{cell.text}`" if column.code else md_escape(cell.text) if column.label or column.escape else cell.text
    return f"**{text}**" if cell.best else text


def to_markdown(table: Table, level: int = 2) -> str:
    """``table`` as markdown, a section with a heading under a heading of ``level`` (``##``: a section of a document
    whose title is ``#``)."""
    lines = [table.caption, ""] if table.caption else []
    columns = table.columns
    for k, section in enumerate(table.sections):
        if section.heading is not None:
            lines += [*([""] if k else []), f"{'#' * level} {section.heading}", "", *section.preamble]
        if k == 0 or section.heading is not None:
            columns = section.columns or table.columns
            lines += ["| " + " | ".join(md_escape(c.name) for c in columns) + " |",
                      "|" + "|".join(" --- " if c.label else " ---: " for c in columns) + "|"]
        lines += ["| " + " | ".join(_md_cell(cell, c) for cell, c in zip(row, columns)) + " |"
                  for row in section.rows]
    notes = [*table.notes, *(f"warning: {w}" for w in table.warnings)]
    lines += ["", *(f"- {md_escape(note)}" for note in notes)] if notes else []
    return "\n".join(lines) + "\n"


def to_latex(table: Table) -> str:
    """booktabs ``tabular``s (one per section with a heading), the notes as comments above; a table with a caption
    is a float with its ``\\caption``. A column empty in every line is left out: it only takes width in a paper."""
    out = [f"% {' '.join(note.split())}" for note in table.notes]
    out.append("% needs \\usepackage{booktabs}")
    out += [r"\begin{table}[t]", r"\centering"] if table.caption else []
    for k, group in enumerate(_tabulars(table)):
        columns = group[0].columns or table.columns
        rows = [row for section in group for row in section.rows]
        keep = [i for i in range(len(columns)) if i < table.keys or any(row[i].text for row in rows)]
        if k:
            out += [r"\bottomrule", r"\end{tabular}"]
        if group[0].heading is not None:
            out.append(f"% {latex_escape(group[0].heading)}")
        out += [rf"\begin{{tabular}}{{{''.join('l' if columns[i].label else 'r' for i in keep)}}}", r"\toprule",
                " & ".join(latex_escape(columns[i].name) for i in keep) + r" \\", r"\midrule"]
        for j, section in enumerate(group):
            out += [r"\midrule"] if j and section.rows else []
            out += [" & ".join(_latex_cell(row[i]) for i in keep) + r" \\" for row in section.rows]
    out += [r"\bottomrule", r"\end{tabular}"]
    out += [rf"\caption{{{latex_escape(table.caption)}}}", r"\end{table}"] if table.caption else []
    return "\n".join(out) + "\n"


def _tabulars(table: Table) -> list[list[Section]]:
    """The sections of each table of its own: a section with a heading starts one."""
    groups: list[list[Section]] = []
    for section in table.sections:
        if section.heading is not None or not groups:
            groups.append([section])
        else:
            groups[-1].append(section)
    return groups


def _latex_cell(cell: TableCell) -> str:
    if cell.math is None:
        return f"\\textbf{{{latex_escape(cell.text)}}}" if cell.best else latex_escape(cell.text)
    number = cell.math.replace("−", "-")  # math mode sets its own minus from a hyphen
    return (f"\\mathbf{{{number}}}" if cell.best else number).join("$$")


def _rich_table(table: Table, section: Section, shown: list[int], title: Optional[str], caption: Optional[str],
                stacked: bool = False, room: Optional[int] = None, fold: bool = False) -> Any:
    """``room``: the width the last columns (flags) may take, where Rich's own narrowing would not wrap them;
    ``fold``: a whole table's labels fold anywhere, their words too (where it does not fit with them whole)."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    if table.compact:
        out = RichTable(title=title, caption=caption, title_style="bold", header_style="bold", box=box.SIMPLE_HEAD,
                        pad_edge=table.whole or not stacked)
    else:
        out = RichTable(title=title, caption=caption)
    for i in shown:
        column = (section.columns or [])[i]
        name = column.short or column.name
        # a label wraps at its spaces, never inside a word: no narrower than its longest word
        word = max([len(w) for row in section.rows for w in row[i].text.split()] or [0])
        if column.label and column.last:
            out.add_column(name, style="yellow", overflow="fold", min_width=word or None,
                           max_width=max(room, word, len(name)) if room else None)
        elif column.label:
            widest = max([len(column.name), *(len(row[i].text) for row in section.rows)])
            out.add_column(name, overflow="fold",  # whole: a label folds inside a word only where it must
                           min_width=(None if fold else min(word, column.min_width)) if table.whole else
                           max(word, min(widest, column.min_width)) or None)
        else:  # stacked: a long header on two lines too ("128\n(train)", "maxlen\n@10%")
            header = name.replace(" (", "\n(").replace("@", "\n@") if stacked and not table.whole else name
            out.add_column(header, justify="right", no_wrap=not column.wrap,
                           overflow="fold" if column.wrap or table.whole else "ellipsis")
    for r, row in enumerate(section.rows):
        texts = []
        for i in shown:
            cell = row[i]
            look = "bold green" if cell.best else "dim" if cell.stat is not None and not cell.stat.applicable else ""
            # Text(), not str: a label like "model=[a,b]" would otherwise be read as Rich markup
            texts.append(Text((cell.under if stacked else cell.beside) or cell.text, style=look))
        out.add_row(*texts, style="yellow" if r in section.flagged else None)
    return out


def _joined(group: list[Section], table: Table) -> Section:
    """The sections of one table as one: their lines, and the marks of each at its place among them."""
    joined = Section([], group[0].heading, title=group[0].title, columns=group[0].columns or table.columns)
    for section in group:
        joined.flagged |= {len(joined.rows) + i for i in section.flagged}
        joined.rows += section.rows
    return joined


def table_width(table: Any) -> int:
    """The narrowest width a Rich table prints at with nothing cut: its no-wrap columns (numbers) at their
    longest cell, the others (labels, which wrap) at their longest word or ``min_width``."""
    # Rich's own measure takes a number's narrowest as its longest word ("±0.12"), not the whole cell.
    needed = 1  # an edge, then per column its content, two pads and a divider (rules or SIMPLE_HEAD's spaces)
    for column in table.columns:
        texts = [str(column.header), *(str(cell) for cell in column.cells)]
        if column.no_wrap:
            width = max(len(line) for t in texts for line in t.split("\n"))  # a stacked cell: its longest line
        else:
            width = max([column.min_width or 0, *(len(w) for t in texts for w in t.split())])
        needed += width + 3
    return needed


def _fits(rich_table: Any, width: int) -> bool:
    """Whether a Rich table prints within ``width`` with nothing cut: by the measure of :func:`table_width`, and as
    Rich lays it out (its narrowing of wrapping columns stops short of some that could wrap further)."""
    return table_width(rich_table) <= width and _prints_within(rich_table, width)


def _label_widths(rich_table: Any, width: int) -> dict[int, int]:
    """Widths of a Rich table's wrapping columns (labels) that fit it within ``width``: the widest narrowed first, as
    Rich narrows, but none below its longest word (Rich folds the widest label inside a word, though another would
    wrap at its spaces)."""
    fixed, natural, least = 1, {}, {}  # an edge, then per column two pads and a divider (as table_width counts)
    for i, column in enumerate(rich_table.columns):
        lines = [line for t in (str(column.header), *(str(c) for c in column.cells)) for line in t.split("\n")]
        fixed += 3
        if column.no_wrap:
            fixed += max(map(len, lines))
        else:
            natural[i] = max(map(len, lines))
            least[i] = max([column.min_width or 0, *(len(w) for line in lines for w in line.split())])
    while sum(natural.values()) > width - fixed and (wider := [i for i in natural if natural[i] > least[i]]):
        natural[max(wider, key=lambda i: natural[i])] -= 1
    return natural


def _prints_within(rich_table: Any, width: int) -> bool:
    """Whether Rich lays a table out within ``width``, nothing cut."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, legacy_windows=False).print(rich_table, crop=False)
    return max(len(line.rstrip()) for line in buf.getvalue().splitlines() or [""]) <= width  # a pad may go


def rich_tables(table: Table, width: int) -> list[Any]:
    """The Rich tables of ``table`` for a terminal ``width`` wide: one per section with a heading (titled by it),
    each in parts where its columns do not fit side by side, every part repeating the key columns; labels wrap
    at spaces, numbers are never cut. A compact table first sets its intervals under their means when the
    whole of it does not fit with them beside."""
    groups = [_joined(group, table) for group in _tabulars(table)]
    keys, out = list(range(table.keys)), []
    caption = "\n".join([table.caption, *table.notes]) if table.caption else None
    for g, section in enumerate(groups):
        title = section.title or section.heading or table.title
        columns = section.columns or []
        numbers = [i for i in range(table.keys, len(columns)) if not columns[i].last]
        last = [i for i in range(table.keys, len(columns)) if columns[i].last]
        if table.whole:  # its lines one each, at their natural width, or its intervals under their values
            natural = 1 + sum(max([len(c.name), *(len(row[i].text) for row in section.rows)]) + 3  # as table_width
                              for i, c in enumerate(columns))
            whole = partial(_rich_table, table, section, list(range(len(columns))), title,
                            caption if g == len(groups) - 1 else None, natural > width)
            built = whole()
            if not _prints_within(built, width) and table_width(built) <= width:  # its labels fit whole, wrapped
                for i, label_width in _label_widths(built, width).items():
                    built.columns[i].width = label_width
            out.append(built if _prints_within(built, width) else whole(fold=True))
            continue
        stacked = table.compact and table_width(_rich_table(table, section, keys + numbers + last, None, None)) > width
        parts: list[list[int]] = []
        for i in numbers:
            if parts and _fits(_rich_table(table, section, keys + parts[-1] + [i], None, None, stacked), width):
                parts[-1].append(i)
            else:
                parts.append([i])
        parts = parts or [[]]
        if last and parts[-1] and not _fits(_rich_table(table, section, keys + parts[-1] + last, None, None, stacked),
                                            width):
            parts.append([])  # the flags do not fit beside the last numbers: a part of their own, never cut
        for k, part in enumerate(parts):
            end = k == len(parts) - 1
            room = width - table_width(_rich_table(table, section, keys + part, None, None, stacked)) - 3 * len(last)
            out.append(_rich_table(table, section, keys + part + (last if end else []), title if k == 0 else None,
                                   caption if end and g == len(groups) - 1 else None, stacked,
                                   room // len(last) if end and last else None))
    return out
