"""``posexp train``, one run: a composed config in, a run folder with checkpoint and results out.

The recipe, in order: check the config, convert it to the typed :class:`~posexp.config.schema.Config` once,
load the corpus, build the model, train (or reuse a cached training), checkpoint, evaluate, write.
Each step lives in its own package; this module only sequences them.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from posexp.model.factory import build_model
from posexp.config.schema import Config, curve_lengths, eval_lengths, is_task
from posexp.config.identity import RunHash, config_dict, run_hash
from posexp.commands.edge import launch_folder, record_encoder, typed
from posexp.data.corpus import BatchSampler, Corpus, check_fits, corpus_from_config
from posexp.errors import ConfigError, PosexpError, TrainingDiverged, TrainingInterrupted
from posexp.evaluation.accuracy import evaluate_task_config
from posexp.evaluation.curve import CurveProbe
from posexp.runs.provenance import (provenance, run_label, source_fields, write_plugin_sources,
                                      write_run_status)
from posexp.commands.evaluator import check_key_tokens, for_run
from posexp.commands.plugin_source import plugin_failed
from posexp.commands.pretrained import hf_evaluator
from posexp.evaluation.runner import evaluate_config
from posexp.rendering.results import results_table, write_loss_by_position, write_results
from posexp.model.gpt import GPT
from posexp.runs.atomic import DISK_FULL
from posexp.runs.curve import CurveWriter
from posexp.rendering.curve import draw_curve
from posexp.runs.layout import ACCURACY, PERPLEXITY, RESULTS_JSON, TRAIN_LOG
from posexp.runs.lock import RunFolderTaken, run_contents, run_lock
from posexp.runtime.device import resolve_device, step_settings
from posexp.tasks.sampler import TaskSampler
from posexp.tasks.source import TrainingSource, reads_data
from posexp import tracking
from posexp.training import cache, distributed
from posexp.training.checkpoint import check_same_data, read_resume_pointer
from posexp.runtime.device import World
from posexp.training.distributed import shard
from posexp.training.checkpoint import parent_weights
from posexp.training.trainer import LogHook, TrainResult, save_checkpoint, train
from posexp.commands.validation import config_warnings, validate
from posexp.runtime.memory import out_of_memory
from posexp.runtime import terminal, threads

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.train")


def run_train(cfg: DictConfig, run_dir: Path, overrides: list[str], console: Optional[Console] = None) -> dict:
    """``posexp train``'s job: check Hydra's composed config, convert it to the typed one (the edge), then
    :func:`train_run`."""
    return train_run(check_config(cfg), run_dir, overrides, console)


def train_run(spec: Config, run_dir: Path, overrides: list[str], console: Optional[Console] = None,
              resume: Optional[RunHash] = None) -> dict:
    """Load data, train, checkpoint, evaluate and write the results of one run of a checked config.

    Args:
        spec: the typed config, checked (:func:`check_spec`).
        resume: continue training from the run folder's latest checkpoint (``posexp resume``), whose hash
            (in the format the folder recorded) this is.

    Raises:
        TrainingDiverged: after writing a results.json with status "diverged".
        PosexpError: a full disk (or quota), naming the file that could not be written and how to continue.
    """
    console = console or terminal.console()
    device = resolve_device(spec.train.device)
    w = distributed.setup(device)
    if w.distributed:  # several processes (torchrun): rank 0's run folder for all; only rank 0 writes or prints
        run_dir = Path(distributed.broadcast(str(run_dir)))
        shard(spec.train.batch_size, w)  # a batch that does not split fails here, before any data is read
        if not w.is_main:
            console = Console(quiet=True)
    with _claimed(run_dir, w.is_main, resume is not None):
        try:
            return _run(TrainJob(spec, run_dir, overrides, identity=resume or run_hash(spec), resume=resume is not None,
                                 device=device, world=w, console=console, launched_in=launch_folder()))
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            raise _disk_full(run_dir, e) from None


def _disk_full(run_dir: Path, error: OSError) -> PosexpError:
    """What a run stopped by a full disk left: the checkpoints are written whole or not at all, so the last
    complete one is intact and the run continues from it."""
    try:
        pointer = read_resume_pointer(run_dir)
    except PosexpError:
        pointer = None
    what = f"{error.filename or 'a file of the run'}: could not be written ({error.strerror})"
    if pointer is None:
        return PosexpError(f"{what}; the run stopped before its first checkpoint. Free some space, then train it "
                           "again")
    return PosexpError(f"{what}; the run stopped, its last checkpoint (step {pointer['step']}) is intact. Free some "
                       f"space, then continue with: posexp resume {run_dir}")


@contextlib.contextmanager
def _tracked(job: TrainJob, warn: Callable[[str], None]) -> Iterator[tracking.Trackers]:
    """The run's experiment trackers (``logger=...``; none on ranks other than 0), closed with the run's outcome."""
    spec, run_dir = job.spec, job.run_dir
    if not job.world.is_main or not tracking.chosen(spec.logger):
        yield tracking.NO_TRACKERS
        return
    pointer = read_resume_pointer(run_dir) if job.resume else None
    trackers = tracking.start(spec.logger, run_dir, run_label(job.overrides), config_dict(spec),
                              resume_step=(pointer or {}).get("step", 0) if job.resume else None, warn=warn)
    for line in trackers.where():
        log.info(line)
        job.console.print(line, highlight=False, soft_wrap=True)
    try:
        yield trackers
    except TrainingInterrupted:
        trackers.finish("interrupted")
        raise
    except BaseException:
        trackers.finish("failed")
        raise
    trackers.finish("completed")


@contextlib.contextmanager
def _plugin_failures(job: TrainJob, source: TrainingSource, plugins: dict) -> Iterator[None]:
    """What the user's own code (``plugins``: a plugin encoder's hooks, a task's generator) raises while the run
    trains or evaluates: its traceback to train.log, the run recorded as failed (results.json), and one line naming
    the component and that log (:class:`PluginFailed`), as a failed sweep job has it; posexp's errors pass through,
    except a divergence that NaN returned by a plugin's hook caused, which is said as that hook's.
    """
    try:
        yield
    except Exception as e:
        if isinstance(e, PosexpError) and not isinstance(e, TrainingDiverged):
            raise
        failed = plugin_failed(e, plugins, {"encoder": job.spec.encoder, "task": job.spec.task}, "the run stopped",
                               job.run_dir / TRAIN_LOG)
        if failed is None:
            raise
        log.error("%s", failed, exc_info=e)
        if job.world.is_main:
            write_run_status(job.run_dir, job.spec, job.overrides, "failed", failed, source.info(),
                             identity=job.identity)
        raise failed from None


def check_config(cfg: DictConfig) -> Config:
    """The composed config typed (the edge) and checked (:func:`check_spec`). ``posexp train`` checks every
    sweep job with it before the first one trains.

    A new run's encoder is :func:`new_run_encoder`'s; a fine-tune's is its parent's, its revisions recorded by
    :func:`posexp.commands.finetune.child_config`.
    """
    spec = check_spec(typed(cfg))
    if spec.finetune is None:
        spec.encoder = new_run_encoder(spec)
    return spec


def new_run_encoder(spec: Config) -> dict:
    """``spec``'s encoder as a new run records it: with the revision of each revised encoder it builds
    (:func:`posexp.encoders.recorded_revisions`: a mix's layers', which its schema cannot hold), and a mix with
    each layer's options from the run (:func:`posexp.encoders.mixed.record_run_options`)."""
    from posexp.encoders import recorded_revisions
    from posexp.encoders.mixed import record_run_options

    return record_run_options(recorded_revisions(spec.encoder), lambda name: _run_options(spec, name))


