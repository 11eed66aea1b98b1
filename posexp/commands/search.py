"""``posexp search RUN_OR_hf:NAME --target-len N``: LongRoPE's factor search as a command, resumable.

The search (:mod:`posexp.evaluation.longrope_search`: Ding et al. 2024, with the paper's ``n^`` in the search space,
and LongRoPE2's needle-driven objective as ``--objective needle``, Shang et al. 2025) runs on a posexp run folder or on
any transformers causal LM with RoPE (``hf:PATH_OR_NAME``, with ``data=... data.path=...`` overrides as ``posexp eval
hf:`` takes them). It writes into one folder (``--out``; by default ``RUN/longrope/N`` for a run,
``outputs/longrope/NAME/N`` for a model):

- ``state.json``: the search's settings and every candidate scored so far, rewritten after each one. Stopped (Ctrl-C,
  a killed job), the same command continues: the search is deterministic given its seed, so it replays with the
  scores it has and scores only what is new. Other settings against an existing state are refused (``--restart``
  starts over).
- ``factors.json`` (:mod:`posexp.runs.longrope`): the factors and ``n^`` found, read by
  ``posexp eval RUN eval.scaling=longrope eval.longrope_file=FOLDER`` and
  ``posexp finetune RUN scaling=longrope longrope_file=FOLDER``; the command prints both.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from rich.console import Console
from rich.markup import escape

from posexp.commands.edge import HF_PREFIX
from posexp.errors import ConfigError, PosexpError, require
from posexp.runs.longrope import FACTORS_FILE, STATE_FILE, write_factors
from posexp.runtime import terminal

STATE_FORMAT = 1


@dataclass
class Target:
    """What is searched: the model behind the seam, its rotary width and base, its training length, the
    validation tokens, a text encoder (for the needle objective), what names it in the state, and whether
    ``posexp finetune`` takes it (a run trained from scratch; not a pretrained model, nor a fine-tune)."""

    label: str
    model: Any
    rot_dim: int
    base: float
    train_len: int
    val: Any
    vocab: int
    encode: Optional[Callable[[str], list]]
    identity: str
    eval_settings: Any
    position_plan: Any
    device: Any
    dtype: Any
    default_out: Path
    finetunable: bool = False


def _run_target(path: Path, overrides: list[str]) -> Target:
    import posexp
    from posexp.data.corpus import corpus_from_config
    from posexp.evaluation.runner import eval_dtype
    from posexp.model.positions import PositionPlan
    from posexp.runtime.device import resolve_device

    require(not overrides, overrides[0] if overrides else "", "overrides apply to a hf: model (data=..., hf.*); a "
                                                              "run folder is searched on its own data")
    run = posexp.load_run(path)
    cfg, ft = run.config, run.config.finetune
    if ft is not None and ft.scaling != "none":  # as posexp eval refuses eval.scaling=longrope on such a run
        raise PosexpError(f"{path}: this run fine-tunes with scaling={ft.scaling}, which it reads as trained; "
                          f"LongRoPE's factors on top of it are not defined: search its parent {ft.parent}")
    model = run.model
    encoder = model.encoder
    rot_dim = getattr(encoder, "rot_dim", None)
    _check_longrope(encoder, int(cfg.train_len), rot_dim, str(path))
    device = resolve_device(cfg.device)
    model.to(device)
    corpus = corpus_from_config(cfg)
    return Target(str(path), model, int(rot_dim), float(encoder.base), int(cfg.train_len), corpus.val,
                  int(model.shape.vocab_size), _run_encoder(corpus), str(run.info.get("config_hash")), cfg.eval,
                  PositionPlan(cfg), device, eval_dtype(cfg, device, (run.info.get("train") or {}).get("precision")),
                  path / "longrope", finetunable=ft is None)


def _check_longrope(encoder, train_len: int, rot_dim: Optional[int], where: str) -> None:
    from posexp.encoders.extension import scaled_encoder

    name = getattr(encoder, "name", type(encoder).__name__)
    if rot_dim is None:
        raise PosexpError(f"{where}: LongRoPE rescales rope's frequencies; this run's encoder {name!r} has none "
                          f"(posexp search takes rope runs and transformers models with RoPE)")
    try:
        scaled_encoder(encoder, "longrope", 2.0, train_len, [1.0] * (int(rot_dim) // 2))
    except ConfigError as e:
        raise PosexpError(f"{where}: LongRoPE does not apply to this run: {str(e).split(': ', 1)[-1]}") from None


def _run_encoder(corpus) -> Optional[Callable[[str], list]]:
    """Text -> the run's token ids: bytes, or the BPE the corpus was tokenized with; None if neither is at hand."""
    if corpus.tokenizer == "byte":
        return lambda text: list(text.encode("utf-8"))
    if corpus.tokenizer_file and Path(corpus.tokenizer_file).is_file():
        from posexp.data.tokenizer import BPETokenizer

        bpe = BPETokenizer.load(Path(corpus.tokenizer_file))
        return lambda text: [int(t) for t in bpe.encode_batch([text])[0]]
    return None


