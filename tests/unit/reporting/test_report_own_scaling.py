"""A plain ``posexp report`` of pretrained runs each evaluated under its own ``eval.scaling`` shows every run, the
scaled ones under their own scaling, rather than marking them "no nonoverlap results"."""

from __future__ import annotations

import pytest

from posexp.reporting import build_report
from posexp.reporting.options import ReportOptions
from helpers.runs import make_run


def _scaled(ppls: dict[int, float], scaling: str) -> list[dict]:
    return [{"length": n, "multiple": n / 128, "protocol": "nonoverlap", "scaling": scaling, "applicable": True,
             "ppl": p, "loss": 1.0, "tokens": 65536} for n, p in ppls.items()]


def test_a_run_evaluated_only_under_its_own_scaling_shows_it(tmp_path):
    plain = make_run(tmp_path / "0", {128: 3.0, 256: 4.4}, ["eval.scaling=none"])
    yarn = make_run(tmp_path / "1", {}, ["eval.scaling=yarn"], extra_rows=_scaled({128: 3.0, 256: 3.3}, "yarn"))
    report = build_report([plain, yarn])
    rows = {row.label: row for row in report.rows}
    assert rows["eval.scaling=yarn"].cells[256].mean == pytest.approx(3.3)
    assert not rows["eval.scaling=yarn"].flags and not report.warnings  # its scaling is what is compared
    assert rows["eval.scaling=yarn"].ratio == pytest.approx(1.1) and report.other_views == []


def test_a_view_asked_for_or_a_run_with_plain_rows_keeps_the_table_to_one_scaling(tmp_path):
    both = make_run(tmp_path / "0", {128: 3.0, 256: 4.4}, ["encoder=rope"], extra_rows=_scaled({256: 3.3}, "yarn"))
    yarn = make_run(tmp_path / "1", {}, ["encoder=alibi"], extra_rows=_scaled({128: 3.0, 256: 3.9}, "yarn"))
    rows = {row.label: row for row in build_report([both, yarn]).rows}
    assert rows["encoder=rope"].cells[256].mean == pytest.approx(4.4)  # plain rows of its own: those are shown
    assert rows["encoder=alibi"].cells[256].mean == pytest.approx(3.9)
    plain = build_report([both, yarn], ReportOptions(view="scaling=none"))
    assert "no nonoverlap results" in {row.label: row.flags for row in plain.rows}["encoder=alibi"]
