"""One run, one folder: runs never share or overwrite a folder, a config error leaves none behind,
an unusable folder is one line, and an interrupted sweep says where it stands.

The concurrent cases start the real CLI in subprocesses, as a script starting runs would; the others
run it in this process (Typer's runner).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import TINY_RUN, invoke, start_cli

FAST = (*TINY_RUN, "eval.multiples=[1]")
# long enough to be caught training: checkpoints every 5 steps, stopped long before the end
STOPPABLE = (*TINY_RUN, "eval.multiples=[1]", "train.checkpoint_every=5")
LONG = (*STOPPABLE, "train.steps=100000")


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"ended before {path} appeared: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} did not appear")
        time.sleep(0.05)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- 1: never two runs in one folder ---------------------------------------------------------------

def test_two_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    import hydra.core.utils

    class Frozen(datetime.datetime):  # both runs see the same clock: Hydra names the same outputs/DATE/TIME
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 22, 10, 0, 0)

    monkeypatch.setattr(hydra.core.utils, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    first = invoke("train", *FAST, "seed=1")
    second = invoke("train", *FAST, "seed=2")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    day = tmp_path / "outputs" / "2026-11-22"
    assert sorted(p.name for p in day.iterdir()) == ["10-00-00", "10-00-00-1"]
    seeds = [json.loads((day / name / "results.json").read_text())["run"]["seed"] for name in ("10-00-00", "10-00-00-1")]
    assert seeds == [1, 2]


def test_a_fresh_folder_is_claimed_by_exactly_one_caller(tmp_path):
    from posexp.runs.lock import new_run_dir, unlock_run

    try:
        got = [new_run_dir(tmp_path / "outputs" / "10-00-00")[0] for _ in range(3)]
    finally:
        unlock_run()
    assert [p.name for p in got] == ["10-00-00", "10-00-00-1", "10-00-00-2"]


@pytest.mark.slow  # the two-runs-in-one-second test keeps the race in the default suite
def test_four_trains_started_at_once_in_one_folder_end_with_four_complete_runs(tmp_path):
    procs = [start_cli("train", *FAST, f"seed={i}", cwd=tmp_path) for i in range(4)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    runs = sorted((tmp_path / "outputs").glob("*/*/results.json"))
    assert len(runs) == 4, runs
    results = [json.loads(p.read_text()) for p in runs]
    assert sorted(r["run"]["seed"] for r in results) == [0, 1, 2, 3]
    assert all(r["run"]["status"] == "completed" and r["rows"] for r in results)
    for run in runs:  # each folder is one run's: its saved config is that run's too
        saved = (run.parent / ".hydra" / "config.yaml").read_text()
        assert f"seed: {json.loads(run.read_text())['run']['seed']}" in saved
        assert (run.parent / "checkpoint" / "model.safetensors").is_file()


def _compositions(monkeypatch) -> list:
    """Count Hydra's compositions of posexp's config: each loads the schema posexp stores in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    loads: list = []
    original = ConfigStore.load

    def counted(self, config_path):
        if config_path.startswith("posexp_schema"):
            loads.append(config_path)
        return original(self, config_path)

    monkeypatch.setattr(ConfigStore, "load", counted)
    return loads


def test_a_run_is_composed_as_often_as_by_a_plain_hydra_app_and_typed_once(tmp_path, monkeypatch):
    """Hydra composes a plain ``@hydra.main`` app's config twice (to learn the mode, then the run); posexp adds none:
    the job check and the folder claim read what Hydra composed, and the job takes the config they typed."""
    import sys

    import hydra

    import posexp.commands.train as train
    from posexp.commands.validation import register_configs
    from posexp.config.schema import config_dir

    register_configs()
    monkeypatch.chdir(tmp_path)
    loads = _compositions(monkeypatch)
    plain = hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")(lambda cfg: None)
    monkeypatch.setattr(sys, "argv", ["plain", *FAST, "hydra.run.dir=plain"])
    plain()
    by_hydra, typings, checks = len(loads), [], []
    loads.clear()
    typed, check_spec = train.typed, train.check_spec
    monkeypatch.setattr(train, "typed", lambda *a, **k: typings.append(1) or typed(*a, **k))
    monkeypatch.setattr(train, "check_spec", lambda *a, **k: checks.append(1) or check_spec(*a, **k))
    result = invoke("train", *FAST, "hydra.run.dir=run")
    assert result.exit_code == 0, result.output
    assert by_hydra == 2 and len(loads) == by_hydra, loads
    assert len(typings) == len(checks) == 1
    assert (tmp_path / "run" / "results.json").is_file()