def _run_options(spec: Config, name: str) -> dict:
    """The options ``encoder=NAME``'s shipped yaml takes from the run (a value ``${KEY}`` of a top-level key, as
    cope's ``npos_max: ${train_len}``), at ``spec``'s values; {} for an encoder without a yaml there."""
    import re

    import yaml

    from posexp.config.schema import config_dir

    path = config_dir() / "encoder" / f"{name}.yaml"
    options = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}
    run = config_dict(spec)
    return {key: run[m.group(1)] for key, value in options.items()
            if isinstance(value, str) and (m := re.fullmatch(r"\$\{(\w+)\}", value)) and m.group(1) in run}


def check_spec(spec: Config) -> Config:
    """Everything about a run's config that can be checked without its data: :func:`validate`, and
    enough evaluation tokens for the longest eval length.

    Returns:
        ``spec``.

    Raises:
        ConfigError: naming the key and what is allowed.
    """
    validate(spec)
    check_key_tokens(spec.eval, str(spec.task["name"]))  # an evaluator that is no run stops here, not after training
    tracking.check_loggers(spec.logger)  # a tracker library not installed stops here, before any job trains
    longest = max(eval_lengths(spec))
    if spec.eval.tokens < longest and not is_task(spec):  # a task scores eval.examples instances instead
        raise ConfigError("eval.tokens", f"must be at least the longest eval length {longest} "
                                         f"(got {spec.eval.tokens})")
    return spec


