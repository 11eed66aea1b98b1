"""Tests for the run report, its plot and the atomic writer, on fake run folders."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import re

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from posexp.errors import ConfigError, PosexpError
from posexp.runs.atomic import atomic_write_bytes, atomic_write_text
from posexp.plots.perplexity import plot_ppl_vs_length
from posexp.reporting import (
    build_report,
    find_runs,
    print_report,
    read_run,
    render_csv,
    render_markdown,
    report_main,
    write_summary,
)
from posexp.reporting.options import ReportOptions
from helpers import no_figure
from helpers.runs import make_run, make_sweep, make_task_run, ppl_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
def quiet_console() -> Console:
    return Console(file=io.StringIO(), width=200)


def by_label(report):
    return {row.label: row for row in report.rows}


# --- the table -------------------------------------------------------------


def test_table_values_and_ratio(tmp_path):
    rope = make_run(tmp_path / "rope", {128: 3.4123, 256: 4.0, 512: 6.826}, ["encoder=rope"])
    alibi = make_run(tmp_path / "alibi", {128: 3.5, 256: 3.45, 512: 3.6}, ["encoder=alibi"], encoder="alibi")
    report = build_report([rope, alibi])

    assert report.lengths == [128, 256, 512]
    assert report.protocol == "nonoverlap" and report.scaling is None
    assert report.train_len == 128 and report.ratio_length == 512
    rows = by_label(report)
    assert [rows["encoder=rope"].cells[n].text() for n in report.lengths] == ["3.41", "4.00", "6.83"]
    assert rows["encoder=rope"].ratio == pytest.approx(6.826 / 3.4123)
    assert rows["encoder=alibi"].ratio == pytest.approx(3.6 / 3.5)
    assert all(not row.flags for row in report.rows)

    md = render_markdown(report)
    assert "| encoder=rope | 3.41 | 4.00 | 6.83 | 2.00 |" in md
    assert "128 (train)" in md and "Protocol: nonoverlap" in md and "Training length: 128" in md


def test_run_missing_a_length_shows_dash(tmp_path):
    a = make_run(tmp_path / "a", {128: 3.0, 256: 3.5, 512: 4.0}, ["encoder=rope"])
    b = make_run(tmp_path / "b", {128: 3.0, 256: 3.2}, ["encoder=alibi"], encoder="alibi")
    report = build_report([a, b])
    assert report.lengths == [128, 256, 512]
    assert by_label(report)["encoder=alibi"].cells.get(512) is None
    assert "| encoder=alibi | 3.00 | 3.20 | — |" in render_markdown(report)
    # 512 is not common to every run, so the ratio falls back to 256.
    assert report.ratio_length == 256


def test_label_from_overrides(tmp_path):
    report = build_report([make_run(tmp_path / "r", {128: 3.0}, ["encoder=rope", "base=100"])])
    assert report.rows[0].label == "encoder=rope base=100"

    report = build_report([make_run(tmp_path / "d", {128: 3.0}, [])])
    assert report.rows[0].label == "default"

    # Older results without "overrides": Hydra's own overrides.yaml is the fallback.
    old = make_run(tmp_path / "old", {128: 3.0}, ["encoder=alibi"], overrides_in_results=False)
    assert read_run(old).overrides == ["encoder=alibi"]


def test_shared_overrides_move_to_header_and_duplicate_labels_are_unique(tmp_path):
    a = make_run(tmp_path / "x" / "0", {128: 3.0}, ["train.steps=50", "encoder=rope"])
    b = make_run(tmp_path / "x" / "1", {128: 3.1}, ["train.steps=50", "encoder=alibi"], encoder="alibi")
    c = make_run(tmp_path / "y" / "0", {128: 3.2}, ["train.steps=50", "encoder=alibi"], encoder="alibi")
    report = build_report([a, b, c])
    labels = [row.label for row in report.rows]
    assert report.shared_overrides == ["train.steps=50"]
    assert labels[0] == "encoder=rope"
    assert labels[1] != labels[2] and all(label.startswith("encoder=alibi [") for label in labels[1:])
    assert "`train.steps=50`" in render_markdown(report)


def test_not_applicable_rendered_and_ratio_uses_common_length(tmp_path):
    rope = make_run(tmp_path / "rope", {128: 3.0, 256: 3.3, 512: 4.5}, ["encoder=rope"])
    learned = make_run(tmp_path / "learned", {128: 3.1, 256: 3.6, 512: None}, ["encoder=learned"], encoder="learned")
    report = build_report([rope, learned])
    rows = by_label(report)
    assert rows["encoder=learned"].cells[512].text() == "n/a"
    assert report.ratio_length == 256
    assert rows["encoder=learned"].ratio == pytest.approx(3.6 / 3.1)
    assert rows["encoder=rope"].ratio == pytest.approx(3.3 / 3.0)
    assert "| encoder=learned | 3.10 | 3.60 | n/a | 1.16 |" in render_markdown(report)

    # A run with nothing past the training length has no ratio, and does not take the others' away.
    only_train = make_run(tmp_path / "short", {128: 3.2, 256: None}, ["encoder=short"], encoder="learned")
    report = build_report([rope, only_train])
    assert report.ratio_length == 512
    assert by_label(report)["encoder=short"].ratio is None
    assert by_label(report)["encoder=rope"].ratio == pytest.approx(4.5 / 3.0)
    assert "| encoder=short | 3.20 | n/a | — | n/a |" in render_markdown(report)

    # No run at all past the training length: the ratio is n/a, not a crash or 1.00.
    report = build_report([only_train])
    assert report.ratio_length is None
    assert all(row.ratio is None for row in report.rows)


def test_main_table_prefers_nonoverlap_unscaled_and_mentions_others(tmp_path):
    extra = [
        {"length": 256, "protocol": "sliding", "scaling": None, "applicable": True, "ppl": 9.0},
        {"length": 256, "protocol": "nonoverlap", "scaling": "ntk", "applicable": True, "ppl": 8.0},
    ]
    run = make_run(tmp_path / "r", {128: 3.0, 256: 3.5}, extra_rows=extra)
    report = build_report([run])
    assert (report.protocol, report.scaling) == ("nonoverlap", None)
    assert report.rows[0].cells[256].mean == 3.5
    md = render_markdown(report)
    assert "sliding" in md and "nonoverlap with scaling ntk" in md


def test_other_protocol_used_when_no_nonoverlap(tmp_path):
    rows = [{"length": 128, "protocol": "sliding", "scaling": None, "applicable": True, "ppl": 3.0}]
    report = build_report([make_run(tmp_path / "r", {}, extra_rows=rows)])
    assert report.protocol == "sliding"
    assert any("sliding" in w for w in report.warnings)


def test_mixed_corpus_is_flagged_and_warned(tmp_path):
    runs = [make_run(tmp_path / str(i), {128: 3.0, 256: 3.4}, [f"seed={i}"]) for i in range(2)]
    odd = make_run(tmp_path / "2", {128: 2.0, 256: 2.1}, ["seed=2"], fingerprint="fp-other")
    report = build_report([*runs, odd])
    rows = by_label(report)
    assert rows["seed=2"].flags == ["different corpus"]
    assert not rows["seed=0"].flags and not rows["seed=1"].flags

    summary = write_summary(report, tmp_path / "out")
    md = summary.read_text()
    assert "**Warning:** seed=2: different corpus, corpus stdlib (fp-other) vs stdlib (fp-stdlib) for the others" in md
    assert "| seed=2 | 2.00 | 2.10 | 1.05 | different corpus |" in md
    csv_rows = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert {r["flags"] for r in csv_rows if r["label"] == "seed=2"} == {"different corpus"}

    console = quiet_console()
    print_report(report, console)
    assert "warning: seed=2: different corpus" in console.file.getvalue()


def test_eval_settings_and_train_len_outliers_and_status(tmp_path):
    a = make_run(tmp_path / "a", {128: 3.0}, ["encoder=a"])
    b = make_run(tmp_path / "b", {128: 3.0}, ["encoder=b"])
    c = make_run(tmp_path / "c", {128: 3.0}, ["encoder=c"], eval_settings={"tokens": 1024, "protocol": "nonoverlap"})
    d = make_run(tmp_path / "d", {256: 3.0}, ["encoder=d"], train_len=256, status="failed")
    rows = by_label(build_report([a, b, c, d]))
    assert rows["encoder=c"].flags == ["different eval settings"]
    assert rows["encoder=d"].flags == ["different train length", "status: failed"]


def test_the_eval_settings_warning_names_the_settings_the_rows_were_measured_with(tmp_path):
    """A run evaluated again on another budget (posexp eval RUN eval.tokens=2048) keeps the eval settings it
    trained with in results.json; the warning names the budget its rows were measured on, not those."""
    runs = [make_run(tmp_path / str(i), {128: 3.0, 256: 3.3}, [f"seed={i}"], seed=i) for i in range(3)]
    for folder, budget in zip(runs, (65536, 65536, 2048)):
        results = json.loads((folder / "results.json").read_text())
        for row in results["rows"]:
            row["eval_tokens"] = budget
        (folder / "results.json").write_text(json.dumps(results))
    report = build_report(runs)
    assert by_label(report)["seed=2"].flags == ["different eval settings"]
    assert ("seed=2: different eval settings, eval settings protocol=nonoverlap, tokens=2048 vs protocol=nonoverlap, "
            "tokens=65536 for the others; not comparable with the other runs") in report.warnings


# --- finding and loading runs ------------------------------------------------


def test_multirun_layout_natural_sort_and_report_main(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", 12)
    found = find_runs([sweep])
    assert [p.name for p in found] == [str(i) for i in range(12)]
    # Overlapping paths count each run once.
    assert find_runs([sweep, sweep / "3"]) == found

    summary = report_main([str(sweep)], console=quiet_console())
    assert summary == sweep / "reports" / "default" / "summary.md"  # a folder of the report's own
    md = summary.read_text()
    assert md.index("| seed=2 |") < md.index("| seed=10 |")
    assert "`../../0`" in md  # run folders shown relative to the report, which lives in the sweep


def test_sweep_job_without_results_is_warned(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", 3)
    (sweep / "3" / ".hydra").mkdir(parents=True)  # a job that crashed before writing results
    md = report_main([str(sweep)], console=quiet_console()).read_text()
    assert "sweep job 3 has no results.json" in md


def test_a_folder_given_with_no_finished_run_is_warned(tmp_path):
    """posexp report RUN_STILL_TRAINING SWEEP reported the sweep alone, without a word of the first folder (its
    report folder was even named after both)."""
    sweep = make_sweep(tmp_path / "sweep", 2)
    (tmp_path / "live" / "checkpoint").mkdir(parents=True)  # still training: no results.json yet
    md = report_main([str(tmp_path / "live"), str(sweep)], out=tmp_path / "out", console=quiet_console()).read_text()
    assert f"{tmp_path / 'live'}: no run in it has written its results.json yet" in md.replace("\\", "")


def test_single_run_folder_is_a_run(tmp_path):
    run = make_run(tmp_path / "run", {128: 3.0})
    assert find_runs([run]) == [run]
    assert find_runs([run / "results.json"]) == [run]


def test_report_main_output_folder_choice(tmp_path, monkeypatch):
    a = make_run(tmp_path / "a", {128: 3.0}, ["encoder=a"])
    b = make_run(tmp_path / "b", {128: 3.0}, ["encoder=b"])
    assert report_main([a, b], out=tmp_path / "cmp", console=quiet_console()) == tmp_path / "cmp" / "summary.md"
    monkeypatch.chdir(tmp_path)
    summary = report_main([str(a), str(b)], console=quiet_console())
    assert summary.resolve() == (tmp_path / "reports" / "a+b" / "summary.md").resolve()
    # a run's or a sweep's own folder is never a report's
    with pytest.raises(ConfigError, match="--out.*run folder"):
        report_main([a, b], out=a, console=quiet_console())


def test_missing_folder_raises_helpful_error(tmp_path):
    with pytest.raises(PosexpError, match=r"nope: no such folder.*results\.json"):
        find_runs([tmp_path / "nope"])


def test_empty_folder_raises_helpful_error(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(PosexpError) as err:
        report_main([str(tmp_path / "empty")], console=quiet_console())
    assert "no runs found in" in str(err.value) and "empty" in str(err.value)
    assert "results.json" in str(err.value)


def test_corrupt_results_raises_helpful_error(tmp_path):
    make_run(tmp_path / "sweep" / "0", {128: 3.0})
    bad = tmp_path / "sweep" / "1"
    bad.mkdir()
    (bad / "results.json").write_text('{"run": {"label": "x"}, "rows": [')
    with pytest.raises(PosexpError, match=r"1[/\\]results\.json: not valid JSON"):
        report_main([str(tmp_path / "sweep")], console=quiet_console(), options=ReportOptions(strict=True))
    (bad / "results.json").write_text("[1, 2]")
    with pytest.raises(PosexpError, match=r"results\.json: top level is a list"):
        read_run(bad)


# --- outputs -----------------------------------------------------------------


def test_summary_csv_rows(tmp_path):
    rope = make_run(tmp_path / "sweep" / "0", {128: 3.0, 256: 3.3}, ["encoder=rope"])
    learned = make_run(tmp_path / "sweep" / "1", {128: 3.1, 256: None}, ["encoder=learned"],
                       encoder="learned", base=None)
    report = build_report([rope, learned])
    write_summary(report, tmp_path / "sweep")
    with (tmp_path / "sweep" / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["label", "run_dir", "encoder", "base", "seed", "length", "multiple", "protocol",
                             "scaling", "ppl", "ppl_low", "ppl_high", "loss", "applicable", "flags"]
    assert [(r["label"], r["length"], r["ppl"], r["applicable"]) for r in rows] == [
        ("encoder=rope", "128", "3.0", "true"),
        ("encoder=rope", "256", "3.3", "true"),
        ("encoder=learned", "128", "3.1", "true"),
        ("encoder=learned", "256", "", "false"),
    ]
    assert rows[0]["run_dir"] == "0" and rows[0]["base"] == "10000.0" and rows[2]["base"] == ""
    assert render_csv(report).count("\n") == 5


def test_summary_md_links_the_plot_and_plot_is_png(tmp_path):
    run = make_run(tmp_path / "run", {64: 3.5, 128: 3.0, 256: 3.4, 512: None})
    summary = write_summary(build_report([run]), tmp_path / "run")
    assert "![perplexity vs context length](ppl_vs_length.png)" in summary.read_text()
    assert (tmp_path / "run" / "ppl_vs_length.png").read_bytes()[:8] == PNG_MAGIC
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]


def test_plot_handles_gaps_bands_and_all_missing(tmp_path):
    lengths = [128, 256, 512, 1024]
    series = [
        ("rope", lengths, [3.0, 3.5, 5.0, 9.0], [2.9, 3.4, 4.8, 8.5], [3.1, 3.6, 5.2, 9.5]),
        ("learned", lengths, [3.1, 3.6, None, None], None, None),
    ]
    out = plot_ppl_vs_length(series, tmp_path / "a.png", train_len=128, title="t", ylabel="perplexity (per byte)")
    assert out.read_bytes()[:8] == PNG_MAGIC
    out = plot_ppl_vs_length([("x", lengths, [None] * 4, None, None)], tmp_path / "b.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_plot_with_many_series(tmp_path):
    lengths = [128, 256]
    series = [(f"seed={i}", lengths, [3.0 + i / 50, 3.5 + i / 50], None, None) for i in range(40)]
    assert plot_ppl_vs_length(series, tmp_path / "many.png", train_len=128).read_bytes()[:8] == PNG_MAGIC


def test_a_fine_tunes_long_label_keeps_the_plot_readable(tmp_path):
    """A fine-tune's label (its parent's path and every override) was wider than the figure: constrained layout
    gave up with a warning and the axes collapsed. The legend wraps it; the axes keep most of the figure."""
    import warnings

    from posexp.plots import perplexity

    label = ("rope, base 10000, parent=/home/someone/experiments/2026-11-25/10-00-00/rope train_len=64 "
             "train.steps=6 train.batch_size=4 train.warmup_steps=2 train.log_every=1 eval.tokens=1024 scaling=linear")
    figures = []
    real_save = perplexity.save_png
    with warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always")
        mp.setattr(perplexity, "save_png", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
        plot_ppl_vs_length([(label, [64, 128, 256], [3.0, 3.4, 4.0], None, None)], tmp_path / "p.png", train_len=64)
    assert not [w for w in caught if "constrained_layout" in str(w.message)], [str(w.message) for w in caught]
    assert figures[0].axes[0].get_position().width > 0.5  # of the figure's width
    assert figures[0].axes[0].get_legend() is None  # below the axes, never over the data
    shown = figures[0].legends[0].get_texts()[0].get_text()
    assert shown.startswith("rope, base 10000") and shown.endswith("scaling=linear")  # what tells runs apart
    assert shown.count("\n") <= 2


def test_the_passkey_heatmaps_axis_labels_are_inside_the_figure(tmp_path):
    """The depth axis's label ran past the top and bottom of the heatmap's figure, cut off at both ends."""
    from posexp.plots import accuracy

    figures = []
    real_save = accuracy.save_png
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(accuracy, "save_png", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
        accuracy.plot_passkey_heatmap([32, 64, 128], [0.0, 0.25, 0.5, 0.75, 1.0], [[0.5, 0.2, 0.0]] * 5,
                                      tmp_path / "h.png", train_len=32, title="task=passkey")
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    for label in (fig.axes[0].yaxis.label, fig.axes[0].xaxis.label):
        box = label.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, \
            label.get_text()


def test_report_of_only_a_failed_run(tmp_path):
    run = make_run(tmp_path / "run", {}, status="failed")
    summary = report_main([str(run)], console=quiet_console())
    md = summary.read_text()
    assert "status: failed" in md and "**Warning:**" in md
    assert (summary.parent / "ppl_vs_length.png").read_bytes()[:8] == PNG_MAGIC
    assert not (run / "ppl_vs_length.png").exists()  # the run's own folder holds only what the run wrote


def test_print_report_has_title_and_values(tmp_path):
    report = build_report([make_run(tmp_path / "r", {128: 3.0, 256: None}, ["model=[a,b]"])])
    console = quiet_console()
    print_report(report, console)
    text = console.file.getvalue()
    assert "Perplexity vs context length" in text
    assert "model=[a,b]" in text and "3.00" in text and "n/a" in text


def test_hundred_runs_make_one_row_each(tmp_path):
    # speed lives in scripts/bench_report.py; here only that nothing is lost at that size
    dirs = [make_run(tmp_path / str(i), {n: 3.0 + i / 100 for n in (64, 128, 256, 512, 1024)}, [f"seed={i}"])
            for i in range(100)]
    report = build_report(find_runs([tmp_path]))
    print_report(report, quiet_console())
    render_markdown(report, tmp_path)
    render_csv(report, tmp_path)
    assert len(report.rows) == 100
    assert sorted(str(row.run.path) for row in report.rows) == sorted(str(d) for d in dirs)


# --- atomic writes -------------------------------------------------------------


def test_atomic_write_text_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    atomic_write_text(target, "new ünïcode")
    assert target.read_text(encoding="utf-8") == "new ünïcode"
    atomic_write_bytes(tmp_path / "sub" / "b.bin", b"\x00\x01")
    assert (tmp_path / "sub" / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["b.bin", "f.txt", "sub"]


def test_atomic_write_failure_keeps_old_content(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_report_whose_task_figure_fails_leaves_no_report_md_without_its_task_section(tmp_path, monkeypatch):
    """report.md and summary.md are written once, after every part has drawn its figures: a part that fails (here
    the task section's figure) leaves neither the earlier report's files nor new ones that lack that part."""
    import posexp.plots.accuracy
    import posexp.plots.perplexity

    make_run(tmp_path / "runs" / "lm", {128: 3.0, 256: 3.5})
    make_task_run(tmp_path / "runs" / "task", {64: 1.0, 128: 0.5})
    for name in ("plot_ppl_vs_length", "plot_position_overlay", "plot_training_curves"):
        monkeypatch.setattr(posexp.plots.perplexity, name, no_figure)
    monkeypatch.setattr(posexp.plots.accuracy, "plot_accuracy_vs_length", no_figure)
    out = tmp_path / "out"
    report_main([tmp_path / "runs"], out=out, console=quiet_console())
    assert "## Tasks: accuracy vs context length" in (out / "report.md").read_text()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(posexp.plots.accuracy, "plot_accuracy_vs_length", full_disk)
    with pytest.raises(PosexpError, match=f"^cannot write the report into {re.escape(str(out))}: No space left on "
                                          "device$"):
        report_main([tmp_path / "runs"], out=out, console=quiet_console())
    assert not (out / "report.md").exists() and not (out / "summary.md").exists()


# --- the Hydra callback ----------------------------------------------------------


def test_callback_writes_summary_into_sweep_dir(tmp_path):
    from posexp.cli.jobs import SweepSummaryCallback

    sweep = make_sweep(tmp_path / "multirun" / "2024-01-01" / "12-00-00", 3)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"}}})
    SweepSummaryCallback().on_multirun_end(config)
    assert (sweep / "summary.md").is_file()
    assert (sweep / "summary.csv").is_file()
    assert (sweep / "report.md").is_file()  # the same code path as posexp report


def test_callback_never_raises(tmp_path, caplog):
    from posexp.cli.jobs import SweepSummaryCallback

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "missing")}}})
    with caplog.at_level(logging.WARNING, logger="posexp.report"):
        SweepSummaryCallback().on_multirun_end(config)
        SweepSummaryCallback().on_multirun_end(OmegaConf.create({}))
    assert "sweep summary not written" in caplog.text
    assert "missing: no such folder" in caplog.text


# --- grouping, seeds, summary metrics (posexp report --by/--metric/--where/--sort/--format) ---------


from posexp.reporting import (  # noqa: E402
    mean_interval,
    metric_value,
    parse_metric,
    render_json,
    render_latex,
    render_table_csv,
    render_table_markdown,
    t_quantile,
)


def by_group(report):
    return {group.label: group for group in report.groups}


def test_t_quantile_is_students_distribution():
    # Student (1908): one and two degrees of freedom have closed forms.
    for p in (0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-6)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-6)
    # Printed tables of t(0.975, df), and the normal limit for many degrees of freedom.
    assert t_quantile(0.975, 5) == pytest.approx(2.5706, abs=1e-4)
    assert t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert t_quantile(0.975, 100000) == pytest.approx(1.95996, abs=1e-4)
    # Heavier tails with fewer runs: the interval widens as df falls.
    assert t_quantile(0.975, 2) > t_quantile(0.975, 3) > t_quantile(0.975, 10)


def test_mean_interval_over_seeds():
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    half = t_quantile(0.975, 2) * 1.0 / math.sqrt(3)  # sample sd of 1, 2, 3 is 1
    assert mean == pytest.approx(2.0)
    assert (low, high) == (pytest.approx(2.0 - half), pytest.approx(2.0 + half))
    assert mean_interval([4.0]) == (4.0, None, None)


def seeds(tmp_path, encoder, values, base=10000.0, **kw):
    """One run per seed; values[i] is seed i's perplexity at the training length, 1.5x it at 2x."""
    return [make_run(tmp_path / f"{encoder}-{base}-{i}", {128: v, 256: 1.5 * v}, [f"encoder={encoder}", f"seed={i}"],
                     encoder=encoder, base=base, seed=i, **kw) for i, v in enumerate(values)]


def test_group_by_encoder_averages_seeds_with_t_interval(tmp_path):
    runs = seeds(tmp_path, "rope", [3.0, 3.2, 3.4]) + seeds(tmp_path, "alibi", [4.0], base=None)
    report = build_report(runs, ReportOptions(by="encoder", metrics="ratio@2x"))
    groups = by_group(report)
    assert list(groups) == ["encoder=rope", "encoder=alibi"]
    rope, alibi = groups["encoder=rope"], groups["encoder=alibi"]
    assert (rope.n, alibi.n) == (3, 1)
    mean, low, high = mean_interval([3.0, 3.2, 3.4])
    cell = rope.cells[128]
    assert (cell.mean, cell.low, cell.high, cell.n) == (pytest.approx(mean), pytest.approx(low), pytest.approx(high), 3)
    assert rope.metrics["ratio@2x"].mean == pytest.approx(1.5)
    # A single run keeps its own evaluation interval and shows no ± over seeds.
    assert alibi.cells[128].low == pytest.approx(4.0 * 0.98) and alibi.cells[128].spread is None
    md = render_table_markdown(report)
    assert md.splitlines()[0] == "| encoder | n | 128 (train) | 256 | ratio@2x | flags |"
    # the lower perplexity of each column is bold; a ratio equal in every line is not
    assert f"| rope | 3 | **{mean:.2f} ± {(high - low) / 2:.2f}** |" in md
    assert "| alibi | 1 | 4.00 | 6.00 | 1.50 |" in md
    assert not any(g.flags for g in report.groups)


def test_two_means_printed_alike_are_both_bold_or_neither(tmp_path):
    """ratio 1.0999 was bold and 1.1000 beside it was not, though both print 1.10: the bold read as a difference
    the table does not show."""
    runs = [make_run(tmp_path / "a", {128: 3.00, 256: 3.2997}, ["seed=0"], seed=0),
            make_run(tmp_path / "b", {128: 3.02, 256: 3.322}, ["seed=1"], seed=1),
            make_run(tmp_path / "c", {128: 3.10, 256: 3.44}, ["seed=2"], seed=2)]
    lines = render_table_markdown(build_report(runs, ReportOptions(metrics="ratio@2x"))).splitlines()
    assert "| **1.10** |" in lines[2] and "| **1.10** |" in lines[3], lines  # 1.0999 and 1.1000
    assert "| 1.11 |" in lines[4], lines


def test_different_corpus_or_eval_settings_are_never_averaged(tmp_path):
    same = seeds(tmp_path, "rope", [3.0, 3.2])
    other_corpus = make_run(tmp_path / "oc", {128: 9.0, 256: 9.5}, ["encoder=rope", "seed=7"], seed=7,
                            fingerprint="fp-other")
    other_eval = make_run(tmp_path / "oe", {128: 8.0, 256: 8.5}, ["encoder=rope", "seed=8"], seed=8,
                          eval_settings={"tokens": 1024, "protocol": "nonoverlap"})
    report = build_report([*same, other_corpus, other_eval], ReportOptions(by="encoder"))
    assert len(report.groups) == 3
    assert sorted(g.n for g in report.groups) == [1, 1, 2]
    main = next(g for g in report.groups if g.n == 2)
    assert main.cells[128].mean == pytest.approx(3.1)  # 9.0 and 8.0 are not in it
    apart = [g for g in report.groups if g.n == 1]
    assert "kept apart: not comparable" not in main.flags  # the sweep's own rope runs are still compared
    assert all("kept apart: not comparable" in g.flags for g in apart)
    assert {f for g in apart for f in g.flags} >= {"different corpus", "different eval settings"}
    assert any("corpus stdlib fp-other" in g.label for g in apart)
    assert any("never averaged together" in w for w in report.warnings)
    md = render_table_markdown(report)
    assert md.count("kept apart: not comparable") == 2


def test_a_stray_run_is_set_aside_alone_and_the_rest_of_its_group_still_compared(tmp_path):
    """One rope run trained at another length, dropped into a folder with a sweep: it stands apart, named in a
    warning; the sweep's own rope runs were kept apart with it and left out of the comparison."""
    runs = seeds(tmp_path, "rope", [3.0, 3.2]) + seeds(tmp_path, "alibi", [3.5, 3.6], base=None)
    runs.append(make_run(tmp_path / "stray", {256: 3.1, 512: 4.0}, ["encoder=rope", "train_len=256"], train_len=256))
    report = build_report(runs, ReportOptions(by="encoder", metrics="ratio@2x", baseline="encoder=alibi"))
    flags = {g.label: g.flags for g in report.groups}
    assert flags == {"encoder=rope": [], "encoder=rope [train_len=256]": ["different train length",
                                                                         "kept apart: not comparable"],
                     "encoder=alibi": []}
    verdicts = {d.group: d.verdict for d in report.comparison.differences}
    assert verdicts["encoder=rope [train_len=256]"] == "not compared" and verdicts["encoder=rope"] != "not compared"
    assert any(w.startswith("encoder=rope train_len=256: different train length") for w in report.warnings)
    assert "1 group has the same --by values but a different corpus, eval settings, train length or status; it is " \
           "shown apart, never averaged with the others" in report.warnings


def test_runs_of_an_encoders_earlier_revision_stand_apart_from_the_runs_of_its_latest(tmp_path):
    """fox runs trained before its fix (no encoder.revision) and after it (revision 2) are different methods: --by
    encoder pooled them as seeds of one group ("averaged over encoder.revision"). The earlier ones stand apart, named
    in a warning and never compared, as runs on another corpus; a mix is read by its layers' revisions; grouping by
    encoder.revision compares them on purpose."""
    def fox(name: str, ppl: float, seed: int, revision: dict) -> object:
        return make_run(tmp_path / name, {128: ppl, 256: ppl + 1}, ["encoder=fox", f"seed={seed}"], encoder="fox",
                        seed=seed, config={"encoder": {"name": "fox", **revision}})

    latest = [fox(f"new{i}", 3.0 + i / 10, i, {"revision": 2}) for i in range(2)]
    earlier = fox("old", 5.0, 7, {})
    mix = make_run(tmp_path / "mix", {128: 4.0, 256: 5.0}, ["encoder=mixed"], encoder="mixed[rope,fox]",
                   config={"encoder": {"name": "mixed", "layers": ["rope", "fox"], "options": None}})
    rope = make_run(tmp_path / "rope", {128: 3.5, 256: 4.5}, ["encoder=rope"])
    report = build_report([*latest, earlier, mix, rope], ReportOptions(by="encoder"))
    groups = by_group(report)
    assert groups["encoder=fox"].n == 2 and groups["encoder=fox"].cells[128].mean == pytest.approx(3.05)
    apart = groups["encoder=fox [fox revision 1 (2 in others)]"]
    assert apart.flags == ["earlier encoder revision", "kept apart: not comparable"]
    assert groups["encoder=mixed[rope,fox]"].flags == ["earlier encoder revision"]
    assert groups["encoder=rope"].flags == []
    verdicts = {d.group: d.verdict for d in report.comparison.differences}
    assert verdicts[apart.label] == verdicts["encoder=mixed[rope,fox]"] == "not compared"
    assert "encoder=fox seed=7: earlier encoder revision, fox revision 1 (2 in others): trained by other code; not " \
           "comparable with the other runs" in report.warnings
    report = build_report([*latest, earlier], ReportOptions(by=["encoder", "encoder.revision"]))
    assert [g.n for g in report.groups] == [2, 1] and not any(g.flags for g in report.groups)


def test_group_keys_from_nested_config_and_pooled_keys_are_flagged(tmp_path):
    deep = [make_run(tmp_path / f"d{i}", {128: 3.0 + i / 10}, ["model.n_layers=4", f"seed={i}"], seed=i,
                     config={"model": {"n_layers": 4}}) for i in range(2)]
    shallow = make_run(tmp_path / "s", {128: 4.0}, ["model.n_layers=2"], config={"model": {"n_layers": 2}})
    other_base = make_run(tmp_path / "b", {128: 3.5}, ["model.n_layers=4", "base=100"], base=100.0, seed=5,
                          config={"model": {"n_layers": 4}})
    report = build_report([*deep, shallow], ReportOptions(by="model.n_layers"))
    assert {g.label: g.n for g in report.groups} == {"model.n_layers=4": 2, "model.n_layers=2": 1}
    assert not any(g.flags for g in report.groups)  # the 4-layer runs differ only in seed

    report = build_report([*deep, other_base], ReportOptions(by="model.n_layers"))
    assert by_group(report)["model.n_layers=4"].flags == ["averaged over base"]
    assert any("differ in base" in w for w in report.warnings)
    # Grouping by base as well separates them again.
    report = build_report([*deep, other_base], ReportOptions(by=["model.n_layers", "base"]))
    assert len(report.groups) == 2 and not any(g.flags for g in report.groups)


def test_key_read_from_hydra_config_when_results_have_none(tmp_path):
    run = make_run(tmp_path / "r", {128: 3.0}, ["encoder=rope"])
    data = json.loads((run / "results.json").read_text())
    del data["run"]["config"]
    (run / "results.json").write_text(json.dumps(data))
    (run / ".hydra" / "config.yaml").write_text("model:\n  n_layers: 6\n")
    report = build_report([run], ReportOptions(by="model.n_layers"))
    assert report.groups[0].key == {"model.n_layers": 6}


def test_failed_run_stays_its_own_group(tmp_path):
    ok = seeds(tmp_path, "rope", [3.0, 3.2])
    failed = make_run(tmp_path / "f", {}, ["encoder=rope", "seed=9"], status="failed", seed=9)
    report = build_report([*ok, failed], ReportOptions(by="encoder"))
    assert [g.n for g in report.groups] == [2, 1]
    assert "status: failed" in report.groups[1].flags
    assert report.groups[0].cells[128].mean == pytest.approx(3.1)


def test_run_that_failed_before_its_data_is_not_called_another_corpus(tmp_path):
    """A sweep job that failed before reading data has no fingerprint or eval settings: it is flagged
    failed, not "different corpus", and it does not outvote the finished runs."""
    ok = seeds(tmp_path, "rope", [3.0, 3.2])
    early = []
    for seed in (8, 9):  # more failed runs than finished ones with any one fingerprint
        run = make_run(tmp_path / f"f{seed}", {}, ["encoder=rope", f"seed={seed}"], status="failed", seed=seed)
        info = json.loads((run / "results.json").read_text())
        info["run"]["corpus_fingerprint"] = info["run"]["eval_settings"] = None
        (run / "results.json").write_text(json.dumps(info))
        early.append(run)
    other = make_run(tmp_path / "o", {128: 9.0}, ["encoder=alibi"], encoder="alibi", fingerprint="fp-other")
    report = build_report([*early, *ok, other])
    flags = {row.run.path.name: row.flags for row in report.rows}
    for name in ("f8", "f9"):
        assert "status: failed" in flags[name] and not any(f.startswith("different") for f in flags[name])
    assert report.corpus == ("stdlib", "fp-stdlib")
    assert "different corpus" in flags["o"]
    assert not any("corpus" in f for name, fs in flags.items() if name != "o" for f in fs)


def test_summary_metrics(tmp_path):
    ppls = {128: 3.0, 256: 3.2, 512: 3.5, 1024: 5.0}
    run = make_run(tmp_path / "rope", ppls, ["encoder=rope"])
    learned = make_run(tmp_path / "learned", {128: 3.1, 256: None, 512: None, 1024: None}, ["encoder=learned"],
                       encoder="learned")
    report = build_report([run, learned],
                          ReportOptions(metrics="ratio@4x,ratio@1024,ppl@2x,maxlen,maxlen@20%,auc,auc@4x"))
    row, lrow = report.rows

    def value(name, r=row):
        return metric_value(parse_metric(name), r, report)

    assert value("ratio@4x") == (True, pytest.approx(3.5 / 3.0))
    assert value("ratio@1024") == (True, pytest.approx(5.0 / 3.0))
    assert value("ppl@2x") == (True, pytest.approx(3.2))
    assert value("maxlen") == (True, 256)  # 3.2 <= 3.3, then 3.5 > 3.3 (10% over 3.0)
    assert value("maxlen@20%") == (True, 512)  # 3.5 <= 3.6, 5.0 > 3.6
    xs = [math.log2(n) for n in ppls]
    ys = [math.log(p) for p in ppls.values()]
    area = sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(3))
    assert report.auc_multiple == 8
    assert value("auc") == (True, pytest.approx(area))
    assert value("auc@4x") == (True, pytest.approx(sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2
                                                      for i in range(2))))
    # Learned positions past their table: n/a, except maxlen, which is the training length itself.
    assert value("ratio@4x", lrow) == (False, None)
    assert value("auc", lrow) == (False, None)
    assert value("maxlen", lrow) == (True, 128)
    # A length the run was never evaluated at is missing, not n/a.
    assert value("ratio@16x") == (None, None)
    groups = by_group(report)
    assert groups["encoder=learned"].metrics["ratio@4x"].text() == "n/a"
    assert groups["encoder=rope"].metrics["maxlen@10%"].text(0) == "256"


