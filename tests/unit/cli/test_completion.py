"""Tab completion's answers and its install commands, in this process: what a TAB offers after each word, the
flags and keys it reads from the app, the schema and the registries, and ``--install-completion`` writing the
script and the line that loads it. The script in a real bash and zsh, and a TAB that never loads torch, are
tests/process/test_completion_in_a_shell.py and tests/process/test_fresh_interpreter.py."""

from __future__ import annotations

import pytest

from posexp.cli import completion, options, shell
from posexp.cli.arguments import OPTIONAL_GROUPS
from posexp.cli.completion import DIRS, FILES, WORDS, AppKeys, complete
from posexp.config.schema import config_dir
from helpers import REPO, immutable, invoke_main

EXAMPLE_CONF = REPO / "scripts" / "plugin_example" / "conf"


def _tab(line: str) -> tuple[str, list[str]]:
    """The kind and the whole words a TAB at the end of ``line`` offers."""
    words, typed = shell.split_line(line)
    reply = complete(words[1:], typed)
    return reply.kind, list(reply.items)


def _yamls(group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


# -- what a TAB offers --------------------------------------------------------------------------------

def test_subcommands_then_a_group_key_with_its_options():
    assert _tab("posexp tr") == (WORDS, ["train"])
    assert _tab("posexp train enc") == (WORDS, ["encoder="])  # the group, not encoder. beside it
    assert _tab("posexp train encoder=") == (WORDS, [f"encoder={n}" for n in _yamls("encoder")])
    assert _tab("posexp train model=s") == (WORDS, ["model=small"])
    assert _tab("posexp train encoder=rope model=") == (WORDS, [f"model={n}" for n in _yamls("model")])
    assert _tab("posexp train tr") == (WORDS, ["train=", "train_len="])
    assert _tab("posexp analyze exp") == (WORDS, ["experiment="])


def test_the_keys_offered_are_the_composed_configs(compose):
    cfg = compose()
    known = AppKeys.of("config", [])
    for group in ("model", "train", "eval", "data", "tokenizer", "task", "encoder"):
        offered = {k.removeprefix(f"{group}.").rstrip("=.") for k in known.keys(f"{group}.")}
        own = set(cfg[group]) - ({"name"} if group == "encoder" else set())  # encoder=NAME chooses the name
        assert offered == own, group
    top = {k.rstrip("=") for k in known.keys("")}
    # the lineage a fine-tune writes is no setting; the optional groups bring keys only when chosen
    assert top == set(cfg) - {"finetune"} | set(OPTIONAL_GROUPS)
    assert "logger.tensorboard." in known.keys("logger.")


def test_encoder_keys_follow_the_encoder_chosen_on_the_line():
    assert _tab("posexp train encoder.")[1] == [f"encoder.{k}=" for k in
                                                ("alpha", "base", "freq_schedule", "lr_mult", "rotary_fraction")]
    assert _tab("posexp train encoder=t5 encoder.")[1] == [f"encoder.{k}=" for k in
                                                           ("lr_mult", "max_distance", "num_buckets")]
    assert _tab("posexp check t5 ")[1] == ["num_buckets=", "max_distance=", "lr_mult="]
    assert _tab("posexp check ro") == (WORDS, ["rope"])


def test_values_of_keys_that_take_one_of_a_few():
    assert _tab("posexp train eval.scaling=y")[1] == ["eval.scaling=yarn"]
    assert _tab("posexp train cache=")[1] == ["cache=true", "cache=false"]
    assert _tab("posexp train precision=")[1] == ["precision=auto", "precision=fp32", "precision=bf16"]
    assert _tab("posexp finetune runs/a scaling=r")[1] == []  # rerope is evaluation-only
    assert _tab("posexp finetune runs/a scaling=s")[1] == []  # and so are self_extend and string
    assert _tab("posexp train eval.scaling=s")[1] == ["eval.scaling=self_extend", "eval.scaling=string"]
    assert _tab("posexp train base=") == (WORDS, [])  # a number: nothing to list
    assert _tab("posexp train --cfg ")[1] == ["job", "hydra", "all"]
    assert _tab("posexp report --format=m")[1] == ["--format=markdown"]


def test_sweeps_lists_and_hydra_prefixes_keep_what_was_typed():
    assert _tab("posexp train -m encoder=rope,al")[1] == ["encoder=rope,alibi"]
    assert _tab("posexp train logger=[tensorboard,ml")[1] == ["logger=[tensorboard,mlflow"]
    assert _tab("posexp train +model.d_")[1] == ["+model.d_model="]
    assert _tab("posexp report --by encoder,ba")[1] == ["encoder,base"]


def test_run_folders_where_a_command_takes_them():
    assert _tab("posexp eval ")[0] == DIRS and _tab("posexp eval ")[1] == ["eval."]
    assert _tab("posexp eval outputs/x eval.prot") == (WORDS, ["eval.protocol="])
    assert _tab("posexp resume ")[0] == _tab("posexp report ")[0] == _tab("posexp finetune ")[0] == DIRS
    assert _tab("posexp finetune outputs/x sc")[1] == ["scaling=", "scaling_factor="]
    assert _tab("posexp analyze ./ou")[0] == DIRS
    assert _tab("posexp report --out ")[0] == _tab("posexp train hydra.run.dir=")[0] == DIRS
    assert _tab("posexp train data.path=")[0] == FILES


def test_a_pretrained_models_settings_complete_after_hf_model():
    # posexp eval hf:MODEL and posexp search hf:MODEL take the pretrained app's overrides (data=, hf.*), not folders
    assert _tab("posexp eval hf:gpt2 da") == _tab("posexp search hf:gpt2 da") == (WORDS, ["data="])
    assert _tab("posexp search hf:gpt2 --target-len 4096 hf.b")[1] == ["hf.bos="]
    assert _tab("posexp eval hf:gpt2 eval.sc")[1] == ["eval.scaling=", "eval.scaling_factor="]


def test_the_users_config_folder_adds_its_encoders():
    assert "encoder=logrope" in _tab(f"posexp train --config-dir {EXAMPLE_CONF} encoder=")[1]
    assert "encoder=logrope" not in _tab("posexp train encoder=")[1]
    assert _tab(f"posexp train -cd {EXAMPLE_CONF} encoder=logrope encoder.")[1] == [
        "encoder.base=", "encoder.lr_mult=", "encoder.scale="]
    # hydra.searchpath works like --config-dir (posexp train takes both)
    assert "encoder=logrope" in _tab(f"posexp train hydra.searchpath=[file://{EXAMPLE_CONF}] encoder=")[1]
    assert "encoder=logrope" in _tab(f"posexp train +hydra.searchpath=[pkg://x,file://{EXAMPLE_CONF}] encoder=")[1]


def test_a_task_of_the_users_config_folder_offers_the_keys_its_yaml_lists(tmp_path):
    """A task of one's own (a module the yaml names, components.md) was offered as task=first, but task.<TAB> then
    offered nothing: its keys are those its yaml lists, as an encoder of one's own has them."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "first.yaml").write_text("# @package _global_\ntask:\n  name: first\n  module: lab.first\n"
                                                  "  symbols: 8\n  repeats: 2\n")
    assert "task=first" in _tab(f"posexp train --config-dir {tmp_path} task=")[1]
    assert _tab(f"posexp train --config-dir {tmp_path} task=first task.")[1] == [
        "task.name=", "task.repeats=", "task.symbols="]


def test_bash_gets_the_part_after_its_word_break():
    """readline replaces the text after the last ``=`` (``@``, ``:``...), so that is what bash is given."""
    assert shell.reply_text("bash", "posexp train encoder=ro") == "words:ro\nrope"
    assert shell.reply_text("bash", "posexp train enc") == "words:enc\nencoder="
    assert shell.reply_text("bash", "posexp train hydra.run.dir=ou") == "dirs:ou"
    assert shell.reply_text("zsh", "posexp train encoder=ro") == "words:encoder=ro\nencoder=rope"
    # a shell whose COMP_WORDBREAKS lost its = (as Hydra's own script leaves it) gets whole words
    assert shell.reply_text("bash", "posexp train encoder=ro", " \t\n\"'><;|&(:") == "words:encoder=ro\nencoder=rope"


# -- the tables agree with what they describe --------------------------------------------------------

def test_the_subcommands_and_options_are_the_apps():
    """The app declares its options from posexp.cli.options, which completion reads: no option of the app's is
    missing there, and a flag is one in both."""
    import typer

    from posexp.cli.app import app

    root = typer.main.get_command(app)
    assert set(options.COMMANDS) == set(root.commands)  # type: ignore[attr-defined]
    for name, command in [(options.ROOT, root), *root.commands.items()]:  # type: ignore[attr-defined]
        if name in ("train", "analyze", "finetune"):  # Hydra's flags, which Typer passes on
            continue
        apps = {o: not p.is_flag for p in command.params if p.param_type_name == "option" for o in p.opts}
        ours = {n: not o.flag for o in options.options(name) for n in o.names}
        assert ours == apps, name


def test_an_option_declared_once_is_completed(monkeypatch):
    """A new option of a command's declaration is offered, and its value completed, with nothing else to edit."""
    declared = options.COMMANDS["report"]
    monkeypatch.setitem(options.COMMANDS, "report", lambda: (*declared(), options.Option(
        ("--palette",), "Colours.", "dark", ("dark", "light"))))
    options.options.cache_clear()
    try:
        assert _tab("posexp report --pal")[1] == ["--palette"]
        assert _tab("posexp report runs --palette l")[1] == ["light"]
        assert _tab("posexp report --palette=d")[1] == ["--palette=dark"]
    finally:
        options.options.cache_clear()


def test_the_arguments_are_the_apps():
    """The app builds its positional arguments from posexp.cli.options, which completion reads: the same names, in
    the same order, with the same help, metavar, count and need."""
    import typer

    from posexp.cli.app import app

    for name, command in typer.main.get_command(app).commands.items():  # type: ignore[attr-defined]
        apps = [(p.name, p.help, p.metavar, p.required, p.nargs) for p in command.params
                if p.param_type_name == "argument"]
        ours = [(a.name, a.help, a.metavar or None, a.required, -1 if a.many else 1)
                for a in options.arguments(name)]
        assert ours == apps, name


def test_an_argument_declared_once_is_completed(monkeypatch):
    """A new positional argument of a command's declaration is completed where it stands, with nothing else to
    edit: after resume's one run folder, an encoder, then that encoder's options."""
    declared = options.COMMANDS["resume"]
    monkeypatch.setitem(options.COMMANDS, "resume", lambda: (
        *declared(), options.Argument("encoder", "The encoder.", options.ENCODER),
        options.Argument("settings", "Its options.", options.ENCODER_OPTIONS, required=False, many=True)))
    options.options.cache_clear()
    options.arguments.cache_clear()
    try:
        assert _tab("posexp resume ")[0] == DIRS  # the run folder still comes first
        assert _tab("posexp resume runs/a ro") == (WORDS, ["rope"])
        assert _tab("posexp resume --allow-changed-encoder runs/a t5 num") == (WORDS, ["num_buckets="])
        assert _tab("posexp resume runs/a t5 base=1 max") == (WORDS, ["max_distance="])
    finally:
        monkeypatch.undo()
        options.options.cache_clear()
        options.arguments.cache_clear()
    assert _tab("posexp resume runs/a ro") == (WORDS, [])  # as declared: one run folder, nothing after it


def test_the_hydra_flags_read_and_offered_are_hydras():
    """posexp reads Hydra's flags with a parser of its own (Hydra has no public one): the same flags and choices
    as Hydra's own help lists."""
    import re

    from typer.testing import CliRunner

    from posexp.cli import hydra_flags
    from posexp.cli.app import app
    from posexp.commands.plugin_source import ALLOW_FLAG
    from posexp.runs.lock import OVERWRITE_FLAG

    text = CliRunner().invoke(app, ["train", "--hydra-help"]).output
    listed = dict(re.findall(r"^(-[\w,-]+) : (.*)$", text, flags=re.M))
    hydras = {flag for flags in listed for flag in flags.split(",")}
    assert hydras == hydra_flags.option_strings()
    choices = {flags.split(",")[0]: tuple(re.search(r"\[(.*)\]", what).group(1).split("|"))  # type: ignore[union-attr]
               for flags, what in listed.items() if re.search(r"\[(.*)\]", what)}
    assert choices == {flag: options.find("train", flag).values for flag in ("--cfg", "--info")}  # type: ignore[union-attr]
    assert {n for o in options.options("train") for n in o.names} - {OVERWRITE_FLAG} <= hydras
    assert (options.OVERWRITE, options.ALLOW_CHANGED) == (OVERWRITE_FLAG, ALLOW_FLAG)


def test_the_copied_value_lists_equal_their_owners():
    from posexp.commands.check import FORMATS as CHECK_FORMATS
    from posexp.encoders.scaling import SCALINGS
    from posexp.encoders.extension import FINETUNE_SCALINGS
    from posexp.model.positions import CURRICULA, POSITION_SCHEMES
    from posexp.reporting.render import FORMATS
    from posexp.runtime.device import COMPILE_SETTINGS
    from posexp.config.schema import Config, EvalConfig, FinetuneAppConfig, TrainConfig
    from posexp.evaluation.longrope_search import OBJECTIVES

    choices = completion.field_choices  # what completion offers for a key: the values its schema comment lists
    assert choices(EvalConfig)["scaling"] == SCALINGS and choices(FinetuneAppConfig)["scaling"] == FINETUNE_SCALINGS
    assert choices(TrainConfig)["positions"] == POSITION_SCHEMES and choices(TrainConfig)["curriculum"] == CURRICULA
    values = {(c, o): options.find(c, o).values for c, o in  # type: ignore[union-attr]
              [("report", "--format"), ("check", "--format"), ("search", "--objective"), ("report", "--view")]}
    assert (values["report", "--format"], values["check", "--format"]) == (FORMATS, CHECK_FORMATS)
    assert values["search", "--objective"] == OBJECTIVES
    assert choices(Config)["compile"] == tuple(str(v).lower() for v in COMPILE_SETTINGS)
    from posexp.reporting.views import PROTOCOLS, VIEW_KEYS

    views = values["report", "--view"]
    assert {v.split("=")[0] for v in views} == set(VIEW_KEYS)
    assert [v.split("=")[1] for v in views if v.startswith("protocol=")] == list(PROTOCOLS)
    from posexp.commands.eval_overrides import EVAL_OPTIONS  # named by eval's one line for an option it lacks

    assert EVAL_OPTIONS == ("-m", *(o.names[0] for o in options.options("eval")))


def test_every_builtin_encoders_yaml_lists_its_options():
    """Completion reads an encoder's options from its yaml; a built-in's must list every one."""
    from posexp.encoders import option_names, registry
    from posexp.encoders.plugins import is_builtin

    for name, cls in registry().items():
        if is_builtin(cls):
            assert set(completion.encoder_keys(name)) == {*option_names(name), "lr_mult"}, name


# -- installing it --------------------------------------------------------------------------------------

def test_hydras_install_command_prints_the_script_without_an_error():
    from typer.testing import CliRunner

    from posexp.cli.app import app

    for command in (["train", "-sc", "install=bash"], ["analyze", "--shell-completion", "install=zsh"],
                    ["finetune", "-sc", "install=bash"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0 and result.stdout == shell.SCRIPT and not result.stderr, command
    refused = CliRunner().invoke(app, ["train", "-sc", "query=bash"])
    assert refused.exit_code == 2 and "install=bash" in refused.stderr and len(refused.stderr.splitlines()) == 1


def test_install_completion_loads_the_script_at_start_once(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from posexp.cli.app import app

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".bashrc").write_text("alias ll='ls -l'")  # the user's own lines stay
    monkeypatch.setattr(shell, "detect_shell", lambda: "bash")
    for _ in range(2):
        result = CliRunner().invoke(app, ["--install-completion"])
        assert result.exit_code == 0, result.output
    assert (tmp_path / ".bash_completions" / "posexp.sh").read_text() == shell.SCRIPT
    assert (tmp_path / ".bashrc").read_text() == f"alias ll='ls -l'\nsource '{tmp_path}/.bash_completions/posexp.sh'\n"
    script, rc = shell.install("zsh", tmp_path)
    assert script.read_text() == shell.SCRIPT and rc.read_text().count("fpath+=~/.zfunc") == 1
    monkeypatch.setattr(shell, "detect_shell", lambda: "fish")
    refused = CliRunner().invoke(app, ["--install-completion"])
    assert refused.exit_code == 2 and "bash and zsh" in refused.stderr


def test_install_completion_into_an_immutable_bashrc_is_one_line(tmp_path, monkeypatch):
    """--install-completion to an immutable .bashrc (or a full disk) was an OSError traceback."""
    rc = tmp_path / ".bashrc"
    rc.write_text("alias ll='ls -l'\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SHELL", "/bin/bash")
    with immutable(rc):
        done = invoke_main("--install-completion", "bash")
    assert done.exit_code != 0 and "Traceback" not in done.output, done.output
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("error: ") and ".bashrc" in line


def test_an_item_of_a_list_or_sweep_is_not_offered_again():
    listed = complete(["train"], "logger=[tensorboard,").items
    assert "logger=[tensorboard,wandb" in listed and "logger=[tensorboard,tensorboard" not in listed
    swept = complete(["train"], "encoder=rope,").items
    assert "encoder=rope,alibi" in swept and "encoder=rope,rope" not in swept
    assert "encoder,encoder" not in complete(["report", "--by"], "encoder,").items
