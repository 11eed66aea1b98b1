"""posexp report --by: each group against a reference group, with a 95% interval over paired seeds and a verdict
in words a reviewer accepts (Holm-corrected, inconclusive rather than "the same", equivalence only within a
--margin, effects also in %); the same in report.md, the sweep's own summary.md and --format json."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from posexp.errors import ConfigError
from posexp.reporting import build_report, render_json, report_main
from posexp.reporting.compare import Difference, Margin, comparison_table, interval_text, parse_margin, verdict_line, verdict_lines, window_verdicts
from posexp.reporting.stats import (TTest, holm, mean_interval, runs_needed, runs_needed_equivalent,
                                    t_cdf, t_quantile, t_two_sided_p)
from posexp.reporting.options import ReportOptions
from helpers.runs import make_run

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


def test_runs_needed():
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
    test = TTest.welch([3.0, 4.0, 5.0], [1.0, 2.0, 3.0])
    (low, high), diff, df = test.interval(), test.difference, test.df
    assert (diff, df) == (pytest.approx(2.0), pytest.approx(4.0))
    assert (low, high) == (pytest.approx(2 - 2.2667, abs=1e-3), pytest.approx(2 + 2.2667, abs=1e-3))


def test_t_cdf_known_values():
    # the t table's two-sided 5% point with 4 degrees of freedom, and 1% with 9
    assert t_two_sided_p(2.776, 4) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(3.250, 9) == pytest.approx(0.01, abs=1e-4)
    for t in (-40.0, -3.0, -0.5, 0.0, 0.7, 5.0, 70.0):
        # closed forms: Cauchy (df = 1) and df = 2
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)
        assert t_cdf(-t, 3.5) == pytest.approx(1 - t_cdf(t, 3.5), abs=1e-13)
    # the far tail keeps its relative precision (p = 1 − t/√(2 + t²) for df = 2)
    assert t_two_sided_p(70.0, 2) == pytest.approx(1 - 70 / math.sqrt(4902), rel=1e-9)
    # the inverse of t_quantile (a different integral), also at a Welch df
    for df in (1, 1.5, 2, 4.3, 9, 30, 200):
        for p in (0.6, 0.9, 0.975, 0.995):
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-8)


def test_holm_adjusts_step_down():
    # Holm (1979): sorted 0.005, 0.01, 0.03, 0.04 are multiplied by 4, 3, 2, 1 and made monotone
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.03]) == [0.03]  # one test: nothing to correct
    assert holm([0.03, 0.2, 0.5, 0.6, 0.9])[0] == pytest.approx(0.15)
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1


def test_holm_rejects_what_the_sequential_procedure_rejects():
    import random

    rng = random.Random(0)
    for _ in range(200):
        ps = [rng.random() ** 3 for _ in range(rng.randint(1, 8))]
        m, rejected = len(ps), set()
        for j, i in enumerate(sorted(range(m), key=lambda i: ps[i])):  # reject while p_(j) <= α / (m − j)
            if ps[i] > 0.05 / (m - j):
                break
            rejected.add(i)
        adjusted = holm(ps)
        assert {i for i, a in enumerate(adjusted) if a <= 0.05} == rejected
        # never below the raw p, never above Bonferroni's m·p
        assert all(p <= a <= min(1.0, m * p) + 1e-15 for p, a in zip(ps, adjusted))


def test_tost_is_equivalent_exactly_when_the_90_interval_lies_inside_the_margin():
    # Schuirmann (1987): both one-sided tests reject at α ⇔ the (1 − 2α) interval lies inside (−margin, +margin)
    for shift in (0.0, 0.01, 0.02, 0.03, 0.05, -0.04):
        test = TTest.paired([shift + 0.01, shift - 0.01, shift + 0.004, shift])
        low, high = test.interval(0.90)
        for margin in (0.01, 0.025, 0.04, 0.06, 0.1):
            assert (test.equivalence_p(margin) < 0.05) == (-margin < low and high < margin), (shift, margin)
    # by hand: differences 0.1, 0.2, 0.3 (mean 0.2, se 0.1/√3); the lower test binds: P(T_2 > (0.2 − 0.5) / se)
    test = TTest.paired([0.1, 0.2, 0.3])
    assert test.equivalence_p(0.5) == pytest.approx(t_cdf((0.2 - 0.5) / (0.1 / math.sqrt(3)), 2))
    assert test.p_value() == pytest.approx(t_two_sided_p(0.2 / (0.1 / math.sqrt(3)), 2))


def test_runs_needed_to_show_equivalence():
    # Chow, Shao & Wang (2008) §3.1.4: (z_0.95 + z_0.9)² = (1.645 + 1.282)² = 8.56 for sd = margin, no difference
    assert runs_needed_equivalent(0.0, 1.0, 1.0) == pytest.approx(8.564, abs=1e-3)
    assert runs_needed_equivalent(0.5, 1.0, 1.0, groups=2) == pytest.approx(2 * 4 * 8.564, abs=1e-2)
    assert runs_needed_equivalent(1.0, 1.0, 1.0) == math.inf


def test_margin_parses_relative_and_absolute_forms():
    assert parse_margin("2%", ["encoder"]) == Margin(0.02, True) and str(Margin(0.02, True)) == "2%"
    assert parse_margin(" 0.05 ", ["encoder"]) == Margin(0.05, False) and str(Margin(0.05, False)) == "0.05"
    assert parse_margin(None, []) is None
    assert Margin(0.02, True).of(-1.5) == pytest.approx(0.03) and Margin(0.02, True).of(0.0) is None


@pytest.mark.parametrize("text", ["abc", "-2%", "0", "0%", "150%", "%", "nan", "inf", "2%%", ""])
def test_a_bad_margin_is_one_line_naming_the_option_and_its_forms(text):
    with pytest.raises(ConfigError) as caught:
        parse_margin(text, ["encoder"])
    message = str(caught.value)
    assert message.startswith(f"--margin: {text.strip()!r} is not a margin")
    assert message.endswith("use a percentage of the reference group's mean (e.g. 2%) or an absolute difference in "
                            "the metric's unit (e.g. 0.05), greater than 0")
    assert "\n" not in message


@pytest.mark.parametrize("text", ["200%", "100%"])
def test_a_relative_margin_of_100_percent_or_more_names_the_rule_it_breaks(text):
    with pytest.raises(ConfigError) as caught:
        parse_margin(text, ["encoder"])
    assert f"--margin: {text!r} is not a margin: a percentage must be under 100% of the reference group's mean" in \
        str(caught.value)


@pytest.mark.parametrize("text", ["-2%", "0", "0%"])
def test_a_margin_not_above_zero_names_the_rule_it_breaks(text):
    with pytest.raises(ConfigError) as caught:
        parse_margin(text, ["encoder"])
    assert "must be above 0" in str(caught.value)


def test_margin_needs_by(tmp_path):
    with pytest.raises(ConfigError, match="^--margin: needs --by"):
        build_report(ratio_runs(tmp_path, {100: [1.2, 1.3]}, seeds=(0, 1)), ReportOptions(margin="2%"))


# --- the comparison in a report ------------------------------------------------


def test_paired_difference_over_seeds_matches_the_hand_computation(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.0, 1.1, 1.2], 1000: [1.1, 1.3, 1.5]})
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    (diff,) = report.comparison.differences
    assert (report.comparison.reference, diff.group, diff.method, diff.n) == ("base=100", "base=1000", "paired t", 3)
    assert (diff.difference, diff.low, diff.high) == (pytest.approx(0.2), pytest.approx(0.2 - 0.24843, abs=1e-4),
                                                      pytest.approx(0.2 + 0.24843, abs=1e-4))
    assert diff.verdict == "inconclusive" and diff.text() == "inconclusive at n = 3 (about 4 seeds needed)"
    # n ≈ 7.85 · (sd / diff)^2 = 7.85 · 0.25 = 1.96, but never fewer than one more than the n that did not tell
    assert diff.needed == 4


def test_journey_bases_cannot_be_told_apart_at_n_3(tmp_path):
    report = build_report(ratio_runs(tmp_path, journey_ratios()), ReportOptions(by="base", metrics="ratio"))
    ratio = {g.label: g.metrics["ratio"] for g in report.groups}
    assert [f"{s.mean:.2f} ± {s.spread:.2f}" for s in ratio.values()] == ["1.22 ± 0.06", "1.25 ± 0.10",
                                                                          "1.25 ± 0.11"]
    assert {d.verdict for d in report.comparison.differences} == {"inconclusive"}
    line = verdict_line(report.comparison, report.metrics[0])
    assert "base=1000" in line and "base=10000" in line
    assert "are inconclusive against base=100 at n = 3" in line
    assert "seeds would be needed" in line and "paired t, 95%" in line


def test_a_clear_difference_is_called_by_the_metrics_direction(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.20, 1.22, 1.21], 1000: [1.80, 1.85, 1.83], 10000: [1.21, 1.20, 1.23]})
    report = build_report(runs, ReportOptions(by="base", metrics="ratio,maxlen"))
    verdicts = {(d.group, d.metric): d.verdict for d in report.comparison.differences}
    assert verdicts[("base=1000", "ratio")] == "worse"  # a higher ratio is worse
    assert verdicts[("base=10000", "ratio")] == "inconclusive"
    line = verdict_line(report.comparison, report.metrics[0])
    assert "base=1000 (+0.617 (+51.0%) [" in line and ", n = 3, Holm-adjusted p < 0.001) is worse" in line
    assert "base=10000 (" in line and "is inconclusive against base=100 at n = 3" in line
    assert verdicts[("base=1000", "maxlen@10%")] == "equal"  # 256 tokens for every seed of both
    assert "maxlen@10% (higher is better)" in verdict_line(report.comparison, report.metrics[1])
    # against the worse group, the same difference is called better
    report = build_report(runs, ReportOptions(by="base", metrics="ratio", baseline="base=1000"))
    assert {d.group: d.verdict for d in report.comparison.differences} == {"base=100": "better", "base=10000": "better"}


def test_no_difference_and_groups_kept_apart_are_said_so(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.2, 1.3], 1000: [1.2, 1.3]}, seeds=(0, 1))
    runs.append(make_run(tmp_path / "other", {128: 3.0, 256: 3.0, 512: 4.0}, ["base=10000", "seed=0"],
                         base=10000.0, fingerprint="fp-other"))
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    line = verdict_line(report.comparison, report.metrics[0])
    assert "base=1000 shows no difference at all" in line
    assert "not compared: base=10000 (measured differently: different corpus)" in line


def test_baseline_selects_the_reference(tmp_path):
    runs = ratio_runs(tmp_path, journey_ratios())
    report = build_report(runs, ReportOptions(by="base", metrics="ratio", baseline="base=1000"))
    assert report.comparison.reference == "base=1000"
    assert [d.group for d in report.comparison.differences] == ["base=100", "base=10000"]
    with pytest.raises(ConfigError, match=r"^--baseline: no group has base=5; the groups are: base=100; "):
        build_report(runs, ReportOptions(by="base", baseline="base=5"))
    with pytest.raises(ConfigError, match="--baseline: seed=0 does not name a group; .* --by keys \\(base\\)"):
        build_report(runs, ReportOptions(by="base", baseline="seed=0"))
    with pytest.raises(ConfigError, match="--baseline: needs --by"):
        build_report(runs, ReportOptions(baseline="base=100"))
    # two seeds under --by base,seed: base=100 names two groups, and taking the first would be a silent choice
    with pytest.raises(ConfigError, match=r"^--baseline: base=100 matches \d+ groups \(base=100 seed=0; base=100 "
                                          r"seed=1.*\); name one"):
        build_report(runs, ReportOptions(by="base,seed", baseline="base=100"))
    both = build_report(runs, ReportOptions(by="base,seed", metrics="ratio", baseline="base=100,seed=1"))
    assert both.comparison.reference == "base=100 seed=1"


def test_a_baseline_whose_groups_are_kept_apart_says_so(tmp_path):
    """Runs of base=100 only on another corpus and with other eval settings: both base=100 groups stand apart, out of
    the comparison: --baseline base=100 said 'no group has base=100' though the table shows them. With the sweep's
    own base=100 runs beside them, those are the reference and the stray runs alone stand apart."""
    ratios = journey_ratios()
    strays = [make_run(tmp_path / "other", {128: 9.0, 256: 9.9}, ["base=100", "seed=9"], base=100.0, seed=9,
                       fingerprint="fp-other"),
              make_run(tmp_path / "other-eval", {128: 9.0, 256: 9.9}, ["base=100", "seed=8"], base=100.0, seed=8,
                       eval_settings={"tokens": 1024, "protocol": "nonoverlap"})]
    runs = ratio_runs(tmp_path, {b: r for b, r in ratios.items() if b != 100}) + strays
    with pytest.raises(ConfigError, match=r"^--baseline: the groups with base=100 are not compared with the others "
                                          r"\(base=100 \[corpus stdlib fp-other\]: different corpus, kept apart: not "
                                          r"comparable; base=100 \[eval protocol=nonoverlap, tokens=1024\]: different "
                                          r"eval settings, kept apart: not comparable\); the groups compared are: "
                                          r"base=1000; base=10000$"):
        build_report(runs, ReportOptions(by="base", metrics="ratio", baseline="base=100"))
    report = build_report(ratio_runs(tmp_path, ratios) + strays, ReportOptions(by="base", metrics="ratio",
                                                                               baseline="base=100"))
    assert report.comparison.reference == "base=100"
    assert [d.verdict for d in report.comparison.differences if "[" in d.group] == ["not compared"] * 2


def test_one_run_per_group_says_no_interval_and_how_to_add_seeds(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.2], 1000: [1.3]}, seeds=(0,))
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    (diff,) = report.comparison.differences
    assert (diff.verdict, diff.low, diff.high, diff.n) == ("no interval", None, None, 1)
    line = verdict_line(report.comparison, report.metrics[0])
    assert "no interval exists" in line and "`seed=0,1,2`" in line


def test_a_comparison_without_any_interval_does_not_title_itself_a_95_percent_interval(tmp_path):
    """One run a group: the table was titled "Each group − base=100 (no interval, 95% interval)"."""
    runs = ratio_runs(tmp_path, {100: [1.2], 1000: [1.3]}, seeds=(0,))
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    assert comparison_table(report.comparison).title == "Each group − base=100 (no interval)"
    paired = build_report(ratio_runs(tmp_path / "paired", {100: [1.2, 1.3], 1000: [1.3, 1.5]}, seeds=(0, 1)),
                          ReportOptions(by="base", metrics="ratio"))
    assert comparison_table(paired.comparison).title == "Each group − base=100 (paired t, 95% interval)"


def test_seeds_needed_for_some_of_the_groups_are_named_by_their_group():
    """Of two inconclusive groups one needs more than 10,000 seeds (the table says so): the line read "about 52 for
    encoder=alibi seeds would be needed"."""
    from posexp.reporting.selection import parse_metric
    from posexp.reporting.table import Comparison

    diffs = [Difference(group, "auc", "encoder=rope", 0.01, -0.4, 0.4, 2, "paired t", "inconclusive", needed=needed)
             for group, needed in (("base=10000", 20000), ("encoder=alibi", 52))]
    comparison = Comparison("encoder=rope", [parse_metric("auc")], ["encoder"], diffs, {"auc": 3}, family=2)
    line = verdict_line(comparison, parse_metric("auc"))
    assert "at n = 2: about 52 seeds for encoder=alibi would be needed to resolve this difference" in line, line
    diffs[0].needed = 12
    line = verdict_line(comparison, parse_metric("auc"))
    assert "at n = 2: about 12 and 52 seeds would be needed to resolve each difference" in line, line