def test_sort_and_where(tmp_path):
    runs = [make_run(tmp_path / enc, {128: 3.0, 256: p}, [f"encoder={enc}"], encoder=enc,
                     base=10000.0 if enc == "rope" else None)
            for enc, p in (("rope", 4.5), ("alibi", 3.0), ("t5", 3.6), ("learned", None))]
    report = build_report(runs, ReportOptions(by="encoder", metrics="ratio@2x", sort="ratio@2x"))
    assert [g.key["encoder"] for g in report.groups] == ["alibi", "t5", "rope", "learned"]  # n/a last
    report = build_report(runs, ReportOptions(by="encoder", metrics="ratio@2x", sort="-ratio@2x"))
    assert [g.key["encoder"] for g in report.groups] == ["rope", "t5", "alibi", "learned"]
    # Sorting by a metric not asked for adds its column.
    report = build_report(runs, ReportOptions(by="encoder", metrics="ratio@2x", sort="-maxlen@10%"))
    assert [m.name for m in report.metrics] == ["ratio@2x", "maxlen@10%"]

    rope_or_t5 = build_report(runs, ReportOptions(where="encoder=rope,t5"))
    assert [r.label for r in rope_or_t5.rows] == ["encoder=rope", "encoder=t5"]
    assert [r.label for r in build_report(runs, ReportOptions(where=["encoder!=rope", "base=null"])).rows] == [
        "encoder=alibi", "encoder=t5", "encoder=learned"]
    base_10000 = build_report(runs, ReportOptions(where="base=10000"))
    assert [r.label for r in base_10000.rows] == ["encoder=rope"]  # 10000.0 in json
    # a value no run has: the values they have, to pick from
    with pytest.raises(PosexpError, match=r"^no run matches encoder=nope \(of 4 runs; they have encoder rope, alibi, t5, "
                                          r"learned\); values are compared as in results.json"):
        build_report(runs, ReportOptions(where="encoder=nope"))
    with pytest.raises(PosexpError, match=r"^no run matches encoder=alibi and base=10000 \(of 4 runs; they have "
                                          r"encoder rope, alibi, t5, learned; base 10000, null\)"):
        build_report(runs, ReportOptions(where=["encoder=alibi", "base=10000"]))


