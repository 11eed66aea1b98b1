"""``posexp.load_run`` and ``posexp.load_runs``: a finished run's config, results rows and trained model, from
Python; many runs as one long table."""

from __future__ import annotations

import json

import pytest

from helpers import TINY_RUN, invoke
from helpers.runs import make_run, make_task_run

TINY = (*TINY_RUN, "train.steps=4", "train.log_every=2", "eval.multiples=[1,2]", "eval.tokens=512")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("load") / "run"
    result = invoke("train", *TINY, f"hydra.run.dir={run}")
    assert result.exit_code == 0, result.output
    return run


def test_load_run_gives_the_typed_config_and_the_results_rows(run_dir):
    import posexp
    from posexp.config.schema import Config

    run = posexp.load_run(run_dir)
    assert isinstance(run.config, Config)
    assert run.config.train.steps == 4 and run.config.encoder["name"] == "rope"  # ``encoder`` stays a mapping
    written = json.loads((run_dir / "results.json").read_text())["rows"]
    pd = pytest.importorskip("pandas")
    assert isinstance(run.results, pd.DataFrame)
    assert list(run.results["length"]) == [r["length"] for r in written]
    assert list(run.results["ppl"]) == pytest.approx([r["ppl"] for r in written])


def test_the_results_carry_the_runs_encoder_and_seed_as_load_runs_does(run_dir):
    import posexp

    run = posexp.load_run(run_dir)
    info = json.loads((run_dir / "results.json").read_text())["run"]
    assert set(run.results["encoder"]) == {info["encoder"]} and set(run.results["seed"]) == {info["seed"]}
    assert set(run.results["task"]) == {"lm"} and set(run.results["train_len"]) == {info["train_len"]}
    table = posexp.load_runs(run_dir)
    assert table.drop(columns="run").equals(run.results.drop(columns="run"))


def test_a_results_json_named_directly_loads_the_whole_run(run_dir):
    import torch

    import posexp

    by_file, by_folder = posexp.load_run(run_dir / "results.json"), posexp.load_run(run_dir)
    assert by_file.path == run_dir and by_file.config == by_folder.config
    assert list(by_file.results["ppl"]) == list(by_folder.results["ppl"])
    state = by_folder.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in by_file.model.state_dict().items())


def test_the_model_has_the_checkpoint_weights_tied_and_runs(run_dir):
    import torch
    from safetensors.torch import load_file

    import posexp

    model = posexp.load_run(run_dir).model
    assert not model.training
    assert model.lm_head.weight is model.wte.weight  # tied: one tensor, as in training
    saved = load_file(str(run_dir / "checkpoint" / "model.safetensors"))
    state = model.state_dict()
    assert {"wte.weight", "lm_head.weight"} & saved.keys()  # a shared tensor is saved once, under one name
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    tokens = torch.randint(0, model.shape.vocab_size, (2, 16))
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (2, 16, model.shape.vocab_size) and torch.isfinite(logits).all()


def test_a_folder_that_is_no_run_is_one_clear_error(tmp_path):
    import posexp
    from posexp.errors import PosexpError

    with pytest.raises(PosexpError, match="results.json"):
        posexp.load_run(tmp_path)


def test_the_report_and_load_run_read_one_run_class(run_dir):
    """One :class:`Run`: what a report reads is what ``posexp.load_run`` gives, with the same rows and curve; read
    for a report it says so if asked for a model (that it stays light, without torch or Hydra, is checked in a
    fresh interpreter: tests/process/test_fresh_interpreter.py)."""
    import posexp
    from posexp.reporting.runs import Run, read_run

    run, report = posexp.load_run(run_dir), read_run(run_dir)
    assert type(run) is Run and type(report) is Run
    assert run.rows == report.rows and run.info == report.info and run.overrides == report.overrides
    assert run.config_data == report.config_data and run.curve.equals(report.curve)
    from posexp.errors import PosexpError

    with pytest.raises(PosexpError, match="without its model; open it with posexp.load_run"):
        report.model


# -- many runs: posexp.load_runs ----------------------------------------------------------------------

