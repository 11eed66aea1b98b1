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

``posexp eval -m RUN eval.scaling=linear,yarn`` evaluates every combination of
the values (Hydra's sweep grammar: ``a,b``, ``range(...)``), one setting after
the other, as that many ``posexp eval`` commands would: each setting's rows join
the run's ``results.json`` beside the others (their key holds the scaling), so
``posexp report RUN --cols scaling`` compares them. Besides ``eval.*``, where and
how the evaluation computes may be set (``train.threads``, ``device``,
``precision`` and their ``train.`` keys): they leave the weights as trained.

Everything that can be checked is checked for every run before any run is
evaluated, so bad input leaves every ``results.json`` as it was. A run whose
``results.json`` cannot be read is the exception: it is skipped with a warning
naming it and the other runs are evaluated (``--strict``: nothing is).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ContextManager, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.text import Text

from posexp.commands.edge import SavedConfig, folder_run_hash, read_saved_config, typed
from posexp.commands.plugin_source import check_plugin_sources, plugin_failures
from posexp.commands.eval_overrides import (Setting, apply_eval_overrides, apply_runtime_overrides, is_multirun,
                                            parse_eval_overrides, parse_settings, split_args)
from posexp.commands.finetune import parent_changed
from posexp.config.schema import Config, eval_lengths, is_task
from posexp.commands.validation import validate
from posexp.commands.evaluator import check_key_tokens, for_run
from posexp.commands.pretrained import hf_evaluator, pretrained_hint
from posexp.errors import ConfigError, PosexpError, TrainingInterrupted
from posexp.runs.atomic import DISK_FULL, unwritable
from posexp.runs.lock import EVALUATING, refuse_running, run_lock
from posexp.runs.layout import (ACCURACY_PLOT, CHECKPOINT, HYDRA_CONFIG, LOSS_BY_POSITION_CSV, LOSS_BY_POSITION_PNG,
                                PASSKEY_HEATMAP, PPL_PLOT, RESULTS_CSV, RESULTS_JSON, RESULTS_MD, SUMMARY_MD, TRAIN_LOG,
                                is_run_dir, merge_rows, natural_key, read_results, runs_under)
from posexp.runtime import terminal

# -- finding and checking runs -------------------------------------------------------------------

def find_eval_runs(folders: Sequence[str | os.PathLike], warn=None, given: Sequence[str] = ()) -> list[Path]:
    """Run folders (``results.json`` + ``checkpoint/model.safetensors``) given or found under ``folders``.

    A folder given directly must be such a run. Below a folder given, folders with
    ``results.json`` but no checkpoint are skipped with a warning; pretrained models' runs (``posexp eval
    hf:MODEL``, whose weights stay in the model's folder) with the command that measures them again, ``given``
    (the user's ``eval.KEY=VALUE``) in it.
    """
    from posexp.commands.pretrained import pretrained_of, rerun_command

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
        pretrained = [folder for folder in skipped if pretrained_of(folder) is not None]
        for folder in skipped:
            if warn is not None and folder not in pretrained:
                warn(f"skipping {folder}: it has {RESULTS_JSON} but no {CHECKPOINT}")
        mine = any(p == root.resolve() or root.resolve() in p.parents for p in found)
        if pretrained and not mine and len(pretrained) == len(skipped):  # nothing here but pretrained runs
            raise PosexpError(f"{root}: its {len(pretrained)} run(s) are pretrained models' evaluations, whose weights "
                              f"stay in the models' own folders; measure them again as new runs: "
                              f"{rerun_command(pretrained, given)}")
        elif pretrained and warn is not None:
            warn(f"skipping {len(pretrained)} pretrained model run(s) below {root}, whose weights stay in the models' "
                 f"own folders; measure them again as new runs: {rerun_command(pretrained, given)}")
        if not mine:
            refuse_running(root)
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
    setting: Setting = Setting()  # the overrides it is evaluated with
    key_tokens: Any = None  # eval.key_tokens' selector (posexp/commands/evaluator.py), its tokens checked here


def load_run_config(run_dir: Path, results: dict) -> DictConfig:
    if (run_dir / HYDRA_CONFIG).is_file():
        return read_saved_config(run_dir)
    stored = results.get("run", {}).get("config")
    if isinstance(stored, dict):
        return OmegaConf.create(stored)
    raise PosexpError(f"{run_dir}: no {HYDRA_CONFIG} and no config in {RESULTS_JSON}; cannot rebuild the model")


def _setting_config(raw: DictConfig, overrides: Sequence[tuple[str, Any]],
                    runtime: Sequence[tuple[str, Any]] = ()) -> tuple[SavedConfig, Config]:
    """The run's config with an evaluation setting: as saved with the ``eval`` overrides (whose hash is the run's),
    and that computing where and how ``runtime`` says, checked (what is evaluated).

    Raises:
        ConfigError: a value the setting cannot have with this run.
    """
    with_eval = apply_eval_overrides(raw, list(overrides))
    saved = SavedConfig(raw, typed(with_eval))  # the edge: typed from here on
    cfg = typed(apply_runtime_overrides(with_eval, runtime)) if runtime else saved.spec
    validate(cfg, memory="weights")  # evaluating needs the weights, not what training holds
    check_key_tokens(cfg.eval, str(cfg.task["name"]))
    lengths = eval_lengths(cfg)
    if cfg.eval.tokens < max(lengths) and not is_task(cfg):
        raise ConfigError("eval.tokens", f"must be at least the longest eval length {max(lengths)} "
                                         f"(got {cfg.eval.tokens})")
    return saved, cfg


def prepare(run_dir: Path, overrides: list[tuple[str, Any]], results: Optional[dict] = None,
            allow_changed_encoder: bool = False, warn=None, runtime: Sequence[tuple[str, Any]] = ()) -> Prepared:
    """Load and check one run: results (unless given), config + overrides (``runtime``: where and how it computes,
    :data:`~posexp.commands.eval_overrides.RUNTIME_KEYS`), a plugin encoder's code, corpus, weights. Writes nothing."""
    from posexp.training.checkpoint import load_weights
    from posexp.data.corpus import check_fits, corpus_from_config
    from posexp.tasks.source import TrainingSource, reads_data
    from posexp.model.factory import build_model

    results = read_results(run_dir) if results is None else results
    raw = load_run_config(run_dir, results)
    check_plugin_sources(run_dir, raw, results, allow_changed_encoder, warn)
    saved, cfg = _setting_config(raw, overrides, runtime)
    lineage_broken = parent_changed(cfg.finetune) if cfg.finetune is not None else None
    if lineage_broken and warn is not None:  # the run's own rows stand; what it is a fine-tune of does not
        warn(f"{run_dir}: {lineage_broken}; its rows are its own, its finetune.parent is no longer that run")
    lengths = eval_lengths(cfg)
    recorded = results["run"].get("config_hash")
    identity = folder_run_hash(run_dir, saved)  # a folder in another hash format is refused here
    if recorded is not None and recorded != identity.value:
        raise PosexpError(f"{run_dir}: {HYDRA_CONFIG} does not match the config the run was trained with "
                          f"(config hash {identity.value} vs {recorded} in {RESULTS_JSON}); was it edited?")
    task = is_task(cfg)
    # the tokenizer too: a config without one is byte-level; a generated task reads no corpus
    corpus = corpus_from_config(cfg) if not task or reads_data(cfg.task) else None
    source = TrainingSource.of_task(cfg, corpus) if task else TrainingSource.of_corpus(corpus)
    recorded_fp = results["run"].get("corpus_fingerprint")
    if recorded_fp is not None and recorded_fp != source.fingerprint:
        what = f"task={cfg.task['name']}'s instances" if task else f"the {cfg.data.name} corpus"
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
    return Prepared(run_dir, cfg, results, model, corpus, source.task, digest,
                    Setting(tuple(overrides), tuple(runtime)), selector)


def prepare_setting(p: Prepared, setting: Setting) -> Prepared:
    """The run ``p`` (its weights and corpus, loaded once) checked for another setting of the same command; its
    key-token selector made again where the setting names other key tokens."""
    from posexp.data.corpus import check_fits
    from posexp.runtime.device import resolve_device

    _, cfg = _setting_config(load_run_config(p.run_dir, p.results), setting.eval, setting.runtime)
    selector = p.key_tokens
    if p.task is None:
        check_fits(p.corpus, int(cfg.train_len), max(eval_lengths(cfg)))
        if cfg.eval.key_tokens != p.cfg.eval.key_tokens or cfg.train_len != p.cfg.train_len:
            selector = for_run(cfg, p.corpus, resolve_device(cfg.train.device), hf_evaluator, str(p.run_dir))
    return dataclasses.replace(p, cfg=cfg, setting=setting, key_tokens=selector)


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


def prepare_all(runs: Sequence[Path], settings: Sequence[Setting], given: set[Path], console: Console,
                strict: bool = False, allow_changed_encoder: bool = False) -> list[Prepared]:
    """Check every run, in every setting, before any is evaluated; a run's weights load once for all settings.

    A run whose ``results.json`` cannot be read is skipped with a warning (unless ``strict``), so
    one damaged run of a sweep does not stop the others; as is a run found under a folder given
    that a rotary-only scaling cannot apply to (in that setting). Any other problem stops everything.

    Returns:
        One :class:`Prepared` per run and setting, a run's settings one after the other.

    Raises:
        PosexpError: the first problem, when ``strict``, when nothing is left, or when it is not one of those two.
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
        loaded: Optional[Prepared] = None
        for setting in settings:
            try:
                if loaded is None:
                    loaded = prepare(run_dir, list(setting.eval), results, allow_changed_encoder,
                                     lambda m: _warn(console, m), runtime=setting.runtime)
                    prepared.append(dataclasses.replace(loaded, setting=setting))
                else:
                    prepared.append(prepare_setting(loaded, setting))
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
    """``posexp eval``: check every run (in every setting of ``-m``), then evaluate each and merge its rows.
    Returns each evaluation's results (one per run and setting).

    With ``strict``, a run whose ``results.json`` cannot be read stops the command before anything is
    evaluated; otherwise it is skipped with a warning and the other runs are evaluated. A run of a plugin
    encoder whose source changed since it was trained stops the command unless ``allow_changed_encoder``.
    """
    console = console or terminal.console()
    folders, raw_overrides = split_args(args)
    settings = parse_settings(raw_overrides, multirun=is_multirun(args))
    runs = find_eval_runs(folders, lambda msg: _warn(console, msg), raw_overrides)
    prepared = prepare_all(runs, settings, {Path(f).resolve() for f in folders}, console, strict=strict,
                           allow_changed_encoder=allow_changed_encoder)

    out: list[dict] = []
    previous = signal.getsignal(signal.SIGTERM)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        signal.signal(signal.SIGTERM, _stop)
    try:
        for run_dir, group in itertools.groupby(prepared, key=lambda p: p.run_dir):
            # refused while another process trains there; waits for another evaluation, whose rows it keeps
            with run_lock(run_dir, EVALUATING, wait_for=(EVALUATING,),
                          on_wait=lambda line: console.print(line, highlight=False, soft_wrap=True)):
                for p in group:
                    _check_still_the_run(p)
                    out.append(_evaluate_run(p, list(p.setting.texts), console))
    except (KeyboardInterrupt, _Stopped) as e:
        raise _stopped(prepared, len(out), signal.SIGTERM if isinstance(e, _Stopped) else signal.SIGINT) from None
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise PosexpError(f"{e.filename}: could not be written ({e.strerror}); "
                          f"{_left(prepared, len(out), 'free some space, then')}") from None
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    _note_sweep_summaries(folders, console)
    if len(settings) > 1:
        _note_comparison(prepared, settings, console)
    return out


def _note_comparison(prepared: Sequence[Prepared], settings: Sequence[Setting], console: Console) -> None:
    """After ``-m``: how to compare the settings, whose rows now lie side by side in each run's results.json."""
    swept = [text.split("=", 1)[0] for i, text in enumerate(settings[0].texts)
             if len({s.texts[i] for s in settings}) > 1]
    columns = [key[len("eval."):] for key in swept if key in ("eval.scaling", "eval.protocol", "eval.window")]
    folders = list(dict.fromkeys(str(p.run_dir) for p in prepared))
    console.print(f"{len(settings)} settings of {', '.join(swept)} evaluated; compare them: posexp report "
                  f"{shlex.join(folders)}{' --cols ' + columns[0] if columns else ''}", highlight=False,
                  soft_wrap=True)


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


def _stopped(prepared: list[Prepared], finished: int, signum: int) -> TrainingInterrupted:
    """What a stopped ``posexp eval`` kept, and the command that finishes it."""
    return TrainingInterrupted(f"posexp eval stopped by {signal.Signals(signum).name}: "
                               f"{_left(prepared, finished)}", 128 + signum)


def _left(prepared: list[Prepared], finished: int, first: str = "") -> str:
    """The evaluations a ``posexp eval`` stopped after ``finished`` of them wrote, and the command (one per
    setting left) that finishes it."""
    done = list(dict.fromkeys(str(p.run_dir) for p in prepared[:finished]))
    runs = list(dict.fromkeys(p.run_dir for p in prepared))
    several = len({p.setting.texts for p in prepared}) > 1
    if several:
        kept = f"{finished} of {len(prepared)} evaluations written ({', '.join(done)}); " if finished else ""
    else:
        kept = (f"{finished} of {len(runs)} run(s) evaluated and written ({', '.join(done)}); " if finished else "")
    rest = prepared[finished:]
    commands: dict[tuple, list[str]] = {}
    for p in rest:
        commands.setdefault(p.setting.texts, []).append(str(p.run_dir))
    again = "; ".join("posexp eval " + shlex.join([*folders, *texts]) for texts, folders in commands.items())
    return (f"{kept}{rest[0].run_dir}'s evaluation was not written, its results.json is as it was; "
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
    with out_of_memory("evaluating", device, "the eval lengths" + (" or eval.examples" if p.task else "")), \
            run_plugin_failures(p, f"the evaluation stopped, {RESULTS_JSON} is as it was"):
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
        **({"precision": cfg.train.precision} if p.setting.runtime else {}),
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


def run_plugin_failures(p: Prepared, stopped: str) -> ContextManager[None]:
    """What the run's plugin encoder or task raises while a command uses the run ``p``, in one line naming it, its
    traceback appended to the run's train.log (:func:`~posexp.commands.plugin_source.plugin_failures`); ``stopped``:
    what it stopped, for that line."""
    from posexp.runs.provenance import source_fields
    from posexp.tasks import task_code

    task = task_code(type(p.task)) if p.task is not None else None
    plugins = {**source_fields(p.cfg.encoder), **({"task_source": task} if task is not None else {})}
    return plugin_failures(plugins, {"encoder": p.cfg.encoder, "task": p.cfg.task}, stopped, p.run_dir / TRAIN_LOG)


def _report_to_trackers(run_dir: Path, rows: list[dict], console: Console) -> None:
    """The new rows and the redrawn files go to the tracked runs the run reported to (trackers.json), if any."""
    from posexp import tracking

    trackers = tracking.reopen(run_dir, lambda message: _warn(console, message))
    if trackers:
        trackers.log_results(rows, run_dir)
        trackers.finish("completed")