def test_where_on_a_list_valued_key_matches_the_list_as_the_command_line_spells_it(tmp_path):
    """--where eval.multiples=[1,2,4] was split at its commas into '[1', '2', '4]' and matched no run."""
    runs = [make_run(tmp_path / name, {128: 3.0, 256: 3.3}, [f"encoder.layers={name}"],
                     config={"eval": {"multiples": multiples}, "encoder": {"layers": layers}})
            for name, multiples, layers in (("mixed", [1, 2, 4], ["rope", "none"]), ("rope", [1, 2], ["rope", "rope"]))]

    def kept(*where: str) -> list[str]:
        return [r.run.path.name for r in build_report(runs, ReportOptions(where=list(where))).rows]

    assert kept("eval.multiples=[1,2,4]") == kept("eval.multiples=[1, 2, 4]") == ["mixed"]
    assert kept("encoder.layers=[rope,none]") == kept("eval.multiples!=[1,2]") == ["mixed"]
    assert kept("eval.multiples=[1,2,4],[1,2]") == ["mixed", "rope"]  # either of two lists


def test_where_and_baseline_find_nope_whose_encoder_is_named_none(tmp_path):
    """NoPE is encoder=none: --where encoder=none matched no run ("they have encoder rope, none") and --baseline
    encoder=none no group ("the groups are: encoder=rope; encoder=none"), "none" being read as null only."""
    runs = [make_run(tmp_path / f"{enc}{seed}", {128: 3.0, 256: 3.3 + enc.startswith("n") + seed / 10},
                     [f"encoder={enc}", f"seed={seed}"], encoder=enc, base=10000.0 if enc == "rope" else None,
                     seed=seed) for enc in ("rope", "none") for seed in (0, 1)]
    assert [r.label for r in build_report(runs, ReportOptions(where="encoder=none")).rows] == ["seed=0", "seed=1"]
    assert len(build_report(runs, ReportOptions(where="base=none")).rows) == 2  # a null value still matches
    with pytest.raises(PosexpError, match="no run matches encoder=null"):  # no encoder is missing
        build_report(runs, ReportOptions(where="encoder=null"))
    report = build_report(runs, ReportOptions(by="encoder", baseline="encoder=none", metrics="ratio"))
    assert report.comparison.reference == "encoder=none"


