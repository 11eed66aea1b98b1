"""``posexp eval RUN_DIR... [eval.KEY=VALUE ...]``: evaluate trained runs again, without retraining.

For each run (a folder with ``results.json`` and ``checkpoint/model.safetensors``;
a sweep folder stands for every run under it) this reloads the config the run
was trained with (``.hydra/config.yaml``), applies the ``eval.*`` overrides (and
nothing else: the weights were trained with the rest), loads the weights with
safetensors (no pickle), evaluates, and merges the new rows into
``results.json``: a row with the same length, protocol, stride / K, scaling and
factor replaces the old one, every other earlier row is kept. Then
``results.csv``/``.md``/``ppl_vs_length.png`` and ``loss_by_position.*`` are
rewritten, ``results.json`` last.

Everything that can be checked is checked for every run before any run is
evaluated, so bad input leaves every ``results.json`` as it was. A run whose
``results.json`` cannot be read is the exception: it is skipped with a warning
naming it and the other runs are evaluated (``--strict``: nothing is).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.text import Text

from posexp.commands.edge import SavedConfig, folder_run_hash, read_saved_config, typed
from posexp.commands.encoder_source import check_encoder_source
from posexp.commands.finetune import parent_changed
from posexp.config.schema import Config, EvalConfig, eval_lengths, is_task
from posexp.commands.validation import validate
from posexp.commands.evaluator import check_key_tokens, for_run
from posexp.commands.pretrained import hf_evaluator, pretrained_hint
from posexp.errors import ConfigError, PosexpError, TrainingInterrupted
from posexp.runs.atomic import DISK_FULL, unwritable
from posexp.runs.lock import EVALUATING, run_lock
from posexp.runs.layout import (ACCURACY_PLOT, CHECKPOINT, HYDRA_CONFIG, LOSS_BY_POSITION_CSV, LOSS_BY_POSITION_PNG,
                                PASSKEY_HEATMAP, PPL_PLOT, RESULTS_CSV, RESULTS_JSON, RESULTS_MD, SUMMARY_MD,
                                is_run_dir, merge_rows, natural_key, read_results, runs_under)

# what posexp eval may change; eval.during_training was measured while the run trained, and stays as it was
TRAINING_ONLY = "during_training"
EVAL_KEYS = tuple(f.name for f in dataclasses.fields(EvalConfig) if f.name != TRAINING_ONLY)
VALUE_HINTS = {
    "lengths": "a list of integers, e.g. eval.lengths=[256,1024,8192]",
    "multiples": "a list of integers, e.g. eval.multiples=[1,2,4,8,16,32]",
    "tokens": "an integer",
    "protocol": "one of nonoverlap, sliding, last_k",
    "stride": "an integer, e.g. eval.stride=64",
    "last_k": "an integer, e.g. eval.last_k=64",
    "scaling": "one of none, linear, ntk, dynamic_ntk, yarn, llama3, longrope, rerope",
    "scaling_factor": "a number >= 1, e.g. eval.scaling_factor=4, or null",
    "rerope_window": "an integer number of tokens, e.g. eval.rerope_window=64, or null",
    "longrope_factors": "a list of numbers > 0, one per rotary frequency, e.g. eval.longrope_factors=[1.0,1.5,...], or null",
    "window": "a positive integer number of keys, e.g. eval.window=128, or null",
    "sinks": "a positive integer number of tokens, e.g. eval.sinks=4, or null (needs eval.window)",
    "batch_tokens": "an integer",
    "loss_by_position": "true or false",
    "key_tokens.alpha": "a number of nats, e.g. eval.key_tokens.alpha=2", "key_tokens.beta": "a number of nats",
    "key_tokens.short_len": "an integer number of tokens, or null",
}
NESTED_KEYS = ("key_tokens",)  # eval groups set key by key: eval.key_tokens.evaluator=RUN
# Changing the first key without the second resets the second to its default:
# a stride belongs to the sliding protocol, a factor to the scaling it was given for, sinks to their window.
DEPENDENT_KEYS = {"protocol": ("stride", "last_k"), "scaling": ("scaling_factor", "rerope_window", "longrope_factors"), "multiples": ("lengths",),
                  "window": ("sinks",)}


# -- arguments -------------------------------------------------------------------------------

def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Run folders and ``key=value`` overrides, in the order given (an existing path is always a folder)."""
    folders, overrides = [], []
    for arg in args:
        if "=" in arg and not Path(arg).exists():
            overrides.append(arg)
        elif arg.startswith("eval.") and not Path(arg).exists():
            raise ConfigError(arg, f"an override needs a value, e.g. {arg}=...")
        else:
            folders.append(arg)
    return folders, overrides