def _hf_target(name: str, overrides: list[str], console: Console) -> Target:
    from hydra import compose, initialize_config_dir

    from posexp.commands.pretrained import _corpus, _load, check_pretrained, document_separator, window_bos
    from posexp.commands.validation import register_configs
    from posexp.config.schema import config_dir
    from posexp.hf.rotary import find_rotary, rope_theta
    from posexp.runtime.device import resolve_device
    from posexp.runtime.precision import resolve_precision

    require(name.strip() != "", "hf:NAME", "names the model: posexp search hf:PATH_OR_NAME --target-len N")
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        try:
            cfg = compose("pretrained", overrides=[f"hf.model={name}", *overrides])
        except Exception as e:  # Hydra's and OmegaConf's composition errors, in one line
            raise PosexpError(f"cannot compose the model's settings from {' '.join(overrides)!r}: "
                              f"{str(e).splitlines()[0]}") from None
    spec = check_pretrained(cfg)
    device = resolve_device(spec.device)
    dtype = resolve_precision(spec.precision, device)
    lm, tokenizer, record = _load(spec, device, dtype)
    reason = lm.check_scaling("longrope")
    if reason is not None:
        raise PosexpError(f"{HF_PREFIX}{name}: LongRoPE does not apply: {reason}")
    sites = [s for s in find_rotary(lm.model) if not s.local]
    train_len = int(spec.train_len or record["context_length"])
    separator = document_separator(tokenizer, lm.config)
    corpus = _corpus(spec, tokenizer, separator, console)
    lm.bos = window_bos(spec.hf.bos, tokenizer, lm.config)
    # the name's characters a folder name takes, never a hidden folder (hf:./x searches into outputs/longrope/x)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name)[-80:].strip("-.") or "model"
    return Target(f"{HF_PREFIX}{name}", lm, int(sites[0].dim), rope_theta(lm.config, sites[0].layer_type), train_len,
                  corpus.val, len(tokenizer), lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                  str(record.get("weights_sha256") or record.get("config_sha256") or name), spec.eval, None, device,
                  dtype, Path("outputs") / "longrope" / slug)


def _state(folder: Path, settings: dict, restart: bool) -> dict[str, float]:
    """The scores a stopped search left in ``folder`` (none for a new one).

    Raises:
        PosexpError: the state there is another search's (other settings), unless ``restart``.
    """
    path = folder / STATE_FILE
    if restart or not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text())
        recorded, scored = state["settings"], state["scored"]
    except (OSError, ValueError, KeyError, TypeError):
        raise PosexpError(f"{path} is not a search state; remove it or use --restart") from None
    # "model" is the run folder or hf: name as typed (relative or absolute); "identity" says which weights it is
    changed = sorted(k for k in set(recorded) | set(settings) if recorded.get(k) != settings.get(k) and k != "model")
    if changed:
        raise PosexpError(f"{path} holds a search with other settings ({', '.join(changed)}); continue it with "
                          f"the same options, start over with --restart, or choose another --out")
    return {str(k): (float(v) if v is not None else math.inf) for k, v in scored.items()}