@pytest.mark.parametrize("kwargs, option, allowed", [
    ({"by": "encoder,modle.n_layers"}, "--by", "model.n_layers"),
    ({"where": "nokey=1"}, "--where", "encoder"),
    ({"where": "encoder"}, "--where", "KEY=VALUE"),
    ({"metrics": "perplexity"}, "--metric", "ratio@Kx"),
    ({"metrics": "ratio@eight"}, "--metric", "8x"),
    ({"metrics": "maxlen@0.1"}, "--metric", "maxlen@10%"),
    ({"metrics": "auc@1x"}, "--metric", "auc@16x"),
    ({"sort": "speed"}, "--sort", "maxlen@10%"),
    ({"tolerance": 0.0}, "--tolerance", "0.1"),
])
def test_bad_options_name_the_option_and_allowed_values(tmp_path, kwargs, option, allowed):
    run = make_run(tmp_path / "r", {128: 3.0}, config={"model": {"n_layers": 2}})
    with pytest.raises(ConfigError) as err:
        build_report([run], ReportOptions(**kwargs))
    assert str(err.value).startswith(f"{option}: ") and allowed in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_format_is_a_config_error(tmp_path):
    run = make_run(tmp_path / "r", {128: 3.0})
    with pytest.raises(ConfigError, match=r"--format: unknown format 'xlsx'; choose one of rich, markdown, csv, "
                                          r"json, latex"):
        report_main([run], console=quiet_console(), options=ReportOptions(fmt="xlsx"))
    assert not (run / "report.md").exists()


