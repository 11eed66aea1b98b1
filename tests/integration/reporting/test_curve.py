"""Extrapolation while training goes (eval.during_training): its config, curve.csv, that it leaves the run as it
would be without it, resume, the trackers, the figures and the report."""

from __future__ import annotations

import csv
import json
import math
import signal
from pathlib import Path

import pytest
from rich.console import Console

import posexp
from helpers import TINY_RUN, invoke, sigterm_at_step
from posexp.commands.edge import typed
from posexp.commands.train import check_config, run_train
from posexp.config.identity import config_hash
from posexp.errors import ConfigError
from posexp.reporting import report_main
from posexp.reporting.curve_report import diverged_from
from posexp.runs.curve import CurveWriter
from posexp.runs.curve import read_curve
from posexp.training.cache import cache_key
from posexp.reporting.options import ReportOptions

CURVE = ("eval.during_training.every=5", "eval.during_training.multiples=[1,2,4]",
         "eval.during_training.tokens=1024")  # the smoke run: 20 steps of train_len 32
STEPS = [5, 10, 15, 20]


def _curve_rows(run_dir: Path) -> list[list[str]]:
    with open(run_dir / "curve.csv", newline="") as f:
        return list(csv.reader(f))


def _numbers(results: dict) -> list[tuple]:
    return [(r["length"], r["ppl"], r["loss"], r["ppl_low"], r["ppl_high"]) for r in results["rows"]]


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoint" / "model.safetensors"))


# -- config ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("override,key,says", [
    ("eval.during_training.every=-5", "eval.during_training.every", "0 or null turns the curve off"),
    ("eval.during_training.multiples=[1,0]", "eval.during_training.multiples", "positive integers"),
    ("eval.during_training.multiples=[]", "eval.during_training.multiples", "at least one multiple"),
    ("eval.during_training.tokens=64", "eval.during_training.tokens", "longest curve length 128"),
])
def test_a_bad_curve_setting_names_its_key(tiny, override, key, says):
    with pytest.raises(ConfigError, match=rf"^{key}: .*{says}"):
        check_config(tiny("eval.during_training.every=5", "eval.during_training.multiples=[1,4]", override))


def test_a_task_curve_needs_instances_and_lengths_the_task_builds(tiny):
    task = ("task=reverse", "train_len=16", "eval.multiples=[1,2]", "eval.during_training.every=5")
    with pytest.raises(ConfigError, match=r"^eval.during_training.examples: must be a positive"):
        check_config(tiny(*task, "eval.during_training.examples=0"))
    mqar = ("task=mqar", "task.symbols=8", *task[1:])  # at most 8 key-value pairs: 35 tokens
    check_config(tiny(*mqar, "eval.during_training.multiples=[1,2]"))
    with pytest.raises(ConfigError, match=r"^eval.during_training.multiples: length 64 needs more than the 8"):
        check_config(tiny(*mqar, "eval.during_training.multiples=[1,4]"))


def test_the_curve_is_off_by_default_and_off_at_zero(tiny):
    assert typed(tiny()).eval.during_training.every is None
    check_config(tiny("eval.during_training.every=0", "eval.during_training.tokens=1"))  # off: nothing to check


def test_curve_settings_change_neither_the_config_hash_nor_the_cache_key(tiny):
    plain = typed(tiny())
    curved = typed(tiny(*CURVE, "eval.during_training.examples=8"))
    assert config_hash(curved) == config_hash(plain)
    assert cache_key(curved, "fp") == cache_key(plain, "fp")


def test_posexp_eval_refuses_curve_keys_in_one_line():
    from posexp.commands.eval import parse_eval_overrides

    with pytest.raises(ConfigError, match=r"^eval.during_training.every: is measured while a run trains"):
        parse_eval_overrides(["eval.during_training.every=5"])


# -- a run with the curve ----------------------------------------------------------------------------