def _save_state(folder: Path, settings: dict, scored: dict[str, float]) -> None:
    from posexp.runs.atomic import atomic_write_text

    values = {k: (v if math.isfinite(v) else None) for k, v in scored.items()}
    atomic_write_text(folder / STATE_FILE, json.dumps({"format": STATE_FORMAT, "settings": settings,
                                                       "scored": values}) + "\n")


@dataclass(frozen=True)
class SearchOptions:
    """What ``posexp search`` is asked beyond its target: the folder (``out``; None: the default), the objective
    (``ppl`` or ``needle``) and what it scores (``tokens`` held-out targets, or ``needles`` documents), the
    evolutionary search's settings, whether to drop a stopped search's state (``restart``), and for ``hf:`` models
    the overrides ``posexp eval hf:`` takes."""

    out: Optional[Path] = None
    objective: str = "ppl"
    tokens: int = 8192
    needles: int = 8
    settings: Any = None  # posexp.evaluation.longrope_search.SearchSettings; None: its defaults
    restart: bool = False
    overrides: tuple = ()


def _target(target: str, overrides: list[str], console: Console) -> Target:
    """The run folder or ``hf:`` model a search extends, loaded."""
    if target.startswith(HF_PREFIX):
        return _hf_target(target[len(HF_PREFIX):], overrides, console)
    path = Path(target).expanduser()
    if not path.is_dir():
        raise PosexpError(f"{target}: not a run folder; posexp search takes a run folder or hf:PATH_OR_NAME")
    return _run_target(path, overrides)


def _check_options(options: SearchOptions, objectives: tuple) -> None:
    """Raises ConfigError naming the option for an objective or a budget a search cannot take."""
    require(options.objective in objectives, "--objective",
            f"must be one of: {', '.join(objectives)} (got {options.objective!r})")
    require(options.tokens > 0, "--tokens", f"must be a positive number of held-out targets (got {options.tokens})")
    require(options.needles > 0, "--needles", f"must be a positive number of documents (got {options.needles})")


def search_main(target: str, target_len: int, options: SearchOptions = SearchOptions(),
                console: Optional[Console] = None) -> dict:
    """Run (or continue) a search and write its factors file; returns the file's record (the module docstring).

    Raises:
        ConfigError / PosexpError: one line naming the option and what is allowed.
    """
    from posexp.evaluation.longrope_search import (OBJECTIVES, SearchSettings, check_settings, needle_documents,
                                                   needle_score, perplexity_score)

    console = console or terminal.console()
    out, objective, tokens, needles, restart = (options.out, options.objective, options.tokens, options.needles,
                                                options.restart)
    overrides = list(options.overrides)
    _check_options(options, OBJECTIVES)
    settings = options.settings or SearchSettings()
    start, seed = settings.start, settings.seed
    check_settings(settings)
    found = _target(target, overrides, console)
    _check_lengths(found, target_len, start)
    folder = (out or found.default_out / str(target_len)).expanduser()
    identity = {"model": found.label, "identity": found.identity, "target_len": int(target_len),
                "train_len": found.train_len, "rot_dim": found.rot_dim, "objective": objective,
                **({"tokens": int(tokens)} if objective == "ppl" else {"needles": int(needles)}), **asdict(settings)}
    scored = _state(folder, identity, restart)
    if objective == "ppl":
        require(found.val.size > tokens + target_len, "--tokens",
                f"{tokens} held-out targets at length {target_len} need {tokens + target_len + 1} validation tokens; "
                f"the data has {found.val.size}")
        score = perplexity_score(found.model, found.val[-(tokens + target_len + 1):], found.eval_settings,
                                 found.train_len, target_len, found.device, found.dtype, found.position_plan)
    else:
        if found.encode is None:
            raise PosexpError(f"{found.label}: --objective needle writes its passkeys as text, and this run's "
                              f"tokenizer is not at hand to encode them; use --objective ppl")
        try:
            docs, answer = needle_documents(found.encode, found.val, found.vocab, target_len, needles, seed)
        except ConfigError as e:  # the passkey task names its own key; here the length is --target-len's
            raise ConfigError("--target-len", str(e).split(": ", 1)[-1].replace("eval.lengths", "--target-len")
                              .replace("task passkey", "--objective needle")) from None
        score = needle_score(found.model, docs, answer, found.train_len, found.device, found.dtype,
                             position_plan=found.position_plan)
    folder.mkdir(parents=True, exist_ok=True)
    known = len(scored)
    console.print(f"[bold]posexp search[/] {escape(found.label)} · LongRoPE to {target_len} tokens "
                  f"({target_len / found.train_len:g}x {found.train_len}) · objective {objective} · "
                  f"{settings.candidates()} candidates at most · state {escape(str(folder / STATE_FILE))}"
                  + (f" · resuming with {known} scored" if known else ""), highlight=False, soft_wrap=True)
    result = _searched(score, found, target_len, settings, scored, folder, identity, console)
    record = {"factors": result.factors, "start": result.start, "target_len": int(target_len),
              "train_len": found.train_len, "rot_dim": found.rot_dim, "objective": objective,
              "score": result.ppl, "initial": result.initial, "history": result.history, "model": found.label,
              "settings": identity}
    path = write_factors(folder, record)
    _print_done(console, found, result, target_len, objective, path)
    return record