def test_a_metric_named_as_a_length_column_is_one_csv_column(tmp_path):
    """``--metric ppl@256 --format csv`` wrote two columns named ppl@256 (the length's and the metric's): csv
    readers then keep one, or rename the other."""
    runs = [make_run(tmp_path / "a", {128: 3.0, 256: 4.5}, ["encoder=rope"]),
            make_run(tmp_path / "b", {128: 3.0, 256: 3.5}, ["encoder=alibi"], encoder="alibi")]
    report = build_report(runs, ReportOptions(by="encoder", metrics="ppl@256,ratio@2x"))
    header, *lines = list(csv.reader(io.StringIO(render_table_csv(report))))
    assert len(header) == len(set(header)), header
    assert header.count("ppl@256") == 1 and "ratio@2x" in header
    rows = [dict(zip(header, line)) for line in lines]
    assert float(rows[1]["ppl@256"]) == pytest.approx(3.5) and rows[1]["ppl@256_low"] != ""
    assert rows[1]["best"].split() == ["ppl@256", "ratio@2x"]
    assert json.loads(render_json(report))["groups"][1]["best"] == ["ppl@256", "ratio@2x"]


def test_machine_readable_formats(tmp_path):
    runs = seeds(tmp_path, "rope", [3.0, 3.2]) + [
        make_run(tmp_path / "odd", {128: 9.0, 256: 9.9}, ["encoder=rope_odd"], fingerprint="fp-other")]
    report = build_report(runs, ReportOptions(by="encoder", metrics="ratio@2x"))
    rows = list(csv.DictReader(io.StringIO(render_table_csv(report))))
    assert [r["encoder"] for r in rows] == ["rope", "rope"]
    assert rows[0]["n"] == "2" and float(rows[0]["ppl@128"]) == pytest.approx(3.1)
    assert float(rows[0]["ppl@128_low"]) < 3.1 < float(rows[0]["ppl@128_high"])
    assert float(rows[0]["ratio@2x"]) == pytest.approx(1.5) and rows[0]["ratio@2x_n"] == "2"
    assert "different corpus" in rows[1]["flags"]

    data = json.loads(render_json(report))
    assert data["by"] == ["encoder"] and data["groups"][0]["n"] == 2
    assert data["groups"][0]["ppl"]["128"]["mean"] == pytest.approx(3.1)
    assert "ratio@2x" in data["metrics"] and data["warnings"]

    tex = render_latex(report)
    assert "\\begin{tabular}{lrrrrl}" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    assert "$3.10 \\pm" in tex and "ratio@2x" in tex
    assert "kept apart: not comparable" in tex


