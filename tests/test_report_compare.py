"""posexp report --by: each group against a reference group, with a 95% interval over paired seeds and a verdict
in words; the same in report.md, the sweep's own summary.md and --format json."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from posexp.errors import ConfigError
from posexp.reporting import build_report, render_json, report_main
from posexp.reporting.compare import verdict_line
from posexp.reporting.stats import mean_interval, normal_quantile, runs_needed, t_quantile, welch_interval
from test_report import make_run

# The journey of the issue: base=100,1000,10000 x seed=0,1,2 gave ratios 1.22 ± 0.06, 1.25 ± 0.10, 1.25 ± 0.11
# (mean ± half-width of the 95% t-interval over 3 seeds). sd = half-width · √3 / t(0.975, 2).
JOURNEY = {100: (1.22, 0.06, (-1, 0, 1)), 1000: (1.25, 0.10, (0, 1, -1)), 10000: (1.25, 0.11, (1, -1, 0))}


def ratio_runs(root: Path, ratios: dict, train_ppl: float = 3.0, seeds=(0, 1, 2)) -> list[Path]:
    """One run per (base, seed) with ppl ``train_ppl`` at 128 tokens and ``ratio`` times it at 512."""
    runs = []
    for base, values in ratios.items():
        for seed, ratio in zip(seeds, values):
            runs.append(make_run(root / f"base{base}-s{seed}", {128: train_ppl, 256: train_ppl, 512: ratio * train_ppl},
                                 [f"base={base}", f"seed={seed}"], base=float(base), seed=seed))
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return runs


def journey_ratios() -> dict[int, list[float]]:
    t = t_quantile(0.975, 2)
    return {base: [mean + half * math.sqrt(3) / t * k for k in pattern]
            for base, (mean, half, pattern) in JOURNEY.items()}


# --- the statistics ------------------------------------------------------------


def test_t_quantile_known_answers():
    # Student's t table (e.g. NIST/SEMATECH e-Handbook, Table 1.3.6.7.2)
    assert t_quantile(0.975, 2) == pytest.approx(4.303, abs=5e-4)
    assert t_quantile(0.975, 9) == pytest.approx(2.262, abs=5e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)
    # a non-integer df (Welch) lies between its neighbours
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)


def test_normal_quantile_and_runs_needed():
    assert normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    assert normal_quantile(0.8) == pytest.approx(0.841621, abs=1e-6)
    # (z_0.975 + z_0.8)^2 = 7.85 paired pairs for a difference of one sd; twice that per group unpaired (Lehr's 16)
    assert runs_needed(1.0, 1.0) == pytest.approx(7.849, abs=1e-3)
    assert runs_needed(0.5, 1.0, groups=2) == pytest.approx(4 * 2 * 7.849, abs=1e-2)
    assert runs_needed(0.0, 1.0) == math.inf


def test_paired_and_welch_intervals_by_hand():
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, half-width 4.303 · 0.1 / √3 = 0.2484
    mean, low, high = mean_interval([0.1, 0.2, 0.3])
    assert (mean, low, high) == (pytest.approx(0.2), pytest.approx(0.2 - 0.24843, abs=1e-4),
                                 pytest.approx(0.2 + 0.24843, abs=1e-4))
    # equal sizes and variances: Welch's df is 2n - 2 = 4; half-width 2.776 · √(1/3 + 1/3) = 2.2667
    diff, low, high, df = welch_interval([3.0, 4.0, 5.0], [1.0, 2.0, 3.0])
    assert (diff, df) == (pytest.approx(2.0), pytest.approx(4.0))
    assert (low, high) == (pytest.approx(2 - 2.2667, abs=1e-3), pytest.approx(2 + 2.2667, abs=1e-3))


# --- the comparison in a report ------------------------------------------------


def test_paired_difference_over_seeds_matches_the_hand_computation(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.0, 1.1, 1.2], 1000: [1.1, 1.3, 1.5]})
    report = build_report(runs, by="base", metrics="ratio")
    (diff,) = report.comparison.differences
    assert (report.comparison.reference, diff.group, diff.method, diff.n) == ("base=100", "base=1000", "paired t", 3)
    assert (diff.difference, diff.low, diff.high) == (pytest.approx(0.2), pytest.approx(0.2 - 0.24843, abs=1e-4),
                                                      pytest.approx(0.2 + 0.24843, abs=1e-4))
    assert diff.verdict == "indistinguishable"
    # n ≈ 7.85 · (sd / diff)^2 = 7.85 · 0.25 = 1.96, but never fewer than one more than the n that did not tell
    assert diff.needed == 4


def test_journey_bases_cannot_be_told_apart_at_n_3(tmp_path):
    report = build_report(ratio_runs(tmp_path, journey_ratios()), by="base", metrics="ratio")
    ratio = {g.label: g.metrics["ratio"] for g in report.groups}
    assert [f"{s.mean:.2f} ± {s.spread:.2f}" for s in ratio.values()] == ["1.22 ± 0.06", "1.25 ± 0.10",
                                                                          "1.25 ± 0.11"]
    assert {d.verdict for d in report.comparison.differences} == {"indistinguishable"}
    line = verdict_line(report.comparison, report.metrics[0])
    assert "base=1000" in line and "base=10000" in line
    assert "cannot be told apart from base=100 at n = 3" in line
    assert "seed pairs would be needed" in line and "paired t, 95%" in line


def test_a_clear_difference_is_called_by_the_metrics_direction(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.20, 1.22, 1.21], 1000: [1.80, 1.85, 1.83], 10000: [1.21, 1.20, 1.23]})
    report = build_report(runs, by="base", metrics="ratio,maxlen")
    verdicts = {(d.group, d.metric): d.verdict for d in report.comparison.differences}
    assert verdicts[("base=1000", "ratio")] == "worse"  # a higher ratio is worse
    assert verdicts[("base=10000", "ratio")] == "indistinguishable"
    line = verdict_line(report.comparison, report.metrics[0])
    assert "base=1000 (+0.617 [" in line and "is worse beyond the interval" in line
    assert "base=10000 (" in line and "cannot be told apart from base=100 at n = 3" in line
    assert verdicts[("base=1000", "maxlen@10%")] == "equal"  # 256 tokens for every seed of both
    assert "maxlen@10% (higher is better)" in verdict_line(report.comparison, report.metrics[1])
    # against the worse group, the same difference is called better
    report = build_report(runs, by="base", metrics="ratio", baseline="base=1000")
    assert {d.group: d.verdict for d in report.comparison.differences} == {"base=100": "better", "base=10000": "better"}


def test_no_difference_and_groups_kept_apart_are_said_so(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.2, 1.3], 1000: [1.2, 1.3]}, seeds=(0, 1))
    runs.append(make_run(tmp_path / "other", {128: 3.0, 256: 3.0, 512: 4.0}, ["base=10000", "seed=0"],
                         base=10000.0, fingerprint="fp-other"))
    report = build_report(runs, by="base", metrics="ratio")
    line = verdict_line(report.comparison, report.metrics[0])
    assert "base=1000 shows no difference at all" in line
    assert "not compared: base=10000 (measured differently: different corpus)" in line


def test_baseline_selects_the_reference(tmp_path):
    runs = ratio_runs(tmp_path, journey_ratios())
    report = build_report(runs, by="base", metrics="ratio", baseline="base=1000")
    assert report.comparison.reference == "base=1000"
    assert [d.group for d in report.comparison.differences] == ["base=100", "base=10000"]
    with pytest.raises(ConfigError, match=r"^--baseline: no group has base=5; the groups are: base=100; "):
        build_report(runs, by="base", baseline="base=5")
    with pytest.raises(ConfigError, match="--baseline: seed=0 does not name a group; .* --by keys \\(base\\)"):
        build_report(runs, by="base", baseline="seed=0")
    with pytest.raises(ConfigError, match="--baseline: needs --by"):
        build_report(runs, baseline="base=100")


def test_one_run_per_group_says_no_interval_and_how_to_add_seeds(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.2], 1000: [1.3]}, seeds=(0,))
    report = build_report(runs, by="base", metrics="ratio")
    (diff,) = report.comparison.differences
    assert (diff.verdict, diff.low, diff.high, diff.n) == ("no interval", None, None, 1)
    line = verdict_line(report.comparison, report.metrics[0])
    assert "no interval exists" in line and "`seed=0,1,2`" in line


def test_seeds_that_differ_fall_back_to_welch(tmp_path):
    runs = (ratio_runs(tmp_path / "a", {100: [1.2, 1.25, 1.3]}, seeds=(0, 1, 2))
            + ratio_runs(tmp_path / "b", {1000: [1.3, 1.35, 1.4]}, seeds=(5, 6, 7)))
    (diff,) = build_report(runs, by="base", metrics="ratio").comparison.differences
    assert diff.method == "Welch t" and "unpaired" in diff.reason
    expected = welch_interval([1.3, 1.35, 1.4], [1.2, 1.25, 1.3])
    assert (diff.low, diff.high) == (pytest.approx(expected[1]), pytest.approx(expected[2]))


def test_json_carries_the_comparison_fields(tmp_path):
    report = build_report(ratio_runs(tmp_path, journey_ratios()), by="base", metrics="ratio")
    data = json.loads(render_json(report))
    comparison = data["comparison"]
    assert comparison["reference"] == "base=100" and comparison["confidence"] == 0.95
    assert "cannot be told apart" in comparison["metrics"]["ratio"]["verdict"]
    first = comparison["differences"][0]
    for field in ("reference", "difference", "low", "high", "n", "method", "verdict"):
        assert field in first
    assert (first["reference"], first["n"], first["method"]) == ("base=100", 3, "paired t")
    # equal everywhere at 128 and 256 tokens: nothing marked there
    assert data["groups"][0]["best"] == ["ppl@512", "ratio"] and data["groups"][0]["seeds"] == [0, 1, 2]


def test_report_md_and_terminal_carry_the_comparison(tmp_path):
    ratio_runs(tmp_path / "sweep", journey_ratios())
    out = io.StringIO()
    report_main([tmp_path / "sweep"], tmp_path / "out", console=Console(file=out, width=200),
                by="base", metrics="ratio")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Comparison" in md and "cannot be told apart from base=100 at n = 3" in md
    plain = md.replace("\\", "")  # markdown escapes of the brackets
    assert "| base=1000 | ratio | 3 | paired t | +0.030 [" in plain and "] | indistinguishable |" in plain
    assert "**1.22 ± 0.06**" in md  # the best ratio of the column is marked
    assert "cannot be told apart from base=100 at n = 3" in out.getvalue()


def test_sweep_summary_md_compares_what_the_sweep_varies(tmp_path):
    # what the end-of-sweep callback does: report the sweep folder without --by
    ratio_runs(tmp_path / "sweep", journey_ratios())
    out = io.StringIO()
    report_main([tmp_path / "sweep"], out=tmp_path / "sweep", console=Console(file=out, width=200), _sweep_end=True)
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "## Comparison" in summary and "cannot be told apart from base=100 at n = 3" in summary
    # the terminal of the finished sweep says it too, under its one-line-per-run table
    assert "Grouped by base" in out.getvalue() and "cannot be told apart from base=100 at n = 3" in out.getvalue()
    header = (tmp_path / "sweep" / "summary.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["label", "run_dir", "encoder", "base", "seed"]


def test_one_seed_sweep_summary_says_to_add_seeds(tmp_path):
    ratio_runs(tmp_path / "sweep", {100: [1.2], 1000: [1.3], 10000: [1.25]}, seeds=(0,))
    report_main([tmp_path / "sweep"], out=tmp_path / "sweep", console=Console(file=io.StringIO(), width=200),
                _sweep_end=True)
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "no interval exists" in summary and "`seed=0,1,2`" in summary


def test_cli_baseline_option(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    ratio_runs(tmp_path / "sweep", journey_ratios())
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--by", "base", "--metric", "ratio",
                                 "--baseline", "base=10000", "--format", "json", "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["comparison"]["reference"] == "base=10000"
    result = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--by", "base", "--baseline", "bse=1"])
    assert result.exit_code == 2 and "--baseline: bse=1 does not name a group" in result.output
    assert "Traceback" not in result.output