def parse_eval_overrides(overrides: Sequence[str]) -> list[tuple[str, Any]]:
    """``[(key, value)]`` for ``eval.KEY=VALUE`` overrides, parsed with Hydra's override grammar.

    Raises:
        ConfigError: a key outside ``eval.``, an unknown ``eval`` key, a sweep, or bad syntax.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if not key.startswith("eval."):
            raise ConfigError(key, f"posexp eval changes evaluation settings only (eval.*): the weights were trained "
                                   f"with the rest of the config. To change {key}, train a new run: "
                                   f"posexp train ... {text}")
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as e:
            raise ConfigError(key, f"cannot parse {text!r}: {str(e).splitlines()[0]}") from None
        if ov.type != OverrideType.CHANGE:
            raise ConfigError(key, f"write it as a plain {key}=VALUE (no + or ~ prefix)")
        if ov.is_sweep_override():
            raise ConfigError(key, "posexp eval evaluates one setting at a time; run it once per value")
        name = key[len("eval."):]
        if name.split(".")[0] == TRAINING_ONLY:
            raise ConfigError(key, "is measured while a run trains (curve.csv); posexp eval evaluates the trained "
                                   f"weights only. To measure the curve, train a run with {text}")
        if name not in EVAL_KEYS and not (name.split(".")[0] in NESTED_KEYS and name.count(".") == 1):
            raise ConfigError(key, f"not an evaluation setting; choose one of: "
                                   f"{', '.join('eval.' + k for k in EVAL_KEYS)}")
        parsed.append((name, ov.value()))
    return parsed


def apply_eval_overrides(cfg: DictConfig, overrides: list[tuple[str, Any]]) -> DictConfig:
    """A copy of ``cfg`` whose ``eval`` group is the typed schema, the run's values, then the overrides."""
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[assignment]
    stored: dict = OmegaConf.to_container(cfg.get("eval") or OmegaConf.create({}))  # type: ignore[assignment]
    kept = (*EVAL_KEYS, TRAINING_ONLY)  # the run's curve settings stay in the config it records
    ev: Any = OmegaConf.merge(OmegaConf.structured(EvalConfig), {k: v for k, v in stored.items() if k in kept})
    given = {name for name, _ in overrides}
    for key, dependents in DEPENDENT_KEYS.items():
        if key in given:
            for dep in dependents:
                if dep not in given:
                    ev[dep] = None
    for name, value in overrides:
        try:
            OmegaConf.update(ev, name, value, merge=False)
        except OmegaConfBaseException:
            raise ConfigError(f"eval.{name}", f"{value!r} is not a valid value; expected "
                                              f"{VALUE_HINTS.get(name, 'a value of the schema type')}") from None
    cfg.eval = ev
    return cfg


# -- finding and checking runs -------------------------------------------------------------------