def test_report_main_format_prints_only_the_table(tmp_path):
    runs = seeds(tmp_path / "sweep", "rope", [3.0, 3.2])
    out, err = quiet_console(), quiet_console()
    report_main([tmp_path / "sweep"], out=tmp_path / "rep", console=out, err_console=err,
                options=ReportOptions(by="encoder", fmt="csv", metrics="ratio@2x"))
    rows = list(csv.DictReader(io.StringIO(out.file.getvalue())))
    assert len(rows) == 1 and rows[0]["encoder"] == "rope"
    assert "wrote" in err.file.getvalue() and "wrote" not in out.file.getvalue()
    assert runs


def test_report_md_is_self_contained_with_figures(tmp_path):
    sweep = tmp_path / "sweep"
    for enc, base in (("rope", 10000.0), ("alibi", None)):
        for i in range(2):
            make_run(sweep / f"{enc}{i}", {128: 3.0 + i / 10, 256: 3.5, 512: 4.0}, [f"encoder={enc}", f"seed={i}"],
                     encoder=enc, base=base, seed=i, curves=True)
    console = quiet_console()
    folder = report_main([sweep], console=console,
                         options=ReportOptions(by="encoder", metrics="ratio@4x,maxlen,auc")).parent
    assert folder == sweep / "reports" / "by-encoder"
    md = (folder / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images == ["report_ppl_vs_length.png", "report_loss_by_position.png", "report_training_curves.png"]
    for image in images:
        assert (folder / image).read_bytes()[:8] == PNG_MAGIC
    assert "| encoder | n | 128 (train) | 256 | 512 | ratio@4x | maxlen@10% | auc | flags |" in md
    assert "Student 1908" in md and "## Runs" in md
    # summary.md keeps one line per run next to it.
    summary = (folder / "summary.md").read_text()
    assert "| encoder=rope seed=0 | 3.00 | 3.50 | 4.00 |" in summary
    assert "| encoder=rope seed=1 | 3.10 | 3.50 | 4.00 |" in summary
    printed = console.file.getvalue()
    assert "rope" in printed and "±" in printed and "ratio@4x" in printed


def test_legend_names_encoding_and_base(tmp_path):
    from posexp.reporting.render import legend_label

    runs = seeds(tmp_path, "rope", [3.0, 3.1]) + seeds(tmp_path, "alibi", [3.5], base=None)
    report = build_report(runs, ReportOptions(by="encoder"))
    assert [legend_label(report, g) for g in report.groups] == ["rope, base 10000 (n=2)", "alibi"]
    report = build_report(runs)
    assert legend_label(report, report.groups[0]) == "rope, base 10000, seed=0"


def test_cli_report_options_and_errors(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    seeds(tmp_path / "sweep", "rope", [3.0, 3.2])
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--by", "encoder", "--metric", "ratio@2x",
                                 "--format", "markdown", "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert "| encoder | n | 128 (train) | 256 | ratio@2x | flags |" in result.stdout
    assert (tmp_path / "rep" / "report.md").is_file()
    result = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--by", "encodr"])
    assert result.exit_code == 2
    assert "--by: unknown config key 'encodr'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("target,message", [
    ("a_file", "--out: {out} is a file; give a folder of the report's own (made if missing)"),
    ("sweep/rope-10000.0-0", "--out: {out} is a run folder, whose files are its own"),
])
def test_a_wrong_out_stops_before_the_table_is_printed(tmp_path, target, message):
    """`posexp report SWEEP --format csv --out FILE > table.csv` wrote the table, then failed with exit status 2
    ('cannot replace the earlier report's FILE/report.md: Not a directory' for a file)."""
    seeds(tmp_path / "sweep", "rope", [3.0, 3.2])
    (tmp_path / "a_file").write_text("mine\n")
    out = io.StringIO()
    with pytest.raises(ConfigError) as e:
        report_main([tmp_path / "sweep"], tmp_path / target, console=Console(file=out),
                    options=ReportOptions(fmt="csv"))
    assert str(e.value).startswith(message.format(out=tmp_path / target)) and out.getvalue() == ""
    assert (tmp_path / "a_file").read_text() == "mine\n"


