"""The type checker is part of the test command: mypy, configured in pyproject.toml, passes on the package, and
is strict enough to refuse the raw Hydra config where a command's typed config is expected."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import REPO

ROOT = REPO


def _mypy(*args: str) -> SimpleNamespace:
    """mypy as ``python -m mypy`` runs it from the repository root, through its own in-process API."""
    # mypy is in the test extra, so a missing one is a broken install: the tests fail saying so, never skip
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[test]' (the test extra has it)", pytrace=False)
    from mypy import api

    here = os.getcwd()
    os.chdir(ROOT)
    try:
        stdout, stderr, returncode = api.run(["--config-file", str(ROOT / "pyproject.toml"), *args])
    finally:
        os.chdir(here)
    return SimpleNamespace(stdout=stdout, stderr=stderr, returncode=returncode)


def test_the_package_type_checks():
    done = _mypy()
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_raw_hydra_config_where_the_typed_one_is_annotated_is_refused(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from omegaconf import OmegaConf\n"
                     "from posexp.model.factory import build_model\n"
                     "from posexp.data.corpus import tokenizer_spec\n"
                     "def run() -> None:\n"
                     "    cfg = OmegaConf.create({})\n"
                     "    build_model(cfg, 256)\n"
                     "    tokenizer_spec(cfg)\n")
    done = _mypy(str(probe))
    assert done.returncode == 1
    assert done.stdout.count('incompatible type "DictConfig"; expected "Config"') == 2, done.stdout


def test_a_missing_mypy_fails_the_type_tests_instead_of_skipping_them(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mypy" else find_spec(name, *a))
    with pytest.raises(pytest.fail.Exception, match="mypy is not installed"):
        _mypy()
