"""Mistakes a user types on the command line: one line ``error: ...``, exit code 2, nothing run, no run folder.

Hydra skips an optional group whose option does not exist (``experiment=smok`` ran the full default
training), lets ``+key=`` add keys outside the schema, and reports its own errors in several lines with
exit code 1. Each case here is refused in one line before any job runs or any folder is made.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from posexp.cli.app import app

from helpers import TINY_RUN, invoke_main

# the shared tiny run, smaller still: a case which is wrongly accepted finishes in seconds (and then fails its asserts)
TINY = (*TINY_RUN, "train.steps=2", "train.batch_size=2", "train.warmup_steps=0", "eval.multiples=[1]",
        "eval.tokens=256")
TINY_ANALYZE = ("train_len=32", "analyze.length=64", "analyze.figures=false")

TRAIN_CASES = [
    # 3: a typo in an optional group, and in the other groups
    (["experiment=smok"], ["experiment=smok", "did you mean experiment=smoke", "smoke"]),
    (["search=bogus"], ["search=bogus", "choose one of: base"]),
    (["-m", "experiment=smok"], ["experiment=smok", "smoke"]),
    (["-m", "search=bogus"], ["search=bogus", "base"]),
    (["-m", "experiment=smoke,smok"], ["experiment=smok", "smoke"]),
    (["encoder=rpoe"], ["encoder=rpoe", "did you mean encoder=rope", "alibi"]),
    (["data=x"], ["data=x", "stdlib", "text", "hf"]),
    (["encoder="], ["encoder=", "rope", "alibi"]),
    # 4: keys outside the schema, however they arrive
    (["+model.d_modle=64"], ["model.d_modle", "did you mean model.d_model", "n_heads"]),
    (["++model.d_modle=64"], ["model.d_modle", "did you mean model.d_model"]),
    (["model.d_modle=64"], ["model.d_modle", "did you mean model.d_model"]),
    (["+encoder.bsae=3"], ["encoder.bsae", "did you mean encoder.base"]),
    (["+nope=1"], ["nope", "train_len"]),
    (["-m", "encoder=rope,alibi", "encoder.rotary_fraction=0.5"], ["encoder.rotary_fraction", "encoder=alibi"]),
    # 9: what Hydra reports itself, in several lines and exit code 1
    (["train.steps=abc"], ["train.steps", "Integer", "HYDRA_FULL_ERROR=1"]),
    (["-m", "seed=0,abc"], ["seed", "Integer", "seed=abc"]),
    (["seed=0,1"], ["seed=0,1", "-m"]),
    (["outputs/typo"], ["outputs/typo", "KEY=VALUE"]),
    (["hydra/launcher=nope"], ["hydra/launcher=nope", "basic", "joblib"]),
    (["~model.d_model"], ["model.d_model", "deletion"]),
    # a seed beyond torch's 64 bits was an overflow traceback, after the run folder was made
    (["seed=123456789012345678901234567890"], ["seed", "2**63 - 1"]),
    # joblib refused n_jobs=0 with a traceback once the sweep had started
    (["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "seed=0,1"], ["hydra.launcher.n_jobs=0", "at least 1"]),
]

ANALYZE_CASES = [
    (["experiment=smok"], ["experiment=smok", "smoke"]),
    (["search=bogus"], ["search=bogus", "base"]),
    (["-m", "experiment=smok"], ["experiment=smok", "smoke"]),
    (["encoder=rpoe"], ["did you mean encoder=rope"]),
    (["+model.d_modle=64"], ["did you mean model.d_model"]),
    (["+analyze.lenght=3"], ["analyze.lenght", "did you mean analyze.length"]),
    (["train.steps=abc"], ["train.steps", "Integer"]),
    (["outputs/typo"], ["outputs/typo", "no such run folder", "KEY=VALUE"]),
]


def _assert_one_line_error(result, needles, tmp_path):
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1 and out.startswith("error:"), out
    assert "Traceback" not in out
    for needle in needles:
        assert needle in out, (needle, out)
    assert not any((tmp_path / d).exists() for d in ("run", "sweep", "outputs")), list(tmp_path.iterdir())


@pytest.mark.parametrize("args,needles", TRAIN_CASES, ids=[" ".join(a) for a, _ in TRAIN_CASES])
def test_train_override_mistake_is_one_line_and_runs_nothing(args, needles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", *args, *TINY, "hydra.run.dir=run", "hydra.sweep.dir=sweep"])
    _assert_one_line_error(result, needles, tmp_path)


@pytest.mark.parametrize("args,needles", ANALYZE_CASES, ids=[" ".join(a) for a, _ in ANALYZE_CASES])
def test_analyze_override_mistake_is_one_line_and_runs_nothing(args, needles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["analyze", *args, *TINY_ANALYZE, "hydra.run.dir=run", "hydra.sweep.dir=sweep"])
    _assert_one_line_error(result, needles, tmp_path)


def test_cfg_job_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", "experiment=smok", "--cfg", "job"])
    _assert_one_line_error(result, ["experiment=smok", "smoke"], tmp_path)


@pytest.mark.parametrize("group,text,needles", [
    ("encoder", "defaults:\n  - rope\n  - _self_\nbsae: 500\n",
     ["In 'encoder/mine'", "encoder.bsae is not a config key", "did you mean encoder.base?"]),
    ("task", "defaults:\n  - copy\n  - _self_\nsymbosl: 8\n",
     ["In 'task/mine'", "task.symbosl", "did you mean task.symbols?"]),
], ids=["encoder", "task"])
def test_a_key_typed_wrong_in_a_yaml_of_ones_own_is_named_with_a_did_you_mean(group, text, needles, tmp_path,
                                                                              monkeypatch):
    """A typo inside a yaml of --config-dir was Hydra's "ConfigKeyError raised while composing config", with no
    "did you mean" and not the keys allowed, as the same typo on the command line gets."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf" / group).mkdir(parents=True)
    (tmp_path / "conf" / group / "mine.yaml").write_text(text)
    result = CliRunner().invoke(app, ["train", "--config-dir", "conf", f"{group}=mine", *TINY, "hydra.run.dir=run"])
    _assert_one_line_error(result, needles, tmp_path)
    sweep = ["train", "--config-dir", "conf", "-m", f"{group}=mine", "seed=0,1", *TINY, "hydra.sweep.dir=sweep"]
    _assert_one_line_error(CliRunner().invoke(app, sweep), needles, tmp_path)