def test_group_cell_with_fewer_runs_says_how_many(tmp_path):
    a = make_run(tmp_path / "a", {128: 3.0, 256: 3.3, 512: 4.0}, ["encoder=rope", "seed=0"])
    b = make_run(tmp_path / "b", {128: 3.2, 256: 3.5}, ["encoder=rope", "seed=1"], seed=1)
    report = build_report([a, b], ReportOptions(by="encoder", metrics="ratio@2x"))
    assert report.groups[0].cells[512].n == 1
    assert "| rope | 2 | 3.10 ± " in render_table_markdown(report)
    assert "| 4.00 (n=1) |" in render_table_markdown(report)


def test_group_by_train_len_compares_lengths_without_flagging_them(tmp_path):
    short = seeds(tmp_path / "short", "rope", [3.0, 3.2])
    long = [make_run(tmp_path / f"long{i}", {256: 2.8, 512: 3.0}, ["encoder=rope", "train_len=256", f"seed={i}"],
                     train_len=256, seed=i) for i in range(2)]
    report = build_report([*short, *long], ReportOptions(by="train_len", metrics="ratio@2x"))
    assert [(g.key["train_len"], g.n) for g in report.groups] == [(128, 2), (256, 2)]
    assert not any(g.flags for g in report.groups) and not report.warnings
    assert report.groups[1].metrics["ratio@2x"].mean == pytest.approx(3.0 / 2.8)
    # Without --by train_len the odd length is still flagged, and never averaged with the others.
    report = build_report([*short, *long], ReportOptions(by="encoder"))
    assert [g.flags for g in report.groups] == [[], ["different train length", "kept apart: not comparable"]]


def test_the_plain_ratio_is_never_taken_at_a_runs_own_training_length(tmp_path):
    """Runs trained at 16 reach 64, runs trained at 64 reach 256: 64 is past the first ones' training length but is
    the others' own, where a ratio is 1 by construction; no length is past both, so the plain ratio is n/a."""
    short = [make_run(tmp_path / f"short{i}", {16: 26.0 + i, 32: 26.5 + i, 64: 27.0 + i},
                      ["encoder=rope", "train_len=16", f"seed={i}"], train_len=16, seed=i) for i in range(2)]
    long = [make_run(tmp_path / f"long{i}", {64: 24.0 + i, 128: 25.0 + i, 256: 30.0 + i},
                     ["encoder=rope", "train_len=64", f"seed={i}"], train_len=64, seed=i) for i in range(2)]
    report = build_report([*short, *long], ReportOptions(by="train_len", metrics="ratio,ratio@2x"))
    assert report.ratio_length is None
    assert all(g.metrics["ratio"].mean is None for g in report.groups)
    assert report.groups[1].metrics["ratio@2x"].mean == pytest.approx((25.0 / 24.0 + 26.0 / 25.0) / 2)
    assert "ratio = ppl at the longest length / ppl at the training length; n/a here" in render_markdown(report)


def test_a_stray_run_at_another_train_len_does_not_take_the_others_ratio_away(tmp_path):
    """A sweep at 128 (128 and 256 tokens) and one run at 256 (256 and 512) dropped beside it: 256 is the stray's own
    training length, so no length was past every run's and the ratio was n/a for every run; it is the sweep's at 256
    now, and n/a for the stray alone, which is flagged as trained at another length."""
    runs = seeds(tmp_path, "rope", [3.0, 3.2])
    runs.append(make_run(tmp_path / "stray", {256: 3.1, 512: 4.0}, ["encoder=rope", "train_len=256"], train_len=256))
    report = build_report(runs, ReportOptions(metrics="ratio"))
    assert report.ratio_length == 256
    assert [row.ratio for row in report.rows] == [pytest.approx(1.5), pytest.approx(1.5), None]
    assert "different train length" in report.rows[2].flags


def test_the_ratio_note_names_the_training_length_of_the_runs_compared_not_a_strays(tmp_path):
    """Two runs at 128 and a stray at 256 (flagged, not compared): the note read "ppl at 512 / ppl at each run's own
    training length (128; 256 for encoder=rope seed=1)", as if the stray were a fine-tune compared at its parent's."""
    runs = [make_run(tmp_path / "a", {128: 3.0, 256: 3.5, 512: 4.0}, ["encoder=rope", "seed=0"]),
            make_run(tmp_path / "b", {128: 3.0, 256: 3.4, 512: 3.9}, ["encoder=alibi", "seed=0"], encoder="alibi"),
            make_run(tmp_path / "c", {128: 3.1, 256: 3.2, 512: 3.3, 1024: 3.6}, ["encoder=rope", "seed=1"],
                     train_len=256)]
    report = build_report(runs, ReportOptions(metrics="ratio"))
    assert "different train length" in report.rows[2].flags
    assert report.metrics[0].describe(report).startswith("ratio = ppl at 512 / ppl at the training length (128); ")
    assert "256 for encoder=rope seed=1" in render_markdown(report)  # its training length, said where it is


