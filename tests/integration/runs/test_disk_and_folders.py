"""Where runs live: a run folder or a working folder the user cannot write to, a disk that fills up during a
run, folder names outside ASCII. Each is one line naming the place and what to do, or it works; nothing is left
half-written.

Root writes anywhere, whatever a folder's permission bits say, so a read-only folder is made read-only for real:
as root, the folder is made immutable (``chattr +i``, :func:`helpers.read_only`); as another user, ``chmod`` binds
already. A disk that really fills up (a size-limited tmpfs) is tests/process/test_full_disk.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import types
from pathlib import Path

import pytest

from helpers import TINY_RUN, immutable, invoke, invoke_main, read_only
from posexp.errors import PosexpError

TINY_ANALYZE = ("train_len=32", "analyze.length=64", "analyze.figures=false")
# checkpoints at steps 4, 8 and 12: a disk that fills at the second leaves the first
STEPS = ("train.steps=12", "train.checkpoint_every=4", "train.log_every=1", "eval.multiples=[1,2]")


def _error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


# -- a read-only copy of a run ------------------------------------------------------------------------

def _read_only_copy(trained: Path, where: Path) -> Path:
    copy = where / "shared_run"
    shutil.copytree(trained, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    return copy


def _writable_again(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


# -- a run folder that cannot be written is refused before any evaluation ------------------------------

@pytest.mark.parametrize("command,writes", [("eval", "results.json"), ("analyze", "analysis.json")])
def test_a_read_only_run_folder_is_refused_before_any_work(command, writes, trained, tmp_path):
    run = _read_only_copy(trained, tmp_path)
    before = (run / "results.json").read_bytes()
    try:
        extra = "eval.lengths=[32]" if command == "eval" else "analyze.figures=false"
        with read_only(run):
            done = invoke(command, str(run), extra, cwd=tmp_path)
    finally:
        _writable_again(run)
    assert done.exit_code == 2, done.output
    line = _error_line(done.stderr)
    assert f"{run}: not writable" in line and writes in line and f"cp -r {run} DIR" in line
    assert "posexp eval" not in done.stdout and "attention at" not in done.stdout  # nothing was evaluated
    assert (run / "results.json").read_bytes() == before and not (run / "analysis").exists()


def test_the_writability_check_probes_the_folder_and_leaves_nothing(trained, tmp_path):
    from posexp.commands.eval import check_writable

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    names = sorted(p.name for p in run.iterdir())
    check_writable(run, "posexp eval", "its new rows")  # a writable folder passes
    assert sorted(p.name for p in run.iterdir()) == names
    with read_only(run):
        with pytest.raises(PosexpError) as e:
            check_writable(run, "posexp eval", "its new rows")
        result = invoke("eval", str(run), "eval.lengths=[32]")
    assert str(e.value).startswith(f"{run}: not writable (") and "eval a copy instead" in str(e.value)
    assert result.exit_code == 2 and "not writable" in _error_line(result.output)
    assert "posexp eval" not in result.output.split("error:")[0]  # refused before the evaluation's first line
    assert sorted(p.name for p in run.iterdir()) == names


# -- posexp analyze from a working folder that cannot be written -------------------------------------

def test_analyze_from_a_read_only_working_folder_is_one_line_or_writes_elsewhere(tmp_path):
    cwd = tmp_path / "read_only_cwd"
    cwd.mkdir()
    with read_only(cwd):
        refused = invoke("analyze", "encoder=rope", *TINY_ANALYZE, cwd=cwd)
        elsewhere = invoke("analyze", "encoder=rope", *TINY_ANALYZE, f"hydra.run.dir={tmp_path / 'analysis'}", cwd=cwd)
    assert refused.exit_code == 2, refused.output
    line = _error_line(refused.stderr)
    assert line.startswith("error: outputs/analyze/") and f"{cwd} is not writable" in line
    assert "run the command from a folder you can write to" in line and "hydra.run.dir=DIR" in line
    assert elsewhere.exit_code == 0, elsewhere.output
    assert (tmp_path / "analysis" / "analysis.json").is_file()
    assert list(cwd.iterdir()) == []


def test_an_output_folder_that_cannot_be_made_is_refused_before_hydra_starts(tmp_path):
    from omegaconf import OmegaConf

    from posexp.cli.folders import check_writable

    sweep = OmegaConf.create({"hydra": {"sweep": {"dir": "/proc/posexp/sweep"}}})
    with pytest.raises(PosexpError) as e:  # /proc takes no new folder, whoever asks
        check_writable(sweep, "hydra.sweep.dir")
    assert str(e.value).startswith("/proc/posexp/sweep: cannot create the output folder (")
    assert "/proc is not writable" in str(e.value) and "hydra.sweep.dir=DIR" in str(e.value)
    check_writable(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "a" / "b")}}}), "hydra.run.dir")
    assert list(tmp_path.iterdir()) == []  # makes nothing


def test_cfg_job_writes_no_folder_and_is_not_refused_for_one(tmp_path):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    result = CliRunner().invoke(app, ["analyze", "--cfg", "job", "hydra.run.dir=/proc/posexp/run"])
    assert result.exit_code == 0, result.output
    assert "encoder:" in result.output


# -- a disk that fills up during a run ---------------------------------------------------------------

class _FullWrite:
    """A file on a disk that fills up: the write after ``after`` earlier ones lands half, then ENOSPC, as
    ``write(2)`` reports it (no file name); closing it fails again, as a buffered file's last flush does."""

    def __init__(self, file, after: int = 0):
        self.file, self.after, self.failed = file, after, False

    def write(self, data):
        if self.after > 0:
            self.after -= 1
            return self.file.write(data)
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        self.failed = True
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()

    def close(self) -> None:
        self.file.close()
        if self.failed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fill_disk_at(mp: pytest.MonkeyPatch, name: str) -> None:
    """Writing a file whose name holds ``name`` fails halfway with ENOSPC: through posexp's atomic writer
    (Python's file writes), through safetensors' own (Rust) writer, with the error each raises, and (the
    header and 6 rows in) through the metrics.csv appender."""
    import safetensors.torch
    from safetensors import SafetensorError

    import posexp.runs.atomic as atomic
    import posexp.training.metrics as metrics_csv

    paths: dict[int, str] = {}
    fake_os = types.ModuleType("os")
    fake_os.__dict__.update(os.__dict__)

    def open_(path, flags, mode=0o777, **kwargs):
        fd = os.open(path, flags, mode, **kwargs)
        paths[fd] = str(path)
        return fd

    def fdopen(fd, *args, **kwargs):
        file = os.fdopen(fd, *args, **kwargs)
        return _FullWrite(file) if name in paths.pop(fd, "") else file

    real_save = safetensors.torch.save_model

    def save_model(model, filename, metadata=None, force_contiguous=False):
        real_save(model, filename, metadata, force_contiguous)
        if name in str(filename):
            os.truncate(filename, os.path.getsize(filename) // 2)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def append(path, *args, **kwargs):
        file = open(path, *args, **kwargs)
        return _FullWrite(file, after=7) if name in str(path) else file

    fake_os.open, fake_os.fdopen = open_, fdopen
    mp.setattr(atomic, "os", fake_os)
    mp.setattr(safetensors.torch, "save_model", save_model)
    mp.setattr(metrics_csv, "open", append, raising=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("full") / "run"
    result = invoke("train", *TINY_RUN, *STEPS, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.mark.parametrize("fails,kept", [("step-00000008.state.pt", 4), ("step-00000008.safetensors", 4),
                                        ("metrics.csv", 4), ("results.json", 12)])
def test_a_full_disk_stops_the_run_in_one_line_and_it_resumes_to_the_same_numbers(fails, kept, uninterrupted,
                                                                                   tmp_path):
    run_dir = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        fill_disk_at(mp, fails)
        result = invoke("train", *TINY_RUN, *STEPS, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 2, result.output
    line = _error_line(result.stderr)
    written = run_dir / ("checkpoint/" + fails if fails.startswith("step") else fails)
    assert line.startswith(f"error: {written}: could not be written (No space left on device)"), line
    assert f"last checkpoint (step {kept}) is intact" in line and f"posexp resume {run_dir}" in line
    left = sorted(p.name for p in (run_dir / "checkpoint").iterdir())
    assert not [n for n in left if n.endswith(".tmp") or n.startswith("step-00000008")], left  # space given back
    assert json.loads((run_dir / "checkpoint" / "resume.json").read_text())["step"] == kept
    assert not (run_dir / "results.json").exists()

    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    ours, reference = _results(run_dir), _results(uninterrupted)
    assert [(r["length"], r["ppl"], r["loss"]) for r in ours["rows"]] == \
        [(r["length"], r["ppl"], r["loss"]) for r in reference["rows"]]
    assert ours["run"]["train"]["final_loss"] == reference["run"]["train"]["final_loss"]


def test_atomic_writers_name_the_file_a_full_disk_refused(tmp_path):
    from posexp.runs.atomic import atomic_write_bytes

    (tmp_path / "results.json").write_text("old\n")
    with pytest.MonkeyPatch.context() as mp:
        fill_disk_at(mp, "results.json")
        with pytest.raises(OSError) as e:
            atomic_write_bytes(tmp_path / "results.json", b"new\n" * 100)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "results.json")
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert (tmp_path / "results.json").read_text() == "old\n"


def test_a_full_disk_during_eval_keeps_results_json_and_says_how_to_finish(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = (run / "results.json").read_bytes()
    with pytest.MonkeyPatch.context() as mp:
        fill_disk_at(mp, "results.json")
        result = invoke("eval", str(run), "eval.lengths=[96]")
    assert result.exit_code == 2, result.output
    line = _error_line(result.stderr)
    assert f"{run / 'results.json'}: could not be written (No space left on device)" in line
    assert f"free some space, then finish with: posexp eval {run} 'eval.lengths=[96]'" in line
    assert (run / "results.json").read_bytes() == before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_log_file_that_cannot_be_written_does_not_flood_the_terminal(tmp_path):
    """train.log on a full disk (/dev/full refuses every write): the run finishes and writes its results, with
    no "--- Logging error ---" traceback per log line on the terminal."""
    done = invoke_main("train", *TINY_RUN, "hydra.run.dir=run", "hydra.job_logging.handlers.file.filename=/dev/full",
                  cwd=tmp_path)
    assert done.exit_code == 0, done.output[-2000:]
    assert "Logging error" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["run"]["status"] == "completed"


# -- folder names outside ASCII ----------------------------------------------------------------------

def test_runs_in_folders_named_outside_ascii_train_evaluate_and_fine_tune(tmp_path):
    parent, child = tmp_path / "runs" / "é", tmp_path / "runs" / "über-ü"
    trained = invoke("train", *TINY_RUN, f"hydra.run.dir={parent}")  # typed as is: posexp quotes it for Hydra
    assert trained.exit_code == 0, trained.output
    evaluated = invoke("eval", str(parent), "eval.lengths=[48]")
    assert evaluated.exit_code == 0, evaluated.output
    assert [e["overrides"] for e in _results(parent)["evaluations"]] == [["eval.lengths=[48]"]]
    tuned = invoke("finetune", str(parent), "train_len=64", "train.steps=2", "train.warmup_steps=0",
                   "train.progress=false", "train.threads=1", "eval.tokens=256", f"hydra.run.dir={child}")
    assert tuned.exit_code == 0, tuned.output
    assert _results(child)["run"]["parent"] == str(parent.resolve())


def test_an_override_outside_ascii_that_cannot_be_quoted_for_the_user_names_the_character(tmp_path, monkeypatch):
    from posexp.cli.arguments import quote_non_ascii

    assert quote_non_ascii(["hydra.run.dir=runs/é", "data.path=[a,ü]", "seed=1", "x='é'", "data.path=my é"]) == \
        ["hydra.run.dir='runs/é'", "data.path=[a,'ü']", "seed=1", "x='é'", "data.path='my é'"]
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *TINY_RUN, "data.path={é: 1}")  # a dict's key: quoting it would change its meaning
    assert result.exit_code == 2
    line = _error_line(result.output)
    assert "'é' is not ASCII" in line and "only inside quotes" in line
    assert list(tmp_path.iterdir()) == []


def test_an_immutable_results_json_stops_eval_before_it_writes_anything(tiny, tmp_path):
    """posexp eval wrote results.csv and loss_by_position.csv with the new rows, then failed on results.json."""
    from posexp.commands.eval import reeval_main
    from posexp.commands.train import run_train

    run_dir = tmp_path / "run"
    run_train(tiny("train.steps=2", "eval.multiples=[1]", "eval.tokens=256"), run_dir, [])
    locked = run_dir / "results.json"
    with immutable(locked):
        before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
        with pytest.raises(PosexpError, match=r"results\.json read-only or immutable"):
            reeval_main([str(run_dir), "eval.multiples=[1,2]", "eval.tokens=256"])
        assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