def test_analyze_is_composed_as_often_as_by_a_plain_hydra_app(tmp_path, monkeypatch):
    import sys

    import hydra

    from posexp.analysis.schema import register_analyze_schema
    from posexp.config.schema import config_dir

    register_analyze_schema()
    monkeypatch.chdir(tmp_path)
    loads = _compositions(monkeypatch)
    args = ("encoder=rope", "train_len=32", "analyze.length=64", "analyze.figures=false")
    plain = hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="analyze")(lambda cfg: None)
    monkeypatch.setattr(sys, "argv", ["plain", *args, "hydra.run.dir=plain"])
    plain()
    by_hydra = len(loads)
    loads.clear()
    result = invoke("analyze", *args, "hydra.run.dir=out")
    assert result.exit_code == 0, result.output
    assert by_hydra == 2 and len(loads) == by_hydra, loads
    assert (tmp_path / "out" / "analysis.json").is_file()


# -- 2: a folder that holds a run is refused -------------------------------------------------------

def test_train_into_a_finished_run_is_refused_and_overwrite_replaces_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke("train", *FAST, "seed=1", "hydra.run.dir=run").exit_code == 0
    before = _snapshot(tmp_path / "run")

    again = invoke("train", *FAST, "seed=2", "hydra.run.dir=run")
    assert again.exit_code == 2
    line = _one_error_line(again.stderr)
    assert "run: holds a finished run" in line and "--overwrite" in line and "hydra.run.dir" in line
    assert _snapshot(tmp_path / "run") == before  # not a byte, not a time stamp

    replaced = invoke("train", *FAST, "seed=2", "hydra.run.dir=run", "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert json.loads((tmp_path / "run" / "results.json").read_text())["run"]["seed"] == 2


@pytest.mark.slow  # a training process held open while two more are refused
def test_train_and_resume_refuse_a_run_that_is_still_training(tmp_path):
    run = tmp_path / "run"
    proc = start_cli("train", *LONG, "hydra.run.dir=run", cwd=tmp_path)
    try:
        _wait_for(run / "checkpoint" / "resume.json", proc)
        for command in (["resume", "run"], ["train", *FAST, "hydra.run.dir=run", "--overwrite"]):
            second = start_cli(*command, cwd=tmp_path)
            try:  # refused at once; a second trainer in the folder would still be training
                _, err = second.communicate(timeout=60)
            finally:
                second.kill()
            assert second.returncode == 2, err
            assert re.search(r"run: another posexp process \(.*pid \d+\) is training in this folder", _one_error_line(err))
        assert proc.poll() is None  # the run itself goes on
    finally:
        proc.kill()
        proc.communicate()
    # a killed run leaves no lock behind: resume takes the folder (and is refused only for what it finds there)
    from posexp.runs.lock import lock_run, unlock_run

    assert lock_run(run) is True
    unlock_run(run)


# -- 10: a config error makes no folder; a sweep is checked before its first job -------------------

@pytest.mark.parametrize("bad", ["train.steps=-1", "eval.tokens=16"])
def test_a_config_error_leaves_no_run_folder(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *FAST, bad)
    assert result.exit_code == 2
    assert bad.split("=")[0] in _one_error_line(result.stderr)
    assert list(tmp_path.iterdir()) == []


def test_every_sweep_job_is_checked_before_the_first_one_trains(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "-m", *FAST, "train.steps=20,-1", "seed=0,1")
    assert result.exit_code == 2
    line = _one_error_line(result.stderr)
    assert "train.steps" in line and "train.steps=-1" in line and "no job was started" in line
    assert list(tmp_path.iterdir()) == []


# -- 8: a folder that cannot be made is one line ---------------------------------------------------

def _unwritable(tmp_path: Path) -> str:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    return str(folder / "run")


@pytest.mark.parametrize("where", ["a_file", "a_file/run", "/proc/posexp-run", "read-only"])
def test_a_run_folder_that_cannot_be_made_is_one_line(where, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine\n")
    target = _unwritable(tmp_path) if where == "read-only" else where
    result = invoke("train", *FAST, f"hydra.run.dir={target}")
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.stderr)
    assert target in line and "hydra.run.dir" in line
    assert (tmp_path / "a_file").read_text() == "mine\n"


# -- 14: an interrupted sweep says where it stands -------------------------------------------------

@pytest.mark.parametrize("stop", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_an_interrupted_sweep_names_finished_interrupted_and_unstarted_jobs(stop, tmp_path):
    proc = start_cli("train", "-m", *STOPPABLE, "train.steps=20,100000,20", "hydra.sweep.dir=sweep", cwd=tmp_path)
    try:
        _wait_for(tmp_path / "sweep" / "1" / "checkpoint" / "resume.json", proc)
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + stop, err
    line = _one_error_line(err)
    assert f"stopped by {signal.Signals(stop).name}" in line
    assert "finished: 0;" in line
    assert f"interrupted: 1 (continue with: posexp resume {Path('sweep') / '1'})" in line
    assert "never started: 2 (train.steps=20)" in line
    assert not (tmp_path / "sweep" / "2").exists()
    # one command finishes it: posexp resume SWEEP resumes job 1 and trains job 2 into sweep/2, as planned here
    assert f"finish the whole sweep with: posexp resume {Path('sweep')}" in line
    from posexp.commands.sweep_resume import plan_sweep, resume_sweep

    sweep = tmp_path / "sweep"
    plan = plan_sweep(sweep)
    assert (plan.finished, plan.resume, list(plan.start)) == ([0], [1], [2])
    assert "train.steps=20" in plan.start[2] and all("hydra." not in o for o in plan.start[2])
    ran: list[list[str]] = []
    assert resume_sweep(sweep, lambda _: None, runner=lambda args: ran.append(args) or 0) == []
    assert ran == [["resume", str(sweep / "1")], ["train", *plan.start[2], f"hydra.run.dir={sweep / '2'}"]]


def test_overwrite_deletes_only_what_posexp_wrote(tmp_path, monkeypatch):
    """An unfinished run beside the user's own analysis/notes.md and wandb/settings: --overwrite deleted all of
    analysis/; and a report of another view (reports/view-.../) of the replaced run stayed in the new run."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run / "train.log").write_text("step 5\n")
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "model.safetensors").write_bytes(b"weights")
    mine = {"analysis/notes.md": "my reading", "wandb/settings": "[default]\nproject = mine\n",
            "reports/view-window=16/notes.md": "mine too"}
    posexps = {"analysis/analysis.json": json.dumps({"figures": ["attention_distance.png"]}),
               "analysis/attention_distance.png": "png", "wandb/offline-run-1/run.wandb": "w",
               "reports/view-window=16/report.md": "old", "reports/view-window=16/report_ppl_vs_length.png": "png",
               "reports/view-sinks=4/summary.md": "old", "report.md": "old"}
    for name, text in {**mine, **posexps}.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    replaced = invoke("train", *FAST, "seed=2", "hydra.run.dir=run", "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert {name: (run / name).read_text() for name in mine} == mine
    assert not [name for name in posexps if (run / name).exists()]
    assert not (run / "reports" / "view-sinks=4").exists()
    assert json.loads((run / "results.json").read_text())["run"]["seed"] == 2