def test_seeds_that_differ_fall_back_to_welch(tmp_path):
    runs = (ratio_runs(tmp_path / "a", {100: [1.2, 1.25, 1.3]}, seeds=(0, 1, 2))
            + ratio_runs(tmp_path / "b", {1000: [1.3, 1.35, 1.4]}, seeds=(5, 6, 7)))
    (diff,) = build_report(runs, ReportOptions(by="base", metrics="ratio")).comparison.differences
    assert diff.method == "Welch t" and "unpaired" in diff.reason
    expected = TTest.welch([1.3, 1.35, 1.4], [1.2, 1.25, 1.3]).interval()
    assert (diff.low, diff.high) == (pytest.approx(expected[0]), pytest.approx(expected[1]))


def test_json_carries_the_comparison_fields(tmp_path):
    report = build_report(ratio_runs(tmp_path, journey_ratios()), ReportOptions(by="base", metrics="ratio"))
    data = json.loads(render_json(report))
    comparison = data["comparison"]
    assert comparison["reference"] == "base=100" and comparison["confidence"] == 0.95
    assert "inconclusive against base=100" in comparison["metrics"]["ratio"]["verdict"]
    first = comparison["differences"][0]
    for field in ("reference", "difference", "relative", "low", "high", "n", "method", "p", "p_adjusted",
                  "verdict", "verdict_text"):
        assert field in first
    assert first["verdict_text"].startswith("inconclusive at n = 3 (about ")
    assert comparison["correction"] == {"method": "Holm (1979)", "comparisons": 2} and comparison["margin"] is None
    assert (first["reference"], first["n"], first["method"]) == ("base=100", 3, "paired t")
    # equal everywhere at 128 and 256 tokens: nothing marked there
    assert data["groups"][0]["best"] == ["ppl@512", "ratio"] and data["groups"][0]["seeds"] == [0, 1, 2]