@pytest.mark.parametrize("encoder", ["rope", "t5"])
def test_the_curve_leaves_the_run_as_it_would_be_without_it(tiny, tmp_path, encoder):
    """Dropout on, so that a curve that left the model in eval mode, or drew from torch's RNG, would change the
    training; fp32, one thread: the same numbers bit for bit."""
    common = ("model.dropout=0.1", f"encoder={encoder}")
    plain = run_train(tiny(*common), tmp_path / "plain", list(common))
    curved = run_train(tiny(*common, *CURVE), tmp_path / "curved", [*common, *CURVE])
    assert _numbers(curved) == _numbers(plain)
    assert curved["run"]["train"]["final_loss"] == plain["run"]["train"]["final_loss"]
    assert curved["run"]["config_hash"] == plain["run"]["config_hash"]
    losses = [[row[2] for row in csv.reader(open(tmp_path / d / "metrics.csv"))] for d in ("plain", "curved")]
    assert losses[0] == losses[1]
    mine, theirs = _weights(tmp_path / "curved"), _weights(tmp_path / "plain")
    assert all(mine[k].equal(theirs[k]) for k in theirs)
    assert not (tmp_path / "plain" / "curve.csv").exists() and "curve_s" not in plain["run"]["train"]
    assert curved["run"]["train"]["curve_s"] > 0


