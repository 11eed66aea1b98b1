"""The package layout ``posexp/__init__.py``'s docstring states: who may import whom, no cycles, readable sizes.

Imports are read from the source (function-level ones too: a lazy import hides a dependency, it does not
remove it), so these tests need no import of posexp itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

PKG = REPO / "posexp"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        name = ".".join(("posexp",) + f.relative_to(PKG).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The posexp modules (and third-party top-level packages) ``name`` imports anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t.startswith("posexp.") and t not in MODULES:
                t = t.rpartition(".")[0]
            found.add(t if t.startswith("posexp") else t.split(".")[0])
    found.discard(name)
    return {t for t in found if not (t.startswith("posexp") and name.startswith(t + "."))}  # its own packages


def _under(prefix: str) -> list[str]:
    return [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]


def _offending(modules: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for m in modules:
        hits = sorted(t for t in _imports(m) if any(t == f or t.startswith(f + ".") for f in forbidden))
        if hits:
            bad[m] = hits
    return bad


def test_the_registry_is_a_leaf():
    """Encoders, tasks and trackers are found by name through it, so it sits under all three."""
    assert {t for t in _imports("posexp.registry") if t.startswith("posexp")} == {"posexp.errors"}


def test_config_is_a_leaf():
    assert not [t for t in _imports("posexp.config.schema") if t.startswith("posexp") and t != "posexp.configs"]


def test_encoders_import_nothing_outside_themselves_but_the_leaves():
    leaves = ("posexp.errors", "posexp.registry")
    bad = {m: sorted(t for t in _imports(m) if t.startswith("posexp") and not t.startswith("posexp.encoders")
                     and t not in leaves) for m in _under("posexp.encoders")}
    assert not {m: v for m, v in bad.items() if v}


@pytest.mark.parametrize("layer,forbidden", [
    ("posexp.runtime.device", ("posexp.training", "posexp.evaluation", "posexp.commands", "posexp.data")),
    ("posexp.plots.perplexity", ("torch", "posexp.reporting", "posexp.evaluation")),
    ("posexp.plots.style", ("torch", "posexp.reporting", "posexp.evaluation", "posexp.analysis")),
    ("posexp.runs.lock", ("torch", "posexp.reporting", "posexp.commands", "posexp.training", "posexp.evaluation")),
    ("posexp.runs.layout", ("torch", "posexp.reporting", "posexp.commands", "posexp.training", "posexp.evaluation")),
    ("posexp.reporting", ("torch", "posexp.commands", "posexp.training", "posexp.evaluation", "posexp.analysis",
                          "posexp.model.gpt", "posexp.model.factory", "posexp.commands.validation")),
    ("posexp.data", ("posexp.commands", "posexp.reporting", "posexp.analysis", "posexp.training",
                     "posexp.evaluation", "posexp.tasks")),
    ("posexp.tasks", ("torch", "posexp.commands", "posexp.reporting", "posexp.analysis", "posexp.training",
                      "posexp.evaluation", "posexp.commands.validation", "posexp.model.gpt", "posexp.cli")),
    ("posexp.plots.accuracy", ("torch", "posexp.reporting", "posexp.evaluation")),
    ("posexp.training", ("posexp.commands", "posexp.reporting", "posexp.analysis", "posexp.evaluation",
                         "posexp.cli")),
    ("posexp.evaluation", ("posexp.commands", "posexp.reporting", "posexp.analysis", "posexp.cli",
                           "posexp.commands.validation")),
    ("posexp.commands", ("posexp.analysis", "posexp.cli.app")),
    # the trackers hear about a run from the commands; they know results rows and run folders, not the domain
    ("posexp.tracking", ("posexp.commands", "posexp.training", "posexp.evaluation", "posexp.reporting",
                         "posexp.analysis", "posexp.cli", "posexp.model.gpt", "posexp.model.factory", "posexp.commands.validation",
                         "posexp.data", "posexp.encoders")),
    ("posexp.commands.validation", ("posexp.commands", "posexp.reporting", "posexp.analysis", "posexp.cli")),
    ("posexp.model.factory", ("posexp.commands", "posexp.reporting", "posexp.analysis", "posexp.commands.validation")),
])
def test_each_layer_imports_only_what_sits_below_it(layer, forbidden):
    assert not _offending(_under(layer), forbidden)


def test_nothing_imports_analysis_but_the_cli():
    users = [m for m in MODULES if not m.startswith("posexp.analysis")
             and any(t.startswith("posexp.analysis") for t in _imports(m))]
    assert users and all(m.startswith("posexp.cli.") for m in users), users


def test_nothing_but_the_entry_point_imports_the_cli():
    """The commands included: what they share with the command line (did-you-mean, override quoting) sits
    below both."""
    users = [m for m in MODULES if not m.startswith("posexp.cli") and m != "posexp.__main__"
             and any(t == "posexp.cli" or t.startswith("posexp.cli.") for t in _imports(m))]
    assert not users


def test_no_import_cycles():
    graph = {m: {t for t in _imports(m) if t in MODULES} for m in MODULES}
    # a cycle is a module that reaches itself
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])


def _subpackage(module: str) -> str:
    """``posexp.runs.layout`` -> ``runs``; a module at the top (``posexp.errors``) is a node of its own."""
    return module.split(".")[1] if "." in module else module


def _subpackage_arrows() -> dict[tuple[str, str], list[str]]:
    """Every arrow between two subpackages, with the module imports behind it (function-level ones included)."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for m in MODULES:
        for t in _imports(m):
            if t in MODULES and _subpackage(t) != _subpackage(m):
                arrows.setdefault((_subpackage(m), _subpackage(t)), []).append(f"{m} -> {t}")
    return arrows