@contextlib.contextmanager
def _claimed(run_dir: Path, is_main: bool, resume: bool) -> Iterator[None]:
    """Hold the run folder for this process while it trains and writes there (rank 0 only: it alone writes).

    Raises:
        RunFolderTaken: another process trains there, or (not resuming) a run was written there already.
    """
    if not is_main:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_lock(run_dir):
        if not resume and (run_dir / RESULTS_JSON).is_file():
            raise RunFolderTaken(f"{run_dir}: holds {run_contents(run_dir)} ({RESULTS_JSON}); choose another "
                                 "run folder")
        yield


@dataclass(frozen=True)
class TrainJob:
    """One run as :func:`train_run` settles it before anything is loaded; the recipe's steps below all read it.

    Attributes:
        spec: the typed, checked config.
        run_dir: the run folder (rank 0's, on every rank).
        overrides: what the user typed, as results.json records it.
        identity: the hash the checkpoints record (a resumed run's, in the format its folder recorded).
        resume: continue training from the run folder's latest checkpoint.
        device, world: this process's device and its place among the ranks.
        console: where the run reports (a quiet one on ranks other than 0).
        launched_in: the folder posexp was started in, where a relative ``cache_dir`` is
            (:func:`~posexp.commands.edge.launch_folder`).
    """

    spec: Config
    run_dir: Path
    overrides: list[str]
    identity: RunHash
    resume: bool
    device: torch.device
    world: World
    console: Console
    launched_in: Path


