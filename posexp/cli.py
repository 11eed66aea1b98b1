"""The ``posexp`` command.

``posexp train`` is Hydra's own application: its arguments go to the
``@hydra.main`` function unchanged, so ``-m``, ``--cfg job``, ``--help``,
``hydra/launcher=...`` and sweepers behave as Hydra documents them.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import List, Optional

import hydra
import typer
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from posexp.config import config_dir, register_configs
from posexp.errors import PosexpError, TrainingDiverged, TrainingInterrupted

CONFIG_DIR = config_dir()
GROUPS = ("encoder", "data", "model", "train", "eval", "experiment")
TOP_KEYS = ("base=", "train_len=", "seed=")

register_configs()
err_console = Console(stderr=True)
# Sweep jobs that failed in this process (Hydra's basic launcher runs jobs in-process), for the exit code.
_failed_jobs: list[str] = []


def _fail(error: PosexpError) -> None:
    # soft_wrap: one line however long, for the terminal to wrap and for scripts to grep
    err_console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
    raise SystemExit(error.exit_code)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def _train_app(cfg: DictConfig) -> None:
    from posexp.run import run_train

    hc = HydraConfig.get()
    run_dir, overrides = Path(hc.runtime.output_dir), list(hc.overrides.task)
    try:
        run_train(cfg, run_dir, overrides)
    except TrainingInterrupted as e:
        _fail(e)  # stops a sweep too: the user asked to stop
    except PosexpError as e:
        if hc.mode != RunMode.MULTIRUN:
            _fail(e)
        _record_failed_job(cfg, run_dir, overrides, e)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise SystemExit(130)
    except Exception as e:
        if hc.mode != RunMode.MULTIRUN:
            raise
        logging.getLogger(__name__).exception("sweep job %s failed", run_dir)  # the traceback goes to train.log
        _record_failed_job(cfg, run_dir, overrides, e)


def _record_failed_job(cfg: DictConfig, run_dir: Path, overrides: List[str], error: Exception) -> None:
    """Keep a sweep going past a failed job, which leaves a results.json with status "failed" (or "diverged")."""
    from posexp.run import write_run_status

    if not isinstance(error, TrainingDiverged):  # a diverged run has written its own
        try:
            write_run_status(run_dir, cfg, overrides, "failed", error)
        except OSError as e:
            err_console.print(f"could not record the failure in {run_dir}: {e}", highlight=False)
    err_console.print(f"[bold red]error:[/] sweep job {run_dir} failed: {escape(str(error))}", highlight=False,
                      soft_wrap=True)
    _failed_jobs.append(str(run_dir))


def _run_hydra(app, prog: str, args: List[str]) -> None:
    """Call a ``@hydra.main`` function as if ``prog args...`` had been typed."""
    saved = sys.argv
    sys.argv = [prog, *args]
    try:
        app()
    finally:
        sys.argv = saved


def _options(group: str) -> list[str]:
    folder = CONFIG_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def complete_overrides(incomplete: str) -> list[str]:
    """Shell completion for ``posexp train``: config groups, their options and the top-level keys."""
    if "=" in incomplete:
        key, _, prefix = incomplete.partition("=")
        if key in GROUPS:
            return [f"{key}={o}" for o in _options(key) if o.startswith(prefix)]
        return []
    words = [f"{g}=" for g in GROUPS] + list(TOP_KEYS) + ["-m", "--cfg", "--help"]
    return [w for w in words if w.startswith(incomplete)]


app = typer.Typer(
    name="posexp",
    help="Experiments with positional encodings: train a small causal LM per encoding, measure perplexity "
         "at 1x..16x the training length, compare runs.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

HYDRA_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command(context_settings=HYDRA_PASSTHROUGH)
def train(
    overrides: Optional[List[str]] = typer.Argument(
        None, help="Hydra overrides, e.g. encoder=rope base=10000; -m to sweep; --help for Hydra's help.",
        autocompletion=complete_overrides, show_default=False),
) -> None:
    """Train one model per configuration and evaluate it at several context lengths (a Hydra app)."""
    _failed_jobs.clear()
    _run_hydra(_train_app, "posexp train", list(overrides or []))
    if _failed_jobs:
        err_console.print(f"[bold red]error:[/] {len(_failed_jobs)} sweep job(s) failed: {', '.join(_failed_jobs)}; "
                          "each has a results.json with the reason, the other jobs' results are kept",
                          highlight=False, soft_wrap=True)
        raise SystemExit(1)


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="The run folder of a killed or interrupted posexp train run.",
                                   show_default=False, metavar="RUN_DIR"),
) -> None:
    """Continue a killed or interrupted run from its last checkpoint, in the same folder, to the same results."""
    from posexp.resume import resume_main

    try:
        resume_main(run_dir)
    except PosexpError as e:
        _fail(e)
    except KeyboardInterrupt:
        err_console.print(f"interrupted; continue with: posexp resume {run_dir}")
        raise SystemExit(130)


@app.command()
def report(
    folders: List[Path] = typer.Argument(..., help="Run folders or sweep folders (searched recursively)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write summary.md/csv/png."),
) -> None:
    """Compare finished runs: one table, summary.md, summary.csv and an overlay plot."""
    from posexp.report import report_main

    try:
        report_main([str(f) for f in folders], str(out) if out else None)
    except PosexpError as e:
        _fail(e)


@app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_cmd(
    args: List[str] = typer.Argument(
        ..., help="Run folders (or sweep folders: every run under them), then eval.* overrides, e.g. "
                  "eval.lengths=[256,1024,8192] eval.protocol=last_k eval.last_k=64 eval.scaling=yarn.",
        show_default=False, metavar="RUN_DIR|eval.KEY=VALUE"),
) -> None:
    """Evaluate trained runs again (new lengths, protocols, context-extension scalings) without retraining.

    New rows join each run's results.json (a re-measured row replaces its old one); the other outputs are redrawn.
    """
    from posexp.reeval import reeval_main

    try:
        reeval_main(list(args))
    except PosexpError as e:
        _fail(e)
    except KeyboardInterrupt:
        err_console.print("interrupted; results of runs not yet finished were left as they were")
        raise SystemExit(130)


def _yaml_description(path: Path) -> str:
    """A config's ``description`` key, else its first comment line that is not a Hydra directive."""
    from omegaconf import OmegaConf

    desc = OmegaConf.load(path).get("description")
    if desc:
        return str(desc)
    for line in path.read_text().splitlines():
        if line.startswith("#") and "@package" not in line:
            return line.lstrip("# ").strip()
    return ""


@app.command("list")
def list_cmd() -> None:
    """What you can choose: encoders (with their options), data sets and experiments."""
    from rich.table import Table

    from posexp.encoders import option_names, registry

    console = Console()
    reg = registry()
    table = Table(title="encoders  (posexp train encoder=NAME)")
    table.add_column("name", style="cyan")
    table.add_column("what it is")
    table.add_column("options")
    for name in _options("encoder"):
        cls = reg.get(name)
        desc = cls.description if cls is not None and cls.description else _yaml_description(
            CONFIG_DIR / "encoder" / f"{name}.yaml")
        opts = ", ".join(option_names(name)) if cls is not None else ""
        table.add_row(name, desc, opts or "—")
    console.print(table)
    for group, title in (("data", "data sets  (posexp train data=NAME)"),
                         ("experiment", "experiments  (posexp train experiment=NAME)")):
        t = Table(title=title)
        t.add_column("name", style="cyan")
        t.add_column("what it is")
        for name in _options(group):
            t.add_row(name, _yaml_description(CONFIG_DIR / group / f"{name}.yaml"))
        console.print(t)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
