"""Two posexp commands meeting on one run folder lose nothing.

Evaluations of one run queue behind each other and each merges its rows into the results.json it finds
once it holds the run, so none is dropped; a command refused because another holds the run says what
that other one does there; ``--overwrite`` of a sweep claims every job before it empties any.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers import TINY_RUN, invoke, invoke_main


@contextlib.contextmanager
def held_by(run: Path, doing: str) -> Iterator[None]:
    """Another process holds ``run``'s claim, ``doing`` something there, for the block."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; from posexp.runs.lock import lock_run; "
                               f"lock_run({str(run)!r}, {doing!r}); print('held', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def _lengths(run: Path) -> set[int]:
    return {row["length"] for row in json.loads((run / "results.json").read_text())["rows"]}


@pytest.mark.slow  # an end-to-end run of several seconds; the default suite stays near 10 minutes
def test_four_evaluations_of_one_run_at_once_keep_every_row(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = _lengths(run)
    new = [40, 48, 56, 80]
    procs = [subprocess.Popen([sys.executable, "-m", "posexp", "eval", str(run), f"eval.lengths=[{n}]"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in new]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert _lengths(run) == before | set(new)
    assert not (run / ".posexp-lock.json").exists()


def test_an_evaluation_waits_for_another_and_keeps_its_rows(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    waiting = subprocess.Popen([sys.executable, "-c", "import time; from posexp.runs.lock import lock_run; "
                                f"lock_run({str(run)!r}, 'evaluating'); print('held', flush=True); "
                                "time.sleep(3)"], stdout=subprocess.PIPE, text=True)
    try:
        assert waiting.stdout.readline().strip() == "held"
        result = invoke("eval", str(run), "eval.lengths=[40]")
    finally:
        waiting.wait()
    assert result.exit_code == 0, result.output
    assert "waiting for" in result.output and "evaluating in this folder" in result.output
    assert 40 in _lengths(run)


def test_a_command_refused_by_another_holding_its_folder_says_what_that_one_does_and_touches_nothing(trained,
                                                                                                      tmp_path):
    """A run held by an evaluation, and a sweep one of whose jobs is training: ``--overwrite`` of either is refused,
    naming what the other command does there; a sweep's jobs are all claimed before any is emptied. An evaluation
    of a run that is training is refused too: two commands never write one run's results.json at once."""
    run, sweep, training = tmp_path / "run", tmp_path / "sweep", tmp_path / "training"
    shutil.copytree(trained, run)
    shutil.copytree(trained, training)
    for job in ("0", "1"):
        shutil.copytree(trained, sweep / job)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    before = (run / "results.json").read_bytes()
    trained_before = (training / "results.json").read_bytes()
    swept = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and p.name != ".posexp-lock.json"}
    with held_by(run, "evaluating"), held_by(sweep / "1", "training"), held_by(training, "training"):
        result = invoke("train", *TINY_RUN, f"hydra.run.dir={run}", "--overwrite")
        overwrite = invoke("train", "-m", *TINY_RUN, f"hydra.sweep.dir={sweep}", "encoder=rope,alibi", "--overwrite")
        evaluation = invoke("eval", str(training), "eval.lengths=[32]")
    assert result.exit_code == 2
    assert "is evaluating in this folder" in result.output and "training" not in result.output
    assert (run / "results.json").read_bytes() == before
    assert overwrite.exit_code == 2, overwrite.output
    assert "is training in this folder" in overwrite.output
    after = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and p.name != ".posexp-lock.json"}
    assert after == swept
    assert evaluation.exit_code == 2
    assert "another posexp process (posexp, pid" in evaluation.output
    assert "is training in this folder" in evaluation.output
    assert (training / "results.json").read_bytes() == trained_before


def test_sigterm_during_an_evaluation_says_what_was_kept_and_how_to_finish(trained, tmp_path):
    import signal

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = (run / "results.json").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "posexp", "eval", str(run), "eval.lengths=[32,64,128,256,512]",
                             "eval.tokens=400000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # stopped once it is measuring (its header printed), not while it starts
        if line.startswith("posexp eval"):
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and "results.json is as it was" in err and "Traceback" not in err
    assert f"finish with: posexp eval {run} 'eval.lengths=[32,64,128,256,512]' eval.tokens=400000" in err
    assert (run / "results.json").read_bytes() == before


def test_overwrite_replaces_only_what_posexp_wrote(trained, tmp_path):
    """The user's own files in a run folder (notes, W&B's settings file) survive --overwrite."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    (run / "notes.md").write_text("why I ran this\n")
    (run / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)
    (run / "wandb" / "settings").write_text("[default]\nproject = mine\n")
    result = invoke("train", *TINY_RUN, "seed=3", f"hydra.run.dir={run}", "--overwrite")
    assert result.exit_code == 0, result.output
    assert (run / "notes.md").read_text() == "why I ran this\n"
    assert (run / "wandb" / "settings").is_file() and not (run / "wandb" / "offline-run-20260101_000000-abc").exists()
    assert json.loads((run / "results.json").read_text())["run"]["seed"] == 3


def test_a_run_overwritten_between_loading_its_weights_and_taking_the_folder_is_not_written(tiny, tmp_path,
                                                                                            monkeypatch):
    """posexp eval RUN, then within a second posexp train ... hydra.run.dir=RUN --overwrite: the overwrite went
    through before the evaluation held the folder, and the old weights' rows could land in the new run."""
    import contextlib
    import json

    import posexp.commands.eval as eval_command
    from posexp.commands.train import run_train
    from posexp.errors import PosexpError

    run_dir = tmp_path / "run"
    run_train(tiny("train.steps=2", "eval.multiples=[1]", "eval.tokens=256"), run_dir, [])
    lock = eval_command.run_lock

    @contextlib.contextmanager
    def replaced_first(folder, *args, **kwargs):  # another run's weights now stand in the folder
        meta = folder / "checkpoint" / "meta.json"
        data = json.loads(meta.read_text())
        meta.write_text(json.dumps({**data, "sha256": "0" * 64}))
        with lock(folder, *args, **kwargs):
            yield

    monkeypatch.setattr(eval_command, "run_lock", replaced_first)
    before = (run_dir / "results.json").read_text()
    with pytest.raises(PosexpError, match="its run was replaced while this evaluation started"):
        eval_command.reeval_main([str(run_dir), "eval.multiples=[1,2]", "eval.tokens=256"])
    assert (run_dir / "results.json").read_text() == before


def test_two_exports_into_one_new_folder_at_once_the_second_is_refused(trained, tmp_path):
    """The first claims the folder before writing; the second, started while it writes, is refused in one line
    and the first's export is the one left, whole."""
    import time

    from posexp.commands.export import export_run
    from posexp.hf.export import EXPORT_JSON

    run_dir = trained
    # the first export stops before its check until told to go on: the second starts while it writes
    script = ("import sys, time\nfrom pathlib import Path\nimport posexp.hf.export as e\n"
              "check = e.check_logits\n"
              "def slow(*a, **k):\n"
              "    Path('writing').touch()\n"
              "    while not Path('go').exists():\n"
              "        time.sleep(0.05)\n"
              "    return check(*a, **k)\n"
              "e.check_logits = slow\n"
              "from posexp.cli import main\n"
              f"sys.argv = ['posexp', 'export', {str(run_dir)!r}, 'same']\n"
              "main()\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    first = subprocess.Popen([sys.executable, "-c", script.replace("'same'", repr(str(tmp_path / "same")))],
                             cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (scratch / "writing").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    second = invoke_main("export", str(run_dir), "same", cwd=tmp_path)
    (scratch / "go").touch()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert second.exit_code != 0 and "exported" not in second.stdout
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "exporting in this folder" in lines[0], second.stderr
    assert "exported" in out
    assert (tmp_path / "same" / "model.safetensors").is_file() and (tmp_path / "same" / EXPORT_JSON).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same", "scratch"]
    reference = export_run(run_dir, tmp_path / "scratch" / "reference").folder
    assert sorted(p.name for p in (tmp_path / "same").iterdir()) == sorted(
        p.name for p in reference.iterdir())  # the first's export, whole, no claim note left


def test_a_run_still_training_is_said_to_be_running_not_to_have_stopped_early(trained, tmp_path):
    """Its results.json comes at the end: report, eval, export and analyze of it name the process training there,
    where a folder nobody holds keeps asking whether the run stopped early."""
    training, finished = tmp_path / "training", tmp_path / "run"
    shutil.copytree(trained, finished)
    (training / ".hydra").mkdir(parents=True)
    (training / "metrics.csv").write_text("step,tokens,loss,lr,tokens_per_s,elapsed_s\n")
    commands = [("report", str(training)), ("eval", str(training)), ("export", str(training), str(tmp_path / "hf")),
                ("analyze", str(training))]
    with held_by(training, "training"):
        said = [invoke(*args) for args in commands]
        beside = invoke("report", str(training), str(finished), "--out", str(tmp_path / "report"))
    for result in said:
        assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
        assert f"{training}: the run is still running (another posexp process (posexp, pid" in result.output
        assert "is training in it" in result.output and "stop early" not in result.output
    assert beside.exit_code == 0 and "is training in it" in beside.output and "stopped early" not in beside.output
    stopped = invoke("report", str(training))
    assert stopped.exit_code == 2 and "did the run stop early" in stopped.output
