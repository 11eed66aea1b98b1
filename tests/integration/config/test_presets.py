"""The experiment presets: each composes, passes every check a run makes before it starts, and sets the
protocol its header promises; the ones that need the Hub say so in one line when it cannot be reached."""

from __future__ import annotations

import pytest

from helpers import invoke_main
from posexp.commands.train import check_config
from posexp.config.schema import config_dir, eval_lengths

PRESETS = sorted(p.stem for p in (config_dir() / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_has_a_header_saying_how_to_run_it(name):
    text = (config_dir() / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    assert f"posexp train experiment={name}" in text or f"experiment={name} " in text


@pytest.mark.parametrize("encoder", ["sinusoidal", "rope", "t5", "alibi"])
def test_press2022_is_the_papers_setup_for_each_encoding_of_its_sweep(compose, encoder):
    cfg = compose("experiment=press2022", f"encoder={encoder}")
    spec = check_config(cfg)
    assert spec.train_len == 512 and spec.data.name == "Salesforce/wikitext" and spec.tokenizer.name == "bpe"
    assert (spec.model.d_model, spec.model.n_layers, spec.model.n_heads) == (1024, 16, 8)
    assert eval_lengths(spec) == [512, 1024, 2048, 4096, 8192, 16384]


def test_press2022_without_network_stops_in_one_line_before_making_a_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hugging Face cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = invoke_main("train", "experiment=press2022", "encoder=alibi", f"hydra.run.dir={tmp_path / 'run'}",
                         cwd=tmp_path)
    assert result.exit_code == 2
    [line] = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: data.name: the data set Salesforce/wikitext (wikitext-103-raw-v1) is not cached")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("encoder", ["sinusoidal", "learned", "rope", "alibi", "t5", "none"])
def test_converged_trains_the_default_model_on_the_built_in_data_longer(compose, encoder):
    default, converged = compose(f"encoder={encoder}"), compose("experiment=converged", f"encoder={encoder}")
    check_config(converged)
    assert converged.model == default.model and converged.data == default.data
    assert converged.train_len == default.train_len and converged.eval == default.eval
    tokens = lambda c: c.train.steps * c.train.batch_size * c.train_len  # noqa: E731
    assert tokens(converged) == 4 * tokens(default) and converged.train.steps == 8 * default.train.steps


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_ruoss2023_trains_on_1_to_40_symbols_and_tests_up_to_500(compose, task):
    from posexp.tasks import build_task

    cfg = compose("experiment=ruoss2023", f"task={task}", "train.positions=randomized")
    spec = check_config(cfg)
    assert spec.task["name"] == task  # the command line's task, not the preset's default
    assert (spec.model.d_model, spec.model.n_layers, spec.model.n_heads, spec.model.dropout) == (64, 5, 8, 0.1)
    assert (spec.train.batch_size, spec.train.lr, spec.train.min_lr_ratio) == (128, 1e-3, 1.0)
    made = build_task(cfg.task, None, None)
    assert made.size_for(spec.train_len) == 40 and made.size_for(max(eval_lengths(spec))) == 500


def test_ruoss2023_defaults_to_reverse_and_takes_the_papers_position_range(compose):
    assert check_config(compose("experiment=ruoss2023")).task["name"] == "reverse"
    spec = check_config(compose("experiment=ruoss2023", "train.positions=randomized", "train.max_position=2048"))
    assert spec.train.max_position == 2048


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "addition", "parity"])
@pytest.mark.parametrize("encoder", ["none", "learned", "rope", "t5"])
def test_kazemnejad2023_is_the_nope_papers_model_on_each_task(compose, task, encoder):
    spec = check_config(compose("experiment=kazemnejad2023", f"task={task}", f"encoder={encoder}"))
    assert (spec.model.d_model, spec.model.n_layers, spec.model.n_heads) == (768, 12, 12)
    assert (spec.train.steps, spec.train.batch_size, spec.train.lr, spec.train.weight_decay) == (50000, 256, 3e-4, 0.0)
    assert spec.task["name"] == task and eval_lengths(spec) == [64, 128, 192, 256]
