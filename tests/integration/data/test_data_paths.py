"""``data.path`` as a user types it: a path that is not text, a symlink loop, an empty folder, a home path quoted
or bare; an unwritable token cache said once. Each is one clear line or a warning, never a traceback."""

from __future__ import annotations

import os

import pytest

from helpers import REPO, TINY_RUN, invoke_main
from posexp.config.schema import DataConfig
from posexp.data.corpus import corpus_from_config, load_corpus
from posexp.errors import ConfigError
from posexp.commands.edge import typed

# ---------------------------------------------------------------------------- data.path


def test_data_path_that_is_not_a_file_or_folder_says_what_it_is(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_corpus(DataConfig(name="text", path=os.devnull, cache_dir=str(tmp_path / "cache")))
    assert "not a regular file or folder" in str(e.value) and "empty folder" not in str(e.value)


def test_a_symlink_loop_as_data_path_names_data_path(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ConfigError, match=r"data\.path: .*loop cannot be followed"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "loop"), cache_dir=str(tmp_path / "cache")))


def test_empty_file_and_folder_without_text_files_are_named_as_such(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "empty.txt"), cache_dir=str(tmp_path / "cache")))
    (tmp_path / "hidden" / ".git").mkdir(parents=True)
    (tmp_path / "hidden" / ".git" / "notes.txt").write_text("text, but hidden")
    with pytest.raises(ConfigError, match="has no text files"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "hidden"), cache_dir=str(tmp_path / "cache")))


def test_the_readme_data_path_example_is_an_override_hydra_accepts(monkeypatch, tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from posexp.cli.arguments import expand_home

    line = next(x for x in (REPO / "README.md").read_text().splitlines() if x.startswith("posexp train data=text"))
    monkeypatch.setenv("HOME", str(tmp_path))
    args = expand_home(os.path.expandvars(line.split("#")[0]).split()[2:])  # as the shell passes them, as posexp
    OverridesParser.create().parse_overrides(args)
    assert f"data.path='{tmp_path}/corpus/'" in args


def test_a_hydra_quoted_home_path_is_expanded(compose, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text to train on. " * 200)
    cfg = typed(compose("data=text", "data.path='~/corpus'", f"data.cache_dir={tmp_path / 'cache'}"))
    assert corpus_from_config(cfg).train.size > 0


def test_a_bare_home_path_on_the_command_line_is_expanded_as_a_shell_would(monkeypatch, tmp_path):
    from posexp.cli.arguments import expand_home

    monkeypatch.setenv("HOME", str(tmp_path))
    assert expand_home(["data.path=~/corpus", "+data.cache_dir=~", "encoder=rope", "-m"]) == [
        f"data.path='{tmp_path}/corpus'", f"+data.cache_dir='{tmp_path}'", "encoder=rope", "-m"]
    assert expand_home(["data.path=~/a,~/b"]) == [f"data.path='{tmp_path}/a','{tmp_path}/b'"]
    assert expand_home(["data.path='~/corpus'", "~model.dropout"]) == ["data.path='~/corpus'", "~model.dropout"]


def test_posexp_train_takes_the_readme_style_home_path(monkeypatch, tmp_path):
    home = tmp_path / "home"
    (home / "corpus").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # the command reads this environment
    r = invoke_main("train", *TINY_RUN, "data=text", "data.path=~/corpus", "--cfg", "job", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    assert f"path: {home}/corpus" in r.stdout


# ---------------------------------------------------------------------------- warnings on the terminal


def test_an_unwritable_token_cache_is_said_once_and_the_corpus_still_loads(tmp_path, caplog):
    text = tmp_path / "a.txt"
    text.write_text("some text to train on. " * 200)
    (tmp_path / "a_file").write_text("")
    said: list[str] = []
    corpus = load_corpus(DataConfig(name="text", path=str(text), cache_dir=str(tmp_path / "a_file" / "tokens")),
                         warn=said.append)
    assert corpus.train.size > 0
    assert len(said) == 1 and "cannot be written" in said[0] and "data.cache_dir" in said[0]
    assert any("cannot be written" in r.getMessage() for r in caplog.records)
