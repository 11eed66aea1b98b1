"""The command line keeps no state between commands and hands Hydra its arguments directly: no module-level
mutable globals, no swapped ``sys.argv``, no environment variable set to steer Hydra; and tab completion offers
the values the schema documents for a key, a key added later included."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import posexp.cli

CLI = sorted(Path(posexp.cli.__file__).parent.glob("*.py"))


def _target_names(node: ast.AST) -> list:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
    return [t for t in targets]


@pytest.mark.parametrize("path", CLI, ids=[p.name for p in CLI])
def test_no_global_state_no_argv_swap_no_environment_set(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno}: global statement"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in _target_names(node):
                text = ast.unparse(target)
                assert text != "sys.argv", f"{path.name}:{node.lineno}: sys.argv assigned"
                assert not text.startswith("os.environ["), f"{path.name}:{node.lineno}: {text} set"
        if isinstance(node, ast.Delete):  # del os.environ["COLUMNS"]: toggled as much as set
            assert not any(ast.unparse(t).startswith("os.environ[") for t in node.targets), f"{path.name}:{node.lineno}"
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.update", "os.environ.setdefault",
                                                                      "os.environ.pop", "os.putenv", "os.unsetenv"):
            raise AssertionError(f"{path.name}:{node.lineno}: the environment set")
    for node in tree.body:  # module level: a lower-case name bound to a list, dict or set is state, not a constant
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.List, ast.Dict, ast.Set)):
            for target in _target_names(node):
                name = ast.unparse(target)
                assert name.isupper() or not name.strip("_").islower(), f"{path.name}:{node.lineno}: {name}"


@dataclass
class _NewEvalKeys:
    """A schema group as another change might grow it."""

    remap: str = "none"  # training-free remapping: none | self_extend | dca (Jin et al. 2024) | ms_poe
    remap_window: int = 512  # tokens: a number, nothing to list
    style: str = "a"  # the longest | mean | an eval length: a phrase is no value


def test_completion_offers_the_values_a_schema_comment_lists():
    from posexp.cli.completion import field_choices, schema_tree

    assert field_choices(_NewEvalKeys) == {"remap": ("none", "self_extend", "dca", "ms_poe"),
                                            "style": ("longest", "mean")}
    tree = schema_tree(_NewEvalKeys)
    assert tree["remap"] == ("none", "self_extend", "dca", "ms_poe") and tree["remap_window"] is int


def test_every_listed_eval_scaling_completes():
    from posexp.cli import shell
    from posexp.cli.completion import complete

    words, typed = shell.split_line("posexp train eval.scaling=")
    from posexp.encoders.scaling import SCALINGS

    assert complete(words[1:], typed).items == tuple(f"eval.scaling={s}" for s in SCALINGS)
