"""A result row knows how it was measured: the typed row of posexp/runs/row.py, its settings per row, and a
report that compares rows by those settings, not by what the run recorded when it trained."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from posexp.errors import PosexpError
from posexp.reporting.lm_report import build_report
from posexp.runs.layout import read_results
from posexp.runs.row import ROW_KEY, ResultRow, csv_columns, row_key
from posexp.reporting.options import ReportOptions


def _row(length: int, ppl: float, **extra) -> dict:
    return {"metric": "perplexity", "length": length, "multiple": length / 128, "protocol": "nonoverlap",
            "stride": None, "last_k": None, "scaling": None, "scaling_factor": None, "applicable": True,
            "ppl": ppl, "loss": 1.0, "ppl_low": ppl * 0.98, "ppl_high": ppl * 1.02, "tokens": 4096, **extra}


def _write(folder: Path, rows: list[dict], seed: int = 0, tokens: int = 65536) -> Path:
    folder.mkdir(parents=True)
    run = {"label": f"seed={seed}", "overrides": [f"seed={seed}"], "encoder": "rope", "base": 10000.0,
           "train_len": 128, "seed": seed, "corpus": "stdlib", "corpus_fingerprint": "fp", "status": "completed",
           "eval_settings": {"tokens": tokens, "protocol": "nonoverlap"}, "config": {"seed": seed}}
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return folder


def test_a_row_round_trips_and_its_key_comes_from_the_declaration():
    stored = _row(256, 3.0, eval_tokens=4096, mem_measure="rss")
    row = ResultRow.from_dict(stored)
    assert row.to_dict() == {**stored, **row.to_dict()} and row.to_dict()["mem_measure"] == "rss"  # nothing lost
    assert "length" in ROW_KEY and "scaling_factor" in ROW_KEY and "ppl" not in ROW_KEY
    assert row_key(stored) == row_key({**stored, "ppl": 9.0})  # the measurement is not the key
    assert row_key(stored) != row_key({**stored, "scaling": "yarn"})
    assert row.settings() == {"eval_tokens": 4096}


def test_a_row_written_before_settings_were_per_row_takes_the_runs_budget(tmp_path):
    run = _write(tmp_path / "old", [_row(128, 3.0)], tokens=16384)
    (row,) = read_results(run)["rows"]
    assert row["eval_tokens"] == 16384


@pytest.mark.parametrize("field,value,words", [("scaling_factor", "abc", "scaling_factor is 'abc', not a number"),
                                               ("window", "abc", "window is 'abc', not an integer"),
                                               ("protocol", 3, "protocol is 3, not text")])
def test_a_hand_edited_field_of_the_wrong_type_is_named_not_a_traceback(tmp_path, field, value, words):
    run = _write(tmp_path / "edited", [_row(128, 3.0, **{field: value})])
    with pytest.raises(PosexpError, match=f"row 0: {words}"):
        read_results(run)


def test_results_csv_takes_its_columns_from_the_row():
    columns = csv_columns([_row(128, 3.0, window=64, sinks=None)])
    assert columns[:3] == ["length", "multiple", "protocol"] and "window" in columns and "sinks" in columns
    assert "first_target" in columns and "exact_match" not in columns
    assert "window" not in csv_columns([_row(128, 3.0)])


def test_a_report_compares_runs_by_the_settings_of_their_rows_not_the_runs_record(tmp_path):
    # both runs were trained recording eval.tokens=65536; both were then evaluated again on 16384 tokens
    a = _write(tmp_path / "a", [_row(n, 3.0 + n / 1000, eval_tokens=16384) for n in (128, 256)], seed=0)
    b = _write(tmp_path / "b", [_row(n, 3.1 + n / 1000, eval_tokens=16384) for n in (128, 256)], seed=1)
    report = build_report([a, b])
    assert not any("different eval settings" in row.flags for row in report.rows), report.warnings
    # one of them measured on another budget: now they differ, and the report says so
    c = _write(tmp_path / "c", [_row(n, 3.1, eval_tokens=4096) for n in (128, 256)], seed=2)
    flagged = build_report([a, b, c])
    assert [row.flags for row in flagged.rows][2] == ["different eval settings"]


def test_a_run_whose_lengths_were_measured_on_different_budgets_is_flagged(tmp_path):
    mixed = _write(tmp_path / "mixed", [_row(128, 3.0, eval_tokens=1024), _row(256, 3.5, eval_tokens=65536)])
    report = build_report([mixed])
    assert "different eval settings" in report.rows[0].flags
    assert any("different token budgets" in w and "1,024" in w for w in report.warnings)


def test_a_report_writes_into_a_folder_of_its_own_and_leaves_no_stale_figure(tmp_path):
    from posexp.reporting.summary import report_main

    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        _write(sweep / str(seed), [_row(n, 3.0 + seed, eval_tokens=4096) for n in (128, 256)], seed=seed)
    (sweep / "summary.md").write_text("the sweep's own summary\n")
    quiet = Console(file=io.StringIO())
    plain = report_main([sweep], console=quiet).parent
    grouped = report_main([sweep], console=quiet, options=ReportOptions(by="seed")).parent
    assert (plain.name, grouped.name) == ("default", "by-seed") and plain.parent == sweep / "reports"
    assert (sweep / "summary.md").read_text() == "the sweep's own summary\n"
    assert (plain / "ppl_vs_length.png").is_file() and not (plain / "report_ppl_vs_length.png").exists()
    (plain / "report_ppl_vs_length.png").write_bytes(b"left by an earlier report")
    report_main([sweep], console=quiet)  # the same report again replaces its own files, nothing else
    assert not (plain / "report_ppl_vs_length.png").exists()


def test_every_figure_a_report_draws_is_cleared_by_the_next_report():
    from posexp.runs import layout

    figures = {value for name, value in vars(layout).items() if name.startswith("REPORT_") and name.endswith("_PLOT")}
    assert figures and figures <= set(layout.REPORT_FILES)  # else an old figure stays beside the new report


# -- any key as a column --------------------------------------------------------------------------------

def _window_runs(tmp_path: Path) -> list[Path]:
    """Three seeds of one encoding, each evaluated plain and within a 64-token window: the plain rows are
    better by 0.5 ± a little at 256 (2×), the same at 128 (the window covers the whole context)."""
    runs = []
    for seed, noise in ((0, 0.01), (1, -0.02), (2, 0.015)):
        rows = [_row(128, 3.0 + noise, eval_tokens=4096), _row(256, 3.2 + noise, eval_tokens=4096),
                _row(128, 3.0 + noise, eval_tokens=4096, window=64, sinks=None),
                _row(256, 3.7 + 2 * noise, eval_tokens=4096, window=64, sinks=None)]
        runs.append(_write(tmp_path / str(seed), rows, seed=seed))
    return runs


def test_cols_window_pivots_plain_against_window_with_a_paired_verdict(tmp_path):
    from posexp.reporting.pivot import as_table, build_pivot
    from posexp.reporting.tables import render
    from posexp.reporting.runs import read_run

    pivot = build_pivot([read_run(p) for p in _window_runs(tmp_path)], ["encoder"], ["window"])
    assert pivot.columns == [(None,), (64,)]  # the plain rows are the baseline
    cell = pivot.cell(("rope",), 256, (64,))
    diff, low, high = cell.diff()
    assert len(cell.values) == 3 and diff == pytest.approx(0.5 + 0.005 / 3, abs=1e-9) and low > 0
    assert any("beats its own window at 2×" in note for note in pivot.notes), pivot.notes
    table = json.loads(render(as_table(pivot), "json"))
    assert table["baseline"] == {"window": None} and {c["length"] for c in table["cells"]} == {128, 256}


def test_cols_on_the_command_line_prints_one_table_and_names_an_unknown_key(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    _window_runs(tmp_path / "sweep")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--by", "encoder", "--cols", "window"],
                                env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "window=none (baseline)" in result.output and "window=64 (Δ)" in result.output
    assert (tmp_path / "sweep" / "reports" / "by-encoder-cols-window" / "pivot.csv").is_file()
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--cols", "windw"])
    assert bad.exit_code == 2 and "--cols" in bad.output and "windw" in bad.output and "Traceback" not in bad.output


def test_cols_window_over_rows_without_a_window_says_how_to_make_them(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    for seed in (0, 1):
        _write(tmp_path / "sweep" / str(seed), [_row(128, 3.0, eval_tokens=4096), _row(256, 3.4, eval_tokens=4096)],
               seed=seed)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "sweep"), "--cols", "window"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--cols: no row has a window" in result.output and "posexp eval RUN eval.window=128" in result.output


def test_a_grouped_report_is_one_table_at_100_columns_and_wraps_its_intervals_at_80(tmp_path):
    from posexp.reporting.lm_report import build_report
    from posexp.reporting.render import print_report

    runs = []
    for encoder, growth in (("rope", 1.3), ("alibi", 1.02), ("sinusoidal", 3.0)):
        for seed in range(3):
            rows = [_row(n, 3.0 * growth ** i + 0.05 * seed, eval_tokens=65536)
                    for i, n in enumerate((128, 256, 512, 1024, 2048))]
            folder = _write(tmp_path / f"{encoder}{seed}", rows, seed=seed)
            data = json.loads((folder / "results.json").read_text())
            data["run"].update(encoder=encoder, config={"encoder": {"name": encoder}, "seed": seed})
            (folder / "results.json").write_text(json.dumps(data))
            runs.append(folder)
    report = build_report(runs, ReportOptions(by="encoder"))
    for width, tables in ((100, 1), (80, 2)):
        out = io.StringIO()
        print_report(report, Console(file=out, width=width))
        text = out.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width
        assert text.count(" encoder ") == tables, text  # one header row per table
        assert "243.05" in text and "±0.12" in text  # no number cut


def test_a_runs_figure_is_titled_by_its_encoding_and_a_sweeps_lines_are_coloured_by_what_it_varies(tmp_path):
    from posexp.reporting.lm_report import build_report
    from posexp.reporting.render import plot_groups
    from posexp.rendering.results import plot_title

    assert plot_title({"encoder": "rope", "base": 10000.0, "label": "default", "train_len": 128}) == \
        "rope, base 10000 (trained at 128 tokens)"
    runs = []
    for encoder in ("rope", "alibi"):
        for seed in (0, 1):
            folder = _write(tmp_path / f"{encoder}{seed}", [_row(128, 3.0 + seed)], seed=seed)
            data = json.loads((folder / "results.json").read_text())
            data["run"].update(encoder=encoder, overrides=[f"encoder={encoder}", f"seed={seed}"])
            (folder / "results.json").write_text(json.dumps(data))
            runs.append(folder)
    assert plot_groups(build_report(runs)) == ["rope", "rope", "alibi", "alibi"]  # seeds share a colour


def test_a_views_header_states_only_the_protocol_it_shows(tmp_path):
    from posexp.reporting.summary import report_main

    rows = [_row(128, 3.0, eval_tokens=4096), _row(256, 3.3, eval_tokens=4096),
            _row(128, 3.1, eval_tokens=4096, protocol="last_k", last_k=32),
            _row(256, 3.05, eval_tokens=4096, protocol="last_k", last_k=32)]
    run = _write(tmp_path / "run", rows)
    md = report_main([run], console=Console(file=io.StringIO()),
                     options=ReportOptions(view="protocol=last_k")).parent / "report.md"
    text = md.read_text()
    assert "last\\_k" in text and "nonoverlap" not in text.split("## Runs")[0]


def test_a_runs_table_at_40_columns_cuts_no_number(tmp_path):
    from posexp.rendering.results import ResultsTable

    results = read_results(_write(tmp_path / "run", [_row(n, 75.83959956455082, eval_tokens=1024)
                                                     for n in (32, 64, 128)]))
    out = io.StringIO()
    Console(file=out, width=40).print(ResultsTable(results))
    text = out.getvalue()
    assert "…" not in text and "75.840" in text and "left out at this width" in text


def test_cols_scaling_pairs_one_models_folders_and_shows_its_task_beside_its_perplexity(tmp_path):
    """``posexp eval -m hf:M eval.scaling=none,yarn`` writes a folder per scaling: the same model on the same tokens
    is paired across them, and a zero-shot passkey run of it joins the same line; another token budget is not
    paired, and a note says so."""
    from helpers.runs import pretrained_sweep

    from posexp.reporting.pivot import build_pivot
    from posexp.reporting.runs import read_run

    sweep = pretrained_sweep(tmp_path)
    runs = [read_run(p) for p in sorted(sweep.iterdir())]
    pivot = build_pivot(runs, [], ["scaling"])
    assert pivot.lines == [("hf.model=tiny",)] and [m.name for m in pivot.measures] == ["ppl", "passkey acc"]
    yarn = pivot.cell(("hf.model=tiny",), 512, ("yarn",))
    assert yarn.diffs == [pytest.approx(3.9 - 9.1)] and not pivot.notes
    acc = pivot.cell(("hf.model=tiny",), 256, ("yarn",), pivot.measures[1])
    assert acc.mean == pytest.approx(90.0) and acc.diffs == [pytest.approx(40.0)]
    recorded = json.loads((sweep / "1" / "results.json").read_text())
    for row in recorded["rows"]:
        row.update(tokens=32768, eval_tokens=32768)
    (sweep / "1" / "results.json").write_text(json.dumps(recorded))
    pivot = build_pivot([read_run(p) for p in sorted(sweep.iterdir())], [], ["scaling"])
    assert not pivot.cell(("hf.model=tiny",), 512, ("yarn",)).diffs
    assert any("3 of 6 values have no difference" in note and "measured on other tokens" in note
               for note in pivot.notes), pivot.notes


def test_fine_tunes_say_their_target_and_are_differenced_only_where_measured_alike(tmp_path):
    """A parent evaluated again on another token budget after its fine-tunes: no difference where the rows scored
    other tokens, each such line named; the fine-tunes' label names their target length; the perplexity report
    says its runs trained at other lengths and that each ratio is taken at the run's own."""
    from helpers.runs import longer_finetunes

    from posexp.reporting.extension import build_extension_table, extension_runs
    from posexp.reporting.lm_report import build_report
    from posexp.reporting.render import render_markdown
    from posexp.reporting.runs import read_run

    top = longer_finetunes(tmp_path)
    runs = [read_run(top / name) for name in ("parent", "ft_direct", "ft_yarn")]
    table = build_extension_table(*extension_runs(runs))
    parent, direct, _ = table.lines
    assert direct.label == "direct ft→512, 150 steps"
    assert direct.difference(parent, 128) == pytest.approx(0.2) and direct.difference(parent, 512) is None
    assert any(w.startswith("direct ft→512, 150 steps: no difference to the parent at 256, 512, 1024: measured on "
                            "other tokens") for w in table.warnings), table.warnings
    text = render_markdown(build_report([top / name for name in ("parent", "ft_direct", "ft_yarn")]))
    assert "Training length: 128 tokens (512 for " in text and "each run's own training length (128; 512 for" in text