def _run(job: TrainJob) -> dict:
    """:func:`run_train` in a claimed run folder: data, model, training (or a cached one), evaluation, results."""
    spec, run_dir, w, resume, console = job.spec, job.run_dir, job.world, job.resume, job.console
    if w.is_main and not resume:
        record_encoder(run_dir, spec.encoder)
    chosen = threads.apply(spec.train.threads)
    if not resume:  # train.log's first line, as the terminal's (posexp.train logs the training steps); a resume
        # refused for a damaged checkpoint leaves train.log as it was, and one that goes on says its own threads
        logging.getLogger("posexp.threads").info("%s", threads.describe(chosen, torch.get_num_threads()))
    warn = _warner(console)
    cache_writable = warn_about_settings(spec, warn, w.is_main, job.launched_in)
    source = _load_source(spec, w, console, warn)
    if resume:
        check_same_data(run_dir, source.fingerprint)
    # eval.key_tokens: an evaluator that reads other tokens is refused here, before training
    key_tokens = for_run(spec, source.corpus, job.device, hf_evaluator, str(run_dir),
                         log=lambda m: console.print(m, highlight=False)) if w.is_main else None
    lineage = spec.finetune
    if lineage is not None and lineage.parent_corpus_fingerprint not in (None, source.fingerprint):
        raise PosexpError(f"the data here ({source.describe()}, fingerprint {source.fingerprint}) is not what the "
                          f"parent {lineage.parent} trained on ({lineage.parent_corpus_fingerprint}); a fine-tune "
                          "continues on its parent's data")
    # a fine-tune starts from its parent's weights, unless it resumes from a checkpoint of its own
    start = parent_weights(lineage) if lineage is not None and not (resume and read_resume_pointer(run_dir)) else None
    with out_of_memory("building the model", torch.device("cpu"), "model.d_model or model.n_layers"):
        model = build_model(spec, source.vocab_size, init=start)
    _announce(job, model, source, chosen)
    plugins = {**source_fields(spec.encoder), **source.sources()}
    if w.is_main and not resume:
        write_plugin_sources(run_dir, plugins)
    with _plugin_failures(job, source, plugins), _tracked(job, warn) as trackers:
        # cache=true: a finished training of the same training config is evaluated, not repeated (training/cache.py)
        reused = distributed.broadcast(cache.lookup(spec, source.fingerprint, job.launched_in)) if spec.cache and not resume else None
        if reused is not None:
            result = reused.restore(model, run_dir, job.device) if w.is_main else None
            cache.log.info(reused.message())
            console.print(reused.message(), highlight=False)
            if spec.eval.during_training.every:
                warn("eval.during_training: no curve: these weights come from the sweep cache, and the curve is "
                     "measured while a model trains; cache=false trains again and measures it")
        else:
            probe = _curve_probe(job, model, source, trackers, warn) if w.is_main else None
            with out_of_memory("training", job.device,
                               "train.batch_size, train_len, model.d_model or model.n_layers"):
                result = _train(job, model, source, trackers.log_train, probe)
        if not w.is_main:
            return {}  # rank 0 evaluates and writes; the weights are the same on every rank
        save_checkpoint(model, run_dir, {"config_hash": job.identity.value, "hash_format": job.identity.format,
                                         "steps": result.steps, "encoder": spec.encoder["name"]})
        if spec.cache and reused is None and cache_writable:
            cache.store(spec, source.fingerprint, run_dir, result, warn, job.launched_in)
        results = _evaluate_and_write(job, model, source, result, reused, key_tokens)
        trackers.log_results(results["rows"], run_dir)
    curve_s = results["run"]["train"].get("curve_s")
    trained = f"weights from cache {reused.key}" if reused is not None else \
        f"train {result.wall_s:.0f}s, {result.tokens_per_s:,.0f} tokens/s" + \
        (f"; curve {curve_s:.0f}s" if curve_s is not None else "")
    console.print(f"wrote {run_dir / RESULTS_JSON} ({trained})", highlight=False)
    return results


def _warner(console: Console) -> Callable[[str], None]:
    """A warning for the user: yellow on the run's console, and in train.log."""
    def warn(message: str) -> None:
        log.warning(message)
        console.print(f"[yellow]warning: {escape(message)}[/]", highlight=False, soft_wrap=True)  # one line, for grep
    return warn


def warn_about_settings(cfg: Config, warn: Callable[[str], None], is_main: bool,
                        launched_in: Optional[Path] = None) -> bool:
    """Warn about settings that train, but probably not as meant; returns whether ``cache_dir`` can be written.

    With ``cache=true`` and a ``cache_dir`` that cannot be written, this is said once, here: the run reads the
    cache but stores nothing.
    """
    for note in config_warnings(cfg):
        warn(note)
    problem = cache.unwritable_warning(cfg, launched_in) if cfg.cache and is_main else None
    if problem is not None:
        warn(problem)
    return problem is None


def _load_corpus(cfg: Config, w: World, console: Console, warn: Callable[[str], None]) -> Corpus:
    corpus = None
    for turn in (True, False):  # rank 0 builds the token cache first, the others then read it
        if w.is_main == turn:
            corpus = corpus_from_config(cfg, log=lambda msg: console.print(msg, highlight=False), warn=warn)
        distributed.barrier()
    return corpus


def _load_source(spec: Config, w: World, console: Console,
                 warn: Callable[[str], None]) -> TrainingSource:
    """What the run trains on: the corpus of ``data`` (task=lm), or a task (with ``data``'s text for passkey)."""
    longest = max(eval_lengths(spec))
    needs_corpus = not is_task(spec) or reads_data(spec.task)
    corpus = _load_corpus(spec, w, console, warn) if needs_corpus else None
    if not is_task(spec):
        check_fits(corpus, spec.train_len, longest)
        if spec.eval.during_training.every and corpus.val.size < max(curve_lengths(spec)) + 1:
            raise ConfigError("eval.during_training.multiples",
                              f"the validation split has {corpus.val.size} tokens, fewer than one window of the "
                              f"longest curve length + 1 = {max(curve_lengths(spec)) + 1}; use smaller multiples")
        return TrainingSource.of_corpus(corpus)
    return TrainingSource.of_task(spec, corpus)