def test_hydra_full_error_keeps_hydras_own_report(tmp_path, monkeypatch):
    """The full text on request: Hydra raises its own exception, with the key in it."""
    from hydra.errors import ConfigCompositionException

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    result = CliRunner().invoke(app, ["train", "train.steps=abc", *TINY, "hydra.run.dir=run"])
    assert isinstance(result.exception, ConfigCompositionException)
    assert "train.steps" in str(result.exception.__cause__)
    result = CliRunner().invoke(app, ["train", "encoder=rpoe", *TINY, "hydra.run.dir=run"])  # checked before Hydra
    assert isinstance(result.exception, ConfigCompositionException) and "encoder/rpoe" in str(result.exception)
    # what Hydra would let through silently is still refused, in one line
    result = CliRunner().invoke(app, ["train", "experiment=smok", *TINY, "hydra.run.dir=run"])
    _assert_one_line_error(result, ["experiment=smok"], tmp_path)


def test_valid_overrides_and_sweeps_pass_the_check():
    from posexp.cli.arguments import check_command_line
    from posexp.cli.hydra_flags import read

    for args in (["-m", "encoder=rope,alibi", "base=100,10000", "experiment=smoke", "seed=range(2)",
                  "eval.lengths=[64,128]", "hydra.sweep.dir=x", "hydra/launcher=basic", "logger=[tensorboard,mlflow]"],
                 ["encoder=t5", "encoder.num_buckets=16", "experiment=smoke", "--cfg", "job"],
                 ["-m", "encoder=rope", "base=interval(100,1000)"]):  # a sweeper's to draw
        line = read(args)
        assert line is not None
        check_command_line(line)


# -- 13: -h everywhere, and what the main keys mean ------------------------------------------------

@pytest.mark.parametrize("command", ["train", "analyze", "eval", "report", "resume", "list", "check"])
def test_dash_h_is_help_on_every_subcommand(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [command, "-h"])
    assert result.exit_code == 0, result.output
    assert ("Usage" in result.output) or (f"posexp {command}" in result.output), result.output
    assert not (tmp_path / "outputs").exists()


def test_train_help_says_what_the_main_keys_mean(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    assert "encoder:" in result.output and "alibi" in result.output  # Hydra's help, as before
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 3}
    for key, default, meaning in [("train.lr", "0.003", "peak learning rate"),
                                  ("model.d_model", "128", "width of the residual stream"),
                                  ("train_len", "128", "training context length"),
                                  ("eval.protocol", "nonoverlap", "sliding"),
                                  ("base", "10000.0", "base frequency")]:
        assert key in rows, (key, sorted(rows))
        assert default in rows[key] and meaning in rows[key].lower(), rows[key]


