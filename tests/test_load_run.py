"""``posexp.load_run``: a finished run's config, results rows and trained model, from Python."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import TINY_RUN, run_cli

TINY = (*TINY_RUN, "train.steps=4", "train.log_every=2", "eval.multiples=[1,2]", "eval.tokens=512")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("load") / "run"
    proc = run_cli("train", *TINY, f"hydra.run.dir={run}", cwd=run.parent)
    assert proc.returncode == 0, proc.stderr
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


def test_without_pandas_the_rows_are_dicts(run_dir, monkeypatch):
    import posexp

    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    rows = posexp.load_run(run_dir).results
    assert isinstance(rows, list) and rows[0]["metric"] == "perplexity"


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


def test_import_posexp_stays_light():
    code = "import sys, posexp; posexp.load_run; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