def test_report_md_and_terminal_carry_the_comparison(tmp_path):
    ratio_runs(tmp_path / "sweep", journey_ratios())
    out = io.StringIO()
    report_main([tmp_path / "sweep"], tmp_path / "out", console=Console(file=out, width=200),
                options=ReportOptions(by="base", metrics="ratio"))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Comparison" in md and "inconclusive against base=100 at n = 3" in md
    plain = md.replace("\\", "")  # markdown escapes of the brackets
    assert "| base=1000 | ratio | 3 | paired t | +0.030 (+2.5%) [" in plain
    assert "] | 0.908 | inconclusive at n = 3 (about " in plain and "Holm-corrected over 2 comparisons" in md
    assert "**1.22 ± 0.06**" in md  # the best ratio of the column is marked
    assert "inconclusive against base=100 at n = 3" in out.getvalue()
    assert "Holm-corrected over 2 comparisons" in out.getvalue()


def test_sweep_summary_md_compares_what_the_sweep_varies(tmp_path):
    # what the end-of-sweep callback does: report the sweep folder without --by
    ratio_runs(tmp_path / "sweep", journey_ratios())
    out = io.StringIO()
    report_main([tmp_path / "sweep"], out=tmp_path / "sweep", console=Console(file=out, width=200), _sweep_end=True)
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "## Comparison" in summary and "inconclusive against base=100 at n = 3" in summary
    # the terminal of the finished sweep says it too, under its one-line-per-run table
    assert "Grouped by base" in out.getvalue() and "inconclusive against base=100 at n = 3" in out.getvalue()
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


