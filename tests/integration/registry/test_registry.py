"""Encoders, tasks and trackers are found by name one way (posexp.registry): a class registers itself in a module
of its package, nothing else lists it, and an unknown name is one error naming the key, the close name and all."""

from __future__ import annotations

import sys

import pytest

from posexp import encoders
from posexp.errors import ConfigError
from posexp.tasks import TASKS, check_task_name
from posexp.tracking import TRACKERS, _tracker_class


@pytest.mark.parametrize("find,key,typo,meant", [
    (encoders.get, "encoder", "rop", "rope"),
    (check_task_name, "task", "copi", "copy"),
    (_tracker_class, "logger", "wandbx", "wandb"),
], ids=["encoder", "task", "tracker"])
def test_an_unknown_name_is_an_error_naming_the_close_one_and_every_allowed_one(find, key, typo, meant):
    with pytest.raises(ConfigError) as caught:
        find(typo)
    assert caught.value.key == key
    message = str(caught.value)
    assert f"did you mean {meant}? choose one of: " in message and "\n" not in message


def test_every_kind_is_one_registry_of_the_classes_its_package_holds():
    assert set(TASKS) >= {"copy", "passkey", "niah"} and all(TASKS[n].name == n for n in TASKS)
    assert list(TRACKERS) == ["mlflow", "tensorboard", "wandb"] and all(TRACKERS[n].name == n for n in TRACKERS)
    assert all(cls.name == n for n, cls in encoders.registry().items())


def test_a_new_module_in_the_package_is_found_with_no_list_to_edit(tmp_path, monkeypatch):
    package = tmp_path / "kinds"
    package.mkdir()
    (package / "__init__.py").write_text("from posexp.registry import Registry\nKINDS = Registry('kind', 'kind', 'kinds')\n")
    for name in ("first", "second"):
        (package / f"{name}.py").write_text(f"from kinds import KINDS\n@KINDS.register({name!r})\nclass K:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kinds", raising=False)
    import kinds

    assert list(kinds.KINDS) == ["first", "second"] and kinds.KINDS["second"].name == "second"
    with pytest.raises(RuntimeError, match="two kinds registered as 'first'"):
        kinds.KINDS.register("first")(type("Other", (), {}))
    for name in ("kinds", "kinds.first", "kinds.second"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("kind", ["task", "logger", "encoder"])
def test_a_users_module_that_is_not_here_says_where_it_was_looked_for_and_what_to_do(kind, tmp_path, monkeypatch):
    """Every component of one's own (``task.module``, ``logger.NAME.module``, ``encoder.module``) is imported alike:
    a module not found (``posexp eval`` of a plugin task's run from another folder) is named with the folders
    searched and what to do, not Python's "No module named"."""
    from posexp.encoders import load_plugin
    from posexp.tasks import task_class

    monkeypatch.chdir(tmp_path)
    find = {"task": lambda: task_class({"name": "first", "module": "my_lab.first"}),
            "logger": lambda: _tracker_class("jsonl", "my_lab.jsonl"),
            "encoder": lambda: load_plugin("mine", "my_lab.mine")}[kind]
    with pytest.raises(ConfigError) as e:
        find()
    assert e.value.key == {"task": "task.module", "logger": "logger.jsonl.module", "encoder": "encoder.module"}[kind]
    assert "no module 'my_lab." in str(e.value)
    assert str(tmp_path) in str(e.value) and "start posexp in the folder that holds my_lab/" in str(e.value)