def test_a_list_valued_key_can_be_a_pivots_column_or_line(tmp_path):
    from helpers.runs import make_run
    from posexp.reporting.pivot import build_pivot
    from posexp.reporting.runs import read_run

    runs = [read_run(make_run(tmp_path / name, {128: ppl}, ["encoder=rope"], config={"model": {"lst": lst}},
                              seed=seed)) for name, ppl, lst, seed in (("a", 3.0, [1, 2], 0), ("b", 3.1, [3, 4], 1))]
    assert build_pivot(runs, [], ["model.lst"]).columns == [("[1, 2]",), ("[3, 4]",)]  # a TypeError before
    assert build_pivot(runs, ["model.lst"], ["seed"]).lines == [("[1, 2]",), ("[3, 4]",)]


def test_a_pivot_spells_a_keys_values_as_the_grouped_report_does(tmp_path):
    from helpers.runs import make_run
    from posexp.reporting.pivot import build_pivot, label
    from posexp.reporting.runs import read_run
    from posexp.reporting.selection import show_value

    runs = [read_run(make_run(tmp_path / str(tied), {128: 3.0 + tied}, ["encoder=rope"],
                              config={"model": {"tie_embeddings": tied, "lst": [1, 2]}})) for tied in (True, False)]
    pivot = build_pivot(runs, ["model.lst"], ["model.tie_embeddings"])
    # as typed (model.tie_embeddings=true) and as --by shows it, not Python's True
    assert [label(pivot.cols, c) for c in pivot.columns] == ["model.tie_embeddings=false", "model.tie_embeddings=true"]
    assert [label(pivot.by, line) for line in pivot.lines] == [f"model.lst={show_value([1, 2])}"]
    assert label(["window"], (None,)) == "window=none"  # no window: a value of its own, not a missing one


def test_a_runs_results_say_why_its_rows_are_not_applicable_once_per_reason():
    from rich.console import Console

    from helpers.runs import ppl_rows
    from posexp.rendering.results import results_markdown, results_table

    rows = ppl_rows({128: 3.0, 256: None, 512: None}, 128)
    rows += ppl_rows({256: None}, 128, scaling="ms_poe")
    for r in rows:
        r.update(targets=[0, 1], tokens=r["tokens"] if r["applicable"] else 0)
        if not r["applicable"]:
            r["reason"] = "every layer skipped" if r["scaling"] else "encoder 'learned' represents at most 128 positions"
    results = {"run": {"label": "encoder=learned", "train_len": 128, "base": None}, "rows": rows}
    text = results_markdown(results)
    assert "- lengths 256, 512: not applicable (encoder 'learned' represents at most 128 positions)" in text
    assert "- length 256 (ms_poe ×2): not applicable (every layer skipped)" in text
    console = Console(width=200, record=True)
    console.print(results_table(results))
    assert "lengths 256, 512: not applicable (encoder 'learned'" in console.export_text()
