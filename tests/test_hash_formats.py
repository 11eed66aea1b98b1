"""Run folders written in hash format 1 (before a run recorded its format) keep resolving: ``posexp eval`` and
``posexp resume`` check them against the hash they recorded, and what they write keeps that format; a new run
records format 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from posexp.commands.edge import recorded_hash_format, typed
from posexp.commands.eval import reeval_main
from posexp.commands.resume import resume_main
from posexp.commands.train import run_train
from posexp.config.identity import HASH_FORMAT, config_hash
from posexp.config.legacy import format1_hash
from posexp.errors import TrainingInterrupted
from posexp.runs.layout import HYDRA_CONFIG
from posexp.training import trainer
from posexp.training.checkpoint import sha256_file

from conftest import sigterm_at_step

OVERRIDES = ("train.steps=4", "train.warmup_steps=1", "train.log_every=2", "train.checkpoint_every=2",
             "eval.multiples=[1]", "eval.tokens=256", "eval.loss_by_position=false")


def _as_format_1(run_dir: Path, cfg) -> str:
    """Rewrite every hash the folder records as format 1 wrote it: the old value, no format (and the weights'
    SHA-256 wherever it is recorded, as their metadata holds the hash)."""
    old = format1_hash(OmegaConf.to_container(cfg, resolve=True))
    (run_dir / HYDRA_CONFIG).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / HYDRA_CONFIG).write_text(OmegaConf.to_yaml(cfg))
    digests = {}
    for weights in (run_dir / "checkpoint").glob("*.safetensors"):
        with safe_open(str(weights), "pt") as f:
            meta = f.metadata()
        save_file(load_file(str(weights)), str(weights), metadata={**meta, "config_hash": old})
        digests[weights.name] = sha256_file(weights)
    for name in ("results.json", "checkpoint/meta.json", "checkpoint/resume.json"):
        path = run_dir / name
        if path.is_file():
            data = json.loads(path.read_text())
            record = data["run"] if name == "results.json" else data
            record["config_hash"] = old
            record.pop("hash_format", None)
            if name == "checkpoint/meta.json":
                record["sha256"] = digests["model.safetensors"]
            if name == "checkpoint/resume.json":
                record["weights_sha256"] = digests[record["weights"]]
            path.write_text(json.dumps(data))
    return old


def test_a_new_run_records_the_current_format(tiny, tmp_path):
    cfg = tiny(*OVERRIDES)
    run = run_train(cfg, tmp_path / "run", [])["run"]
    assert run["hash_format"] == HASH_FORMAT == 2 and run["config_hash"] == config_hash(typed(cfg))
    assert json.loads((tmp_path / "run" / "checkpoint" / "meta.json").read_text())["hash_format"] == 2


def test_a_format_1_run_is_evaluated_against_the_hash_it_recorded(tiny, tmp_path):
    cfg = tiny(*OVERRIDES)
    run_dir = tmp_path / "run"
    run_train(cfg, run_dir, [])
    old = _as_format_1(run_dir, cfg)
    assert recorded_hash_format(run_dir) == 1 and old != config_hash(typed(cfg))
    results = reeval_main([str(run_dir), "eval.multiples=[1,2]"])[0]
    assert sorted(r["length"] for r in results["rows"]) == [32, 64]
    assert results["run"]["config_hash"] == old


def test_a_killed_format_1_run_resumes_and_keeps_its_format(tiny, tmp_path, monkeypatch):
    cfg = tiny(*OVERRIDES)
    run_dir = tmp_path / "run"
    sample = sigterm_at_step(monkeypatch, trainer.BatchSampler, "batch", 2)
    with pytest.raises(TrainingInterrupted):
        run_train(cfg, run_dir, [])
    monkeypatch.setattr(trainer.BatchSampler, "batch", sample)
    old = _as_format_1(run_dir, cfg)
    run = resume_main(run_dir)["run"]
    assert run["train"]["resumed_at"] == [3]
    assert (run["config_hash"], run["hash_format"]) == (old, 1)
    assert json.loads((run_dir / "checkpoint" / "meta.json").read_text())["hash_format"] == 1


def test_a_run_from_a_newer_hash_format_is_said_to_be_from_a_newer_posexp_not_edited(tiny, tmp_path):
    from posexp.errors import PosexpError

    run_dir = tmp_path / "run"
    run_train(tiny(*OVERRIDES), run_dir, [])
    results = json.loads((run_dir / "results.json").read_text())
    results["run"]["hash_format"] = HASH_FORMAT + 1
    (run_dir / "results.json").write_text(json.dumps(results))
    before = (run_dir / "results.json").read_text()
    with pytest.raises(PosexpError, match=rf"written by a newer posexp \(hash format {HASH_FORMAT + 1}") as caught:
        reeval_main([str(run_dir), "eval.multiples=[1,2]"])
    assert "edited" not in str(caught.value)
    assert (run_dir / "results.json").read_text() == before
