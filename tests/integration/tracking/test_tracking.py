"""Experiment trackers (logger=tensorboard / mlflow / wandb): what each one's own reader finds after a run.

Every test reads back with the library's own client (TensorBoard's EventAccumulator, MlflowClient, the
records of W&B's offline run file) and skips when that library is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
from pathlib import Path

import pytest

from helpers import TINY_RUN, invoke, invoke_main, sigterm_at_step
from posexp.commands.train import check_config, run_train
from posexp.errors import ConfigError
from posexp.tracking.tracker import eval_points, metric_name, row_value

TINY = ("train.steps=4", "train.log_every=2", "train.warmup_steps=1",
        "eval.multiples=[1,2]", "train.threads=1")


def _train(tiny, run_dir: Path, *overrides: str) -> dict:
    """``posexp train`` in this process, leaving the run folder Hydra would (``.hydra/`` included)."""
    from omegaconf import OmegaConf

    args = [*TINY, *overrides]
    cfg = tiny(*args)
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(args), run_dir / ".hydra" / "overrides.yaml")
    return run_train(cfg, run_dir, args)


def _metrics_steps(run_dir: Path) -> list[int]:
    return [int(line.split(",")[0]) for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]


def _ppl_by_length(results: dict, protocol: str = "nonoverlap") -> dict[int, float]:
    return {r["length"]: r["ppl"] for r in results["rows"] if r["protocol"] == protocol}


# -- naming: one series per curve over length -------------------------------------------------------

def test_every_row_key_but_the_length_is_in_the_series_name():
    rows = [{"metric": "perplexity", "length": 64, "protocol": "nonoverlap", "ppl": 5.0},
            {"length": 64, "protocol": "sliding", "stride": 16, "ppl": 4.0},  # written before rows had a metric
            {"metric": "perplexity", "length": 64, "protocol": "nonoverlap", "scaling": "yarn", "scaling_factor": 4.0,
             "ppl": 4.5},
            {"metric": "perplexity", "length": 64, "protocol": "last_k", "last_k": 8, "ppl": 4.1},
            {"metric": "accuracy", "length": 64, "task": "passkey", "protocol": "teacher_forced", "depth": 0.5,
             "exact_match": 0.75, "token_accuracy": 0.9}]
    names = [metric_name(r) for r in rows]
    assert names == ["eval/ppl/nonoverlap", "eval/ppl/sliding_S16", "eval/ppl/nonoverlap_yarn_x4",
                     "eval/ppl/last_k_K8", "eval/exact_match/passkey_teacher_forced_depth0.5"]
    assert all(n.count("/") == 2 for n in names)  # no name is another one's folder in MLflow's file store
    assert [row_value(r) for r in rows] == [5.0, 4.0, 4.5, 4.1, 0.75]


def test_a_task_row_is_two_series_exact_match_and_per_token():
    from posexp.evaluation.accuracy import _summarise
    import numpy as np

    measured = _summarise(np.array([3, 2]), np.array([3, 4]), 1.4)  # one of two exact, 5 of 7 tokens right
    row = {"metric": "accuracy", "task": "copy", "protocol": "teacher_forced", "length": 32, **measured}
    points = {p.name: p.value for p in eval_points([row])}
    assert points == {"eval/exact_match/copy_teacher_forced": 0.5,
                      "eval/token_accuracy/copy_teacher_forced": 5 / 7}


def test_rows_not_measured_are_not_points():
    rows = [{"length": 64, "protocol": "nonoverlap", "ppl": 5.0},
            {"length": 128, "protocol": "nonoverlap", "ppl": None, "applicable": False},
            {"length": 256, "protocol": "nonoverlap", "ppl": float("nan")}]
    assert [(p.name, p.length, p.value) for p in eval_points(rows)] == [("eval/ppl/nonoverlap", 64, 5.0)]


# -- no tracker: no cost (a default run imports none: tests/process/test_fresh_interpreter.py) ----------------------

def test_a_missing_library_names_its_extra_in_one_line_before_anything_runs(tmp_path, monkeypatch):
    """mlflow made unimportable (as when it is not installed): one line, exit 2, no run folder."""
    monkeypatch.setitem(sys.modules, "mlflow", None)
    out = invoke_main("train", *TINY_RUN, *TINY, "logger=[tensorboard,mlflow]", f"hydra.run.dir={tmp_path / 'run'}",
                      cwd=tmp_path)
    assert out.exit_code == 2, out.stderr
    assert out.stderr.strip() == ("error: logger: mlflow needs the mlflow package, which is not installed: "
                                  "pip install 'posexp[mlflow]'")
    assert not (tmp_path / "run").exists()


def test_an_unknown_wandb_mode_is_refused_with_the_choices(tiny):
    pytest.importorskip("wandb")
    with pytest.raises(ConfigError, match=r"logger.wandb.mode: unknown W&B mode 'ofline'; choose one of: online, "
                                          r"offline, disabled"):
        check_config(tiny(*TINY, "logger=wandb", "logger.wandb.mode=ofline"))


# -- TensorBoard -----------------------------------------------------------------------------------

def _event_accumulator(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_reads_back_the_curve_every_row_and_the_files(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "run"
    results = _train(tiny, run_dir, "logger=tensorboard")
    acc = _event_accumulator(run_dir / "tensorboard")
    tags = acc.Tags()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == _metrics_steps(run_dir) == [2, 4]
    assert {"train/lr", "train/tokens_per_s"} <= set(tags["scalars"])
    ppl = {e.step: e.value for e in acc.Scalars("eval/ppl/nonoverlap")}
    assert ppl == pytest.approx(_ppl_by_length(results), rel=1e-6)  # step = length in tokens
    assert {"ppl_vs_length", "loss_by_position"} <= set(tags["images"])
    assert {"config/text_summary", "results.json/text_summary"} <= set(tags["tensors"])
    assert json.loads(Path(run_dir / "trackers.json").read_text())["tensorboard"]["log_dir"] == \
        str((run_dir / "tensorboard").resolve())


def test_tensorboard_holds_every_figure_a_task_run_with_depths_draws(tiny, tmp_path):
    """A passkey run draws accuracy by length, its length x depth heatmap and accuracy by depth: all three are
    images of its tracked run, as the figures of a perplexity run are."""
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "run"
    _train(tiny, run_dir, "task=passkey", "train_len=64", "eval.examples=4", "eval.depths=[0,1]", "logger=tensorboard")
    drawn = {p.stem for p in run_dir.glob("*.png")}
    assert {"accuracy_vs_length", "passkey_heatmap", "accuracy_vs_depth"} <= drawn
    assert set(_event_accumulator(run_dir / "tensorboard").Tags()["images"]) == drawn


def test_posexp_eval_appends_its_rows_to_the_tensorboard_run(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from posexp.commands.eval import reeval_main

    run_dir = tmp_path / "run"
    _train(tiny, run_dir, "logger=tensorboard")
    [results] = reeval_main([str(run_dir), "eval.protocol=sliding", "eval.stride=16"])
    acc = _event_accumulator(run_dir / "tensorboard")
    sliding = {e.step: e.value for e in acc.Scalars("eval/ppl/sliding_S16")}
    assert sliding == pytest.approx(_ppl_by_length(results, "sliding"), rel=1e-6)
    assert len(acc.Scalars("eval/ppl/nonoverlap")) == 2  # the training's rows are still there


def test_a_resumed_run_keeps_every_tensorboard_point_up_to_its_checkpoint(tmp_path, monkeypatch):
    """SIGTERM in step 3 logs and checkpoints step 3, and the resumed training logs steps 4 on. TensorBoard's purge
    at the resume started at step 3 itself, so its loss (logged by no later session) and the config were hidden."""
    pytest.importorskip("tensorboard")
    from posexp.data.corpus import BatchSampler

    run_dir = tmp_path / "run"
    args = (*TINY_RUN, "logger=tensorboard", "train.steps=6", "train.log_every=1", "eval.multiples=[1]")
    sample = sigterm_at_step(monkeypatch, BatchSampler, "batch", 2)  # 0-based: the 3rd step
    stopped = invoke("train", *args, f"hydra.run.dir={run_dir}")
    assert stopped.exit_code == 128 + signal.SIGTERM, stopped.output
    monkeypatch.setattr(BatchSampler, "batch", sample)
    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    acc = _event_accumulator(run_dir / "tensorboard")
    assert [e.step for e in acc.Scalars("train/loss")] == _metrics_steps(run_dir) == [1, 2, 3, 4, 5, 6]
    assert "config/text_summary" in acc.Tags()["tensors"]


# -- MLflow ----------------------------------------------------------------------------------------

@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A local file store: the one every MLflow install can write (MLflow 3 asks for this opt-in to it)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"file:{tmp_path / 'mlruns'}"


def _mlflow_runs(uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("posexp")
    return client, client.search_runs([experiment.experiment_id]) if experiment else []


def test_mlflow_holds_params_curve_rows_and_artifacts(tiny, tmp_path, mlflow_store):
    run_dir = tmp_path / "run"
    results = _train(tiny, run_dir, "logger=mlflow", f"logger.mlflow.tracking_uri={mlflow_store}")
    client, runs = _mlflow_runs(mlflow_store)
    [run] = runs
    assert run.info.status == "FINISHED"
    assert run.data.params["model.d_model"] == "32" and run.data.params["encoder.name"] == "rope"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == _metrics_steps(run_dir)
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/ppl/nonoverlap")}
    assert history == pytest.approx(_ppl_by_length(results), rel=1e-9)
    assert run.data.metrics["eval/ppl/nonoverlap_L64"] == pytest.approx(_ppl_by_length(results)[64], rel=1e-9)
    stored = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.json", "results.csv", "ppl_vs_length.png", "config.yaml"} <= stored
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"] == run.info.run_id


def test_resume_and_eval_append_to_the_same_mlflow_run(tiny, tmp_path, mlflow_store):
    from posexp.commands.eval import reeval_main
    from posexp.commands.resume import resume_main

    run_dir = tmp_path / "run"
    _train(tiny, run_dir, "logger=mlflow", f"logger.mlflow.tracking_uri={mlflow_store}")
    (run_dir / "results.json").unlink()  # a run killed after its last checkpoint: resume evaluates it again
    resume_main(run_dir)
    reeval_main([str(run_dir), "eval.lengths=[96]"])
    client, runs = _mlflow_runs(mlflow_store)
    [run] = runs  # no second run
    history = client.get_metric_history(run.info.run_id, "eval/ppl/nonoverlap")
    assert sorted({m.step for m in history}) == [32, 64, 96]
    assert run.info.status == "FINISHED"


# -- W&B, offline ----------------------------------------------------------------------------------

def _wandb_records(run_dir: Path, runs: int = 1) -> list:
    """Every record of the run's offline files, once each of them ends with its exit record (W&B's service
    process may still be writing when ``finish()`` has returned)."""
    deadline = time.monotonic() + 60
    while True:
        records = _read_wandb_files(run_dir)
        if sum(r.WhichOneof("record_type") == "exit" for r in records) >= runs or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _read_wandb_files(run_dir: Path) -> list:
    """W&B's log format: a 7-byte header, then 32 KiB blocks of records, each with a 7-byte header (CRC-32,
    length, kind: 1 whole, 2 first, 3 middle, 4 last part)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, part = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(part)
                out.append(record)
                part = b""
    return out


