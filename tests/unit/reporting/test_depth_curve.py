"""The lost-in-the-middle figure (Liu et al. 2023): exact match by depth at each length, in a task run's folder
and in ``posexp report`` over task runs with depths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from posexp.reporting.depth_curve import group_depth_series
from posexp.reporting.runs import read_run
from posexp.reporting.summary import report_main
from posexp.runs.layout import REPORT_DEPTH_PLOT
from helpers import REPO

U = {0.0: 0.9, 0.5: 0.4, 1.0: 0.95}  # a U: good first and last, poor in the middle


def _kv_run(folder: Path, by_depth: dict[int, dict[float, float]], seed: int = 0, train_len: int = 64) -> Path:
    """A kv_retrieval run's folder as the trainer writes it: a row per length x depth."""
    rows = [{"metric": "accuracy", "task": "kv_retrieval", "length": n, "multiple": n / train_len, "depth": d,
             "protocol": "teacher_forced", "scaling": None, "scaling_factor": None, "applicable": True,
             "exact_match": acc, "exact_match_low": acc - 0.05, "exact_match_high": acc + 0.05, "examples": 100}
            for n, accs in by_depth.items() for d, acc in accs.items()]
    run = {"label": f"seed={seed}", "overrides": [f"seed={seed}"], "encoder": "rope", "train_len": train_len,
           "seed": seed, "status": "completed", "task": {"name": "kv_retrieval", "options": {"symbols": 16}},
           "config": {"encoder": {"name": "rope"}, "seed": seed, "train_len": train_len,
                      "task": {"name": "kv_retrieval"}}}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return folder


def test_each_length_is_a_line_over_depths_averaged_over_seeds(tmp_path):
    runs = [read_run(_kv_run(tmp_path / str(s), {64: U, 128: {d: a - 0.2 * s for d, a in U.items()}}, seed=s))
            for s in (0, 1)]
    series = group_depth_series("rope", runs, many=False)
    assert [label for label, _, _ in series] == ["L=64", "L=128"]
    (_, depths, at64), (_, _, at128) = series
    assert depths == [0.0, 0.5, 1.0] and at64 == pytest.approx([0.9, 0.4, 0.95])
    assert at128 == pytest.approx([0.8, 0.3, 0.85])  # the mean of the two seeds
    assert min(at64) == at64[1]  # the middle is the trough: the U the figure shows
    assert group_depth_series("copy", [], many=True) == []


def test_report_of_kv_runs_draws_the_depth_figure_and_links_it(tmp_path):
    _kv_run(tmp_path / "sweep" / "0", {64: U, 128: U})
    report_main([tmp_path / "sweep"], console=Console(file=open(tmp_path / "out.txt", "w"), width=200))
    out = tmp_path / "sweep" / "reports" / "default"
    assert (out / REPORT_DEPTH_PLOT).is_file() and REPORT_DEPTH_PLOT in (out / "report.md").read_text()


def test_a_report_without_depths_draws_no_depth_figure(tmp_path):
    from helpers.runs import make_task_run

    make_task_run(tmp_path / "s" / "0", {64: 1.0, 128: 0.5})
    report_main([tmp_path / "s"], console=Console(file=open(tmp_path / "out.txt", "w"), width=200))
    out = tmp_path / "s" / "reports" / "default"
    assert not (out / REPORT_DEPTH_PLOT).exists() and REPORT_DEPTH_PLOT not in (out / "report.md").read_text()

