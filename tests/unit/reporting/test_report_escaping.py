"""Every table kind, through every text format, with labels holding & # % _ \\ $: LaTeX escapes each with the one
escaper (posexp.reporting.formatting.latex_escape), markdown keeps its table whole, csv and json keep the text."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from posexp.reporting import build_report, render_json
from posexp.reporting.options import ReportOptions
from posexp.reporting.summary import report_main
from helpers import no_figure as _no_figure
from helpers.runs import make_task_run
from helpers.runs import ppl_rows as _ppl_rows
from helpers.runs import write_run as _write_run

NASTY = "a&b#c%d_e\\f$g"
LATEX = r"a\&b\#c\%d\_e\textbackslash{}f\$g"


def _runs(root: Path) -> dict[str, tuple[list[Path], dict]]:
    lm = root / "lm"
    for seed in (0, 1):
        _write_run(lm / str(seed), _ppl_rows({128: 3.0 + seed / 10, 256: 3.5 + seed / 10}, 128),
                   [f"encoder={NASTY}", f"seed={seed}"], NASTY, seed=seed, config={"data": {"note": NASTY}})
    parent = _write_run(root / "ext" / "parent", _ppl_rows({128: 3.0, 256: 4.0}, 128), [f"encoder={NASTY}"], NASTY)
    _write_run(root / "ext" / "ft", _ppl_rows({128: 3.1, 256: 3.3}, 128), [f"encoder={NASTY}"], NASTY,
               extra={"parent": str(parent.resolve()), "scaling": None, "finetune": {"steps": 10}})
    make_task_run(root / "task" / "0", {64: 1.0, 128: 0.5}, encoder=NASTY)
    return {"perplexity": ([lm], {"by": "data.note"}), "pivot": ([lm], {"by": "data.note", "cols": "seed"}),
            "extension": ([root / "ext"], {}), "task": ([root / "task"], {})}


@pytest.mark.parametrize("kind", ["perplexity", "pivot", "extension", "task"])
@pytest.mark.parametrize("fmt", ["latex", "markdown", "csv", "json"])
def test_labels_with_special_characters_survive_every_format(tmp_path, kind, fmt, monkeypatch):
    import posexp.plots.accuracy
    import posexp.plots.perplexity

    for module in (posexp.plots.perplexity, posexp.plots.accuracy):  # the text is tested, not the figures
        for name in dir(module):
            if name.startswith("plot_"):
                monkeypatch.setattr(module, name, _no_figure)
    paths, options = _runs(tmp_path)[kind]
    out = io.StringIO()
    report_main(paths, out=tmp_path / "out", options=ReportOptions(fmt=fmt, **options),
                console=Console(file=out, width=200), err_console=Console(file=io.StringIO()))
    text = out.getvalue()
    if fmt == "latex":
        assert LATEX in text
        for line in text.splitlines():
            if not line.startswith("%"):  # outside comments, no special character is left unescaped
                assert NASTY not in line and "$g" not in line.replace(r"\$g", "")
    elif fmt == "markdown":
        rows = [line for line in text.splitlines() if line.startswith("|") and NASTY[:3] in line.replace("\\", "")]
        assert rows, text
        header = next(line for line in text.splitlines() if line.startswith("|"))
        assert all(line.count(" | ") == header.count(" | ") for line in rows)  # no cell split or merged
        assert r"d\_e\\f\$g" in text  # _ \ $ escaped: no emphasis, escape or math ($...$) is read into the label
    elif fmt == "csv":
        assert any(NASTY in cell for row in csv.reader(io.StringIO(text)) for cell in row)
    else:
        assert any(NASTY in value for value in _strings(json.loads(text)))


def _strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in (*_strings(key), *_strings(value))]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [node] if isinstance(node, str) else []


def test_the_curve_table_keeps_special_characters_whole_in_report_md(tmp_path, monkeypatch):
    """The extrapolation-during-training table (report.md only): the label escaped, its line one cell per column."""
    import math

    import posexp.plots.curve
    import posexp.plots.perplexity
    from posexp.runs.curve import CurveWriter

    for module in (posexp.plots.perplexity, posexp.plots.curve):
        for name in dir(module):
            if name.startswith("plot_"):
                monkeypatch.setattr(module, name, _no_figure)
    folder = _write_run(tmp_path / "curve" / "0", _ppl_rows({128: 4.5}, 128), [f"encoder={NASTY}"], NASTY)
    writer = CurveWriter(folder, "perplexity")
    for step, ppls in ((100, (6.0, 6.3)), (200, (5.0, 6.0))):
        writer.write([{"step": step, "length": 128 * m, "multiple": m, "ppl": p, "loss": math.log(p), "tokens": 4096,
                       "eval_s": 0.5} for m, p in zip((1, 4), ppls)])
    report_main([folder], out=tmp_path / "out", options=ReportOptions(fmt="markdown"),
                console=Console(file=io.StringIO()), err_console=Console(file=io.StringIO()))
    text = (tmp_path / "out" / "report.md").read_text().split("## Extrapolation during training")[1]
    header = next(line for line in text.splitlines() if line.startswith("| curve"))
    [row] = [line for line in text.splitlines() if line.startswith("| encoder=")]
    assert r"a&b#c%d\_e\\f\$g" in row and row.count(" | ") == header.count(" | ")


def test_a_task_warning_escapes_its_labels_in_markdown_as_a_perplexity_warning_does(tmp_path):
    """The task report's warnings (a run that did not learn at 1x, named by its label) went into markdown as they
    were: \\, _ and $ in a label read as an escape, emphasis or math."""
    make_task_run(tmp_path / "task" / "0", {64: 0.0, 128: 0.0}, encoder=NASTY)
    out = io.StringIO()
    report_main([tmp_path / "task"], out=tmp_path / "out", options=ReportOptions(fmt="markdown"),
                console=Console(file=out, width=200), err_console=Console(file=io.StringIO()))
    [warning] = [line for line in (tmp_path / "out" / "summary.md").read_text().splitlines() if "Warning" in line]
    assert r"encoder=a&b#c%d\_e\\f\$g" in warning


def test_latex_writes_angle_brackets_and_bars_as_text_not_as_the_default_fonts_other_glyphs():
    from posexp.reporting.formatting import latex_escape

    # OT1, LaTeX's default text font, prints < > | as ¡ ¿ and a dash
    assert latex_escape("< 0.001") == r"\textless{} 0.001"
    assert latex_escape("a<b>c|d") == r"a\textless{}b\textgreater{}c\textbar{}d"


def test_the_comparison_prose_of_report_md_escapes_labels_as_its_table_does(tmp_path, monkeypatch):
    """Labels holding * _ | $ went into report.md's verdict lines as they were: `*run*` turned italic and a `$`
    pair into math, while the table above escaped them. The JSON and the terminal keep the plain label."""
    import posexp.plots.perplexity

    monkeypatch.setattr(posexp.plots.perplexity, "plot_ppl_vs_length", _no_figure)
    for k, note in enumerate(("base_*run*|$1$", "new_*run*|$2$")):
        for seed in (0, 1):
            _write_run(tmp_path / "lm" / f"{k}{seed}", _ppl_rows({128: 3.0, 256: 4.0 + k + seed / 10}, 128),
                       [f"data.note={note}", f"seed={seed}"], "rope", seed=seed, config={"data": {"note": note}})
    out = tmp_path / "out"
    report_main([tmp_path / "lm"], out=out, options=ReportOptions(by="data.note", fmt="json"),
                console=Console(file=io.StringIO()), err_console=Console(file=io.StringIO()))
    verdicts = [line for line in (out / "report.md").read_text().splitlines() if "each group −" in line]
    assert len(verdicts) == 3
    for line in verdicts:
        assert r"data.note=base\_\*run\*\|\$1\$" in line and r"data.note=new\_\*run\*\|\$2\$" in line
        assert "*run*" not in line and "|$" not in line
    runs = sorted((tmp_path / "lm").iterdir())
    verdicts = json.loads(render_json(build_report(runs, ReportOptions(by="data.note"))))["comparison"]["verdicts"]
    assert "data.note=new_*run*|$2$ (" in verdicts[0]