# --- verdicts a reviewer accepts -----------------------------------------------

REF = [1.20, 1.22, 1.21]


def shifted(offsets) -> list[float]:
    return [r + o for r, o in zip(REF, offsets)]


def test_no_output_says_indistinguishable(tmp_path):
    runs = ratio_runs(tmp_path / "sweep", journey_ratios())
    out = io.StringIO()
    report_main([tmp_path / "sweep"], tmp_path / "out", console=Console(file=out, width=80),
                options=ReportOptions(by="base", metrics="ratio"))
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    texts = [out.getvalue(), (tmp_path / "out" / "report.md").read_text(), (tmp_path / "out" / "summary.md").read_text(),
             render_json(report)]
    assert not [t for t in texts if "indistinguishable" in t or "cannot be told apart" in t]
    cells = {d.group: d.text() for d in report.comparison.differences}
    assert all(c.startswith("inconclusive at n = 3 (about ") and c.endswith(" seeds needed)") for c in cells.values())
    # an interval containing 0 is said not to be equivalence, and how to test that
    assert "An interval containing 0 is inconclusive, not evidence of equivalence; --margin 2%" in texts[1]
    assert "inconclusive against base=100 at n = 3" in " ".join(out.getvalue().split())  # however it wraps


def test_every_difference_is_also_relative_to_the_reference_mean(tmp_path):
    runs = ratio_runs(tmp_path, {100: [1.0, 1.1, 1.2], 1000: [1.1, 1.3, 1.5]})
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    (diff,) = report.comparison.differences
    assert diff.relative == pytest.approx(100 * 0.2 / 1.1)
    assert interval_text(diff, 3) == "+0.200 (+18.2%) [−0.048, +0.448]"
    assert json.loads(render_json(report))["comparison"]["differences"][0]["relative"] == pytest.approx(18.1818, 1e-4)
    assert "base=1000 (+0.200 (+18.2%) [−0.048, +0.448])" in verdict_line(report.comparison, report.metrics[0])


