"""One reader for every metric: perplexity and task runs are built of the same rows, cells and groups, and a
metric of the value at one length is its field and direction alone."""

from __future__ import annotations

import json

import pytest

from posexp.reporting import build_report, metrics
from posexp.reporting.metrics import LOWER, ValueAt
from posexp.reporting.selection import parse_metric
from posexp.reporting.options import ReportOptions
from posexp.reporting.runs import read_run
from posexp.reporting.task_report import build_task_report
from helpers.runs import make_run, make_task_run


@pytest.fixture
def registry(monkeypatch):
    metrics.specs()
    monkeypatch.setattr(metrics, "_REGISTRY", dict(metrics._REGISTRY))
    return metrics._REGISTRY


def test_a_value_at_metric_is_its_field_and_reads_the_rows_the_table_shows(registry, tmp_path):
    class LossAt(ValueAt):
        kind, pattern, forms, examples, better, reads = "loss_at", "loss@{at}", "loss@Kx", ("loss@2x",), LOWER, "loss"

        def describe(self, metric, report):
            return f"{metric.name} = loss at {metric.where()}."

    assert "loss_at" in registry and not any(type(s) is ValueAt for s in registry.values())  # the shape is no metric
    sliding = [{"length": 256, "protocol": "sliding", "scaling": None, "applicable": True, "ppl": 9.0, "loss": 9.0}]
    folder = make_run(tmp_path / "r", {128: 3.0, 256: 4.0, 512: None}, extra_rows=sliding)
    report = build_report([folder], ReportOptions(metrics="loss@2x,loss@4x,loss@1024"))
    (group,) = report.groups
    assert group.metrics["loss@2x"].mean == pytest.approx(1.0)  # the nonoverlap row's, not the sliding one's
    assert group.metrics["loss@4x"].applicable is False  # 512 is not applicable
    assert group.metrics["loss@1024"].applicable is None  # never evaluated
    assert parse_metric("loss@2x").describe(report) == "loss@2x = loss at 2× the training length."


def test_depths_of_a_length_are_averaged_once_and_a_repeated_row_counts_once(tmp_path):
    folder = make_task_run(tmp_path / "p", {64: 1.0, 128: 0.5}, task="passkey")
    results = json.loads((folder / "results.json").read_text())
    rows = results["rows"]
    deeper = {**rows[1], "depth": 1.0, "exact_match": 0.25}
    rows[1]["depth"] = 0.0
    results["rows"] = [*rows, deeper, {**deeper, "exact_match": 0.0}]  # the repeated depth-1 row is left out
    (folder / "results.json").write_text(json.dumps(results))
    (group,) = build_task_report([read_run(folder)], metrics=["acc@2x"]).groups
    assert group.cells[128].mean == pytest.approx(37.5) and group.cells[128].low is None  # a mean: no interval
    assert group.metrics["acc@2x"].mean == pytest.approx(37.5)
    assert group.cells[64].low is not None  # one row: its own Wilson interval
