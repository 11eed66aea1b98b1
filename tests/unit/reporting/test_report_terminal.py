"""A report's terminal table at any width: labels wrap at their spaces and never inside a word, and no column
(the flags last of all) is cut, whatever the terminal's width."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from posexp.reporting import report_main
from posexp.reporting.tables import Column, Section, Table, TableCell, rich_tables
from helpers.runs import make_run

LABELS = ["encoder=irope", "encoder=stickbreaking seed=1"]
FLAGS = "status: diverged; kept apart: not comparable"


def _printed(table: Table, width: int) -> str:
    """What a terminal ``width`` columns wide shows of ``table`` (no colour, nothing cropped)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, legacy_windows=False)
    for part in rich_tables(table, width):
        console.print(part, crop=False)
    return buf.getvalue()


def _table(compact: bool) -> Table:
    columns = [Column("run", label=True, min_width=12), *(Column(str(n)) for n in (64, 128, 256, 512, 1024)),
               Column("ratio"), Column("flags", label=True, last=True, min_width=12)]
    rows = [[TableCell(label), *(TableCell("3.45", beside="3.45 ±0.12", under="3.45\n±0.12") for _ in range(6)),
             TableCell(FLAGS)] for label in LABELS]
    return Table("perplexity", columns, [Section(rows)], keys=1, compact=compact)


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("width", range(50, 130, 3))
def test_no_word_is_cut_and_no_line_is_wider_than_the_terminal(width, compact):
    out = _printed(_table(compact), width)
    assert max(len(line) for line in out.splitlines()) <= width, out
    words = {w for text in (*LABELS, FLAGS) for w in text.split()}
    assert all(w in out.split() for w in words), out


def test_the_report_called_from_python_prints_its_table_with_columns_0(tmp_path, monkeypatch, capsys):
    """report_main without a console of the caller's builds its own: COLUMNS=0 made it zero characters wide, so that
    the table (and every warning) printed nothing at all."""
    make_run(tmp_path / "run", {128: 5.0, 256: 7.0})
    monkeypatch.setenv("COLUMNS", "0")
    report_main([tmp_path / "run"], out=tmp_path / "report")
    out = capsys.readouterr().out
    assert "Perplexity vs context length" in out and "5.00" in out and "7.00" in out, out


@pytest.mark.parametrize("width", range(40, 130, 3))
def test_a_comparison_keeps_its_group_labels_whole_where_they_fit_and_cuts_nothing_where_they_do_not(width):
    """The comparison table (whole: never in parts) folded ``encoder=learned`` into ``encoder=learne`` / ``d`` at 80
    columns, where the table fits with it whole."""
    from posexp.reporting.compare import comparison_table
    from posexp.reporting.difference import Difference
    from posexp.reporting.selection import parse_metric
    from posexp.reporting.table import Comparison

    differences = [Difference(group, "maxlen@10%", "encoder=rope", p_adjusted=0.4, n=2, difference=192.0,
                              low=-161.0, high=545.0, method="paired t", verdict="inconclusive")
                   for group in ("encoder=alibi", "encoder=learned")]
    comparison = Comparison("encoder=rope", [parse_metric("maxlen@10%")], ["encoder"], differences,
                            {"maxlen@10%": 0})
    out = _printed(comparison_table(comparison, method=False), width)
    assert max(len(line.rstrip()) for line in out.splitlines()) <= width, out  # nothing cut
    if width >= 80:
        assert "encoder=learned" in out.split() and "encoder=alibi" in out.split(), out


@pytest.mark.parametrize("width", range(40, 130, 3))
def test_a_comparison_wraps_its_verdicts_at_spaces_before_it_folds_a_label_inside_a_word(width):
    """At 80 columns the comparison folded ``encoder=learned`` into ``encoder=lear`` / ``ned`` and ``maxlen@rel80``
    into ``maxlen@rel8`` / ``0``, where the table fits with every label whole and ``not compared`` on two lines: Rich
    narrowed the widest label first, and the width of the table with its intervals beside was counted without
    its column dividers, so they were not set under their differences."""
    from posexp.reporting.compare import comparison_table
    from posexp.reporting.difference import Difference
    from posexp.reporting.selection import parse_metric
    from posexp.reporting.table import Comparison

    metrics = [parse_metric("maxlen@rel80", applies="accuracy"), parse_metric("ratio")]
    differences = [Difference("encoder=alibi", "maxlen@rel80", "encoder=rope", 64.0, 64.0, 64.0, 2, "paired t",
                              "better", relative=100.0, p_adjusted=0.0001),
                   Difference("encoder=learned", "ratio", "encoder=rope", reason="no value in this group")]
    comparison = Comparison("encoder=rope", metrics, ["encoder"], differences, {"maxlen@rel80": 0, "ratio": 3})
    out = _printed(comparison_table(comparison, method=False), width)
    assert max(len(line.rstrip()) for line in out.splitlines()) <= width, out  # nothing cut
    if width >= 79:
        assert {"encoder=learned", "encoder=alibi", "maxlen@rel80"} <= set(out.split()), out