def test_a_difference_that_rounds_to_zero_has_the_sign_of_its_percentage(tmp_path):
    """Seeds 0.0003 lower on ratio (about 2) printed "+0.000 (−0.02%)" beside "better": the signs disagreed."""
    runs = ratio_runs(tmp_path, {100: [2.0, 2.01, 2.02], 1000: [1.9996, 2.0098, 2.0197]})
    report = build_report(runs, ReportOptions(by="base", metrics="ratio"))
    (diff,) = report.comparison.differences
    assert diff.verdict == "better" and diff.difference == pytest.approx(-0.0003)
    assert interval_text(diff, 3).startswith("−0.000 (−0.01%) [")
    assert "base=1000 (−0.000 (−0.01%) [" in verdict_line(report.comparison, report.metrics[0])
    vanishing = Difference("a", "ratio", "b", difference=-1e-12, relative=-5e-11)  # zero at every resolution shown
    assert interval_text(vanishing, 3) == "+0.000 (+0.00%)"


def test_a_metric_whose_zero_is_an_ordinary_value_has_no_percent_difference_nor_percent_margin(tmp_path):
    # slope@4x is an exponent (0 = flat): +0.05 against a reference slope of 0.001 is no "+5000%"
    runs = ratio_runs(tmp_path, {100: [1.0, 1.001, 1.002], 1000: [1.1, 1.3, 1.5]})
    report = build_report(runs, ReportOptions(by="base", metrics="ratio,slope@4x", margin="2%"))
    ratio, slope = report.comparison.differences
    assert ratio.relative is not None and ratio.margin == pytest.approx(0.02 * 1.001)
    assert slope.difference > 0 and slope.relative is None and "%" not in interval_text(slope, 3)
    assert slope.margin is None and "slope@4x has no 2%" in slope.reason and "absolute margin" in slope.reason
    absolute = build_report(runs, ReportOptions(by="base", metrics="slope@4x", margin="0.05"))
    assert absolute.comparison.differences[0].margin == 0.05


