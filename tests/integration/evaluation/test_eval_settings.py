"""``posexp eval`` of trained runs in several settings at once (``-m``), with the settings that leave the weights
alone (threads, device, precision); what a row says of the model it measured (``model_scaling``); the checks of
settings that would otherwise be accepted in silence (depths of a task without any, a fine-tune's unused LongRoPE
factors); ``load_runs`` on a sweep that is still running."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import REPO, TINY_RUN, invoke
from posexp.errors import ConfigError


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(trained, dest)
    return dest


def _results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def _by_scaling(run: Path, length: int) -> dict:
    return {r["scaling"]: r for r in _results(run)["rows"] if r["length"] == length}


# -- posexp eval -m RUN ------------------------------------------------------------------------------

def test_eval_m_sweeps_scalings_of_a_run_each_as_its_own_command_would(trained, run_copy, tmp_path):
    result = invoke("eval", "-m", str(run_copy), "eval.scaling=linear,yarn", "eval.lengths=[64,128]",
                    "eval.tokens=256")
    assert result.exit_code == 0, result.output
    rows = _by_scaling(run_copy, 128)
    assert {"linear", "yarn", None} <= set(rows)  # the training's unscaled row stays beside the two new ones
    assert rows["linear"]["ppl"] != rows["yarn"]["ppl"]
    evaluations = _results(run_copy)["evaluations"]
    assert [e["overrides"] for e in evaluations[-2:]] == [
        ["eval.scaling=linear", "eval.lengths=[64,128]", "eval.tokens=256"],
        ["eval.scaling=yarn", "eval.lengths=[64,128]", "eval.tokens=256"]]
    assert f"posexp report {run_copy} --cols scaling" in result.output

    alone = tmp_path / "alone"  # the same setting by itself: the same numbers
    shutil.copytree(trained, alone)
    single = invoke("eval", str(alone), "eval.scaling=yarn", "eval.lengths=[64,128]", "eval.tokens=256")
    assert single.exit_code == 0, single.output
    assert _by_scaling(alone, 128)["yarn"]["ppl"] == rows["yarn"]["ppl"]

    report = invoke("report", str(run_copy), "--cols", "scaling", cwd=tmp_path)
    assert report.exit_code == 0, report.output
    assert "scaling=linear" in report.output and "scaling=yarn" in report.output


def test_eval_m_checks_every_setting_before_evaluating_any(run_copy):
    before = (run_copy / "results.json").read_bytes()
    result = invoke("eval", "-m", str(run_copy), "eval.scaling=linear,bogus", "eval.lengths=[64]")
    assert result.exit_code != 0
    assert "eval.scaling" in result.output and "bogus" in result.output and "Traceback" not in result.output
    assert (run_copy / "results.json").read_bytes() == before


def test_a_sweep_without_m_is_refused_and_says_how_to_sweep(run_copy):
    before = (run_copy / "results.json").read_bytes()
    result = invoke("eval", str(run_copy), "eval.scaling=linear,yarn")
    assert result.exit_code != 0
    assert "one setting at a time" in result.output and "posexp eval -m RUN eval.scaling=linear,yarn" in result.output
    assert (run_copy / "results.json").read_bytes() == before


def test_eval_m_sweep_order_and_the_command_that_finishes_a_stopped_one():
    from posexp.commands.eval import Prepared, _left, parse_settings

    settings = parse_settings(["eval.scaling=linear,yarn", "eval.lengths=[64],[128]", "train.threads=1"],
                              multirun=True)
    assert [s.texts for s in settings] == [  # the first key's values vary slowest, as posexp train -m orders jobs
        ("eval.scaling=linear", "eval.lengths=[64]", "train.threads=1"),
        ("eval.scaling=linear", "eval.lengths=[128]", "train.threads=1"),
        ("eval.scaling=yarn", "eval.lengths=[64]", "train.threads=1"),
        ("eval.scaling=yarn", "eval.lengths=[128]", "train.threads=1")]
    assert settings[2].eval == (("scaling", "yarn"), ("lengths", [64])) and settings[2].runtime == (
        ("train.threads", 1),)
    prepared = [Prepared(Path(run), None, {}, None, None, setting=s)  # type: ignore[arg-type]
                for run in ("a", "b") for s in settings[:2]]
    left = _left(prepared, 1)
    assert "1 of 4 evaluations written (a)" in left
    assert left.endswith("finish with: posexp eval a b eval.scaling=linear 'eval.lengths=[128]' train.threads=1; "
                         "posexp eval b eval.scaling=linear 'eval.lengths=[64]' train.threads=1")


# -- settings that leave the weights alone ------------------------------------------------------------

def test_a_runs_evaluation_takes_threads_device_and_precision(run_copy):
    result = invoke("eval", str(run_copy), "train.threads=1", "device=cpu", "precision=fp32", "eval.lengths=[64]",
                    "eval.tokens=256")
    assert result.exit_code == 0, result.output
    last = _results(run_copy)["evaluations"][-1]
    assert last["overrides"][:3] == ["train.threads=1", "device=cpu", "precision=fp32"]
    assert last["device"] == "cpu" and last["precision"] == "fp32"
    for bad, needle in (("train.threads=0", "train.threads"), ("device=tpu", "device"),
                        ("model.d_model=64", "train a new run")):
        refused = invoke("eval", str(run_copy), bad, "eval.lengths=[64]")
        assert refused.exit_code != 0 and needle in refused.output and "Traceback" not in refused.output, bad


# -- what a row says of the model --------------------------------------------------------------------

def test_a_yarn_fine_tunes_rows_say_the_model_carries_yarn(run_copy, tmp_path):
    import posexp

    child = tmp_path / "ft"
    result = invoke("finetune", str(run_copy), "scaling=yarn", "train.steps=2", "train.progress=false",
                    "train.threads=1", "precision=fp32", "eval.multiples=[1]", "eval.tokens=256",
                    f"hydra.run.dir={child}")
    assert result.exit_code == 0, result.output
    rows = _results(child)["rows"]
    assert rows and all(r["model_scaling"] == "yarn" and r["model_scaling_factor"] == 4.0 for r in rows)
    assert all(r["scaling"] is None for r in rows)  # no evaluation-time scaling on top
    assert all("model_scaling" not in r for r in _results(run_copy)["rows"])  # a run trained from scratch: none
    again = invoke("eval", str(child), "eval.lengths=[256]", "eval.tokens=256")
    assert again.exit_code == 0, again.output
    assert _by_scaling(child, 256)[None]["model_scaling"] == "yarn"
    df = posexp.load_runs([run_copy, child])
    assert set(df[df.model_scaling == "yarn"].run) == {str(child)}


def test_a_pretrained_models_carried_scaling_is_read_from_its_rope_parameters():
    transformers = pytest.importorskip("transformers")
    from posexp.commands.pretrained import carried_scaling
    from posexp.hf.rotary import rope_record

    def record(**kwargs) -> dict:
        return rope_record(transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, **kwargs))

    assert carried_scaling(record()) == (None, None)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    assert carried_scaling(record(rope_scaling=yarn)) == ("yarn", 4.0)
    per_type = {"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}
    assert carried_scaling(per_type) == ("linear", 8.0)  # Gemma 3: the full-attention layers' scaling
    assert carried_scaling({"rope_theta": None}) == (None, None)


# -- settings refused instead of ignored -------------------------------------------------------------

def test_a_task_without_depths_refuses_eval_depths(tiny):
    from posexp.commands.train import check_config

    with pytest.raises(ConfigError, match=r"^eval.depths: task=vartrack places nothing at a depth.*passkey"):
        check_config(tiny("task=vartrack", "eval.depths=[0.5]"))
    check_config(tiny("task=vartrack"))  # the default list, which every config carries, stands for "not asked"
    check_config(tiny("task=passkey", "eval.depths=[0.5]"))


def test_a_fine_tune_refuses_longrope_factors_without_longrope(run_copy, tmp_path):
    child = tmp_path / "ft"
    result = invoke("finetune", str(run_copy), "scaling=yarn", "longrope_factors=[1.0,1.5]", "train.steps=2",
                    f"hydra.run.dir={child}")
    assert result.exit_code != 0
    assert "longrope_factors: only applies with scaling=longrope (scaling is yarn)" in result.output
    assert not child.exists()


def test_a_fine_tunes_eval_tokens_given_on_its_command_line_is_the_one_it_measures_with(trained, tmp_path):
    for given, expected in ((["eval.tokens=256"], 256), ([], _results(trained)["run"]["config"]["eval"]["tokens"])):
        child = tmp_path / f"ft{len(given)}"
        result = invoke("finetune", str(trained), "train.steps=2", "train.progress=false", "train.threads=1",
                        "precision=fp32", "eval.multiples=[1]", *given, f"hydra.run.dir={child}")
        assert result.exit_code == 0, result.output
        saved = _results(child)
        assert saved["run"]["config"]["eval"]["tokens"] == expected  # unset: the parent's budget, to compare
        assert [r["eval_tokens"] for r in saved["rows"]] == [expected]


def test_load_runs_warns_of_sweep_jobs_without_results(run_copy, tmp_path):
    import posexp

    sweep = tmp_path / "sweep"
    shutil.copytree(run_copy, sweep / "0")
    (sweep / "1" / ".hydra").mkdir(parents=True)  # a job still training: no results.json yet
    (sweep / "multirun.yaml").write_text("{}\n")
    with pytest.warns(UserWarning, match=r"sweep job 1 has no results.json yet \(still running, or failed\)"):
        df = posexp.load_runs(sweep)
    assert set(df.run) == {str(sweep / "0")}
    with pytest.warns(UserWarning, match="sweep job 1"):  # found below a folder given, too
        posexp.load_runs(tmp_path)


# -- pretrained models: perplexity and the zero-shot passkey in one sweep -----------------------------

def test_pretrained_task_is_spelled_as_posexp_train_spells_it():
    from posexp.commands.pretrained import pretrained_arguments

    assert pretrained_arguments(["-m", "hf:M", "task=lm,passkey", "eval.scaling=none,yarn"]) == [
        "-m", "hf.model=M", "task.name=lm,passkey", "eval.scaling=none,yarn"]


@pytest.mark.slow  # an export and a four-job sweep through the CLI (~15 s)
def test_a_pretrained_sweep_measures_perplexity_and_passkey_per_scaling(trained, tmp_path):
    pytest.importorskip("transformers")
    exported = tmp_path / "exported"
    assert invoke("export", str(trained), str(exported)).exit_code == 0
    sweep = tmp_path / "sweep"
    result = invoke("eval", "-m", f"hf:{exported}", "task=lm,passkey", "eval.scaling=none,yarn", "eval.lengths=[512]",
                    "eval.tokens=512", "eval.examples=2", "eval.depths=[0.5]", f"hydra.sweep.dir={sweep}")
    assert result.exit_code == 0, result.output
    jobs = [_results(sweep / str(i)) for i in range(4)]
    kinds = {(j["rows"][0]["metric"], j["rows"][0].get("scaling")) for j in jobs}
    assert kinds == {("perplexity", None), ("perplexity", "yarn"), ("accuracy", None), ("accuracy", "yarn")}


def test_the_readme_shows_load_runs_with_config_keys_as_columns_and_the_call_works(run_copy):
    import re

    import posexp

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    call = re.search(r"`posexp\.load_runs\(SWEEP, columns=\[(\"[\w.]+\")\]\)`", readme)
    assert call, "the README says how to get config keys as columns"
    key = json.loads(call.group(1))
    df = posexp.load_runs(run_copy, columns=[key])
    assert key in df.columns and set(df[key]) == {20}  # the smoke experiment's train.steps