def _finetune(folder, parent):
    """A fine-tune's folder as posexp finetune writes it: lineage at the top of ``run``, its own rows, and one row
    the parent-style evaluation-time scaling would add (``posexp eval FT eval.scaling=ntk``)."""
    extra = [{"length": 512, "multiple": 2.0, "protocol": "nonoverlap", "scaling": "ntk", "scaling_factor": 2.0,
              "applicable": True, "ppl": 7.5}]
    make_run(folder, {256: 6.0, 512: 6.5}, overrides=["finetune"], train_len=256, extra_rows=extra)
    results = json.loads((folder / "results.json").read_text())
    results["run"].update({"parent": str(parent), "scaling": "yarn", "scaling_factor": 2.0, "parent_train_len": 128,
                           "finetune": {"parent": str(parent), "scaling": "yarn", "steps": 200}})
    (folder / "results.json").write_text(json.dumps(results))


def test_load_runs_is_one_long_table_a_pivot_needs_no_join(tmp_path):
    import posexp

    sweep = tmp_path / "sweep"
    layers = {"model": {"n_layers": 2}}
    make_run(sweep / "0", {128: 10.0, 256: 12.0}, seed=0, config=layers)
    make_run(sweep / "1", {128: 11.0, 256: 14.0}, seed=1, config=layers)
    make_run(sweep / "2", {128: 9.0, 256: 9.5}, overrides=["encoder=alibi"], encoder="alibi", base=None, config=layers)
    make_run(sweep / "3", {}, overrides=["encoder=t5"], encoder="t5", status="failed")
    make_task_run(tmp_path / "task", {64: 1.0, 128: 0.5})
    _finetune(tmp_path / "ft", sweep / "0")

    df = posexp.load_runs([sweep, tmp_path / "task", tmp_path / "ft"], columns=["model.n_layers"])
    lm = df[(df.task == "lm") & (df.ft_scaling.isna())]
    table = lm.pivot_table(index="encoder", columns="length", values="ppl")
    assert list(table.columns) == [128, 256]  # lengths stay integers beside the failed run's empty row
    assert table.loc["rope", 128] == pytest.approx(10.5) and table.loc["rope", 256] == pytest.approx(13.0)
    assert table.loc["alibi", 256] == pytest.approx(9.5) and "t5" not in table.index
    failed = df[df.encoder == "t5"]
    assert len(failed) == 1 and failed.status.item() == "failed" and failed.ppl.isna().all()
    assert sorted(set(df[df.encoder == "rope"].seed.dropna())) == [0, 1]
    assert set(df.run) == {str(sweep / n) for n in "0123"} | {str(tmp_path / "task"), str(tmp_path / "ft")}
    assert set(lm.dropna(subset=["length"])["model.n_layers"]) == {2}
    task = df[df.task == "copy"]
    assert list(task.exact_match) == [1.0, 0.5] and set(task.train_len) == {64}
    # a fine-tune: what it was trained with (ft_scaling) apart from how each row was evaluated (scaling)
    ft = df[df.run == str(tmp_path / "ft")]
    assert set(ft.ft_scaling) == {"yarn"} and set(ft.parent) == {str(sweep / "0")}
    assert list(ft.scaling) == ["none", "none", "ntk"]
    assert ft.pivot_table(index="scaling", columns="length", values="ppl").loc["ntk", 512] == pytest.approx(7.5)


def test_load_runs_names_an_unknown_column_and_a_folder_without_runs(tmp_path):
    import posexp
    from posexp.errors import ConfigError, PosexpError

    make_run(tmp_path / "r", {128: 10.0}, config={"model": {"n_layers": 2}})
    with pytest.raises(ConfigError, match=r"model\.n_layer'.*did you mean model\.n_layers\?") as e:
        posexp.load_runs(tmp_path / "r", columns=["model.n_layer"])
    assert e.value.key == "columns"
    (tmp_path / "empty").mkdir()
    with pytest.raises(PosexpError, match="no runs found"):
        posexp.load_runs(tmp_path / "empty")


def test_a_run_that_cannot_be_read_is_left_out_with_a_warning_or_stops_a_strict_load(tmp_path):
    import posexp
    from posexp.errors import PosexpError

    make_run(tmp_path / "s" / "0", {128: 10.0})
    (tmp_path / "s" / "1").mkdir()
    (tmp_path / "s" / "1" / "results.json").write_text("{not json")
    with pytest.warns(UserWarning, match="not valid JSON"):
        df = posexp.load_runs(tmp_path / "s")
    assert list(df.ppl) == [10.0]
    with pytest.raises(PosexpError, match="not valid JSON"):
        posexp.load_runs(tmp_path / "s", strict=True)
