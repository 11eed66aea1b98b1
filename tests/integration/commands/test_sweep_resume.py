"""``posexp resume SWEEP`` of a sweep stopped before some of its jobs started: it ends as the sweep would have."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import yaml

from helpers.runs import make_run


def test_the_summary_of_a_resumed_sweep_holds_the_jobs_that_never_started(tmp_path, monkeypatch):
    """Those jobs train as single runs, which write no sweep summary: summary.md kept only the jobs that had
    finished or were resumed (here: rope), though the sweep compares rope and alibi."""
    from posexp.commands import sweep_resume

    sweep = tmp_path / "sweep"
    make_run(sweep / "0", {128: 3.0, 256: 3.3}, ["encoder=rope"])
    hydra = {"job": {"config_name": "config"}, "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
             "overrides": {"task": ["encoder=rope,alibi"]}, "runtime": {"config_sources": []}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    (sweep / "summary.md").write_text("| encoder=rope | 3.00 | 3.30 |\n")  # as a resumed job left it

    def train(args: list[str]) -> types.SimpleNamespace:
        """posexp train JOB hydra.run.dir=SWEEP/N, as the never-started job's own process would leave it."""
        folder = Path(next(a for a in args if a.startswith("hydra.run.dir=")).partition("=")[2])
        make_run(folder, {128: 3.1, 256: 3.2}, ["encoder=alibi"], encoder="alibi")
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(sweep_resume.subprocess, "run", train)
    sweep_resume.finish_sweep(sweep, lambda _: None)
    summary = (sweep / "summary.md").read_text()
    assert "| encoder=rope |" in summary and "| encoder=alibi |" in summary
    assert "encoder=alibi" in (sweep / "summary.csv").read_text() and (sweep / "report.md").is_file()


@pytest.mark.parametrize("multirun", ["hydra: [\n", "hydra:\n  job: {config_name: config}\n  sweep: {subdir: "
                                      "'${hydra.job.num}'}\n  overrides: {task: ['seed=range(']}\n"],
                         ids=["not yaml", "an override Hydra cannot parse"])
def test_a_damaged_multirun_yaml_is_one_line_naming_it(tmp_path, multirun):
    """posexp resume SWEEP printed yaml's or Hydra's traceback."""
    from helpers import invoke

    sweep = tmp_path / "sweep"
    make_run(sweep / "0", {128: 3.0})
    (sweep / "multirun.yaml").write_text(multirun)
    result = invoke("resume", str(sweep))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    (line,) = result.stderr.strip().splitlines()
    assert str(sweep / "multirun.yaml") in line and "posexp resume JOB_FOLDER continues each job" in line


def test_the_report_of_a_stopped_sweep_names_the_jobs_that_never_started(tmp_path):
    """The report warned of the interrupted job (a folder without results.json) and said nothing of the jobs that
    never started, so the table read as the whole sweep."""
    from helpers import invoke

    sweep = tmp_path / "sweep"
    make_run(sweep / "0", {128: 3.0, 256: 3.3}, ["encoder=rope", "seed=0"])
    (sweep / "1" / ".hydra").mkdir(parents=True)  # interrupted: no results.json
    hydra = {"job": {"config_name": "config"}, "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
             "overrides": {"task": ["encoder=rope,alibi", "seed=0,1"]}, "runtime": {"config_sources": []}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    result = invoke("report", str(sweep))
    assert result.exit_code == 0, result.output
    said = (f"{sweep}: 2 of the sweep's 4 jobs never started and are not in the table: 2 (encoder=alibi seed=0), "
            f"3 (encoder=alibi seed=1); finish the sweep with: posexp resume {sweep}")
    assert f"warning: {said}" in result.stdout
    assert "2 of the sweep's 4 jobs never started" in (sweep / "reports" / "default" / "summary.md").read_text()


def test_the_report_of_a_folder_holding_sweeps_names_their_jobs_that_never_started_or_did_not_finish(tmp_path):
    """posexp report outputs/ (the sweeps under it, and a single run) said nothing of a sweep's jobs that never
    started nor of one interrupted, as posexp report SWEEP does: the table read as the whole sweep."""
    from helpers import invoke

    outputs = tmp_path / "outputs"
    sweep = outputs / "multirun" / "2026-11-29" / "10-00-00"
    make_run(sweep / "0", {128: 3.0, 256: 3.3}, ["encoder=rope", "seed=0"])
    (sweep / "1" / ".hydra").mkdir(parents=True)  # interrupted: no results.json
    hydra = {"job": {"config_name": "config"}, "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
             "overrides": {"task": ["encoder=rope,alibi", "seed=0,1"]}, "runtime": {"config_sources": []}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    make_run(outputs / "2026-11-29" / "09-00-00", {128: 3.1, 256: 3.5}, ["encoder=alibi"], encoder="alibi")
    for given in ([outputs], [outputs, sweep]):  # the sweep given too: each warning once
        result = invoke("report", *map(str, given))
        assert result.exit_code == 0, result.output
        warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
        assert warnings == [f"warning: {sweep}: sweep job 1 has no results.json (failed or still running) and is not "
                            "in the table",
                            f"warning: {sweep}: 2 of the sweep's 4 jobs never started and are not in the table: 2 "
                            f"(encoder=alibi seed=0), 3 (encoder=alibi seed=1); finish the sweep with: posexp resume "
                            f"{sweep}"], result.stdout


def test_a_sweep_job_resumed_alone_leaves_a_summary_naming_the_jobs_that_never_started(trained, tmp_path):
    """posexp resume SWEEP/0 (what the interrupted sweep says to type) wrote the sweep's summary.md of job 0 alone,
    without a word of the job that never started, nor of one interrupted."""
    import shutil

    from helpers import invoke

    sweep = tmp_path / "sweep"
    shutil.copytree(trained, sweep / "0")
    (sweep / "0" / "results.json").unlink()  # killed while it evaluated
    (sweep / "1" / ".hydra").mkdir(parents=True)  # interrupted before it wrote anything
    hydra = {"job": {"config_name": "config"}, "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
             "overrides": {"task": ["seed=0,1,2"]}, "runtime": {"config_sources": []}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    result = invoke("resume", str(sweep / "0"))
    assert result.exit_code == 0, result.output
    summary = (sweep / "summary.md").read_text()
    assert "sweep job 1 has no results.json" in summary
    assert "1 of the sweep's 3 jobs never started and is not in the table: 2 (seed=2)" in summary


def test_a_sweep_whose_sweeper_drew_its_jobs_is_not_planned_from_its_overrides(tmp_path):
    """posexp resume SWEEP of a stopped Optuna search (search=base: the trials' bases are the sweeper's) read its
    overrides as a basic sweep's, one job, and said every job had finished though trials never ran."""
    from posexp.commands.sweep_resume import plan_sweep
    from posexp.errors import PosexpError

    sweep = tmp_path / "sweep"
    make_run(sweep / "0", {128: 3.0})
    hydra = {"job": {"config_name": "config"}, "sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"},
             "sweeper": {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
                         "n_trials": 10},
             "overrides": {"task": ["search=base", "encoder=rope"]}, "runtime": {"config_sources": []}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    with pytest.raises(PosexpError, match=r"its sweeper \(OptunaSweeper\) drew its jobs; posexp resume JOB_FOLDER"):
        plan_sweep(sweep)