def test_a_run_near_its_corpus_unigram_perplexity_is_marked_did_not_learn(tmp_path):
    """A model whose perplexity at its own training length is about what token frequencies alone give did not
    learn to read its context: a flat curve past 1x from it is no sign of extrapolation."""
    from posexp.reporting import build_report

    def with_unigram(folder, unigram):
        results = json.loads((folder / "results.json").read_text())
        if unigram is not None:
            results["run"]["unigram_ppl"] = unigram
        (folder / "results.json").write_text(json.dumps(results))
        return folder

    runs = [with_unigram(make_run(tmp_path / "flat", {128: 24.0, 256: 24.1}, ["encoder=none"], encoder="none"), 25.0),
            with_unigram(make_run(tmp_path / "learned", {128: 4.6, 256: 5.0}, ["encoder=rope"]), 25.0),
            with_unigram(make_run(tmp_path / "old", {128: 24.0, 256: 24.0}, ["encoder=alibi"], encoder="alibi"), None)]
    report = build_report(runs)
    flags = {row.label: row.flags for row in report.rows}
    assert "did not learn at 1×" in flags["encoder=none"]
    assert "did not learn at 1×" not in flags["encoder=rope"]
    assert "did not learn at 1×" not in flags["encoder=alibi"]  # written before runs recorded unigram_ppl
    (warning,) = [w for w in report.warnings if w.startswith("did not learn at 1×")]
    assert "encoder=none" in warning and "encoder=rope" not in warning


def test_the_unigram_perplexity_is_the_vocabulary_for_uniform_tokens_and_near_one_for_a_constant_stream():
    import numpy as np

    from posexp.data.tokens import unigram_perplexity

    uniform = np.random.default_rng(0).integers(0, 256, 200_000).astype(np.uint8)
    assert unigram_perplexity(uniform, uniform[:20_000], 256) == pytest.approx(256, rel=0.01)
    constant = np.full(10_000, 7, dtype=np.uint8)
    assert unigram_perplexity(constant, constant, 256) == pytest.approx(1.0, abs=0.03)
    assert unigram_perplexity(constant[:0], constant, 256) is None


def test_a_sweep_and_its_backup_copy_under_one_folder_count_each_run_once(tmp_path):
    """Every run counted twice turned a paired comparison at n = 2 into Welch's at n = 4, with no word."""
    import shutil

    from posexp.reporting import build_report
    from posexp.runs.layout import find_runs

    for e in ("rope", "alibi"):
        for s in range(2):
            make_run(tmp_path / "sweep" / f"{e}{s}", {128: 4.0 + s, 256: 5.0 + s}, [f"encoder={e}", f"seed={s}"],
                     encoder=e, seed=s, config={"hash_of": e})
            folder = tmp_path / "sweep" / f"{e}{s}"
            results = json.loads((folder / "results.json").read_text())
            results["run"]["config_hash"] = f"{e}-{s}"
            results["run"]["train"]["final_loss"] = 1.0 + s / 10
            (folder / "results.json").write_text(json.dumps(results))
    shutil.copytree(tmp_path / "sweep", tmp_path / "sweep.bak")
    report = build_report(find_runs(tmp_path), ReportOptions(by="encoder"))
    assert sorted(len(g.rows) for g in report.groups) == [2, 2]
    copies = [w for w in report.warnings if "the same run as" in w]
    assert len(copies) == 4 and all("counted once" in w for w in copies)


def test_a_run_without_the_viewed_rows_is_flagged_by_the_view_not_a_protocol_it_has(tmp_path):
    """``--view window=16`` flagged a run that has plain rows but no windowed ones "no nonoverlap results"."""
    from posexp.reporting import build_report

    windowed = [{"length": n, "multiple": n / 128, "protocol": "nonoverlap", "scaling": None, "window": 16,
                 "sinks": 0, "applicable": True, "ppl": 6.0, "loss": 1.8, "ppl_low": 5.9, "ppl_high": 6.1,
                 "tokens": 65536, "tokens_per_s": 1.0, "peak_mem_mb": 1.0} for n in (128, 256)]
    a = make_run(tmp_path / "a", {128: 4.0, 256: 4.5}, ["encoder=rope"], extra_rows=windowed)
    b = make_run(tmp_path / "b", {128: 4.1, 256: 4.6}, ["encoder=alibi"], encoder="alibi")
    report = build_report([a, b], ReportOptions(view="window=16"))
    flags = {row.label: row.flags for row in report.rows}
    assert "no window=16 rows" in flags["encoder=alibi"]
    assert not any("nonoverlap" in f for f in flags["encoder=alibi"])
    assert not flags["encoder=rope"]


def test_the_one_run_with_rows_in_the_view_is_not_flagged_for_its_eval_settings(tmp_path):
    """posexp eval RUN eval.scaling=linear, then --view scaling=linear of its sweep: the runs with no linear rows
    outvoted the one that has them, which was flagged "different eval settings" and left out of the comparison."""
    from posexp.reporting import build_report

    linear = [{**r, "scaling": "linear", "scaling_factor": 2.0} for r in ppl_rows({128: 4.0, 256: 4.2}, 128)]
    runs = [make_run(tmp_path / "a", {128: 4.0, 256: 4.5}, ["encoder=rope"], extra_rows=linear)]
    runs += [make_run(tmp_path / enc, {128: 4.1, 256: 4.6}, [f"encoder={enc}"], encoder=enc) for enc in ("alibi", "t5")]
    report = build_report(runs, ReportOptions(view="scaling=linear"))
    assert report.rows[0].flags == [] and not any("different eval settings" in w for w in report.warnings)


def test_a_hand_edited_list_seed_does_not_crash_the_report(tmp_path):
    from posexp.reporting import build_report

    a = make_run(tmp_path / "a", {128: 4.0, 256: 4.5}, ["encoder=rope"])
    b = make_run(tmp_path / "b", {128: 4.1, 256: 4.6}, ["encoder=alibi"], encoder="alibi")
    results = json.loads((b / "results.json").read_text())
    results["run"]["seed"] = [0]
    (b / "results.json").write_text(json.dumps(results))
    assert len(build_report([a, b], ReportOptions(by="encoder")).groups) == 2


def test_ratio_of_a_run_not_evaluated_at_1x_is_missing_and_of_one_that_cannot_run_there_not_applicable(tmp_path):
    full = make_run(tmp_path / "full", {128: 3.0, 256: 3.3, 512: 3.6}, ["encoder=rope"])
    unmeasured = make_run(tmp_path / "unmeasured", {256: 3.1, 512: 3.4}, ["encoder=alibi"], encoder="alibi")
    learned = make_run(tmp_path / "learned", {128: 3.0, 256: None, 512: None}, ["encoder=learned"],
                       encoder="learned")
    ratio = {g.label: g.metrics["ratio"].text() for g in
             build_report([full, unmeasured, learned], ReportOptions(by="encoder", metrics="ratio")).groups}
    assert ratio == {"encoder=rope": "1.20", "encoder=alibi": "—", "encoder=learned": "n/a"}


def test_a_view_whose_rows_measure_a_length_several_ways_says_which_it_shows(tmp_path):
    from helpers.runs import ppl_rows, write_run

    rows = ppl_rows({64: 7.0, 128: 8.0}, 64)
    rows += [{**r, "scaling_options": "offset=21 local=4"} for r in ppl_rows({64: 7.1, 128: 7.5}, 64, "string")]
    rows += [{**r, "scaling_options": "offset=40 local=4"} for r in ppl_rows({128: 7.3}, 64, "string")]
    rows += ppl_rows({64: 7.0, 128: 7.6}, 64, "yarn")
    write_run(tmp_path / "run", rows, ["encoder=rope"], "rope", train_len=64)
    report = build_report([tmp_path / "run"], ReportOptions(view=["scaling=string"]))
    assert report.rows[0].cells[128].mean == 7.5  # the first measured
    assert ("encoder=rope: its string rows measure a length 2 ways (offset=21 local=4; offset=40 local=4); the table "
            "shows the first measured, --cols scaling shows each") in report.warnings
    yarn = build_report([tmp_path / "run"], ReportOptions(view=["scaling=yarn"]))  # one way per length: no warning
    assert not [w for w in yarn.warnings if "ways" in w]
