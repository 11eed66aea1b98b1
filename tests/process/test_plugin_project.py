"""The worked example (scripts/plugin_example) as a researcher uses it, each command a fresh interpreter: copied
into a folder outside the repository, swept against the built-ins and reported, its file edited or removed between
commands (what only a new interpreter sees), and its run loaded in a notebook started in another folder, which
imports the encoder from the file the run recorded. The registry and the CLI's handling of plugins are tested in
this process (tests/integration/encoders/test_plugins.py, tests/integration/runs/test_load_run.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, TINY_RUN, run_cli
from helpers.plugins import write_lab

EXAMPLE = REPO / "scripts" / "plugin_example"
TINY = (*TINY_RUN, "train.steps=6", "train.warmup_steps=2", "train.log_every=2", "eval.tokens=256",
        "eval.loss_by_position=false")


@pytest.fixture
def project(tmp_path) -> Path:
    """The worked example as a researcher's own project folder, outside the repository."""
    folder = tmp_path / "project"
    shutil.copytree(EXAMPLE, folder)
    assert REPO not in folder.parents
    return folder


def _sweep_jobs(sweep: Path) -> dict:
    jobs = {}
    for results in sweep.glob("*/results.json"):
        run = json.loads(results.read_text())["run"]
        jobs[run["encoder"]] = results.parent
    return jobs


def _repository_state() -> str:
    return subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"],
                          capture_output=True, text=True).stdout


