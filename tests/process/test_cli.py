"""The CLI as a user types it: posexp train / -m / --cfg / --help / list / report, and bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from posexp.commands.edge import typed

from helpers import REPO, TINY_RUN, run_cli

RUN_KEYS = {"encoder", "base", "train_len", "overrides", "config_hash", "corpus_fingerprint", "versions",
            "git_commit", "python_version", "label", "status"}
ROW_KEYS = {"length", "protocol", "ppl", "loss", "tokens", "applicable", "loss_se", "ppl_low", "ppl_high"}


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One literal ``posexp train encoder=rope base=10000`` (shrunk by experiment=smoke)."""
    cwd = tmp_path_factory.mktemp("smoke")
    proc = run_cli("train", "encoder=rope", "base=10000", *TINY_RUN, "hydra.run.dir=run", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run", proc


def test_train_writes_the_run_folder(smoke_run):
    run_dir, proc = smoke_run
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
    assert "perplexity by context length" in proc.stdout


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
    from safetensors.torch import load_model

    from posexp.config.schema import DataConfig
    from posexp.data.corpus import load_corpus
    from helpers import evaluate_at
    from posexp.model.factory import build_model

    run_dir, _ = smoke_run
    res = _results(run_dir)
    cfg = typed(compose(*res["run"]["overrides"]))
    model = build_model(cfg, 256)
    load_model(model, str(run_dir / "checkpoint" / "model.safetensors"))
    corpus = load_corpus(DataConfig())
    import torch

    # in the precision the run evaluated in (precision=auto is bf16 on a CPU with native bf16 matmuls)
    dtype = getattr(torch, res["run"]["train"]["precision"])
    rows = evaluate_at(model, corpus.val, [32], 32, tokens=cfg.eval.tokens, batch_tokens=cfg.eval.batch_tokens,
                       dtype=dtype)
    assert rows[0]["ppl"] == pytest.approx(res["rows"][0]["ppl"], rel=1e-5)


def test_base_is_ignored_and_recorded_as_null_without_one(tmp_path):
    proc = run_cli("train", "encoder=alibi", "base=100", *TINY_RUN, "eval.multiples=[1]", "hydra.run.dir=run",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _results(tmp_path / "run")["run"]["base"] is None


def test_learned_is_not_applicable_past_its_length(tmp_path):
    proc = run_cli("train", "encoder=learned", *TINY_RUN, "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = _results(tmp_path / "run")["rows"]
    assert [r["applicable"] for r in rows] == [True, False, False]
    assert rows[1]["ppl"] is None and rows[2]["ppl"] is None


def test_multirun_sweeps_and_summarises(tmp_path):
    proc = run_cli("train", "-m", "encoder=none,alibi", *TINY_RUN, "eval.multiples=[1,2]", "hydra.sweep.dir=sweep",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = sorted((tmp_path / "sweep").glob("*/results.json"))
    assert len(runs) == 2
    encoders = sorted(json.loads(p.read_text())["run"]["encoder"] for p in runs)
    assert encoders == ["alibi", "none"]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "encoder=none" in summary and "encoder=alibi" in summary

    rep = run_cli("report", "sweep", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert "encoder=alibi" in rep.stdout


def test_cfg_job_prints_the_composed_config(tmp_path):
    proc = run_cli("train", "encoder=t5", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "name: t5" in proc.stdout and "num_buckets: 32" in proc.stdout
    assert not (tmp_path / "outputs").exists()  # printing the config runs nothing


def test_help_is_hydras(tmp_path):
    proc = run_cli("train", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "encoder:" in proc.stdout and "alibi" in proc.stdout  # config groups with their options


@pytest.mark.parametrize("how", ["--help", "report"])
def test_help_and_reports_start_without_torch(how, tmp_path):
    """``posexp --help`` and ``posexp report`` (its error too) never wait for torch to load (a TAB loads neither:
    tests/process/test_completion.py)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    args = ["--help"] if how == "--help" else ["report", str(tmp_path / "missing")]
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('torch' in sys.modules, file=sys.stderr))\n"
            f"sys.argv = ['posexp', *{args!r}]\n"
            "from posexp.cli import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.stderr.strip().splitlines()[-1] == "False", proc.stderr
    assert ("train" if how == "--help" else "no such folder") in proc.stdout + proc.stderr


def test_list_names_every_encoder_data_set_and_experiment(tmp_path):
    proc = run_cli("list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shipped = REPO / "configs"
    for group in ("encoder", "data", "experiment"):
        for yaml in (shipped / group).glob("*.yaml"):
            assert yaml.stem in proc.stdout, (group, yaml.stem)


def test_list_reads_at_80_columns(tmp_path):
    import os
    import re
    import subprocess
    import sys

    from posexp.commands.listing import yaml_description
    from posexp.config.schema import config_dir

    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "posexp", "list"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out  # no name or description cut short
    words = set(re.findall(r"[^\s│┃]+", out))
    for group in ("model", "data", "experiment", "logger"):
        for yaml in (config_dir() / group).glob("*.yaml"):
            desc = yaml_description(yaml)
            assert set(desc.split()) <= words, (yaml, desc)  # every word whole: no 9-character column folding them


def test_a_description_is_the_header_first_sentence_not_its_first_line():
    from posexp.commands.listing import yaml_description
    from posexp.config.schema import config_dir

    assert yaml_description(config_dir() / "model" / "press2022.yaml") == (
        "The ALiBi paper's WikiText-103 model (Press et al. 2022): 16 layers of d_model 1024, 8 heads, FFN 4096.")
    # a long first sentence ends at its first clause rather than mid-word
    assert yaml_description(config_dir() / "experiment" / "converged.yaml") == (
        "The built-in data trained long enough that the training-length perplexity stops being a race of how "
        "fast each encoding is learned")


BAD_INPUT = [
    (["encoder=nope"], ["encoder", "rope", "alibi"]),
    (["nope=1"], ["nope"]),
    (["model.dmodel=64"], ["dmodel"]),
    (["base=1"], ["base", "> 1"]),
    (["base=0.5"], ["base"]),
    (["encoder=sinusoidal", "base=-3"], ["base"]),
    (["encoder=t5", "encoder.lr_mult=0"], ["encoder.lr_mult", "> 0"]),
    (["train_len=0"], ["train_len", "positive"]),
    (["train_len=-8"], ["train_len"]),
    (["train_len=12.5"], ["train_len"]),
    (["eval.lengths=[0,64]"], ["eval.lengths", "positive"]),
    (["eval.lengths=[-64]"], ["eval.lengths"]),
    (["eval.lengths=[1.5]"], ["eval.lengths"]),
    (["model.d_model=30", "model.n_heads=4"], ["model.d_model", "divisible"]),
    (["model.d_model=12", "model.n_heads=4"], ["d_model", "even"]),  # rope with head dim 3
    (["data=text"], ["data.path"]),
    (["data=text", "data.path=/no/such/file.txt"], ["data.path", "does not exist"]),
    (["train.steps=0"], ["train.steps"]),
    (["train.precision=fp16"], ["train.precision", "bf16"]),
    (["data=hub"], ["data", "stdlib", "text"]),
]


@pytest.mark.parametrize("overrides,needles", BAD_INPUT, ids=[" ".join(o) for o, _ in BAD_INPUT])
def test_bad_input_is_a_clear_message_not_a_traceback(tmp_path, monkeypatch, overrides, needles):
    # in this interpreter (the CLI as a user calls it, without starting Python and torch 20 times); the
    # fresh-interpreter form is checked once below
    from typer.testing import CliRunner

    from posexp.cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", *TINY_RUN, *overrides, "hydra.run.dir=run"], env={"COLUMNS": "200"})
    out = result.output
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize("overrides,needles", [BAD_INPUT[0], BAD_INPUT[7]], ids=["encoder=nope", "train_len=0"])
def test_bad_input_in_a_fresh_interpreter_is_one_message(tmp_path, overrides, needles):
    proc = run_cli("train", *TINY_RUN, *overrides, "hydra.run.dir=run", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out
    assert all(needle in out for needle in needles), out
    assert not (tmp_path / "run").exists()


def test_overrides_after_a_flag_are_read_without_a_usage_error(capsys):
    """``posexp finetune RUN train_len=512 -m scaling=none,yarn``: overrides on both sides of -m, read in one go."""
    from posexp.cli.hydra_flags import read

    line = read(["parent=/runs/p", "train_len=512", "-m", "scaling=none,yarn", "train.steps=200"])
    assert line is not None and line.multirun and line.runs
    assert line.overrides == ("parent=/runs/p", "train_len=512", "scaling=none,yarn", "train.steps=200")
    assert read(["--cfg", "nope"]) is None  # Hydra's parser refuses it (and says so itself)
    assert not read(["--cfg", "job", "a=1"]).runs and read(["-cd", "conf", "--help"]).helps  # type: ignore[union-attr]
    assert "usage" not in capsys.readouterr().err


def test_a_run_stopped_outside_its_training_steps_says_how_to_go_on(tmp_path):
    import signal as signals

    from posexp.cli.app import _terminate_run
    from posexp.cli.jobs import Terminated, interrupted_hint

    with pytest.raises(Terminated) as stopped:  # SIGTERM while evaluating stops the run as Ctrl-C does
        _terminate_run(signals.SIGTERM, None)
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"")
    hint = interrupted_hint(tmp_path, stopped.value)
    assert "SIGTERM" in hint and "while evaluating" in hint and f"posexp resume {tmp_path}" in hint
    assert "Ctrl-C" in interrupted_hint(tmp_path, KeyboardInterrupt())