def test_curve_csv_holds_each_point_and_matches_posexp_eval_of_the_last_weights(tiny, tmp_path):
    from posexp.commands.eval import reeval_main

    run_dir = tmp_path / "run"
    run_train(tiny(*CURVE), run_dir, list(CURVE))
    metric, rows = read_curve(run_dir)
    assert metric == "perplexity"
    assert _curve_rows(run_dir)[0] == ["step", "length", "multiple", "ppl", "loss", "tokens", "eval_s"]
    assert [(r["step"], r["length"], r["multiple"]) for r in rows] == \
        [(s, 32 * m, float(m)) for s in STEPS for m in (1, 2, 4)]
    assert all(r["tokens"] == 1024 and r["ppl"] == pytest.approx(math.exp(r["loss"]), rel=1e-6) for r in rows)
    first, last = ({r["length"]: r["ppl"] for r in rows if r["step"] == s} for s in (5, 20))
    assert all(last[n] < first[n] for n in first)  # it learned meanwhile
    # the same tokens at every point: the last point is what posexp eval measures of the final weights
    [results] = reeval_main([str(run_dir), "eval.multiples=[1,2,4]", "eval.tokens=1024"])
    assert {r["length"]: r["ppl"] for r in results["rows"]} == pytest.approx(last, rel=1e-6)
    assert (run_dir / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curve = posexp.load_run(run_dir).curve  # from Python: a DataFrame with pandas
    assert len(curve) == len(rows) and list(curve["ppl"] if hasattr(curve, "columns") else
                                            [r["ppl"] for r in curve]) == [r["ppl"] for r in rows]


def test_a_task_run_curves_its_accuracy_on_the_same_instances(tiny, tmp_path):
    task = ("task=reverse", "train_len=16", "eval.multiples=[1,2]", "eval.examples=16")
    curve = ("eval.during_training.every=10", "eval.during_training.multiples=[1,2]",
             "eval.during_training.examples=16")
    plain = run_train(tiny(*task), tmp_path / "plain", list(task))
    curved = run_train(tiny(*task, *curve), tmp_path / "curved", [*task, *curve])
    exact = lambda res: [(r["length"], r["exact_match"], r["token_accuracy"]) for r in res["rows"]]  # noqa: E731
    assert exact(curved) == exact(plain)
    metric, rows = read_curve(tmp_path / "curved")
    assert metric == "accuracy"
    assert [(r["step"], r["length"], r["examples"]) for r in rows] == [(10, 16, 16), (10, 32, 16), (20, 16, 16),
                                                                          (20, 32, 16)]
    # the last point scores the final model on the final evaluation's instances (eval.examples of each length)
    last = {r["length"]: r["token_accuracy"] for r in rows if r["step"] == 20}
    assert last == pytest.approx({r["length"]: r["token_accuracy"] for r in curved["rows"]}, rel=1e-9)


def test_resume_continues_the_curve_without_repeating_a_step(tmp_path, monkeypatch):
    """SIGTERM in step 12 checkpoints it; a point measured after that checkpoint (as by a run killed before its
    next one) is dropped and measured again; the resumed curve is the uninterrupted one."""
    from posexp.data.corpus import BatchSampler

    args = (*TINY_RUN, "eval.during_training.every=4", "eval.during_training.multiples=[1,2]",
            "eval.during_training.tokens=512")
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    assert invoke("train", *args, f"hydra.run.dir={whole}").exit_code == 0
    sample = sigterm_at_step(monkeypatch, BatchSampler, "batch", 11)  # 0-based: the 12th step
    stopped = invoke("train", *args, f"hydra.run.dir={run_dir}")
    assert stopped.exit_code == 128 + signal.SIGTERM, stopped.output
    assert [r["step"] for r in read_curve(run_dir)[1]] == [4, 4, 8, 8, 12, 12]  # the point of the checkpoint too
    with open(run_dir / "curve.csv", "a") as f:
        f.write("16,32,1,1.5,0.4,512,0.010\n")  # measured after the checkpoint, before a kill
    monkeypatch.setattr(BatchSampler, "batch", sample)
    resumed = invoke("resume", str(run_dir))
    assert resumed.exit_code == 0, resumed.output
    without_time = lambda d: [row[:-1] for row in _curve_rows(d)]  # noqa: E731  (eval_s differs)
    assert without_time(run_dir) == without_time(whole)
    assert json.loads((run_dir / "results.json").read_text())["run"]["train"]["curve_s"] > 0


def test_the_trackers_get_each_point_against_the_step(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    run_train(tiny(*CURVE, "logger=tensorboard"), run_dir, [*CURVE, "logger=tensorboard"])
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    rows = read_curve(run_dir)[1]
    for m in (1, 2, 4):
        logged = {e.step: e.value for e in acc.Scalars(f"curve/ppl/{m}x")}
        assert logged == pytest.approx({r["step"]: r["ppl"] for r in rows if r["multiple"] == m}, rel=1e-6)


# -- reading curve.csv, the report ------------------------------------------------------------------

def _fake_run(folder: Path, encoder: str, ppl_at: dict[int, tuple[float, float]]) -> Path:
    """A finished run's folder with a curve: ppl_at[step] = (ppl at 1x, ppl at 4x)."""
    run = {"label": f"encoder={encoder}", "overrides": [f"encoder={encoder}"], "encoder": encoder, "train_len": 128,
           "seed": 0, "corpus_fingerprint": "fp", "eval_settings": {"tokens": 4096, "protocol": "nonoverlap"},
           "status": "completed", "train": {"steps": max(ppl_at)}}
    rows = [{"length": 128, "multiple": 1.0, "protocol": "nonoverlap", "scaling": None, "applicable": True,
             "ppl": ppl_at[max(ppl_at)][0], "loss": math.log(ppl_at[max(ppl_at)][0])}]
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    writer = CurveWriter(folder, "perplexity")
    for step, ppls in ppl_at.items():
        writer.write([{"step": step, "length": 128 * m, "multiple": m, "ppl": p, "loss": math.log(p), "tokens": 4096,
                       "eval_s": 0.5} for m, p in zip((1, 4), ppls)])
    return folder


def test_diverged_from_is_the_step_the_ratio_stays_above_the_tolerance():
    rows = lambda pairs: [{"step": s, "multiple": m, "ppl": p} for s, (a, b) in pairs.items()  # noqa: E731
                          for m, p in ((1, a), (4, b))]
    # above 1.1 at step 100, back within at 200, above again from 300 on
    ratio, since = diverged_from(rows({100: (5, 6), 200: (5, 5.2), 300: (4, 5), 400: (4, 8)}), 4)
    assert (ratio, since) == (2.0, 300)
    assert diverged_from(rows({100: (5, 5), 200: (4, 4.1)}), 4) == (pytest.approx(1.025), None)
    assert diverged_from(rows({100: (5, 5)}), 8) == (None, None)


def test_a_kill_cut_line_is_not_read_and_another_file_is_no_curve(tmp_path):
    writer = CurveWriter(tmp_path, "perplexity")
    writer.write([{"step": 5, "length": 32, "multiple": 1, "ppl": 9.0, "loss": 2.2, "tokens": 64, "eval_s": 0.1}])
    with open(tmp_path / "curve.csv", "a") as f:
        f.write("10,32,1,8.5")  # no newline: the write a kill interrupted
    assert [r["step"] for r in read_curve(tmp_path)[1]] == [5]
    (tmp_path / "curve.csv").write_text("step,loss\n1,2\n")
    assert read_curve(tmp_path) == (None, [])


def test_report_draws_the_runs_curves_side_by_side_and_says_when_4x_parted(tmp_path):
    sweep = tmp_path / "sweep"
    _fake_run(sweep / "0", "rope", {100: (6.0, 6.3), 200: (5.0, 6.0), 300: (4.5, 9.0)})
    _fake_run(sweep / "1", "alibi", {100: (6.2, 6.1), 200: (5.4, 5.3), 300: (5.0, 4.9)})
    (sweep / "2").mkdir()  # a run without a curve (nor results) is simply not drawn
    report_main([sweep], console=Console(quiet=True), err_console=Console(quiet=True))
    assert (sweep / "reports" / "default" / "report_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (sweep / "reports" / "default" / "report.md").read_text()
    assert "## Extrapolation during training" in text and "![extrapolation during training](report_curve.png)" in text
    assert "| encoder=rope | 1 | 300 | 2.00 (from 200) |" in text
    assert "| encoder=alibi | 1 | 300 | 0.98 |" in text


def test_with_by_a_group_s_runs_are_pooled_into_one_panel(tmp_path):
    from posexp.reporting.curve_report import panels_of
    from posexp.reporting.lm_report import build_report

    for seed, ppl4 in ((0, 6.0), (1, 8.0)):
        _fake_run(tmp_path / str(seed), "rope", {100: (5.0, 5.0), 200: (4.0, ppl4)})
    [panel] = panels_of(build_report([tmp_path / "0", tmp_path / "1"], ReportOptions(by="encoder")))
    assert panel.runs == 2 and panel.label == "encoder=rope"
    pooled = {(r["step"], r["multiple"]): r["ppl"] for r in panel.rows}
    assert pooled[200, 4] == pytest.approx(math.sqrt(6.0 * 8.0))  # exp of the mean loss: the geometric mean
    assert pooled[100, 1] == pytest.approx(5.0)


def test_a_report_without_curves_has_no_curve_section(tmp_path):
    run = _fake_run(tmp_path / "run", "rope", {100: (6.0, 6.3)})
    (run / "curve.csv").unlink()
    report_main([run], console=Console(quiet=True), err_console=Console(quiet=True))
    assert "Extrapolation during training" not in (run / "reports" / "default" / "report.md").read_text()
    assert not (run / "report_curve.png").exists()


def test_weights_from_the_sweep_cache_say_they_have_no_curve(tiny, tmp_path):
    import io

    overrides = ("cache=true", *CURVE)
    run_train(tiny(*overrides), tmp_path / "first", list(overrides))
    out = io.StringIO()
    again = run_train(tiny(*overrides), tmp_path / "again", list(overrides), Console(file=out, width=400))
    assert "cached_from" in again["run"] and "curve_s" not in again["run"]["train"]
    assert not (tmp_path / "again" / "curve.csv").exists()
    assert "eval.during_training: no curve: these weights come from the sweep cache" in out.getvalue()


def test_a_long_run_label_over_a_panel_is_wrapped_to_it(tmp_path):
    """A fine-tune's label (its parent's path and every override) ran across its neighbour's panel."""
    import warnings

    from posexp.plots import curve

    label = ("rope, base 10000, parent=/home/someone/experiments/2026-11-25/10-00-00/rope train_len=64 "
             "train.steps=6 train.batch_size=4 train.warmup_steps=2 train.log_every=1 eval.tokens=1024 scaling=linear")
    rows = [{"step": s, "multiple": m, "ppl": 3.0 + m / 10 + 1 / s} for s in (10, 20, 30) for m in (1, 2, 4)]
    figures = []
    real_save = curve.save_png
    with warnings.catch_warnings(record=True) as caught, pytest.MonkeyPatch.context() as mp:
        warnings.simplefilter("always")
        mp.setattr(curve, "save_png", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
        curve.plot_curve_panels([(label, curve.PERPLEXITY, rows), ("alibi", curve.PERPLEXITY, rows)],
                                tmp_path / "panels.png")
    assert not [w for w in caught if "constrained_layout" in str(w.message)], [str(w.message) for w in caught]
    shown = figures[0].axes[0].get_title()
    assert shown.startswith("rope, base 10000") and shown.endswith("scaling=linear")
    assert all(len(line) <= curve.PANEL_TITLE_WIDTH + 2 for line in shown.splitlines()) and shown.count("\n") <= 2
