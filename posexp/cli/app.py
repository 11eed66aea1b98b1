"""The ``posexp`` command.

``posexp train`` is Hydra's own application: its arguments go to Hydra's runner unchanged, so ``-m``,
``--cfg job``, ``--help``, ``hydra/launcher=...`` and sweepers behave as Hydra documents them.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import io
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import typer
from rich.markup import escape

from posexp.analysis.schema import register_analyze_schema
from posexp.cli import hydra_flags, shell
from posexp.cli.hydra_flags import APPS
from posexp.cli.arguments import (COMPOSITION_ERRORS, OverrideError, check_command_line, expand_home, explain,
                                  full_error_requested, print_key_table, quote_non_ascii)
from posexp.cli.console import console, fail, say
from posexp.cli.folders import Carried, Claim, claiming
from posexp.cli.jobs import analyze_task, run_task
from posexp.cli.options import HELP, ROOT, argument, arguments, option, options
from posexp.commands.finetune import CONFIG_NAME
from posexp.commands.listing import print_choices
from posexp.commands.sweeps import check_plugins, sweep_progress, unique
from posexp.errors import PosexpError, Terminated, TrainingInterrupted
from posexp.reporting import ReportOptions, report_main
from posexp.runs.layout import is_run_dir, is_sweep_dir
from posexp.runs.lock import OVERWRITE_FLAG, discard_unused, unlock_run

# What a command runs imports torch (`import posexp.cli.app` took 1.9 s with those modules at the top, 0.26 s without):
# they are imported inside the command that needs them, so that `posexp --help` and `posexp report` start without it.


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """A :class:`PosexpError`, or a path the system refuses (too long, a symlink loop, read-only, full), said in one
    line with its exit status, not as a traceback."""
    try:
        yield
    except PosexpError as e:
        fail(e)
    except OSError as e:
        if e.errno not in SYSTEM_REFUSALS or full_error_requested():
            raise
        fail(PosexpError(f"{e.strerror}: {e.filename}" if e.filename else str(e)))


class _OneLineErrors(typer.core.TyperGroup):
    """Every command's errors said in one line (:func:`_one_line`), its options' (``--install-completion``) too."""

    def make_context(self, *args, **kwargs):
        with _one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _one_line():
            return super().invoke(ctx)


# what the file system refuses for a path the user gave or a folder posexp writes in: said in one line
SYSTEM_REFUSALS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM,
                             errno.EDQUOT, errno.ENOTDIR})

app = typer.Typer(
    name="posexp",
    cls=_OneLineErrors,
    help="Experiments with positional encodings: train a small causal LM per encoding, measure perplexity "
         "at 1x..16x the training length, compare runs.",
    no_args_is_help=True,
    add_completion=False,  # posexp's own completion (posexp.cli.shell): Typer's would load torch at every TAB
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

HYDRA_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _command(name: str, **settings: Any) -> Callable[[Any], Any]:
    """Register a function as subcommand ``name``, typed as its signature says; each parameter is the argument or
    option of that name :mod:`posexp.cli.options` declares for it (``--allow-changed-encoder``:
    ``allow_changed_encoder``)."""
    declared = {a.name: argument(name, a.name) for a in arguments(name)}
    declared.update({o.names[0].lstrip("-").replace("-", "_"): option(name, o.names[0]) for o in options(name)})

    def register(run: Any) -> Any:
        signature = inspect.signature(run, eval_str=True)
        run.__signature__ = signature.replace(parameters=[p.replace(default=declared[p.name])
                                                          for p in signature.parameters.values()])
        return app.command(name, **settings)(run)

    return register


@app.callback()
def _root(
    install_completion: bool = option(ROOT, "--install-completion", is_eager=True, expose_value=False,
                                      callback=shell.install_completion_option),
    show_completion: bool = option(ROOT, "--show-completion", is_eager=True, expose_value=False,
                                   callback=shell.show_completion_option),
) -> None:
    pass


@_command("train", context_settings=HYDRA_PASSTHROUGH)
def train(overrides: Optional[List[str]]) -> None:
    """Train one model per configuration and evaluate it at several context lengths (a Hydra app).

    A new run gets a folder of its own; one that holds a run is refused unless --overwrite is given.
    """
    _launch("config", overrides or [])


@_command("finetune", context_settings=HYDRA_PASSTHROUGH)
def finetune(args: Optional[List[str]]) -> None:
    """Extend a finished run's context: fine-tune it at a longer train_len, its positions scaled (a Hydra app).

    scaling=none (direct fine-tuning), linear (position interpolation), ntk, dynamic_ntk, yarn or llama3;
    the new run records its parent, and evaluates at multiples of the new length.
    """
    _launch(CONFIG_NAME, args or [])


def _launch(config_name: str, args: List[str], folders: bool = False) -> None:
    """Run the Hydra app of ``config_name`` on the command's arguments: Hydra's ``-sc install=bash`` prints posexp's
    completion script; else the command line is checked, then Hydra runs, which checks each job's config and
    claims the run (or sweep) folder (:class:`~posexp.cli.folders.ClaimFolder`).

    ``folders``: the command also takes run folders (``posexp analyze``), for the message of a missing one.
    """
    script = shell.hydra_request(args)  # -sc install=bash, Hydra's way to set up completion: for every subcommand
    if script is not None:
        print(script, end="")
        return
    args = quote_non_ascii(expand_home(APPS[config_name].hydra_arguments(args)))
    overwrite = OVERWRITE_FLAG in args
    args = [a for a in args if a != OVERWRITE_FLAG]  # Hydra's parser knows no --overwrite
    line = hydra_flags.read(args)
    check_plugins(args)
    # the user's config folders: their encoders imported before the schemas are stored with Hydra
    dirs = hydra_flags.user_config_dirs(args) if line is not None else []
    register_analyze_schema()
    try:
        if line is not None:
            check_command_line(line, dirs, folders)
    except OverrideError as e:
        if not (e.hydra_reports and full_error_requested()):  # asked for in full: Hydra reports what it knows
            raise
    from posexp.training import distributed

    # under torchrun, ranks other than 0 run Hydra without writing anything (posexp/training/distributed.py)
    with distributed.worker_overrides() as quiet:
        try:
            with contextlib.nullcontext(None) if quiet else claiming(overwrite) as claim:
                _run_claimed(claim, config_name, [*args, *quiet])
        finally:
            unlock_run()
            distributed.shutdown()
    failed = unique(claim.failed) if claim is not None else []
    if failed and distributed.is_main():
        say(f"{len(failed)} sweep job(s) failed: {', '.join(failed)}; each has a results.json with the reason, the "
            "other jobs' results are kept", error=True)
        raise SystemExit(1)


def _run_hydra(config_name: str, args: List[str], claim: Optional[Claim]) -> None:
    """Run the Hydra app of ``config_name`` as if its command line ``args`` had been typed. A config Hydra cannot
    compose is said in one line (:func:`~posexp.cli.arguments.explain`), Hydra's own report held back
    until then; an error of a job or callback is said by the command. ``--help`` / ``-h`` print Hydra's help, then
    the table of the main keys."""
    held = hydra_flags.HeldStream(sys.stderr)
    if claim is not None:
        claim.held = held
    try:
        with contextlib.redirect_stderr(held) if claim is not None else contextlib.nullcontext():
            hydra_flags.run_app(run_task if APPS[config_name].run else analyze_task, config_name, args)
    except Carried as e:
        if isinstance(e.error, PosexpError):
            fail(e.error)  # as a SystemExit: the run's folder is let go (_run_claimed)
        raise e.error
    except SystemExit as e:
        composing = e.__context__  # Hydra exits while handling the error that stopped it (run_and_report)
        if e.code == 1 and held.holding and isinstance(composing, COMPOSITION_ERRORS) and not full_error_requested():
            held.discard()
            fail(explain(composing))
        if not e.code and any(a in HELP for a in args):
            print_key_table(config_name)
        raise
    finally:
        held.release()


def _run_claimed(claim: Optional[Claim], config_name: str, args: List[str]) -> None:
    """Run Hydra, which claims the folder (:class:`~posexp.cli.folders.ClaimFolder`); a run that never started
    leaves no folder, an interrupted sweep says where it stands."""
    sweep = claim is not None and any(a in ("-m", "--multirun") for a in args)
    previous = signal.getsignal(signal.SIGTERM)
    # SIGTERM outside training steps (the trainer checkpoints on its own) acts as Ctrl-C: says what was done, what next
    signal.signal(signal.SIGTERM, _terminate if sweep else _terminate_run)
    try:
        _run_hydra(config_name, args, claim)
    except (SystemExit, KeyboardInterrupt) as e:
        code = 130 if isinstance(e, KeyboardInterrupt) else e.code
        path = claim.path if claim is not None else None
        stopped = isinstance(e, KeyboardInterrupt)  # before the job began: nothing of it is kept
        if path is not None and not claim.multirun and (stopped or code == PosexpError.exit_code):
            discard_unused(path, claim.created)
            if stopped and not path.exists():
                say(f"interrupted before the run started; {path} was not kept")
        if path is not None and claim.multirun and code in (130, 128 + signal.SIGTERM):
            name = signal.Signals(code - 128).name if code > 128 else "SIGINT"
            say(f"sweep {path} stopped by {name}: {sweep_progress(path, claim.jobs)}", error=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _terminate_run(signum, frame) -> None:
    raise Terminated(signum)


@_command("resume")
def resume(run_dir: Path, allow_changed_encoder: bool) -> None:
    """Continue a killed or interrupted run from its last checkpoint, in the same folder, to the same results."""
    from posexp.runtime.device import world
    from posexp.commands.resume import resume_main

    if world().distributed and is_sweep_dir(run_dir):
        raise PosexpError("posexp resume of a sweep runs in one process; start it without torchrun, or resume "
                          "its runs one by one under torchrun")
    try:
        if is_sweep_dir(run_dir):  # a stopped sweep: its interrupted jobs resumed, those never started trained
            from posexp.commands.sweep_resume import finish_sweep

            return finish_sweep(run_dir, say, allow_changed_encoder)
        resume_main(run_dir, console(), allow_changed_encoder=allow_changed_encoder)
    except KeyboardInterrupt:
        say(f"interrupted; continue with: posexp resume {run_dir}")
        raise SystemExit(130)


@_command("report")
def report(folders: List[Path], out: Optional[Path], by: Optional[List[str]], metric: Optional[List[str]],
           tolerance: float, sort: Optional[str], where: Optional[List[str]], format: str, strict: bool,
           baseline: Optional[List[str]], view: Optional[List[str]], margin: Optional[str],
           cols: Optional[List[str]]) -> None:
    """Compare finished runs: a table (grouped with --by), report.md with figures, summary.md and summary.csv.

    A run whose results.json cannot be read (not JSON, cut short, wrong shape, unreadable) is left out with a
    one-line warning naming it and the others are reported (exit status 0); with --strict it stops the report
    (exit status 2).
    """
    from posexp.commands.sweep_resume import unstarted_jobs

    report_main([str(f) for f in folders], str(out) if out else None, console=console(),
                options=ReportOptions(by=by, metrics=metric, tolerance=tolerance, where=where, sort=sort, fmt=format,
                                      strict=strict, baseline=baseline, view=view, margin=margin, cols=cols),
                sweep_notes=unstarted_jobs(folders))


@_command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_cmd(args: List[str], strict: bool, allow_changed_encoder: bool) -> None:
    """Evaluate trained runs again (new lengths, protocols, context-extension scalings) without retraining.

    New rows join each run's results.json (a re-measured row replaces its old one); the other outputs are redrawn.
    A run whose results.json cannot be read is skipped with a one-line warning naming it and the others are
    evaluated (exit status 0); with --strict nothing is evaluated (exit status 2).
    """
    from posexp.commands.eval import reeval_main

    if any(a.startswith(("hf:", "hf.model=")) for a in args):  # a pretrained model: a new run, as posexp train's
        return _launch("pretrained", args)
    try:
        reeval_main(list(args), console(), strict=strict, allow_changed_encoder=allow_changed_encoder)
    except KeyboardInterrupt:
        say("interrupted; results of runs not yet finished were left as they were")
        raise SystemExit(130)


@_command("analyze", context_settings=HYDRA_PASSTHROUGH)
def analyze(overrides: Optional[List[str]]) -> None:
    """The geometry of an encoding without training (a Hydra app), or of a trained run's encoding and attention.

    Writes PNGs and analysis.json: to the Hydra run dir, or to RUN_DIR/analysis/ for a trained run.
    """
    from posexp.analysis.attention import analyze_runs_main

    args = quote_non_ascii(expand_home(overrides or []))
    # run folders; Hydra overrides are not folders, nor is the user's config folder (--config-dir DIR)
    named = [a for i, a in enumerate(args) if not (i and args[i - 1] in ("--config-dir", "-cd"))]
    if any(is_run_dir(a, needs_weights=True) or Path(a).is_dir() for a in named):
        analyze_runs_main(args, console())
    else:
        _launch("analyze", args, folders=True)


@_command("check")
def check_cmd(encoder: str, options: Optional[List[str]], format: str, config_dir: Optional[Path]) -> None:
    """Hold an encoding to the encoder contract in a small random model: causality, positions, length, memory,
    scalings, precision, speed. No training, seconds on a CPU; exit status 1 when a check fails (or the encoder
    cannot be built), 3 when none fails but one could not measure (out of memory)."""
    from posexp.commands.check import check_main

    raise SystemExit(check_main(encoder, list(options or []), format, console(), dirs=_config_dirs(config_dir)))


@_command("list")
def list_cmd(config_dir: Optional[Path]) -> None:
    """What you can choose: encoders (with their options and where each comes from), model sizes, data sets,
    tokenizers, tasks, experiment trackers and experiments."""
    print_choices(console(), _config_dirs(config_dir))  # the encoders of the user's folder listed too


def _config_dirs(config_dir: Optional[Path]) -> list:
    """A ``--config-dir`` option's folder, checked as Hydra's flag is, its encoders imported
    (:func:`~posexp.cli.hydra_flags.user_config_dirs`)."""
    return hydra_flags.user_config_dirs(["--config-dir", str(config_dir)] if config_dir else [])


@_command("export")
def export(run_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Write a trained run as a transformers model folder (learned, rope and alibi runs).

    OUT_DIR gets config.json, model.safetensors, the tokenizer files (byte or bpe: the run's token ids) and
    posexp_export.json. AutoModelForCausalLM.from_pretrained(OUT_DIR) loads it with no remote code and gives the
    run's logits (fp32; checked while exporting). learned -> GPT-2; rope -> GPT-NeoX (exponential schedule);
    alibi -> MPT (a run trained with model.norm_bias=false). Other encodings are refused. Needs transformers:
    the hf extra of posexp's install.
    """
    from posexp.commands.export import export_run

    done = export_run(run_dir, out_dir, overwrite=overwrite)
    console().print(f"exported {escape(str(run_dir))} to {escape(str(done.folder))}: {escape(done.description)}; "
                    f"max |logit difference| {done.max_abs_diff:.2g} (fp32, lengths "
                    f"{', '.join(map(str, done.checked_lengths))})", highlight=False, soft_wrap=True)