def find_eval_runs(folders: Sequence[str | os.PathLike], warn=None) -> list[Path]:
    """Run folders (``results.json`` + ``checkpoint/model.safetensors``) given or found under ``folders``.

    A folder given directly must be such a run. Below a folder given, folders with
    ``results.json`` but no checkpoint are skipped with a warning.
    """
    if not folders:
        raise PosexpError("give at least one run folder (or a sweep folder), e.g. "
                          "posexp eval outputs/2026-11-22/10-00-00 eval.lengths=[256,1024]")
    found: dict[Path, Path] = {}
    for raw in folders:
        root = Path(raw)
        if not root.exists():
            raise PosexpError(f"{root}: no such folder; pass a run folder (with {RESULTS_JSON} and {CHECKPOINT}) "
                              "or a folder above runs")
        if not root.is_dir():
            raise PosexpError(f"{root}: is a file; pass the run folder that contains it")
        if is_run_dir(root):
            if not is_run_dir(root, needs_weights=True):
                raise PosexpError(pretrained_hint(root) or f"{root}: no checkpoint ({CHECKPOINT} is missing), so "
                                  "there are no weights to evaluate; retrain the run with posexp train")
            found.setdefault(root.resolve(), root)
            continue
        skipped = []
        for folder in runs_under(root):
            if is_run_dir(folder, needs_weights=True):
                found.setdefault(folder.resolve(), folder)
            else:
                skipped.append(folder)
        for folder in skipped:
            if warn is not None:
                warn(f"skipping {folder}: it has {RESULTS_JSON} but no {CHECKPOINT}")
        if not any(p == root.resolve() or root.resolve() in p.parents for p in found):
            extra = f" ({len(skipped)} folder(s) with results but no checkpoint)" if skipped else ""
            raise PosexpError(f"{root}: no runs found below it{extra}; a run folder contains {RESULTS_JSON} and "
                              f"{CHECKPOINT}")
    return sorted(found.values(), key=natural_key)


@dataclass
class Prepared:
    """A run checked and ready to evaluate."""

    run_dir: Path
    cfg: Config
    results: dict
    model: Any
    corpus: Any
    task: Any = None  # a task run's task (posexp/tasks/); None for language modelling
    weights_sha256: Optional[str] = None  # of the weights loaded (checkpoint/meta.json's record), checked again
    key_tokens: Any = None  # eval.key_tokens' selector (posexp/commands/evaluator.py), its tokens checked here


def load_run_config(run_dir: Path, results: dict) -> DictConfig:
    if (run_dir / HYDRA_CONFIG).is_file():
        return read_saved_config(run_dir)
    stored = results.get("run", {}).get("config")
    if isinstance(stored, dict):
        return OmegaConf.create(stored)
    raise PosexpError(f"{run_dir}: no {HYDRA_CONFIG} and no config in {RESULTS_JSON}; cannot rebuild the model")


def prepare(run_dir: Path, overrides: list[tuple[str, Any]], results: Optional[dict] = None,
            allow_changed_encoder: bool = False, warn=None) -> Prepared:
    """Load and check one run: results (unless given), config + overrides, a plugin encoder's code, corpus,
    weights. Writes nothing."""
    from posexp.training.checkpoint import load_weights
    from posexp.data.corpus import check_fits, corpus_from_config
    from posexp.tasks.source import DATA_TASKS, TrainingSource
    from posexp.model.factory import build_model

    results = read_results(run_dir) if results is None else results
    raw = load_run_config(run_dir, results)
    check_encoder_source(run_dir, raw.encoder, results, allow_changed_encoder, warn)
    saved = SavedConfig(raw, typed(apply_eval_overrides(raw, overrides)))  # the edge: typed from here on
    cfg = saved.spec
    validate(cfg, memory="weights")  # evaluating needs the weights, not what training holds
    check_key_tokens(cfg.eval, cfg.task.name)
    lineage_broken = parent_changed(cfg.finetune) if cfg.finetune is not None else None
    if lineage_broken and warn is not None:  # the run's own rows stand; what it is a fine-tune of does not
        warn(f"{run_dir}: {lineage_broken}; its rows are its own, its finetune.parent is no longer that run")
    lengths = eval_lengths(cfg)
    if cfg.eval.tokens < max(lengths) and not is_task(cfg):
        raise ConfigError("eval.tokens", f"must be at least the longest eval length {max(lengths)} "
                                         f"(got {cfg.eval.tokens})")
    recorded = results["run"].get("config_hash")
    identity = folder_run_hash(run_dir, saved)  # a folder in another hash format is refused here
    if recorded is not None and recorded != identity.value:
        raise PosexpError(f"{run_dir}: {HYDRA_CONFIG} does not match the config the run was trained with "
                          f"(config hash {identity.value} vs {recorded} in {RESULTS_JSON}); was it edited?")
    task = is_task(cfg)
    # the tokenizer too: a config without one is byte-level; a generated task reads no corpus
    corpus = corpus_from_config(cfg) if not task or cfg.task.name in DATA_TASKS else None
    source = TrainingSource.of_task(cfg, corpus) if task else TrainingSource.of_corpus(corpus)
    recorded_fp = results["run"].get("corpus_fingerprint")
    if recorded_fp is not None and recorded_fp != source.fingerprint:
        what = f"task={cfg.task.name}'s instances" if task else f"the {cfg.data.name} corpus"
        raise PosexpError(f"{run_dir}: {what} here (fingerprint {source.fingerprint}) is not "
                          f"the one the run was trained and evaluated on ({recorded_fp}); new rows would not be "
                          "comparable with the old ones")
    if not task:
        check_fits(corpus, int(cfg.train_len), max(lengths))
    model = build_model(cfg, source.vocab_size)
    digest = _recorded_sha256(run_dir)
    load_weights(model, run_dir / CHECKPOINT, identity.value, sha256=digest,
                 hint=f"the weights cannot be used; retrain the run with posexp train ({HYDRA_CONFIG} has its config)")
    from posexp.runtime.device import resolve_device
    selector = for_run(cfg, corpus, resolve_device(cfg.train.device), hf_evaluator, str(run_dir)) if not task else None
    return Prepared(run_dir, cfg, results, model, corpus, source.task, digest, selector)


