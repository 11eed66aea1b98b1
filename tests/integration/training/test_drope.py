"""DroPE (Gelberg et al. 2025): ``posexp finetune RUN encoder=none`` drops a RoPE run's positional encoding and
recalibrates it at the parent's length.

What a user relies on: the child starts from the parent's weights, reads no position at all (NoPE: no hook is in
use, shifting every position changes nothing), records that it is a DroPE fine-tune of a RoPE parent, and any
other encoder change is still refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import TINY_RUN, invoke

QUICK = ("train.steps=4", "train.warmup_steps=1", "train.batch_size=4", "train.threads=1", "train.progress=false",
         "eval.tokens=1024", "eval.multiples=[1,2]")


@pytest.fixture(scope="module")
def dropped(trained, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("drope") / "child"
    result = invoke("finetune", str(trained), "encoder=none", *QUICK, "train.lr=1e-12", f"hydra.run.dir={run_dir}")
    assert result.exit_code == 0, result.output
    return run_dir


def test_the_child_starts_from_the_parents_weights_and_reads_no_position(trained, dropped):
    from posexp.commands.loading import load_run

    parent = load_file(str(trained / "checkpoint" / "model.safetensors"))
    child = load_file(str(dropped / "checkpoint" / "model.safetensors"))
    assert parent.keys() == child.keys()  # RoPE has no parameters: every weight carries over
    assert all(torch.allclose(parent[k], child[k], atol=1e-6) for k in parent)  # lr 1e-12: still the parent's
    model = load_run(dropped).model
    hooks = ("uses_embed", "uses_rotate", "uses_bias", "uses_scores", "uses_score_mod", "uses_transform",
             "uses_normalise")
    assert not any(getattr(enc, h) for enc in model.encoder.for_layers(len(model.blocks)) for h in hooks)
    idx = torch.randint(0, 200, (2, 24))
    with torch.no_grad():
        near, far = model(idx, torch.arange(24)), model(idx, torch.arange(24) + 5000)
    torch.testing.assert_close(near, far)  # no position enters the logits
    rope = load_run(trained).model
    with torch.no_grad():  # the parent, same weights, does read them
        assert not torch.allclose(rope(idx, torch.arange(24)), rope(idx, torch.arange(24) + 5000))


def test_the_child_is_recorded_as_a_drope_fine_tune_at_the_parents_length(trained, dropped):
    run = json.loads((dropped / "results.json").read_text())["run"]
    parent = json.loads((trained / "results.json").read_text())["run"]
    assert run["encoder"] == "none" and run["finetune"]["dropped_encoder"] == "rope"
    assert run["finetune"]["train_len"] == parent["train_len"]  # recalibrated at the original length
    assert run["scaling"] == "none" and run["finetune"]["steps"] == 4
    from posexp.reporting.extension import build_extension_table
    from posexp.reporting.runs import read_run

    table = build_extension_table(read_run(trained), [read_run(dropped)])
    assert any(line.label.startswith("DroPE") for line in table.lines)


def test_the_recalibration_recipe_is_the_default(trained):
    from hydra import compose, initialize_config_dir

    from posexp.commands.finetune import check_finetune, parent_argument
    from posexp.commands.validation import register_configs
    from posexp.config.schema import config_dir

    register_configs()
    args = parent_argument([str(trained), "encoder=none"])
    assert "train=drope" in args and "drope=true" in args
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        child = check_finetune(compose("finetune", overrides=args))
        mine = check_finetune(compose("finetune", overrides=parent_argument(
            [str(trained), "encoder=none", "train=finetune"])))
    assert child.train.steps == 50 and child.train.batch_size == 32 and child.train_len == 32
    assert mine.train.steps == 200  # a train= given is kept


@pytest.mark.parametrize("case,key", [
    ("alibi_parent", "encoder: encoder=none (DroPE) drops a RoPE parent's rotary embedding"),
    ("scaled", "scaling: 'linear' scales rotary frequencies"),
    ("other", "encoder: encoder=alibi: a fine-tune keeps the parent's"),
    ("option", "encoder.base: encoder.base=5: a fine-tune keeps the parent's"),
])
def test_other_encoder_changes_are_one_line_and_leave_no_folder(trained, tmp_path, case, key):
    parent = trained
    if case == "alibi_parent":
        parent = tmp_path / "alibi"
        assert invoke("train", *TINY_RUN, "encoder=alibi", "train.steps=2", f"hydra.run.dir={parent}").exit_code == 0
    extra = {"alibi_parent": ("encoder=none",), "scaled": ("encoder=none", "scaling=linear"),
             "other": ("encoder=alibi",), "option": ("encoder.base=5",)}[case]
    run_dir = tmp_path / "new"
    result = invoke("finetune", str(parent), *extra, *QUICK, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], lines
    assert not run_dir.exists()