@_command("search")
def search_cmd(target: str, overrides: Optional[List[str]], target_len: int, out: Optional[Path], objective: str,
               tokens: int, needles: int, population: int, generations: int, parents: int, seed: int,
               start: Optional[int], restart: bool) -> None:
    """Search LongRoPE's per-frequency rescale factors and n^ for a run or a transformers model (Ding et al. 2024;
    --objective needle: LongRoPE2, Shang et al. 2025). Resumable: stopped, the same command continues. Writes
    factors.json, which eval.longrope_file= and finetune's longrope_file= read."""
    from posexp.commands.search import SearchOptions, search_main
    from posexp.evaluation.longrope_search import SearchSettings

    settings = SearchSettings(population=population, generations=generations, parents=parents, seed=seed, start=start)
    try:
        search_main(target, target_len, SearchOptions(out, objective, tokens, needles, settings, restart,
                                                      tuple(overrides or ())))
    except KeyboardInterrupt:
        fail(TrainingInterrupted("stopped; the scores so far are kept: run the same command to continue", 130))


def _usable_streams() -> None:
    """Streams that never stop a run. An output encoding that cannot write posexp's "·" or "×"
    (``PYTHONIOENCODING=ascii``) raised in the middle of a run: such characters are written as "?" instead."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="replace")
    # A log line that cannot be written (train.log on a full disk) is dropped, not printed as a "--- Logging
    # error ---" traceback per line: the write that matters fails next and says so in one line. The logging
    # module's documented setting for applications in use (Python docs, logging.raiseExceptions).
    logging.raiseExceptions = False


def main() -> None:
    """The app on streams that never stop a run (the ``posexp`` command is :func:`posexp.cli.main`)."""
    _usable_streams()
    with _typer_width():
        app()


@contextlib.contextmanager
def _typer_width() -> Iterator[None]:
    """Typer's own console (``--help``, usage errors) under COLUMNS=0 was zero characters wide and printed nothing:
    it gets the terminal's width, as :func:`posexp.runtime.terminal.console` does, for this call only."""
    from typer import rich_utils

    kept = rich_utils.MAX_WIDTH
    if kept is None and os.environ.get("COLUMNS") == "0":
        rich_utils.MAX_WIDTH = shutil.get_terminal_size().columns
    try:
        yield
    finally:
        rich_utils.MAX_WIDTH = kept


if __name__ == "__main__":
    main()