# what posexp eval rewrites in a run folder: all of them or none
EVAL_WRITES = (RESULTS_JSON, RESULTS_CSV, RESULTS_MD, PPL_PLOT, ACCURACY_PLOT, PASSKEY_HEATMAP, LOSS_BY_POSITION_CSV,
               LOSS_BY_POSITION_PNG)


def check_writable(run_dir: Path, command: str, writes: str, into: Optional[Path] = None,
                   replaces: Sequence[str] = ()) -> None:
    """Refuse a run folder this process cannot write to before any work: ``posexp eval`` (and ``analyze``) would
    otherwise fail when it writes, after minutes of evaluation.

    Args:
        run_dir: the run folder.
        command: the command, e.g. "posexp eval", for the message.
        writes: what it writes there, for the message.
        into: the folder written into, ``run_dir`` or one inside it (checked if it exists).
        replaces: the files there it rewrites: each one that exists must be writable (an immutable results.json
            once let ``posexp eval`` write results.csv and fail on results.json, the two disagreeing).

    Raises:
        PosexpError: no file can be created there (permissions, a read-only mount), or a file it rewrites is
            read-only or immutable.
    """
    target = into if into is not None and into.is_dir() else run_dir
    problem = unwritable(target)
    if problem is None:
        locked = [name for name in replaces if (target / name).exists() and not os.access(target / name, os.W_OK)]
        problem = f"{', '.join(locked)} read-only or immutable" if locked else None
    if problem is not None:
        raise PosexpError(f"{target}: not writable ({problem}), and {command} writes {writes} there; "
                          f"{command.split()[-1]} a copy instead: cp -r {shlex.quote(str(run_dir))} DIR, "
                          f"then {command} DIR")


def _recorded_sha256(run_dir: Path) -> Optional[str]:
    """The SHA-256 of the weights written beside them in ``checkpoint/meta.json`` (older runs have none)."""
    try:
        digest = json.loads((run_dir / CHECKPOINT.parent / "meta.json").read_text(encoding="utf-8")).get("sha256")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


# -- the command ---------------------------------------------------------------------------------

def _note_sweep_summaries(folders: Sequence[str], console: Console) -> None:
    """A sweep folder given keeps the summary.md written when the sweep ended (its own record, not this command's):
    say how to report the new rows instead of rewriting it."""
    for raw in folders:
        root = Path(raw)
        if (root / SUMMARY_MD).is_file() and not is_run_dir(root):
            console.print(f"{root / SUMMARY_MD} is the sweep's record as it ended; for a report with these rows: "
                          f"posexp report {root}", highlight=False, soft_wrap=True)


def _warn(console: Console, message: str) -> None:
    """One line, however narrow the terminal: a warning names a folder, read (and grepped) whole."""
    console.print(Text.assemble(("warning: ", "bold yellow"), (message, "yellow")), soft_wrap=True)