def test_holm_turns_a_lone_p_of_003_inconclusive_among_five_comparisons(tmp_path):
    # differences 0.0226, 0.0326, 0.0426: t = 0.0326·√3/0.01 = 5.65 on 2 df, p = 0.030
    worse = shifted([0.0226, 0.0326, 0.0426])
    report = build_report(ratio_runs(tmp_path / "two", {100: REF, 1000: worse}),
                          ReportOptions(by="base", metrics="ratio"))
    (diff,) = report.comparison.differences
    assert diff.p == pytest.approx(0.0300, abs=2e-4) and diff.p_adjusted == diff.p
    assert diff.verdict == "worse" and report.comparison.family == 1

    noise = {b: shifted(o) for b, o in {10: [0.01, -0.01, 0.0], 20: [-0.01, 0.0, 0.01], 30: [0.0, 0.01, -0.01],
                                        40: [0.01, 0.0, -0.01]}.items()}
    report = build_report(ratio_runs(tmp_path / "six", {100: REF, 1000: worse, **noise}),
                          ReportOptions(by="base", metrics="ratio", baseline="base=100"))
    diff = next(d for d in report.comparison.differences if d.group == "base=1000")
    assert diff.p == pytest.approx(0.0300, abs=2e-4) and diff.p_adjusted == pytest.approx(5 * diff.p)
    assert diff.verdict == "inconclusive" and report.comparison.family == 5
    assert "Holm-corrected over 5 comparisons" in verdict_lines(report.comparison)[-1]
    data = json.loads(render_json(report))["comparison"]
    assert data["correction"]["comparisons"] == 5
    assert next(d for d in data["differences"] if d["group"] == "base=1000")["p_adjusted"] == pytest.approx(0.15, 2e-3)


def test_margin_gives_equivalence_by_two_one_sided_tests(tmp_path):
    # +0.004 (+0.3%) [+0.003, +0.005]: beyond the interval, and far inside a margin of 2% (0.0242)
    close = ratio_runs(tmp_path / "close", {100: REF, 1000: shifted([0.0035, 0.0045, 0.004])})
    (diff,) = build_report(close, ReportOptions(by="base", metrics="ratio")).comparison.differences
    assert diff.verdict == "worse"  # without a margin: no practical relevance is judged, no equivalence claimed
    report = build_report(close, ReportOptions(by="base", metrics="ratio", margin="2%"))
    (diff,) = report.comparison.differences
    assert diff.margin == pytest.approx(0.02 * 1.21) and diff.p_equivalence < 0.05
    assert (diff.verdict, diff.text()) == ("equivalent", "equivalent within 2% (worse, by less than that)")
    line = verdict_line(report.comparison, report.metrics[0])
    assert "is equivalent to base=100 within 2% (two one-sided tests)" in line and "inside ±0.024" in line
    assert "Schuirmann 1987" in verdict_lines(report.comparison)[-1]
    # a margin the 90% interval does not fit in: no equivalence; an absolute margin in the metric's unit
    (diff,) = build_report(close, ReportOptions(by="base", metrics="ratio", margin="0.1%")).comparison.differences
    assert diff.verdict == "worse" and diff.p_equivalence > 0.05
    (diff,) = build_report(close, ReportOptions(by="base", metrics="ratio", margin="0.05")).comparison.differences
    assert diff.text() == "equivalent within 0.05 (worse, by less than that)" and diff.margin == 0.05

    # a wide interval around 0 is not equivalence, whatever the margin hides inside it
    wide = ratio_runs(tmp_path / "wide", {100: REF, 1000: shifted([-0.05, 0.06, 0.0])})
    (diff,) = build_report(wide, ReportOptions(by="base", metrics="ratio", margin="2%")).comparison.differences
    assert diff.low < -diff.margin and diff.verdict == "inconclusive"
    assert diff.text().startswith("inconclusive at n = 3 (about ")