@pytest.mark.parametrize("config_name,keys", [
    ("config", ("base", "train_len", "seed", "device", "precision", "compile", "cache", "objective", "model.d_model",
                "model.n_layers", "model.n_heads", "train.steps", "train.batch_size", "train.lr", "train.warmup_steps",
                "train.checkpoint_every", "train.positions", "train.curriculum", "eval.lengths", "eval.multiples",
                "eval.tokens", "eval.protocol", "eval.scaling")),
    ("finetune", ("scaling", "scaling_factor", "train_len", "seed", "train.steps", "train.batch_size", "train.lr",
                  "train.warmup_steps", "eval.multiples", "eval.tokens")),
    ("pretrained", ("hf.model", "hf.revision", "hf.trust_remote_code", "hf.device_map", "train_len", "device",
                    "precision", "eval.lengths", "eval.multiples", "eval.tokens", "eval.protocol", "eval.scaling"))])
def test_the_help_table_lists_the_main_keys_with_their_meaning_and_default(config_name, keys):
    """The table is the schema's commented fields: a main key whose comment went missing drops out of it."""
    from hydra import compose, initialize_config_dir

    from posexp.cli.arguments import key_table
    from posexp.config.schema import config_dir
    from posexp.commands.validation import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name)
        rows = {key: (default, meaning) for key, default, meaning in key_table(config_name, cfg)}
    assert set(keys) <= rows.keys(), set(keys) - rows.keys()
    assert all(meaning for _, meaning in rows.values())
    assert rows["train_len"][0] == ("128" if config_name == "config" else "null")


@pytest.mark.parametrize("columns,encoding", [("0", "utf-8"), ("wide", "utf-8"), ("200", "ascii")],
                         ids=["COLUMNS=0", "COLUMNS=wide", "PYTHONIOENCODING=ascii"])
def test_a_terminal_setting_never_hides_an_error_nor_raises(columns, encoding, tmp_path):
    """COLUMNS=0 printed nothing at all (not even the error); an ASCII-only output raised on posexp's "·"."""
    bad = invoke_main("train", "encoder=rpoe", columns=columns, encoding=encoding, cwd=tmp_path)
    assert bad.exit_code == 2 and "did you mean encoder=rope" in bad.stderr, bad.stderr
    listing = invoke_main("list", columns=columns, encoding=encoding, cwd=tmp_path)
    assert listing.exit_code == 0 and "rope" in listing.stdout, repr(listing.exception)
    assert "Traceback" not in listing.stderr
    helped = invoke_main("report", "--help", columns=columns, encoding=encoding, cwd=tmp_path)
    assert helped.exit_code == 0 and "--metric" in helped.stdout, helped.stdout


@pytest.mark.parametrize("args", [[f"hydra.run.dir={'x' * 300}"], ["-m", f"hydra.sweep.dir=s/{'y' * 300}", "seed=0,1"]],
                         ids=["run", "sweep"])
def test_a_folder_name_too_long_for_the_filesystem_is_one_line(args, tmp_path, monkeypatch):
    """It raised OSError (ENAMETOOLONG) from the folder claim."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", *args, *TINY])
    _assert_one_line_error(result, [args[-1 if len(args) == 1 else 1].split("=")[0], "longer than this filesystem "
                                    "allows"], tmp_path)


@pytest.mark.parametrize("option", ["--bogus", "--config-dir"])
def test_an_option_posexp_eval_does_not_have_is_named_as_one(option, tmp_path):
    """``posexp eval --bogus RUN`` said "--bogus: no such folder; pass a run folder ...": the option read as a run."""
    (tmp_path / "conf").mkdir()
    result = invoke_main("eval", option, "conf", "eval.lengths=[64]", cwd=tmp_path)
    assert result.exit_code == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {option}: no such option of posexp eval; its options: -m, --strict, "
                           "--allow-changed-encoder"), line


@pytest.mark.parametrize("command", ["eval", "resume", "report"])
def test_a_run_folder_whose_name_the_filesystem_refuses_is_one_line(command, tmp_path):
    """``posexp eval`` of a 300-character folder name was an OSError 36 traceback."""
    result = invoke_main(command, "x" * 300, cwd=tmp_path)
    assert result.exit_code == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("error: File name too long: xxx")