def prepare_all(runs: Sequence[Path], overrides: list[tuple[str, Any]], given: set[Path], console: Console,
                strict: bool = False, allow_changed_encoder: bool = False) -> list[Prepared]:
    """Check every run before any is evaluated.

    A run whose ``results.json`` cannot be read is skipped with a warning (unless ``strict``), so
    one damaged run of a sweep does not stop the others; as is a run found under a folder given
    that a rotary-only scaling cannot apply to. Any other problem stops everything.

    Raises:
        PosexpError: the first problem, when ``strict``, when no run is left, or when it is not one of those two.
    """
    prepared, refused = [], []
    for run_dir in runs:
        try:
            results = read_results(run_dir)
        except PosexpError as e:
            if strict:
                raise
            refused.append((run_dir, e))
            continue
        check_writable(run_dir, "posexp eval", f"its new rows to {RESULTS_JSON}", replaces=EVAL_WRITES)
        try:
            prepared.append(prepare(run_dir, overrides, results, allow_changed_encoder, lambda m: _warn(console, m)))
        except ConfigError as e:
            # a sweep over encodings: a rotary-only scaling skips the runs it cannot apply to
            if e.key != "eval.scaling" or "does not apply" not in str(e) or run_dir.resolve() in given:
                raise
            refused.append((run_dir, e))
    if refused and not prepared:
        raise refused[0][1]
    for run_dir, reason in refused:
        _warn(console, f"skipping {run_dir}: {reason}")
    return prepared


def reeval_main(args: Sequence[str], console: Optional[Console] = None, *, strict: bool = False,
                allow_changed_encoder: bool = False) -> list[dict]:
    """``posexp eval``: check every run, then evaluate each and merge its rows. Returns each run's results.

    With ``strict``, a run whose ``results.json`` cannot be read stops the command before anything is
    evaluated; otherwise it is skipped with a warning and the other runs are evaluated. A run of a plugin
    encoder whose source changed since it was trained stops the command unless ``allow_changed_encoder``.
    """
    console = console or Console()
    folders, raw_overrides = split_args(args)
    overrides = parse_eval_overrides(raw_overrides)
    runs = find_eval_runs(folders, lambda msg: _warn(console, msg))
    prepared = prepare_all(runs, overrides, {Path(f).resolve() for f in folders}, console, strict=strict,
                           allow_changed_encoder=allow_changed_encoder)

    out: list[dict] = []
    previous = signal.getsignal(signal.SIGTERM)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        signal.signal(signal.SIGTERM, _stop)
    try:
        for p in prepared:
            # refused while another process trains there; waits for another evaluation, whose rows it keeps
            with run_lock(p.run_dir, EVALUATING, wait_for=(EVALUATING,),
                          on_wait=lambda line: console.print(line, highlight=False, soft_wrap=True)):
                _check_still_the_run(p)
                out.append(_evaluate_run(p, raw_overrides, console))
    except (KeyboardInterrupt, _Stopped) as e:
        raise _stopped([p.run_dir for p in prepared], len(out), raw_overrides,
                       signal.SIGTERM if isinstance(e, _Stopped) else signal.SIGINT) from None
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise PosexpError(f"{e.filename}: could not be written ({e.strerror}); "
                          f"{_left([p.run_dir for p in prepared], len(out), raw_overrides, 'free some space, then')}"
                          ) from None
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    _note_sweep_summaries(folders, console)
    return out


def _check_still_the_run(p: Prepared) -> None:
    """Under the folder's lock, before anything is written: the weights evaluated are still the run's. A
    ``posexp train ... --overwrite`` of the folder between loading them and taking the lock would otherwise get
    the old weights' rows written into the new run."""
    if _recorded_sha256(p.run_dir) != p.weights_sha256:
        raise PosexpError(f"{p.run_dir}: its run was replaced while this evaluation started (its weights are not "
                          f"the ones loaded); nothing was written there: posexp eval {p.run_dir} again evaluates "
                          "the run it holds now")


class _Stopped(Exception):
    """SIGTERM during an evaluation (a scheduler's time limit, kill): stop as Ctrl-C does."""


def _stop(signum, frame) -> None:
    raise _Stopped()