@pytest.mark.slow  # a three-encoder sweep in fresh interpreters; tests/integration/encoders/test_plugins.py keeps the plugin path in the default suite
def test_sweep_against_builtins_and_report_from_a_folder_outside_the_repository(project):
    before = _repository_state()
    proc = run_cli("train", "--config-dir", "conf", "-m", "encoder=rope,alibi,logrope", *TINY,
                   "hydra.sweep.dir=sweep", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _sweep_jobs(project / "sweep")
    assert set(jobs) == {"rope", "alibi", "logrope"}
    run = json.loads((jobs["logrope"] / "results.json").read_text())["run"]
    source = project / "my_encoders" / "logrope.py"
    assert run["encoder_source"]["module"] == "my_encoders.logrope"
    assert Path(run["encoder_source"]["file"]) == source.resolve()
    assert run["encoder_source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert "encoder_source" not in json.loads((jobs["rope"] / "results.json").read_text())["run"]

    report = run_cli("report", "sweep", cwd=project)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "encoder=logrope" in report.stdout and "encoder=alibi" in report.stdout
    assert (project / "sweep" / "report.md").is_file()
    assert _repository_state() == before  # no file of posexp written or changed

    # eval of a plugin's run, from another folder: the module is imported from where the run found it
    again = run_cli("eval", str(jobs["logrope"]), "eval.lengths=[64]", cwd=project.parent)
    assert again.returncode == 0, again.stderr[-2000:]

    # the encoder's file edited: eval says what changed and how to go on; the flag goes on, with a warning
    source.write_text(source.read_text().replace("scale: float = 64.0", "scale: float = 32.0"))
    refused = run_cli("eval", str(jobs["logrope"]), "eval.lengths=[64]", cwd=project)
    assert refused.returncode != 0
    line = refused.stderr.strip().splitlines()[-1]
    assert "source of encoder 'logrope' changed" in line and run["encoder_source"]["sha256"][:12] in line
    assert "--allow-changed-encoder" in line and "Traceback" not in refused.stderr
    allowed = run_cli("eval", str(jobs["logrope"]), "eval.lengths=[64]", "--allow-changed-encoder", cwd=project)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "going on with the code as it is now" in allowed.stdout + allowed.stderr

    # the module gone: one line naming the module and where the run had it
    shutil.rmtree(project / "my_encoders")
    gone = run_cli("eval", str(jobs["logrope"]), "eval.lengths=[64]", cwd=project)
    assert gone.returncode != 0 and "Traceback" not in gone.stderr
    assert "cannot be loaded here" in gone.stderr and "my_encoders.logrope" in gone.stderr


NOTEBOOK = """
import sys, warnings
import torch
import posexp
warnings.simplefilter("always")
run = posexp.load_run(sys.argv[1], allow_changed_encoder=sys.argv[2] == "allow")
model = run.model
print(type(model.encoder).__name__, tuple(model(torch.zeros(1, 8, dtype=torch.long)).shape))
"""


@pytest.mark.slow  # about 30 s: a training run and three interpreters that import torch
def test_a_plugin_runs_model_loads_from_its_recorded_file_and_refuses_a_changed_one(tmp_path):
    project, notebook = tmp_path / "project", tmp_path / "notebook"
    shutil.copytree(EXAMPLE, project)
    notebook.mkdir()
    proc = run_cli("train", "--config-dir", "conf", "encoder=logrope", *TINY, "hydra.run.dir=run", cwd=project)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def load(how: str = "") -> subprocess.CompletedProcess:
        # started in a folder that does not hold my_encoders/: the module comes from the file the run recorded
        return subprocess.run([sys.executable, "-c", NOTEBOOK, str(project / "run"), how], cwd=notebook,
                              capture_output=True, text=True)

    loaded = load()
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split()[0] == "LogRoPE" and "(1, 8, 256)" in loaded.stdout
    source = project / "my_encoders" / "logrope.py"
    source.write_text(source.read_text() + "\n# edited after training\n")
    refused = load()
    assert refused.returncode != 0
    message = refused.stderr.strip().splitlines()[-1]
    assert "PosexpError" in message and "source of encoder 'logrope' changed since the run was trained" in message
    assert "allow_changed_encoder=True" in message
    allowed = load("allow")
    assert allowed.returncode == 0 and allowed.stdout.split()[0] == "LogRoPE", allowed.stderr[-2000:]
    assert "going on with the code as it is now" in allowed.stderr


def test_a_plugin_tasks_run_is_evaluated_from_another_folder(tmp_path):
    """A task of one's own module (conf/task/first.yaml's task.module) is found again, as a plugin encoder is, from
    the file the run recorded: ``posexp eval RUN`` started in a folder that does not hold my_lab/."""
    lab, elsewhere = write_lab(tmp_path / "lab"), tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_cli("train", "--config-dir", "conf", "task=first", *TINY_RUN, "train.steps=3", "eval.examples=8",
                   "eval.multiples=[1]", "hydra.run.dir=run", cwd=lab)
    assert proc.returncode == 0, proc.stderr[-2000:]
    source = lab / "my_lab" / "first.py"
    recorded = json.loads((lab / "run" / "results.json").read_text())["run"]["task_source"]
    assert recorded["module"] == "my_lab.first" and Path(recorded["file"]) == source.resolve()
    assert recorded["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()

    again = run_cli("eval", str(lab / "run"), "eval.lengths=[48]", "eval.examples=8", cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = json.loads((lab / "run" / "results.json").read_text())["rows"]
    assert 48 in {r["length"] for r in rows}

    # the task's file edited: its numbers would come from other code, as an edited encoder's would
    source.write_text(source.read_text() + "\n# edited after training\n")
    refused = run_cli("eval", str(lab / "run"), "eval.lengths=[64]", "eval.examples=8", cwd=elsewhere)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "the source of task 'first' changed since the run was trained" in refused.stderr.strip().splitlines()[-1]


def test_a_plugin_trackers_run_is_updated_by_eval_from_another_folder(tmp_path):
    """A tracker of one's own module (logger.jsonl.module) is imported again from where the run had it: ``posexp
    eval RUN`` from a folder that does not hold my_lab/ appends its rows to the tracked run, with no warning."""
    lab, elsewhere = write_lab(tmp_path / "lab"), tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_cli("train", "--config-dir", "conf", "task=copy", "logger=jsonl", *TINY_RUN, "train.steps=3",
                   "eval.examples=8", "eval.multiples=[1]", "hydra.run.dir=run", cwd=lab)
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = run_cli("eval", str(lab / "run"), "eval.lengths=[48]", "eval.examples=8", cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "warning" not in again.stdout + again.stderr, again.stdout + again.stderr
    events = [json.loads(line) for line in (lab / "run" / "events.jsonl").read_text().splitlines()]
    assert 48 in {e.get("length") for e in events if e["event"] == "eval"}


def test_an_edited_plugin_task_is_trained_again_not_read_from_the_sweep_cache(tmp_path):
    """cache=true reused the weights of a plugin task's earlier run after its generator was edited (another task,
    the same options): the key holds the task's code, as a plugin encoder's."""
    lab = write_lab(tmp_path / "lab")
    args = ("train", "--config-dir", "conf", "task=first", "cache=true", "cache_dir=cache", *TINY_RUN,
            "train.steps=3", "eval.examples=8", "eval.multiples=[1]")
    first = run_cli(*args, "hydra.run.dir=one", cwd=lab)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli(*args, "hydra.run.dir=two", cwd=lab)
    assert again.returncode == 0 and "weights from cache" in again.stdout, again.stderr[-2000:]
    source = lab / "my_lab" / "first.py"
    source.write_text(source.read_text().replace("text[:, :1]", "text[:, -1:]"))  # now the last symbol is written
    edited = run_cli(*args, "hydra.run.dir=three", cwd=lab)
    assert edited.returncode == 0, edited.stderr[-2000:]
    assert "weights from cache" not in edited.stdout
