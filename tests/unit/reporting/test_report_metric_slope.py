"""slope@Kx, the log-log slope of perplexity over multiples of the training length: a metric added as one file."""

from __future__ import annotations

import math
import random

import pytest

from posexp.errors import ConfigError
from posexp.reporting import build_report, parse_metric, render_latex, render_table_markdown
from posexp.reporting.formatting import fmt_signed
from posexp.reporting.metrics.slope import loglog_slope
from posexp.reporting.options import ReportOptions
from helpers.runs import make_run


def _reference_slope(points):
    """Least squares written out from the normal equations: b = (nΣxy − ΣxΣy) / (nΣx² − (Σx)²)."""
    n = len(points)
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    sx, sy = sum(xs), sum(ys)
    sxy, sxx = sum(x * y for x, y in zip(xs, ys)), sum(x * x for x in xs)
    return (n * sxy - sx * sy) / (n * sxx - sx * sx)


def test_a_power_law_gives_back_its_exponent():
    for exponent in (0.0, 0.35, 1.0, -0.2):
        assert loglog_slope([(m, 3.0 * m ** exponent) for m in (1, 2, 4, 8)]) == pytest.approx(exponent, abs=1e-12)


def test_the_slope_is_the_least_squares_one_on_scattered_points():
    rng = random.Random(0)
    points = [(m, math.exp(rng.uniform(1, 3))) for m in (1, 1.5, 2, 4, 8, 16)]
    assert loglog_slope(points) == pytest.approx(_reference_slope(points), rel=1e-12)


def test_slope_in_a_report_spans_1x_to_kx_and_is_na_or_missing_as_declared(tmp_path):
    ppl = {128: 3.0, 256: 3.6, 512: 4.8, 1024: 9.0}
    rope = make_run(tmp_path / "rope", ppl, ["encoder=rope"])
    learned = make_run(tmp_path / "learned", {128: 3.0, 256: 3.5, 512: None}, ["encoder=learned"],
                       encoder="learned")
    report = build_report([rope, learned], ReportOptions(by="encoder", metrics="slope@4x,slope@8x"))
    groups = {g.label: g for g in report.groups}
    expected = _reference_slope([(n / 128, ppl[n]) for n in (128, 256, 512)])
    assert groups["encoder=rope"].metrics["slope@4x"].mean == pytest.approx(expected)
    assert groups["encoder=rope"].metrics["slope@8x"].mean == pytest.approx(
        _reference_slope([(n / 128, p) for n, p in ppl.items()]))
    assert groups["encoder=learned"].metrics["slope@4x"].text() == "n/a"  # 512 not applicable
    assert groups["encoder=learned"].metrics["slope@8x"].applicable is None  # 1024 never evaluated
    metric = parse_metric("slope@4x")
    assert metric.decimals == 3 and not metric.higher_is_better
    assert "ln(ppl) on ln(length / training length)" in metric.describe(report)


@pytest.mark.parametrize("bad", ["slope@1x", "slope@0.5x", "slope@8", "slope@abc"])
def test_slope_takes_a_multiple_above_1(bad):
    with pytest.raises(ConfigError, match="slope takes the upper end of its span as a multiple above 1"):
        parse_metric(bad)


def test_a_flat_run_prints_a_slope_of_zero_not_a_negative_one(tmp_path):
    flat = make_run(tmp_path / "flat", {128: 3.0, 256: 2.9999, 512: 2.9998}, ["encoder=rope"])
    slope = build_report([flat], ReportOptions(metrics="slope@4x")).groups[0].metrics["slope@4x"]
    assert slope.mean < 0 and slope.text(3) == "0.000"  # rounds to zero: no minus sign before it
    assert fmt_signed(-0.001) == "+0.00" and fmt_signed(-0.01) == "−0.01"  # a difference that rounds to zero alike



def test_a_negative_slope_has_the_minus_sign_its_difference_has_not_a_hyphen(tmp_path):
    """A run whose perplexity falls with length printed its slope "-0.050" in the table, beside "−0.2573" in the
    comparison of the same report; LaTeX's math takes its own minus from the hyphen."""
    runs = [make_run(tmp_path / f"{name}{seed}", {128: 3.0, 256: ppl256 + 0.01 * seed, 512: ppl512},
                     [f"encoder={name}", f"seed={seed}"], encoder=name, seed=seed)
            for name, ppl256, ppl512 in (("rope", 3.5, 4.0), ("alibi", 2.9, 2.8)) for seed in (0, 1)]
    options = dict(by="encoder", metrics="slope@4x", baseline="encoder=rope")
    report = build_report(runs, ReportOptions(**options))
    falling = report.groups[1].metrics["slope@4x"]
    assert falling.mean < 0 and falling.text(3).startswith("−0.05") and "-" not in falling.text(3)
    markdown = render_table_markdown(report)
    assert "**−0.050 ± 0.000**" in markdown and "-0.05" not in markdown
    assert "$\\mathbf{-0.050 \\pm 0.000}$" in render_latex(report)