def _stopped(runs: list[Path], finished: int, overrides: Sequence[str], signum: int) -> TrainingInterrupted:
    """What a stopped ``posexp eval`` kept, and the command that finishes it."""
    return TrainingInterrupted(f"posexp eval stopped by {signal.Signals(signum).name}: "
                               f"{_left(runs, finished, overrides)}", 128 + signum)


def _left(runs: list[Path], finished: int, overrides: Sequence[str], first: str = "") -> str:
    """The runs a ``posexp eval`` stopped after ``finished`` of them wrote, and the command that finishes it."""
    kept = (f"{finished} of {len(runs)} run(s) evaluated and written ({', '.join(map(str, runs[:finished]))}); "
            if finished else "")
    rest = runs[finished:]
    again = "posexp eval " + shlex.join([*map(str, rest), *overrides])
    return (f"{kept}{rest[0]}'s evaluation was not written, its results.json is as it was; "
            f"{first + ' ' if first else ''}finish with: {again}")


def _evaluate_run(p: Prepared, raw_overrides: Sequence[str], console: Console) -> dict:
    """Evaluate one prepared run, merge its rows into its results.json and redraw its files."""
    from posexp.runs.provenance import git_commit, versions
    from posexp.evaluation.accuracy import evaluate_task_config
    from posexp.evaluation.runner import evaluate_config
    from posexp.rendering.results import results_table, write_loss_by_position, write_results
    from posexp.runtime import threads
    from posexp.runtime.device import resolve_device
    from posexp.runtime.memory import out_of_memory

    cfg = p.cfg
    threads.apply(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    p.model.to(device)
    e = cfg.eval
    console.print(f"[bold]posexp eval[/] {p.run_dir} · encoder [cyan]{cfg.encoder['name']}[/] · lengths "
                  f"{', '.join(map(str, eval_lengths(cfg)))} · protocol {e.protocol}"
                  f"{f' S={e.stride}' if e.stride is not None else ''}"
                  f"{f' K={e.last_k}' if e.last_k is not None else ''} · scaling {e.scaling}"
                  f"{f' ×{e.scaling_factor:g}' if e.scaling_factor is not None else ''}"
                  f"{f' · window {e.window}' if e.window is not None else ''}"
                  f"{f' + {e.sinks} sinks' if e.sinks is not None else ''} · {device}",
                  highlight=False)
    trained_in = (p.results.get("run") or {}).get("train", {}).get("precision")
    with out_of_memory("evaluating", device, "the eval lengths" + (" or eval.examples" if p.task else "")):
        if p.task is not None:
            rows, positions = evaluate_task_config(p.model, p.task, cfg, device), None
        else:
            if p.key_tokens is not None:
                p.key_tokens.log = lambda m: console.print(m, highlight=False)
            rows, positions = evaluate_config(p.model, p.corpus.val, cfg, device, console, trained_in=trained_in,
                                              key_tokens=p.key_tokens)
    results = read_results(p.run_dir)  # read again under the lock: rows another evaluation wrote meanwhile stay
    results["rows"] = merge_rows(results["rows"], rows)
    results.setdefault("evaluations", []).append({
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "overrides": list(raw_overrides),
        "rows": len(rows),
        "device": str(device),
        "git_commit": git_commit(),
        "versions": versions(),
    })
    label = str(results["run"].get("label") or p.run_dir.name)
    if positions:
        write_loss_by_position(p.run_dir, positions, int(cfg.train_len), label)
    write_results(p.run_dir, results)  # results.json last
    _report_to_trackers(p.run_dir, rows, console)
    console.print(results_table(results))
    console.print(f"wrote {p.run_dir / RESULTS_JSON} ({len(rows)} row(s) evaluated, {len(results['rows'])} in all)",
                  highlight=False)
    return results


def _report_to_trackers(run_dir: Path, rows: list[dict], console: Console) -> None:
    """The new rows and the redrawn files go to the tracked runs the run reported to (trackers.json), if any."""
    from posexp import tracking

    trackers = tracking.reopen(run_dir, lambda message: _warn(console, message))
    if trackers:
        trackers.log_results(rows, run_dir)
        trackers.finish("completed")
