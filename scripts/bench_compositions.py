"""How often a posexp command has Hydra compose its config, beside a plain ``@hydra.main`` app on the same config and
command line (whose job does nothing).

Counted are the loads of posexp's schema (``posexp_schema``) from Hydra's ConfigStore, which every composition of
posexp's configs makes (a sweep job's, twice). Hydra itself composes a run twice (to learn its mode, then the run)
and a sweep once more per job. posexp composes nothing of a single run or analysis ahead of Hydra; a sweep's
covering subset of jobs (one per swept value) is composed ahead, so that a typo in any value trains nothing.

    python scripts/bench_compositions.py            # a markdown table: command, plain app, posexp
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

TINY = ["experiment=smoke", "train.steps=2", "eval.multiples=[1]", "eval.tokens=256", "train.threads=1",
        "precision=fp32", "train.progress=false"]
CASES = [  # (the posexp command, its Hydra app's config, the arguments)
    ("train", "config", TINY),
    ("analyze", "analyze", ["encoder=rope", "train_len=32", "analyze.length=64", "analyze.figures=false"]),
    ("train -m", "config", ["-m", "encoder=rope,alibi", "base=100,1000", *TINY]),
]


@contextlib.contextmanager
def counted() -> Iterator[List[str]]:
    """Inside, each load of posexp's schema from Hydra's ConfigStore is appended to the list yielded."""
    from hydra.core.config_store import ConfigStore

    loads: List[str] = []
    original = ConfigStore.load

    def load(self, config_path: str):
        if config_path.startswith("posexp_schema"):
            loads.append(config_path)
        return original(self, config_path)

    ConfigStore.load = load  # type: ignore[method-assign]
    try:
        yield loads
    finally:
        ConfigStore.load = original  # type: ignore[method-assign]


def plain_app(config_name: str, args: List[str]) -> int:
    """Compositions of a plain ``@hydra.main`` app on posexp's configs, its job doing nothing."""
    import hydra

    from posexp.config.schema import config_dir

    app = hydra.main(version_base="1.3", config_path=str(config_dir()), config_name=config_name)(lambda cfg: None)
    saved = sys.argv
    sys.argv = ["plain", *args, "hydra.run.dir=plain", "hydra.sweep.dir=plain"]
    with counted() as loads:
        try:
            app()
        finally:
            sys.argv = saved
    return len(loads)


def posexp_command(command: str, args: List[str]) -> int:
    """Compositions of the posexp command, run to the end."""
    from typer.testing import CliRunner

    from posexp.cli.app import app

    with counted() as loads:
        result = CliRunner().invoke(app, [command.split()[0], *args, "hydra.run.dir=ours", "hydra.sweep.dir=ours"])
    if result.exit_code != 0:
        raise SystemExit(f"posexp {command} failed: {result.output[-2000:]}")
    return len(loads)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    from posexp.analysis.schema import register_schema
    from posexp.commands.validation import register_configs

    register_configs()
    register_schema()
    print("| command | plain @hydra.main app | posexp |\n|---|---:|---:|")
    for command, config_name, args in CASES:
        with tempfile.TemporaryDirectory() as folder:
            here = os.getcwd()
            os.chdir(folder)
            try:
                plain, ours = plain_app(config_name, args), posexp_command(command, args)
            finally:
                os.chdir(here)
        shown = " ".join([command.split()[0], *(a for a in args if a not in TINY)])
        print(f"| `posexp {shown}` (tiny) | {plain} | {ours} |", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
