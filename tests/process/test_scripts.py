"""scripts/ is held to the package's shape: no import cycle, short functions, and every script answers --help."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import REPO

SCRIPTS = REPO / "scripts"
MAX_FUNCTION_LINES = 80


def _trees() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), filename=str(p)) for p in sorted(SCRIPTS.glob("*.py"))}


def _imports_of(tree: ast.Module, siblings: set[str]) -> set[str]:
    """The scripts/ modules a module imports, at any depth (function-level imports count)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & siblings


def _is_script(tree: ast.Module) -> bool:
    """Whether the module runs as a program (has an ``if __name__ == "__main__":`` block)."""
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def test_scripts_have_no_import_cycle():
    trees = _trees()
    graph = {name: _imports_of(tree, set(trees)) for name, tree in trees.items()}

    def visit(name: str, path: list[str]) -> None:
        for dep in graph[name]:
            assert dep not in path, f"import cycle in scripts/: {' -> '.join(path + [dep])}"
            visit(dep, path + [dep])

    for name in graph:
        visit(name, [name])


def test_no_function_in_scripts_is_over_80_lines():
    long = [f"{name}.py:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in _trees().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_every_module_of_scripts_is_a_script_or_a_helper_a_script_imports():
    trees = _trees()
    helpers = {name for name, tree in trees.items() if not _is_script(tree)}
    imported = set().union(*(_imports_of(tree, set(trees)) for tree in trees.values()))
    assert helpers <= imported, f"neither a script nor imported by one: {sorted(helpers - imported)}"


def _help(path: Path) -> tuple[str, subprocess.CompletedProcess]:
    return path.name, subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                                      timeout=240, cwd=SCRIPTS.parent)


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    scripts = [SCRIPTS / f"{name}.py" for name, tree in _trees().items() if _is_script(tree)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(_help, scripts))


def test_every_script_answers_help(helps):
    assert len(helps) >= 7  # bench, bench_eval, bench_finetune, bench_gpu, bench_launchers, bench_precision, ...
    for name, proc in helps.items():
        assert proc.returncode == 0, f"{name} --help: {proc.stderr.strip()[-400:]}"
        assert proc.stdout.startswith("usage:"), f"{name} --help printed {proc.stdout[:200]!r}"


def test_bench_help_lists_the_gpu_benchmark(helps):
    assert "--gpu" in helps["bench.py"].stdout


def test_every_study_has_the_tables_it_last_produced_beside_it_with_commit_and_machine(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import study

    assert {p.name for p in SCRIPTS.glob("study_*.md")} == {f"study_{name}.md" for name in study.STUDIES}
    for name in study.STUDIES:
        text = (SCRIPTS / f"study_{name}.md").read_text()
        assert text.startswith(f"# Study: {name}\n")
        assert "Last produced" in text and " commit `" in text and " on " in text, name
        steps = study.commands(name)
        assert [w for w, _ in steps][-len(study.STUDIES[name].tables):] == [t.title for t in study.STUDIES[name].tables]
        for what, argv in steps:
            assert not any("{" in a for a in argv), f"{name}: {what}: a folder left unfilled in {argv}"
    lm_tables = [argv for name in ("default", "converged", "encodings", "tasks", "finetune")
                 for _, argv in study.commands(name) if "report" in argv]
    assert lm_tables and all(argv[-2:] == ["--format", "markdown"] for argv in lm_tables)