def _announce(job: TrainJob, model: GPT, source: TrainingSource, chosen: Optional[threads.Threads] = None) -> None:
    spec, device, w = job.spec, job.device, job.world
    base = getattr(model.encoder, "base", None)
    job.console.print(f"[bold]posexp[/] encoder [cyan]{model.encoder.name}[/]"
                  f"{f' base {base:g}' if base is not None else ''} · {model.num_params():,} params · "
                  f"{source.describe()} · "
                  f"train_len {spec.train_len} · {device}"
                  f"{f' × {w.size} processes' if w.distributed else ''} · "
                  f"{threads.describe(chosen, torch.get_num_threads())}"
                  f"{' · compiled' if step_settings(device, spec.compile).compile else ''} · run dir {job.run_dir}",
                  highlight=False)


def _curve_probe(job: TrainJob, model: GPT, source: TrainingSource, trackers: tracking.Trackers,
                 warn: Callable[[str], None]) -> Optional[CurveProbe]:
    """``eval.during_training``: what measures the model while it trains, into curve.csv and the trackers; None
    when the curve is off. A resumed run keeps the points up to its checkpoint and measures the later ones again."""
    if not job.spec.eval.during_training.every:
        return None
    resume_step = (read_resume_pointer(job.run_dir) or {}).get("step", 0) if job.resume else None
    writer = CurveWriter(job.run_dir, PERPLEXITY if source.task is None else ACCURACY, resume_step)

    def on_point(step: int, rows: list[dict]) -> None:
        writer.write(rows)
        trackers.log_curve(step, rows)

    val = source.corpus.val if source.task is None else None
    return CurveProbe(model, job.spec, job.device, on_point, val=val, task=source.task, warn=warn)


def _train(job: TrainJob, model: GPT, source: TrainingSource, on_log: LogHook,
           probe: Optional[CurveProbe] = None) -> TrainResult:
    spec = job.spec
    sampler = TaskSampler(source.task, spec.train.batch_size, spec.seed, source.fingerprint) \
        if source.task is not None else \
        BatchSampler(source.corpus.train, spec.train_len, spec.train.batch_size, spec.seed, source.fingerprint)
    try:
        return train(model, spec, sampler, job.run_dir, job.identity, resume=job.resume, on_log=on_log, probe=probe)
    except TrainingDiverged as e:
        if job.world.is_main:
            write_run_status(job.run_dir, spec, job.overrides, "diverged", e, source.info(), step=e.step,
                             identity=job.identity)
        raise


def _evaluate_and_write(job: TrainJob, model: GPT, source: TrainingSource, result: TrainResult, reused,
                        key_tokens=None) -> dict:
    spec, device, run_dir, console = job.spec, job.device, job.run_dir, job.console
    if source.task is not None:
        rows, positions = evaluate_task_config(model, source.task, spec, device), None
    else:
        rows, positions = evaluate_config(model, source.corpus.val, spec, device, console, trained_in=result.precision,
                                          key_tokens=key_tokens)
    results: dict[str, Any] = {"run": provenance(spec, job.overrides, source.info(), model, result, job.identity),
                               "rows": rows}
    if reused is not None:
        results["run"]["cached_from"] = reused.provenance()
        results["run"]["train"]["threads"] = reused.entry.get("threads")  # of the training, not this evaluation
    elif spec.eval.during_training.every:  # seconds the curve took, every session's: kept off the training clock
        curve = draw_curve(run_dir, spec.train_len, title=f"{model.encoder.label}: extrapolation during training")
        results["run"]["train"]["curve_s"] = round(sum(row["eval_s"] for row in curve), 3)
    if positions:
        write_loss_by_position(run_dir, positions, spec.train_len, results["run"]["label"])
    write_results(run_dir, results)
    console.print(results_table(results))
    return results
