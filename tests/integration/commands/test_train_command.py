"""``posexp train`` as a user types it, run in this process: the run folder it writes, the checkpoint that
reproduces its numbers, a multirun and its summary, and encodings without a base or past their length."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from posexp.commands.edge import typed

from helpers import TINY_RUN, evaluate_at, invoke

RUN_KEYS = {"encoder", "base", "train_len", "overrides", "config_hash", "corpus_fingerprint", "versions",
            "git_commit", "python_version", "label", "status"}
ROW_KEYS = {"length", "protocol", "ppl", "loss", "tokens", "applicable", "loss_se", "ppl_low", "ppl_high"}


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One literal ``posexp train encoder=rope base=10000`` (shrunk by experiment=smoke)."""
    cwd = tmp_path_factory.mktemp("smoke")
    result = invoke("train", "encoder=rope", "base=10000", *TINY_RUN, "hydra.run.dir=run", cwd=cwd)
    assert result.exit_code == 0, result.output
    return cwd / "run", result


def test_train_writes_the_run_folder(smoke_run):
    run_dir, result = smoke_run
    for name in ("results.json", "results.csv", "results.md", "ppl_vs_length.png", "metrics.csv",
                 "checkpoint/model.safetensors", ".hydra/config.yaml", "train.log"):
        assert (run_dir / name).exists(), name
    assert (run_dir / "ppl_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = _results(run_dir)
    assert RUN_KEYS <= set(res["run"])
    assert res["run"]["encoder"] == "rope" and res["run"]["base"] == 10000.0
    assert res["run"]["overrides"][:2] == ["encoder=rope", "base=10000"]
    assert res["run"]["train_len"] == 32  # from experiment=smoke
    assert [r["length"] for r in res["rows"]] == [32, 64, 128]  # 1x, 2x, 4x the training length
    for row in res["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["applicable"] and 1.0 < row["ppl"] < 256.0  # better than nothing, worse than perfect
        assert row["tokens"] == res["rows"][0]["tokens"]  # the same budget at every length
        assert row["ppl_low"] < row["ppl"] < row["ppl_high"]
    # the table is printed for the user
    assert "perplexity by context length" in result.stdout


def test_metrics_csv_has_the_promised_columns(smoke_run):
    run_dir, _ = smoke_run
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) >= {"step", "tokens", "loss", "lr", "tokens_per_s", "elapsed_s"}
    assert int(rows[-1]["step"]) == 20
    assert int(rows[-1]["tokens"]) == 20 * 8 * 32
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])  # it learns


def test_checkpoint_loads_without_code_and_reproduces_results(smoke_run, compose):
    """The safetensors checkpoint alone, loaded into a fresh model, gives the recorded perplexity."""
    import torch
    from safetensors.torch import load_model

    from posexp.config.schema import DataConfig
    from posexp.data.corpus import load_corpus
    from posexp.model.factory import build_model

    run_dir, _ = smoke_run
    res = _results(run_dir)
    cfg = typed(compose(*res["run"]["overrides"]))
    model = build_model(cfg, 256)
    load_model(model, str(run_dir / "checkpoint" / "model.safetensors"))
    corpus = load_corpus(DataConfig())
    # in the precision the run evaluated in (precision=auto is bf16 on a CPU with native bf16 matmuls)
    dtype = getattr(torch, res["run"]["train"]["precision"])
    rows = evaluate_at(model, corpus.val, [32], 32, tokens=cfg.eval.tokens, batch_tokens=cfg.eval.batch_tokens,
                       dtype=dtype)
    assert rows[0]["ppl"] == pytest.approx(res["rows"][0]["ppl"], rel=1e-5)


def test_base_is_ignored_and_recorded_as_null_without_one(tmp_path):
    result = invoke("train", "encoder=alibi", "base=100", *TINY_RUN, "eval.multiples=[1]", "hydra.run.dir=run",
                    cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert _results(tmp_path / "run")["run"]["base"] is None


def test_learned_is_not_applicable_past_its_length(tmp_path):
    result = invoke("train", "encoder=learned", *TINY_RUN, "hydra.run.dir=run", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    rows = _results(tmp_path / "run")["rows"]
    assert [r["applicable"] for r in rows] == [True, False, False]
    assert rows[1]["ppl"] is None and rows[2]["ppl"] is None


def test_multirun_sweeps_and_summarises(tmp_path):
    result = invoke("train", "-m", "encoder=none,alibi", *TINY_RUN, "eval.multiples=[1,2]", "hydra.sweep.dir=sweep",
                    cwd=tmp_path)
    assert result.exit_code == 0, result.output
    runs = sorted((tmp_path / "sweep").glob("*/results.json"))
    assert len(runs) == 2
    encoders = sorted(json.loads(p.read_text())["run"]["encoder"] for p in runs)
    assert encoders == ["alibi", "none"]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "encoder=none" in summary and "encoder=alibi" in summary

    rep = invoke("report", "sweep", cwd=tmp_path)
    assert rep.exit_code == 0, rep.output
    assert "encoder=alibi" in rep.stdout