def test_cli_margin_option(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    ratio_runs(tmp_path / "sweep", {100: REF, 1000: shifted([0.0035, 0.0045, 0.004])})
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--by", "base", "--metric", "ratio",
                                 "--margin", "2%", "--format", "json", "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    comparison = json.loads(result.stdout)["comparison"]
    assert comparison["margin"]["text"] == "2%" and comparison["differences"][0]["verdict"] == "equivalent"
    result = runner.invoke(app, ["report", str(tmp_path / "sweep"), "--by", "base", "--margin", "two"])
    assert result.exit_code == 2 and "--margin: 'two' is not a margin; use a percentage" in result.output
    assert "Traceback" not in result.output


# --- plain rows against their own window ---------------------------------------


def test_window_verdicts_pair_each_run_with_its_own_window():
    runs = [  # length: (plain ppl, window ppl), one mapping per seed
        {128: (3.00, 3.00), 256: (3.10, 3.60), 512: (3.9, 3.7), 1024: (4.6, 4.0)},
        {128: (3.02, 3.02), 256: (3.12, 3.64), 512: (3.5, 3.8), 1024: (4.7, 4.05)},
        {128: (2.98, 2.98), 256: (3.08, 3.59), 512: (3.8, 3.6), 1024: (4.8, 4.1)},
    ]
    verdicts = window_verdicts(runs, train_len=128)
    assert list(verdicts) == [128, 256, 512, 1024]
    assert verdicts[256].text == "beats its own window at 2×"
    assert verdicts[1024].text == "loses to its own window at 8×"
    assert verdicts[512].text.startswith("not shown to beat its own window at 4×: inconclusive at n = 3 (about ")
    assert verdicts[128].text == "equal on every seed of its own window at 1×"
    diff = verdicts[256].difference  # plain − window, paired over the runs
    assert (diff.method, diff.n) == ("paired t", 3)
    assert diff.difference == pytest.approx(-(0.50 + 0.52 + 0.51) / 3)
    assert diff.relative == pytest.approx(100 * diff.difference / ((3.60 + 3.64 + 3.59) / 3))
    # Holm over the four lengths (the equal one's p is 1): 2×'s is the smallest p, so it is multiplied by 4
    assert diff.p == min(v.difference.p for v in verdicts.values()) and diff.p_adjusted == pytest.approx(4 * diff.p)


def test_window_verdicts_with_one_run_or_a_margin():
    one = window_verdicts([{1024: (4.0, 4.5)}], train_len=128)
    assert one[1024].text == "one run: no verdict against its own window at 8×"
    runs = [{1024: (4.00, 4.01)}, {1024: (4.10, 4.12)}, {1024: (3.90, 3.905)}]
    same = window_verdicts(runs, margin=Margin(0.02, True))
    assert same[1024].text == "equivalent within 2% of its own window at 1024 tokens"


def test_a_p_value_that_rounds_to_alpha_shows_which_side_of_it_it_is():
    from posexp.reporting.difference import ALPHA, p_text

    assert ALPHA == 0.05
    assert p_text(0.0498) == "0.0498"  # beside "worse" (p < 0.05), not "0.050"
    assert p_text(0.04996) == "0.04996" and p_text(0.0502) == "0.0502"
    assert float(p_text(0.0499999)) < ALPHA
    assert [p_text(p) for p in (0.05, 0.012, 0.0004, 0.51, None)] == ["0.050", "0.012", "< 0.001", "0.510", "—"]
