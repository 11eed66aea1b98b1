"""Tests for the run report, its plot and the atomic writer, on fake run folders."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from posexp.errors import PosexpError
from posexp.io import atomic_write_bytes, atomic_write_text
from posexp.plots import plot_ppl_vs_length
from posexp.report import (
    SweepSummaryCallback,
    build_report,
    find_runs,
    load_run,
    print_report,
    render_csv,
    render_markdown,
    report_main,
    write_summary,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVAL = {"tokens": 65536, "protocol": "nonoverlap"}


def make_run(
    folder: Path,
    ppls: dict[int, float | None],
    overrides: list[str] | None = ("encoder=rope",),
    encoder: str = "rope",
    base: float | None = 10000.0,
    train_len: int = 128,
    fingerprint: str = "fp-stdlib",
    eval_settings: dict | None = None,
    status: str = "completed",
    extra_rows: list[dict] | None = None,
    overrides_in_results: bool = True,
) -> Path:
    """Write a run folder like the trainer does; a None perplexity means not applicable."""
    overrides = list(overrides or [])
    rows = []
    for length, ppl in ppls.items():
        rows.append({
            "length": length, "multiple": length / train_len, "protocol": "nonoverlap", "scaling": None,
            "applicable": ppl is not None, "ppl": ppl, "loss": None if ppl is None else 1.0,
            "loss_se": 0.01, "ppl_low": None if ppl is None else ppl * 0.98,
            "ppl_high": None if ppl is None else ppl * 1.02, "tokens": 65536, "windows": 65536 // length,
            "tokens_per_s": 40000.0, "peak_mem_mb": 210.0,
        })
    rows += extra_rows or []
    run = {
        "label": " ".join(overrides) or "default", "encoder": encoder, "base": base,
        "train_len": train_len, "seed": 0, "config": {"encoder": {"name": encoder}}, "config_hash": "ab12",
        "corpus": "stdlib", "corpus_fingerprint": fingerprint, "eval_settings": eval_settings or dict(EVAL),
        "versions": {"posexp": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}, "git_commit": None,
        "status": status, "params": 821504,
        "train": {"steps": 1000, "tokens": 4096000, "final_loss": 1.23, "wall_s": 120.0},
    }
    if overrides_in_results:
        run["overrides"] = overrides
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    (folder / ".hydra").mkdir(exist_ok=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides) or "[]\n")
    return folder


def make_sweep(root: Path, n: int) -> Path:
    for i in range(n):
        make_run(root / str(i), {128: 3.0 + i, 256: 4.0 + i}, overrides=["train.steps=50", f"seed={i}"])
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


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
    assert load_run(old).overrides == ["encoder=alibi"]


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
    assert report.rows[0].cells[256].ppl == 3.5
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
    assert "**Warning:** seed=2: different corpus" in md
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


# --- finding and loading runs ------------------------------------------------


def test_multirun_layout_natural_sort_and_report_main(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", 12)
    found = find_runs([sweep])
    assert [p.name for p in found] == [str(i) for i in range(12)]
    # Overlapping paths count each run once.
    assert find_runs([sweep, sweep / "3"]) == found

    summary = report_main([str(sweep)], console=quiet_console())
    assert summary == sweep / "summary.md"
    md = summary.read_text()
    assert md.index("| seed=2 |") < md.index("| seed=10 |")
    assert "`0`" in md  # run folders shown relative to the sweep root


def test_sweep_job_without_results_is_warned(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", 3)
    (sweep / "3" / ".hydra").mkdir(parents=True)  # a job that crashed before writing results
    md = report_main([str(sweep)], console=quiet_console()).read_text()
    assert "sweep job 3 has no results.json" in md


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
    assert summary.resolve() == (tmp_path / "summary.md").resolve()


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
        report_main([str(tmp_path / "sweep")], console=quiet_console())
    (bad / "results.json").write_text("[1, 2]")
    with pytest.raises(PosexpError, match=r"results\.json: top level is a list"):
        load_run(bad)


# --- outputs -----------------------------------------------------------------


def test_summary_csv_rows(tmp_path):
    rope = make_run(tmp_path / "sweep" / "0", {128: 3.0, 256: 3.3}, ["encoder=rope"])
    learned = make_run(tmp_path / "sweep" / "1", {128: 3.1, 256: None}, ["encoder=learned"],
                       encoder="learned", base=None)
    report = build_report([rope, learned])
    write_summary(report, tmp_path / "sweep")
    with (tmp_path / "sweep" / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["label", "run_dir", "encoder", "base", "length", "multiple", "protocol", "scaling",
                             "ppl", "ppl_low", "ppl_high", "loss", "applicable", "flags"]
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


def test_report_of_only_a_failed_run(tmp_path):
    run = make_run(tmp_path / "run", {}, status="failed")
    summary = report_main([str(run)], console=quiet_console())
    md = summary.read_text()
    assert "status: failed" in md and "**Warning:**" in md
    assert (run / "ppl_vs_length.png").read_bytes()[:8] == PNG_MAGIC


def test_print_report_has_title_and_values(tmp_path):
    report = build_report([make_run(tmp_path / "r", {128: 3.0, 256: None}, ["model=[a,b]"])])
    console = quiet_console()
    print_report(report, console)
    text = console.file.getvalue()
    assert "Perplexity vs context length" in text
    assert "model=[a,b]" in text and "3.00" in text and "n/a" in text


def test_hundred_runs_are_fast(tmp_path):
    dirs = [make_run(tmp_path / str(i), {n: 3.0 + i / 100 for n in (64, 128, 256, 512, 1024)}, [f"seed={i}"])
            for i in range(100)]
    start = time.perf_counter()
    report = build_report(find_runs([tmp_path]))
    print_report(report, quiet_console())
    render_markdown(report, tmp_path)
    render_csv(report, tmp_path)
    assert len(report.rows) == 100
    assert time.perf_counter() - start < 2.0


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


# --- the Hydra callback ----------------------------------------------------------


def test_callback_writes_summary_into_sweep_dir(tmp_path):
    sweep = make_sweep(tmp_path / "multirun" / "2024-01-01" / "12-00-00", 3)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"}}})
    SweepSummaryCallback().on_multirun_end(config)
    assert (sweep / "summary.md").is_file()
    assert (sweep / "summary.csv").is_file()


def test_callback_never_raises(tmp_path, caplog):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "missing")}}})
    with caplog.at_level(logging.WARNING, logger="posexp.report"):
        SweepSummaryCallback().on_multirun_end(config)
        SweepSummaryCallback().on_multirun_end(OmegaConf.create({}))
    assert "sweep summary not written" in caplog.text
    assert "missing: no such folder" in caplog.text