def _history(records) -> list[dict]:
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """No API key and no mode set: W&B must not try the network."""
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # artifact staging: not the user's home


def test_wandb_runs_offline_without_an_api_key_and_holds_everything(tiny, tmp_path, wandb_offline):
    run_dir = tmp_path / "run"
    results = _train(tiny, run_dir, "logger=wandb")
    record = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    assert record["mode"] == "offline"
    records = _wandb_records(run_dir)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == record["id"] and run.project == "posexp"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["model"]["d_model"] == 32
    history = _history(records)
    assert [h["_step"] for h in history if "train/loss" in h] == _metrics_steps(run_dir)
    ppl = {h["eval/length"]: h["eval/ppl/nonoverlap"] for h in history if "eval/ppl/nonoverlap" in h}
    assert ppl == pytest.approx(_ppl_by_length(results), rel=1e-9)
    stored = {m.path for r in records if r.WhichOneof("record_type") == "artifact"
              for m in r.artifact.manifest.contents}
    assert {"results.json", "ppl_vs_length.png"} <= stored


def test_posexp_eval_appends_to_the_same_wandb_run_after_its_last_step(tiny, tmp_path, wandb_offline):
    from posexp.commands.eval import reeval_main

    run_dir = tmp_path / "run"
    _train(tiny, run_dir, "logger=wandb")
    trained = json.loads((run_dir / "trackers.json").read_text())["wandb"]
    [results] = reeval_main([str(run_dir), "eval.lengths=[48]"])
    records = _wandb_records(run_dir, runs=2)  # an offline run continued later is a second folder, same id
    assert {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"} == {trained["id"]}
    [added] = [h for h in _history(records) if h.get("eval/length") == 48 and "eval/ppl/nonoverlap" in h]
    assert added["eval/ppl/nonoverlap"] == pytest.approx(_ppl_by_length(results)[48], rel=1e-9)
    assert added["_step"] > trained["step"]  # W&B keeps a step only if it is past the run's last one


# -- a sweep: one tracked run per job, grouped -----------------------------------------------------

@pytest.mark.slow  # a two-job sweep with two trackers; single-run tracking is tested by default
def test_a_sweep_of_two_jobs_gives_two_grouped_runs(tmp_path, mlflow_store, wandb_offline):
    sweep = tmp_path / "sweep"
    result = invoke_main("train", "-m", *TINY_RUN, *TINY, "encoder=rope,alibi", "logger=[mlflow,wandb]",
                         f"logger.mlflow.tracking_uri={mlflow_store}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr[-3000:]
    client, runs = _mlflow_runs(mlflow_store)
    parent = json.loads((sweep / "trackers.json").read_text())["mlflow"]["parent_run_id"]
    children = [r for r in runs if r.info.run_id != parent]
    swept = [next(w for w in r.info.run_name.split() if w.startswith("encoder=")) for r in children]
    assert sorted(swept) == ["encoder=alibi", "encoder=rope"]  # the label names each job's encoder
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent}
    groups = {r.run.run_group for job in ("0", "1") for r in _wandb_records(sweep / job)
              if r.WhichOneof("record_type") == "run"}
    assert groups == {str(sweep)}  # the sweep folder (outside ./outputs here, so its full path)


def test_an_unreachable_tracking_server_is_one_line_within_seconds():
    """MLflow's client retried for minutes in silence; a closed port or a black-holed address is told in seconds."""
    import socket
    import time

    from posexp.errors import PosexpError
    from posexp.tracking.tracker import check_reachable

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(PosexpError, match=r"logger.mlflow.tracking_uri: cannot reach the tracking server"):
            check_reachable(url, "logger.mlflow.tracking_uri")
    assert time.monotonic() - start < 10
    check_reachable("file:///nowhere", "logger.mlflow.tracking_uri")  # not a server: left to the tracker


def test_mlflow_against_an_unreachable_server_fails_before_training(compose, tmp_path):
    pytest.importorskip("mlflow")
    import socket

    from posexp.errors import PosexpError
    from posexp.tracking.mlflow_tracker import _client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(PosexpError, match="cannot reach"):
            _client(f"http://127.0.0.1:{s.getsockname()[1]}")


def test_mlflow_skinny_and_the_default_sqlite_store_is_one_line_naming_the_fix(monkeypatch):
    pytest.importorskip("mlflow")
    import importlib.util

    from posexp.errors import PosexpError
    from posexp.tracking import mlflow_tracker

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sqlalchemy" else real(name, *a))
    with pytest.raises(PosexpError, match=r"needs the full MLflow package: pip install mlflow"):
        mlflow_tracker._client("sqlite:///mlflow.db")


def test_an_unknown_tracker_name_is_an_error_not_another_tracker():
    from posexp.errors import ConfigError
    from posexp.tracking import _tracker_class

    with pytest.raises(ConfigError, match="unknown tracker 'wandbx'; did you mean wandb[?] choose one of: none, "
                                          "mlflow, tensorboard, wandb$"):
        _tracker_class("wandbx")


@pytest.mark.parametrize("content", [b"\x00garbage", b"[1, 2]", b'{"tensorboard": "abc"}'])
def test_a_damaged_trackers_json_is_said_not_ignored(tmp_path, content):
    """A garbage trackers.json made posexp eval and resume start over in the trackers with no word."""
    from posexp import tracking

    (tmp_path / "trackers.json").write_bytes(content)
    said: list[str] = []
    tracking.reopen(tmp_path, said.append)
    assert len(said) == 1 and "trackers.json" in said[0] and "no tracked run of it is updated" in said[0]
    (tmp_path / "trackers.json").write_text('{"tensorboard": {"log_dir": "x"}}')
    assert tracking.tracker.records_problem(tmp_path) is None


def test_a_read_only_home_puts_wandbs_own_folders_in_the_run(tmp_path, monkeypatch):
    """With HOME read-only, W&B's core printed 18 raw log lines on the run's terminal and its artifacts failed."""
    import posexp.runs.atomic as atomic
    from posexp.tracking import wandb_tracker

    for key in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(atomic, "unwritable", lambda folder: "Read-only file system")
    with wandb_tracker._writable_homes(tmp_path):
        assert os.environ["XDG_CACHE_HOME"] == str(tmp_path / "wandb" / "home" / "xdg-cache")
    assert "XDG_CACHE_HOME" not in os.environ  # only while W&B's core starts
    assert os.environ["WANDB_DATA_DIR"] == str(tmp_path / "wandb" / "home" / "data")  # for the later artifacts
    assert os.environ["WANDB_CACHE_DIR"] == str(tmp_path / "wandb" / "home" / "cache")
    monkeypatch.setenv("WANDB_DATA_DIR", "/mine")
    with wandb_tracker._writable_homes(tmp_path):
        pass
    assert os.environ["WANDB_DATA_DIR"] == "/mine"  # the user's own setting stays
    monkeypatch.setattr(atomic, "unwritable", lambda folder: None)
    monkeypatch.delenv("WANDB_CONFIG_DIR")
    with wandb_tracker._writable_homes(tmp_path):
        assert "WANDB_CONFIG_DIR" not in os.environ  # a writable home: W&B's own places
