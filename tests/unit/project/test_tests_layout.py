"""The tests' own layout: what test modules share lives in ``tests/helpers`` (imported as ``helpers``), and a shared
fixture in the nearest conftest.py, which pytest reads itself. No module imports a test module or a conftest:
that runs the module's top-level code a second time under another name, and ties one file's tests to another's
internals.

Imports are read from the source (function-level ones too), under every name a module of ``tests/`` answers to:
from ``tests/`` (pytest's ``pythonpath``), from the repository root, and by its bare name.
"""

from __future__ import annotations

import ast

import pytest

from helpers import REPO

TESTS = REPO / "tests"


def _names(parts: tuple[str, ...]) -> set[str]:
    """The names the module at ``tests/<parts>.py`` can be imported under."""
    return {".".join(parts), ".".join(("tests", *parts)), parts[-1]}


# every test module and conftest, under each of its names
NOT_TO_IMPORT = {name for f in TESTS.rglob("*.py") if f.name.startswith("test_") or f.name == "conftest.py"
                 for name in _names(f.relative_to(TESTS).with_suffix("").parts)}


def _imported(source: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """``(line, module)`` for every module ``source`` imports anywhere, ``from A import B`` giving both ``A`` and
    ``A.B`` (B may be a module); ``package`` is the folder under ``tests/`` it sits in, for relative imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}".lstrip(".")) for a in node.names]
    return found


@pytest.mark.parametrize("source,package", [
    ("from unit.reporting.test_report import make_run", ()),
    ("from tests.integration.data.test_tokenizer import sample_text", ()),
    ("def f():\n    import integration.hf.test_pretrained_runs", ()),
    ("from unit.reporting import test_report_golden", ()),
    ("from conftest import compose", ()),
    ("from test_tasks import make", ()),
    ("from .test_report import make_run", ("unit", "reporting")),
    ("from .. import conftest", ("unit",)),
])
def test_each_way_of_importing_a_test_module_is_seen(source, package):
    assert any(name in NOT_TO_IMPORT for _, name in _imported(source, package))


def test_helpers_and_the_package_are_not_test_modules():
    source = "from helpers import invoke\nfrom helpers.runs import make_run\nfrom posexp.reporting import build_report"
    assert not [name for _, name in _imported(source, ()) if name in NOT_TO_IMPORT]


def test_no_module_imports_a_test_module_or_a_conftest():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        package = path.relative_to(TESTS).parent.parts
        found += [f"{path.relative_to(REPO)}:{line} imports {name}"
                  for line, name in _imported(path.read_text(), package) if name in NOT_TO_IMPORT]
    assert not found, "what tests share belongs in tests/helpers, a shared fixture in a conftest.py:\n" + \
        "\n".join(found)
