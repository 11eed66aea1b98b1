"""The CLI's own commands and flags, run in this process: ``--cfg job``, ``train --help``, ``posexp list`` at
any width, bad overrides as one message, Hydra's flags read beside overrides, and a run stopped outside its
training steps."""

from __future__ import annotations

import re

import pytest

from helpers import REPO, TINY_RUN, invoke


def test_cfg_job_prints_the_composed_config(tmp_path):
    result = invoke("train", "encoder=t5", "--cfg", "job", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "name: t5" in result.stdout and "num_buckets: 32" in result.stdout
    assert not (tmp_path / "outputs").exists()  # printing the config runs nothing


def test_help_is_hydras(tmp_path):
    result = invoke("train", "--help", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "encoder:" in result.stdout and "alibi" in result.stdout  # config groups with their options


def test_a_users_config_named_like_a_builtin_one_is_said_to_be_shadowed(tmp_path, caplog):
    """conf/model/small.yaml (or data, tokenizer, an encoder's defaults) was never read, silently: Hydra reads posexp's
    model/small.yaml first. One line each says so, as for a plugin task's or tracker's yaml."""
    import logging

    conf = tmp_path / "conf"
    for group, name, text in (("model", "small", "d_model: 64\n"), ("tokenizer", "byte", "vocab_size: 256\n"),
                              ("encoder", "rope", "base: 500\n"), ("model", "mine", "d_model: 64\n")):
        (conf / group).mkdir(parents=True, exist_ok=True)
        (conf / group / f"{name}.yaml").write_text(text)
    with caplog.at_level(logging.WARNING, logger="posexp.registry"):
        done = invoke("train", "--config-dir", "conf", "model=small", "--cfg", "job", cwd=tmp_path)
    assert done.exit_code == 0, done.output[-2000:]
    assert [r.getMessage() for r in caplog.records if r.name == "posexp.registry"] == [
        f"your {group} {name!r} ({conf.resolve() / group / name}.yaml) is shadowed by posexp's built-in "
        f"{group}/{name}.yaml, which Hydra reads first; rename yours (the file)"
        for group, name in (("encoder", "rope"), ("model", "small"), ("tokenizer", "byte"))]  # model/mine is not


def test_list_names_every_encoder_data_set_and_experiment(tmp_path):
    result = invoke("list", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    shipped = REPO / "configs"
    for group in ("encoder", "data", "experiment"):
        for yaml in (shipped / group).glob("*.yaml"):
            assert yaml.stem in result.stdout, (group, yaml.stem)


def test_list_with_a_config_dir_names_its_tasks_trackers_and_experiments_too(tmp_path):
    """--config-dir's encoders were listed, its other components not: a task of one's own (components.md) was
    missing from the tasks table, though posexp train --config-dir conf task=NAME runs it."""
    conf = tmp_path / "conf"
    for group, name, header in (("task", "first", "task=first: the first symbol again at the end."),
                                ("logger", "jsonl", "One JSON line per event."),
                                ("experiment", "mine", "My lab's budget.")):
        (conf / group).mkdir(parents=True)
        (conf / group / f"{name}.yaml").write_text(f"# @package _global_\n# {header}\nseed: 0\n")
    result = invoke("list", "--config-dir", str(conf), cwd=tmp_path)
    assert result.exit_code == 0, result.output
    for text in ("task=first: the first symbol again at the end.", "One JSON line per event.", "My lab's budget."):
        assert text in result.stdout, text


@pytest.mark.parametrize("columns", [200, 80])
def test_list_with_a_config_dir_names_its_model_sizes_too(tmp_path, columns):
    """conf/model/mine.yaml trained with model=mine but was missing from posexp list's model sizes, wide or narrow
    (where the descriptions are listed under the table)."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text(
        "# My lab's shape.\ndefaults:\n  - /schema/model/model@_here_\n  - _self_\nd_model: 64\nn_layers: 3\n")
    result = invoke("list", "--config-dir", "conf", columns=columns, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    row = next(line for line in lines if line.strip("│ ").startswith("mine "))
    assert [cell.strip() for cell in row.split("│")[2:4]] == ["64", "3"]
    assert any("mine" in line and "My lab's shape." in line for line in lines)


def test_list_shows_posexps_config_where_the_users_of_that_name_is_shadowed(tmp_path):
    """conf/model/small.yaml was listed with its own shape, though model=small trains posexp's (which Hydra reads
    first): the list shows what a run gets."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "small.yaml").write_text("# Mine.\nd_model: 64\n")
    result = invoke("list", "--config-dir", "conf", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.strip("│ ").startswith("small "))
    assert row.split("│")[2].strip() == "128" and "Mine." not in result.stdout


def test_list_reads_at_80_columns(tmp_path):
    from posexp.commands.listing import yaml_description
    from posexp.config.schema import config_dir

    result = invoke("list", columns=80, cwd=tmp_path)
    assert result.exit_code == 0, result.output
    out = result.stdout
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


def test_a_description_ends_outside_brackets_quotes_and_ellipses():
    """A full stop inside a citation's brackets ("Eq. 4"), an ellipsis ("X2 = X1, ...") or a colon inside a quoted
    title cut a description short: posexp list showed "task=vartrack: ... X2 = X1, ..." without its citation and
    "RNoPE-SWA (Yang et al. 2025, \"Rope to Nope and Back Again" with its bracket and quote left open."""
    from posexp.commands.listing import yaml_description
    from posexp.config.schema import config_dir

    assert yaml_description(config_dir() / "task" / "vartrack.yaml").endswith("(Hsieh et al. 2024 (RULER)).")
    for yaml in sorted(config_dir().glob("*/*.yaml")):
        desc = yaml_description(yaml)
        assert desc.count("(") == desc.count(")") and desc.count('"') % 2 == 0, (yaml, desc)


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
def test_bad_input_is_a_clear_message_not_a_traceback(tmp_path, overrides, needles):
    # in this interpreter (the CLI as a user calls it, without starting Python and torch 20 times); the
    # fresh-interpreter form is checked once in tests/process/test_fresh_interpreter.py
    result = invoke("train", *TINY_RUN, *overrides, "hydra.run.dir=run", cwd=tmp_path)
    out = result.output
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not (tmp_path / "run" / "results.json").exists()


def test_overrides_after_a_flag_are_read_without_a_usage_error(capsys):
    """``posexp finetune RUN train_len=512 -m scaling=none,yarn``: overrides on both sides of -m, read in one go."""
    from posexp.cli.hydra_flags import read

    line = read(["parent=/runs/p", "train_len=512", "-m", "scaling=none,yarn", "train.steps=200"])
    assert line is not None and line.multirun
    assert line.overrides == ("parent=/runs/p", "train_len=512", "scaling=none,yarn", "train.steps=200")
    assert read(["--cfg", "nope"]) is None  # Hydra's parser refuses it (and says so itself)
    # --cfg job runs nothing (test_cfg_job_prints_the_composed_config) yet its overrides are checked as a run's
    assert read(["--cfg", "job", "a=1"]).overrides == ("a=1",)  # type: ignore[union-attr]
    assert read(["-cd", "conf", "--help"]).helps  # type: ignore[union-attr]
    assert "usage" not in capsys.readouterr().err


def test_a_run_stopped_outside_its_training_steps_says_how_to_go_on(tmp_path):
    import signal as signals

    from posexp.cli.app import _terminate_run
    from posexp.commands.resume import interrupted_hint
    from posexp.errors import Terminated

    with pytest.raises(Terminated) as stopped:  # SIGTERM while evaluating stops the run as Ctrl-C does
        _terminate_run(signals.SIGTERM, None)
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"")
    hint = interrupted_hint(tmp_path, stopped.value)
    assert "SIGTERM" in hint and "while evaluating" in hint and f"posexp resume {tmp_path}" in hint
    assert "Ctrl-C" in interrupted_hint(tmp_path, KeyboardInterrupt())