def _check_lengths(found: Target, target_len: int, start: Optional[int]) -> None:
    """Refuse a ``--target-len`` the run cannot be extended to and a ``--start`` past its training length."""
    require(target_len > found.train_len, "--target-len",
            f"must be longer than the training length {found.train_len} it extends (got {target_len})")
    plan = found.position_plan  # a run trained with randomized positions reads lengths up to its range only
    if plan is not None and not plan.eval_supports(target_len):
        raise ConfigError("--target-len", f"{target_len} is past the positions the run reads: trained with randomized "
                                          f"positions drawn from 0..{plan.max_position - 1} (train.max_position)")
    require(start is None or start < found.train_len, "--start",
            f"must be below the training length {found.train_len}: those positions keep the trained rotation "
            f"(got {start})")


def _searched(score, found: Target, target_len: int, settings, scored: dict[str, float], folder: Path,
              identity: dict, console: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from posexp.evaluation.longrope_search import Stretch, search_factors

    best = math.inf
    total = settings.candidates()  # the candidates scored, as the first line says; a stopped search's counted
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("longrope search", total=total, completed=min(len(scored), total))

        def on_scored(key: str, value: float, fresh: bool) -> None:
            nonlocal best
            if fresh:  # the state on disk holds every score: a stop loses at most the candidate being scored
                _save_state(folder, identity, scored)
            if value < best:
                best = value
                progress.update(task, description=f"longrope search · best {best:.3f} at n^={key.rsplit('|', 1)[1]}")
            progress.update(task, advance=int(fresh))  # a parent ranked again, or a known score, is not scored

        started = time.perf_counter()
        result = search_factors(score, Stretch(found.rot_dim, found.base, found.train_len, target_len),
                                settings, cache=scored, on_scored=on_scored,
                                log=lambda m: progress.console.print(f"{m} ({time.perf_counter() - started:.0f} s)",
                                                                     highlight=False))
        progress.update(task, completed=total)
    _save_state(folder, identity, scored)
    return result


def _print_done(console: Console, found: Target, result, target_len: int, objective: str, path: Path) -> None:
    folder = path.parent
    unit = "ppl" if objective == "ppl" else "needle ppl"
    console.print(f"best {unit} at {target_len}: {result.ppl:.3f} with n^={result.start} (pi "
                  f"{result.initial['pi']:.3f}, ntk {result.initial['ntk']:.3f}, yarn {result.initial['yarn']:.3f}); "
                  f"factors in {escape(str(path))}", highlight=False, soft_wrap=True)
    console.print(f"posexp eval {escape(found.label)} eval.scaling=longrope eval.longrope_file={escape(str(folder))}"
                  f" eval.lengths=[{target_len}]", highlight=False, soft_wrap=True)
    if not found.finetunable:
        return
    console.print(f"posexp finetune {escape(found.label)} train_len={target_len} scaling=longrope "
                  f"longrope_file={escape(str(folder))}", highlight=False, soft_wrap=True)


__all__ = ["FACTORS_FILE", "SearchOptions", "search_main"]
