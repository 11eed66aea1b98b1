"""Nothing lost: resume after SIGTERM, divergence, failing sweep jobs, corrupt checkpoints, bad input.

The CLI runs in this process (Typer's runner): the same code without an interpreter's start-up, and a SIGTERM sent
to this process while a step runs. A real run killed or stopped from outside at a random moment is
tests/process/test_signals.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from helpers import TINY_RUN, invoke, sigterm_at_step
from helpers.resume import RESUMABLE, STEPS
from helpers.resume import logged_steps as _logged_steps, numbers as _numbers, results as _results


def test_sigterm_mid_step_checkpoints_that_step_and_resumes_to_identical_numbers(full_run, tmp_path, monkeypatch):
    """The signal arrives while step 6 runs (here, from the batch sampler): step 6 finishes and is checkpointed."""
    from posexp.data.corpus import BatchSampler

    sample = sigterm_at_step(monkeypatch, BatchSampler, "batch", 5)  # 0-based: the 6th step
    run_dir = tmp_path / "run"
    result = invoke("train", *RESUMABLE, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: SIGTERM at step 6 of {STEPS}: checkpoint saved in {run_dir / 'checkpoint'}; "
                     f"continue with: posexp resume {run_dir}"]
    assert json.loads((run_dir / "checkpoint" / "resume.json").read_text())["step"] == 6
    assert _logged_steps(run_dir) == [1, 2, 3, 4, 5, 6]
    assert not (run_dir / "results.json").exists()

    monkeypatch.setattr(BatchSampler, "batch", sample)
    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    assert _numbers(_results(run_dir)) == _numbers(_results(full_run))
    assert _logged_steps(run_dir) == list(range(1, STEPS + 1))


def test_resume_refuses_text_that_changed_since_the_training_started(tmp_path, monkeypatch):
    """A data=text file edited between a stop and posexp resume: the remaining steps trained on the new text with no
    word, and results.json recorded only its fingerprint; posexp eval refuses that corpus, so resume does too."""
    from helpers.text import sample_text
    from posexp.data.corpus import BatchSampler

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_text(sample_text(1500, seed=i))
    run_dir = tmp_path / "run"
    sample = sigterm_at_step(monkeypatch, BatchSampler, "batch", 2)  # 0-based: the 3rd step
    stopped = invoke("train", *TINY_RUN, "data=text", f"data.path={corpus}", "train.log_every=1",
                     "eval.multiples=[1]", f"hydra.run.dir={run_dir}")
    assert stopped.exit_code == 128 + signal.SIGTERM, stopped.output
    monkeypatch.setattr(BatchSampler, "batch", sample)
    with open(corpus / "0.txt", "a") as f:
        f.write(sample_text(100, seed=9))
    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code != 0, resumed.output
    lines = [line for line in resumed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not the one its training started on" in lines[0], resumed.stderr
    assert _logged_steps(run_dir) == [1, 2, 3] and not (run_dir / "results.json").exists()


def test_the_first_sigint_asks_to_stop_the_second_interrupts():
    from posexp.training.trainer import StopOnSignal

    # Python's own SIGINT handler underneath, whatever an earlier test in this process left there:
    # the second Ctrl-C must reach it. raise_signal, not os.kill(getpid()): a signal sent to the
    # process may land on one of torch's threads and reach Python only after the block has ended.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        with StopOnSignal() as stop:
            signal.raise_signal(signal.SIGINT)
            assert stop.received == signal.SIGINT  # noted, training goes on to the end of the step
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    finally:
        signal.signal(signal.SIGINT, outer)


def test_nan_loss_stops_keeps_the_last_good_checkpoint_and_records_divergence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *TINY_RUN, "train.lr=1e6", "train.grad_clip=0", "train.checkpoint_every=1",
                    "hydra.run.dir=run")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "training diverged" in result.stderr and "train.lr" in result.stderr
    run = _results(tmp_path / "run")["run"]
    assert run["status"] == "diverged" and _results(tmp_path / "run")["rows"] == []
    assert run["base"] == 10000.0  # recorded as a finished run's is: --by base groups it with its kind
    step = run["error"]["step"]
    assert f"at step {step}" in run["error"]["message"] and f"at step {step}" in result.stderr
    # the checkpoint of the step before is kept, and its weights are finite
    pointer = json.loads((tmp_path / "run" / "checkpoint" / "resume.json").read_text())
    assert pointer["step"] == step - 1
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "run" / "checkpoint" / pointer["weights"]))
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert not (tmp_path / "run" / "checkpoint" / "model.safetensors").exists()  # nothing to evaluate


def test_a_failing_sweep_job_is_recorded_and_the_others_kept(tmp_path, monkeypatch):
    from posexp.cli import folders

    # A job whose mistake shows only when it runs: the check of every job before the sweep
    # (tests/process/test_run_folders.py) would refuse train.steps=0 up front, so here it checks the first job only.
    monkeypatch.setattr(folders, "jobs_to_check", lambda jobs, limit=0: jobs[:1])
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "-m", *TINY_RUN, "train.steps=20,0", "eval.multiples=[1]", "hydra.sweep.dir=sweep")
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "1 sweep job(s) failed" in result.stderr
    good, bad = _results(tmp_path / "sweep" / "0"), _results(tmp_path / "sweep" / "1")
    assert good["run"]["status"] == "completed" and good["rows"]
    assert bad["run"]["status"] == "failed" and bad["rows"] == []
    assert "train.steps" in bad["run"]["error"]["message"]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "status: failed" in summary and "train.steps=0" in summary
    report = invoke("report", "sweep")
    assert report.exit_code == 0, report.output
    assert "status: failed" in report.stdout


# -- bad input: a clear message naming the file or key, a non-zero exit, nothing changed -----------

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _unfinished(full_run: Path, dest: Path) -> Path:
    """A copy of a run as a kill during evaluation leaves it: checkpoint, no results.json."""
    shutil.copytree(full_run, dest)
    (dest / "results.json").unlink()
    return dest


def _rewrite_weights_config_hash(path: Path, config_hash: str) -> None:
    from safetensors.torch import load_file, save_file

    save_file(load_file(str(path)), str(path), metadata={"config_hash": config_hash, "step": str(STEPS)})


def _case_resume_missing(tmp, full):
    return ("resume", str(tmp / "nope")), ["nope", "no such folder"], tmp


def _case_resume_file(tmp, full):
    (tmp / "notes.txt").write_text("x")
    return ("resume", str(tmp / "notes.txt")), ["notes.txt", "is a file"], tmp


def _case_resume_not_a_run(tmp, full):
    (tmp / "empty").mkdir()
    return ("resume", str(tmp / "empty")), ["empty", "not a run folder", ".hydra"], tmp


def _case_resume_finished(tmp, full):
    shutil.copytree(full, tmp / "run")
    return ("resume", str(tmp / "run")), ["already finished", "posexp eval"], tmp / "run"


def _case_resume_diverged(tmp, full):
    run = _unfinished(full, tmp / "run")
    (run / "results.json").write_text(json.dumps({"run": {"status": "diverged", "error": {"step": 7}}, "rows": []}))
    return ("resume", str(run)), ["diverged at step 7", "train.lr"], run


def _case_resume_truncated_weights(tmp, full):
    run = _unfinished(full, tmp / "run")
    weights = run / "checkpoint" / f"step-{STEPS:08d}.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return ("resume", str(run)), [str(weights), "truncated or corrupt"], run


def _case_resume_corrupt_state(tmp, full):
    run = _unfinished(full, tmp / "run")
    state = run / "checkpoint" / f"step-{STEPS:08d}.state.pt"
    state.write_bytes(os.urandom(500))
    return ("resume", str(run)), [str(state), "corrupt"], run


def _case_resume_corrupt_pointer(tmp, full):
    run = _unfinished(full, tmp / "run")
    pointer = run / "checkpoint" / "resume.json"
    pointer.write_text('{"step": 4, "weig')
    return ("resume", str(run)), [str(pointer), "cannot be read"], run


def _case_resume_other_config(tmp, full):
    run = _unfinished(full, tmp / "run")
    config = run / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("seed: 0", "seed: 5"))
    return ("resume", str(run)), ["resume.json", "different config"], run


def _case_resume_bad_yaml(tmp, full):
    run = _unfinished(full, tmp / "run")
    (run / ".hydra" / "config.yaml").write_text("model: [unclosed\n")
    return ("resume", str(run)), ["config.yaml", "not valid YAML"], run


def _case_eval_truncated_weights(tmp, full):
    shutil.copytree(full, tmp / "run")
    weights = tmp / "run" / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return ("eval", str(tmp / "run"), "eval.lengths=[32]"), [str(weights), "truncated or corrupt"], tmp / "run"


def _case_eval_not_safetensors(tmp, full):
    shutil.copytree(full, tmp / "run")
    weights = tmp / "run" / "checkpoint" / "model.safetensors"
    weights.write_bytes(b"PK\x03\x04 a pickle in disguise " * 20)
    (tmp / "run" / "checkpoint" / "meta.json").write_text("{}")  # no digest to catch it first
    return ("eval", str(tmp / "run")), [str(weights), "not a safetensors file"], tmp / "run"


def _case_eval_other_config(tmp, full):
    from posexp.training.checkpoint import sha256_file

    shutil.copytree(full, tmp / "run")
    weights = tmp / "run" / "checkpoint" / "model.safetensors"
    _rewrite_weights_config_hash(weights, "0123456789abcdef")
    meta = tmp / "run" / "checkpoint" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "sha256": sha256_file(weights)}))
    return ("eval", str(tmp / "run")), [str(weights), "different config", "0123456789abcdef"], tmp / "run"


def _case_report_empty_folder(tmp, full):
    (tmp / "empty").mkdir()
    return ("report", str(tmp / "empty")), ["no runs found", "empty"], tmp / "empty"


def _case_report_missing(tmp, full):
    return ("report", str(tmp / "nope")), ["nope", "no such folder"], tmp


def _case_report_no_runs(tmp, full):
    (tmp / "sweep" / "0").mkdir(parents=True)
    (tmp / "sweep" / "0" / "metrics.csv").write_text("step\n")
    return ("report", str(tmp / "sweep")), ["no runs found", "did the run stop early"], tmp / "sweep"


def _case_report_mixed_with_a_broken_run(tmp, full):
    shutil.copytree(full, tmp / "sweep" / "0")
    (tmp / "sweep" / "1").mkdir()
    (tmp / "sweep" / "1" / "results.json").write_text('{"run": {"label": "x"}, "rows": [')
    return ("report", "--strict", str(tmp / "sweep")), [str(tmp / "sweep" / "1" / "results.json"), "not valid JSON"], \
        tmp / "sweep"


def _case_report_a_file(tmp, full):
    (tmp / "notes.txt").write_text("x")
    return ("report", str(tmp / "notes.txt")), ["notes.txt", "is a file"], tmp


def _train_text(tmp, name: str, data: bytes | None, needles: list[str]):
    path = tmp / "data" / name
    path.parent.mkdir()
    if data is None:
        path.mkdir()
    else:
        path.write_bytes(data)
    return ("train", *TINY_RUN, "data=text", f"data.path={path}", "hydra.run.dir=run"), needles, tmp / "data"


def _case_data_empty_folder(tmp, full):
    return _train_text(tmp, "corpus", None, ["data.path", "empty folder"])


def _case_data_empty_file(tmp, full):
    return _train_text(tmp, "empty.txt", b"", ["data.path", "no text"])


def _case_data_binary(tmp, full):
    return _train_text(tmp, "model.bin", b"\x00\x01\x02binary\x00" * 50, ["data.path", "model.bin", "binary"])


def _case_data_not_utf8(tmp, full):
    return _train_text(tmp, "latin1.txt", "caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 50,
                       ["data.path", "latin1.txt", "not UTF-8"])


def _case_data_smaller_than_a_window(tmp, full):
    return _train_text(tmp, "tiny.txt", b"def f():\n    return 1\n", ["train_len", "fewer than one window"])


def _case_checkpoint_every_negative(tmp, full):
    return ("train", *TINY_RUN, "train.checkpoint_every=-1", "hydra.run.dir=run"), ["train.checkpoint_every", ">= 0"], None


def _case_checkpoint_minutes_negative(tmp, full):
    return ("train", *TINY_RUN, "train.checkpoint_minutes=-2", "hydra.run.dir=run"), \
        ["train.checkpoint_minutes", ">= 0"], None


def _case_checkpoint_every_not_a_number(tmp, full):
    return ("train", *TINY_RUN, "train.checkpoint_every=often", "hydra.run.dir=run"), \
        ["checkpoint_every", "often"], None


def _case_resume_no_folder_given(tmp, full):
    return ("resume",), ["Missing argument", "RUN_DIR"], tmp


BAD_INPUT = [value for name, value in sorted(globals().items()) if name.startswith("_case_")]


@pytest.mark.parametrize("case", BAD_INPUT, ids=[c.__name__[len("_case_"):] for c in BAD_INPUT])
def test_bad_input_is_one_clear_message_and_changes_nothing(case, full_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, needles, watched = case(tmp_path, full_run)
    before = _snapshot(watched) if watched is not None else None
    result = invoke(*args)
    out = result.output
    assert result.exit_code != 0, out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, (needle, out)
    if watched is not None:
        assert _snapshot(watched) == before  # nothing written, nothing half-written, nothing removed
    if args[0] == "train":
        assert not (tmp_path / "run" / "results.json").exists()


# -- the pieces ------------------------------------------------------------------------------------

def test_metrics_csv_drops_a_half_written_line_and_rows_after_the_checkpoint(tmp_path):
    from posexp.training.trainer import MetricsWriter

    path = tmp_path / "metrics.csv"
    rows = "".join(f"{s},{s * 256},5.0,0.001,100.0,{s}.0\n" for s in range(1, 9))
    path.write_text("step,tokens,loss,lr,tokens_per_s,elapsed_s\n" + rows + "9,2304,4.9")  # killed mid-write
    writer = MetricsWriter(path, resume_step=6)
    writer.write(step=7, tokens=1792, loss="4.8", lr="0.001", tokens_per_s="1.0", elapsed_s="7.0")
    writer.close()
    assert _logged_steps(tmp_path) == [1, 2, 3, 4, 5, 6, 7]
    assert path.read_text().endswith("7,1792,4.8,0.001,1.0,7.0\n")


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    from posexp.runs.atomic import atomic_path

    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_trainer_state_loads_without_pickle_code(full_run):
    """The state file holds tensors and plain values only: ``weights_only=True`` loads it."""
    pointer = json.loads((full_run / "checkpoint" / "resume.json").read_text())
    state = torch.load(full_run / "checkpoint" / pointer["state"], weights_only=True)
    assert state["step"] == STEPS and {"optimizer", "rng", "running_loss", "tokens"} <= set(state)
    assert set(state["rng"]) == {"torch", "cuda", "numpy", "python"}


def test_a_checkpoint_pointer_cannot_point_outside_its_folder(full_run, tmp_path):
    from posexp.training.checkpoint import read_resume_pointer
    from posexp.errors import PosexpError

    run = _unfinished(full_run, tmp_path / "run")
    pointer = run / "checkpoint" / "resume.json"
    pointer.write_text(json.dumps({**json.loads(pointer.read_text()), "state": "../../elsewhere.pt"}))
    with pytest.raises(PosexpError, match="must name a file in"):
        read_resume_pointer(run)
