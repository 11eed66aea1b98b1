"""Task runs end to end through the CLI: accuracy rows beside (never mixed with) perplexity rows, the passkey
grid and heatmap, eval / resume of a task run, and bad input as one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from helpers import TINY_RUN, invoke, sigterm_at_step
from posexp.cli.app import app

FAST = (*TINY_RUN, "train.steps=4", "eval.examples=16")


def _rows(run_dir) -> list[dict]:
    return json.loads((run_dir / "results.json").read_text())["rows"]


@pytest.mark.parametrize("args,needles", [
    (["task=bogus"], ["task=bogus", "copy", "mqar", "passkey"]),
    (["task=copy", "train_len=1"], ["train_len", "too short for one instance", ">= 2"]),
    (["task=passkey", "eval.lengths=[16,64]"], ["eval.lengths", "too short for one instance"]),
    (["task=copy", "eval.examples=0"], ["eval.examples", "positive"]),
    (["task=passkey", "eval.depths=[0,1.5]"], ["eval.depths", "[0, 1]"]),
    (["task=passkey", "eval.depths=[-0.1]"], ["eval.depths", "[0, 1]"]),
    (["task=copy", "data=text", "data.path=README.md"], ["data", "task=copy", "reads no data"]),
    (["task=passkey", "tokenizer=bpe"], ["tokenizer", "byte"]),
    (["task=mqar", "task.symbols=4"], ["task.symbols", "raise task.symbols"]),
    (["task=copy", "task.digits=3"], ["task.digits", "passkey"]),
    (["task=copy", "eval.protocol=sliding", "eval.stride=8"], ["eval.protocol", "teacher-forced"]),
])
def test_bad_task_input_is_one_line_naming_the_key(args, needles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", *FAST, *args, "hydra.run.dir=run"])
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1 and out.startswith("error:") and "Traceback" not in out, out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_task_run_writes_accuracy_rows_with_intervals_and_eval_adds_lengths(tmp_path):
    run = tmp_path / "copy"
    done = invoke("train", "task=copy", "encoder=rope", *FAST, f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    rows = _rows(run)
    assert [r["length"] for r in rows] == [32, 64, 128]
    for r in rows:
        assert r["metric"] == "accuracy" and r["task"] == "copy" and r["examples"] == 16
        assert r["answer_tokens"] == 16 * (r["length"] // 2)  # copy of size L/2: L/2 answer tokens each
        assert 0 <= r["exact_match_low"] <= r["exact_match"] <= r["exact_match_high"] <= 1
        assert 0 <= r["token_accuracy_low"] <= r["token_accuracy"] <= r["token_accuracy_high"] <= 1
        assert r["answer_loss"] > 0 and "ppl" not in r
    for name in ("results.md", "results.csv", "accuracy_vs_length.png"):
        assert (run / name).is_file(), name
    assert "exact match" in (run / "results.md").read_text()
    results = json.loads((run / "results.json").read_text())
    assert results["run"]["task"]["name"] == "copy" and results["run"]["vocab_size"] == 18

    again = invoke("eval", str(run), "eval.lengths=[48]", cwd=tmp_path)
    assert again.exit_code == 0, again.output
    rows = _rows(run)
    assert sorted(r["length"] for r in rows) == [32, 48, 64, 128] and {r["metric"] for r in rows} == {"accuracy"}


def test_passkey_rows_are_per_length_and_depth_with_a_heatmap(tmp_path):
    run = tmp_path / "passkey"
    done = invoke("train", "task=passkey", "encoder=alibi", *FAST, "eval.depths=[0,0.5,1]", f"hydra.run.dir={run}",
                  cwd=tmp_path)
    assert done.exit_code == 0, done.output
    rows = _rows(run)
    assert sorted((r["length"], r["depth"]) for r in rows) == [(n, d) for n in (32, 64, 128) for d in (0, 0.5, 1)]
    assert all(r["answer_tokens"] == 16 * 5 for r in rows)  # five key digits per instance
    assert (run / "passkey_heatmap.png").is_file()


@pytest.mark.slow  # an end-to-end run of several seconds; the default suite stays near 10 minutes
def test_learned_positions_past_their_table_are_not_applicable_on_a_task(tmp_path):
    run = tmp_path / "learned"
    done = invoke("train", "task=reverse", "encoder=learned", "encoder.max_length=64", *FAST, f"hydra.run.dir={run}",
                  cwd=tmp_path)
    assert done.exit_code == 0, done.output
    by_length = {r["length"]: r for r in _rows(run)}
    assert by_length[64]["applicable"] and not by_length[128]["applicable"]
    assert by_length[128]["exact_match"] is None and "64" in by_length[128]["reason"]


def test_an_interrupted_task_run_resumes_to_identical_numbers(tmp_path, monkeypatch):
    """SIGTERM during step 4 (from the task's sampler): the run checkpoints it; resume ends where an
    uninterrupted run ends, rows and weights alike."""
    import signal

    from posexp.tasks.sampler import TaskSampler

    args = ["train", "task=reverse", "encoder=alibi", *TINY_RUN, "train.steps=8", "train.checkpoint_every=2",
            "eval.examples=16"]
    full = tmp_path / "full"
    assert CliRunner().invoke(app, [*args, f"hydra.run.dir={full}"]).exit_code == 0
    window = sigterm_at_step(monkeypatch, TaskSampler, "window", 3)
    run = tmp_path / "run"
    stopped = CliRunner().invoke(app, [*args, f"hydra.run.dir={run}"])
    assert stopped.exit_code == 128 + signal.SIGTERM and not (run / "results.json").exists()
    monkeypatch.setattr(TaskSampler, "window", window)
    resumed = CliRunner().invoke(app, ["resume", str(run)])
    assert resumed.exit_code == 0, resumed.output
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("eval_s", "tokens_per_s", "peak_mem_mb")}
                          for r in rows]  # noqa: E731
    assert strip(_rows(run)) == strip(_rows(full))


@pytest.mark.slow
def test_mqar_learns_with_its_yaml_init(tmp_path):
    """4 key-value pairs, 1500 steps (about 15 s): the task yaml's init=pytorch, untied model recalls every value.
    With GPT-2's N(0, 0.02) the same model stays near 45% of values (scripts/study_tasks.md)."""
    run = tmp_path / "mqar"
    done = invoke("train", "task=mqar", "encoder=rope", "task.symbols=16", "train_len=16", "eval.multiples=[1]",
                  "train.steps=1500", "train.progress=false", f"hydra.run.dir={run}", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    (row,) = _rows(run)
    assert row["token_accuracy"] >= 0.95 and row["exact_match"] >= 0.8, row


def test_task_evaluation_records_no_gradients(tiny, monkeypatch):
    """Scoring only reads the weights: no autograd graph (its memory grows with the length), as for perplexity."""
    import torch

    from posexp.commands.edge import typed
    from posexp.evaluation import accuracy
    from posexp.model.factory import build_model
    from posexp.tasks.source import TrainingSource

    cfg = typed(tiny("task=reverse", "train_len=16", "eval.multiples=[1,2]", "eval.examples=4"))
    source = TrainingSource.of_task(cfg, None)
    model = build_model(cfg, source.vocab_size)
    grad_on: list[bool] = []
    score = accuracy._score
    monkeypatch.setattr(accuracy, "_score", lambda *a: grad_on.append(torch.is_grad_enabled()) or score(*a))
    accuracy.evaluate_task_config(model, source.task, cfg, torch.device("cpu"))
    assert grad_on == [False, False]


def test_posexp_eval_of_a_task_at_an_impossible_length_is_one_line(tmp_path, monkeypatch):
    """eval.lengths=[10000000] raised numpy's _ArrayMemoryError (9.54 GiB); and running out of memory where no
    estimate foresaw it is one line naming what to lower, as in training."""
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["train", "task=copy", *FAST, "hydra.run.dir=run"]).exit_code == 0
    import posexp.runtime.memory

    monkeypatch.setattr(posexp.runtime.memory, "memory_capacity", lambda device: (24 * 2**30, "this machine's RAM"))
    refused = CliRunner().invoke(app, ["eval", "run", "eval.lengths=[10000000]", "eval.examples=256"])
    assert refused.exit_code == 2 and "eval.lengths: evaluating at 10,000,000 tokens needs at least" in refused.output

    import posexp.evaluation.accuracy as accuracy

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 9.54 GiB for an array with shape (256, 10000000)")

    monkeypatch.setattr(accuracy, "evaluate_task_config", no_memory)
    failed = CliRunner().invoke(app, ["eval", "run", "eval.lengths=[64]"])
    assert failed.exit_code == 2 and "ran out of memory evaluating" in failed.output
    assert "lower the eval lengths or eval.examples" in failed.output and "Traceback" not in failed.output