def _circles(arrows) -> list[frozenset[str]]:
    """The sets of subpackages that reach one another (strongly connected, more than one member)."""
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {node: reach(node) for node in graph}
    circles = {frozenset({n} | {m for m in reached[n] if n in reached.get(m, set())}) for n in graph}
    return sorted((c for c in circles if len(c) > 1), key=sorted)


# No circle is left: the rendering of a run's results moved above runs/, plots/ and evaluation/ (posexp.rendering).
KNOWN_CIRCLES: list[frozenset] = []


def test_the_subpackages_point_down_with_function_level_imports_counted():
    """Drawn by subpackage, the arrows form no circle but the known one; a new circle names its arrows, and a
    circle broken must leave :data:`KNOWN_CIRCLES` too."""
    arrows = _subpackage_arrows()
    found = _circles(arrows)
    detail = {" ".join(sorted(c)): [f"{a} -> {b}: {', '.join(v)}" for (a, b), v in sorted(arrows.items())
                                    if a in c and b in c] for c in found if c not in KNOWN_CIRCLES}
    assert not detail, f"subpackages in a circle: {detail}"
    assert found == KNOWN_CIRCLES, f"a known circle is gone: take it out of KNOWN_CIRCLES ({found})"


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60  # from its def to its last line, the docstring counted


def _code_lines(node: ast.AST) -> int:
    """A function's lines, from its ``def`` to its last line: the docstring counts, so documenting each argument
    (Google style) keeps the code it documents short."""
    return node.end_lineno - node.lineno + 1


def test_modules_and_functions_stay_readable():
    long_modules = {m: n for m, f in MODULES.items() if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES}
    long_functions = {}
    for m, f in MODULES.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > MAX_FUNCTION_LINES:
                long_functions[f"{m}.{node.name}"] = _code_lines(node)
    assert not long_modules, f"over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"over {MAX_FUNCTION_LINES} lines: {long_functions}"


MAX_PARAMETERS = 8  # self / cls not counted; *args and **kwargs count one each
# Functions that keep more, each with the reason it must. An encoder's __init__ keywords are its options: the registry
# makes the schema of configs/encoder/NAME.yaml from them (posexp.encoders.options_schema) and create(name, **options)
# passes them, for built-in and plugin encoders alike, so an encoder with seven options takes them one by one.
MORE_PARAMETERS = {
    "posexp.encoders.sinusoidal.Sinusoidal.__init__": "its options are its config keys (the encoder contract)",
    "posexp.encoders.irope.IRoPE.__init__": "its options are its config keys (the encoder contract)",
}


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    bound = bool(names) and names[0] in ("self", "cls")
    return len(names) - bound + (a.vararg is not None) + (a.kwarg is not None)


def _functions(node: ast.AST, prefix: str):
    """``(qualified name, def)`` of every function under ``node``: methods as ``module.Class.name``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}.{child.name}", child
            yield from _functions(child, f"{prefix}.{child.name}")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}.{child.name}")
        else:
            yield from _functions(child, prefix)


def test_functions_take_few_parameters_outside_the_cli():
    """Functions take the typed config objects they need (Config, TrainConfig, ReportOptions, ...), not their
    fields one by one; only the CLI's commands, whose parameters are the options a user types, take more."""
    over = {}
    for m, f in MODULES.items():
        if m == "posexp.cli" or m.startswith("posexp.cli."):
            continue
        for name, node in _functions(ast.parse(f.read_text()), m):
            if (n := _parameters(node)) > MAX_PARAMETERS:
                over[name] = n
    assert not over.keys() - MORE_PARAMETERS.keys(), \
        f"over {MAX_PARAMETERS} parameters: { {k: v for k, v in over.items() if k not in MORE_PARAMETERS} }"
    assert not MORE_PARAMETERS.keys() - over.keys(), \
        f"no longer over {MAX_PARAMETERS} parameters (take them off MORE_PARAMETERS): {MORE_PARAMETERS.keys() - over.keys()}"


def test_every_subpackage_ships_in_the_wheel():
    """pyproject's explicit package list: a folder left out installs everywhere but in an editable checkout."""
    import tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(("posexp",) + d.relative_to(PKG).parts) for d in PKG.rglob("*")
               if d.is_dir() and (d / "__init__.py").is_file()}
    assert folders <= listed, f"add to [tool.setuptools] packages: {sorted(folders - listed)}"


def test_the_keys_of_a_result_row_are_listed_in_one_place():
    """posexp/runs/row.py declares what identifies a result row; a second hand-written list of those keys
    (a tuple or list naming protocol, stride, last_k and scaling) anywhere else drifts from it."""
    key = {"protocol", "stride", "last_k", "scaling"}
    found = []
    for name, path in MODULES.items():
        if name == "posexp.runs.row":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if key <= names:
                    found.append(f"{name}:{node.lineno}")
    assert not found, f"a second list of the row key: {found}; take it from posexp.runs.row"


def test_reporting_modules_import_no_private_names_from_one_another():
    """What one module of reporting/ offers another is public: no ``from .x import _name`` inside the package."""
    found = []
    for name, path in MODULES.items():
        if not name.startswith("posexp.reporting"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("posexp.reporting"):
                found += [f"{name} <- {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not found, found


def test_every_name_a_module_exports_is_there():
    """lm_report's ``__all__`` still named ``compare`` after it became ``group_and_compare``: ``from
    posexp.reporting.lm_report import *`` raised AttributeError."""
    import importlib
    import pkgutil

    import posexp

    missing = []
    for info in pkgutil.walk_packages(posexp.__path__, "posexp."):
        module = importlib.import_module(info.name)
        missing += [f"{info.name}.{name}" for name in getattr(module, "__all__", []) if not hasattr(module, name)]
    assert not missing, missing
