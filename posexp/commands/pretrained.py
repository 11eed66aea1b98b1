"""``posexp eval hf:MODEL``, one job: a pretrained transformers causal LM measured under posexp's protocols.

The recipe mirrors ``posexp train``'s without the training: check the config, load the model and its tokenizer
(:mod:`posexp.hf.loading`), tokenize ``data`` with that tokenizer (cached as any corpus is), evaluate through the
model seam (:class:`posexp.hf.model.HFLanguageModel`, read by :func:`posexp.evaluation.perplexity.evaluate` as it
reads posexp's own model) and write the run folder as a run's: results.json with the model's provenance (name,
revision, config and weights SHA-256) in ``run.pretrained``, results.csv / .md, the plots and loss by position.
:func:`pretrained_arguments` reads the command's ``hf:MODEL`` and ``task=`` into this config's overrides: the
recipe knows its config's keys, the command line only runs the app (:data:`posexp.cli.hydra_flags.APPS`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from posexp.commands.edge import HF_PREFIX, typed
from posexp.config.identity import unset_keys_dropped
from posexp.commands.evaluator import Evaluated, check_key_tokens, key_selector, run_tokens
from posexp.config.schema import DEVICES, PRECISIONS, DataConfig, EvalConfig, HFConfig, PretrainedConfig, lengths_of
from posexp.data.corpus import check_fits, load_corpus
from posexp.data.tokenizer import PRETRAINED, TokenizerSpec
from posexp.errors import ConfigError, require
from posexp.evaluation.accuracy import evaluate_task
from posexp.evaluation.key_tokens import Evaluator, OpenedEvaluator
from posexp.evaluation.perplexity import EvalHooks, check_protocol, evaluate
from posexp.evaluation.runner import EvalProgress, with_model_scaling
from posexp.model.window import check_window
from posexp.runs.layout import RESULTS_JSON
from posexp.runs.provenance import eval_settings_of, git_commit, run_label, versions
from posexp.rendering.results import results_table, write_loss_by_position, write_results
from posexp.runtime.device import resolve_device
from posexp.runtime.precision import resolve_precision
from posexp.tasks.passkey_text import TextPasskey
from posexp.runtime import terminal

BOS_CHOICES = ("auto", "true", "false")  # hf.bos
PRETRAINED_TASKS = ("lm", "passkey")  # perplexity, or zero-shot passkey retrieval (posexp.tasks.passkey_text)


def pretrained_arguments(args: Sequence[str]) -> list[str]:
    """``posexp eval hf:MODEL ...`` as the overrides of configs/pretrained.yaml: ``hf:MODEL`` is ``hf.model=MODEL``
    (``hf:A,B`` with ``-m`` sweeps over models, as any comma list does; without ``-m``, a folder named ``A,B`` that
    exists is that one folder, quoted for Hydra), and ``task=passkey`` is ``task.name=passkey`` (``task=lm,passkey``
    with ``-m``: perplexity and the zero-shot passkey in one sweep), as ``posexp train`` spells a task."""
    sweeping, out = any(a in ("-m", "--multirun") for a in args), []
    for a in args:
        name = a[len(HF_PREFIX):]
        if not a.startswith(HF_PREFIX):
            out.append(f"task.name={a[len('task='):]}" if a.startswith("task=") else a)
        elif not sweeping and set(name) & set(",[]{}() ") and not set(name) & set("'\"\\") \
                and Path(name).expanduser().is_dir():
            out.append(f"hf.model='{name}'")
        else:
            out.append(f"hf.model={name}")
    return out


def check_pretrained(cfg: DictConfig) -> PretrainedConfig:
    """Everything about a pretrained model's evaluation that can be checked before the model loads (every sweep
    job is checked first); the lengths in multiples of the model's context length are checked once it has loaded.

    Raises:
        ConfigError: naming the key and what is allowed.
    """
    from posexp.evaluation.extension_checks import check_remap_options, check_scaling_settings
    from posexp.commands.validation import check_data

    spec = typed(cfg, PretrainedConfig)
    require(str(spec.hf.model).strip() != "", "hf.model", "names the model: posexp eval hf:PATH_OR_NAME")
    require(spec.device in DEVICES, "device", f"must be one of: {', '.join(DEVICES)} (got {spec.device!r})")
    require(spec.precision in PRECISIONS, "precision",
            f"must be one of: {', '.join(PRECISIONS)} (got {spec.precision!r})")
    require(spec.train_len is None or spec.train_len > 0, "train_len",
            f"must be a positive number of tokens, or null for the model's own context length (got {spec.train_len})")
    require(spec.hf.device_map in (None, "auto"), "hf.device_map",
            f"must be auto (accelerate places the layers) or null (one device; got {spec.hf.device_map!r})")
    require(spec.hf.query_chunk is None or spec.hf.query_chunk > 0, "hf.query_chunk",
            f"must be a positive number of queries, or null (got {spec.hf.query_chunk})")
    require(str(spec.hf.bos).lower() in BOS_CHOICES, "hf.bos",
            f"must be one of: {', '.join(BOS_CHOICES)} (got {spec.hf.bos!r})")
    check_data(spec.data, None)
    require(spec.task.name in PRETRAINED_TASKS, "task.name",
            f"a pretrained model is measured on {' or '.join(PRETRAINED_TASKS)} (got {spec.task.name!r}); the "
            "generated tasks are read in posexp's own vocabularies, which a pretrained model does not share")
    require(spec.task.digits >= 1, "task.digits", f"must be a positive number of digits (got {spec.task.digits})")
    e = spec.eval
    values = e.lengths if e.lengths is not None else e.multiples
    require(len(values) > 0 and all(v > 0 for v in values), "eval.lengths" if e.lengths is not None else
            "eval.multiples", f"must list positive numbers (got {list(values)})")
    check_scaling_settings(e.scaling, e.scaling_factor, e.rerope_window, spec.train_len)
    check_remap_options(e, spec.train_len)
    if e.lengths is not None:
        check_protocol(e.protocol, e.stride, e.last_k, min(e.lengths))
    check_window(e.window, e.sinks)
    check_key_tokens(e, spec.task.name)
    return spec


def pretrained_run(spec: PretrainedConfig, run_dir: Path, overrides: list[str],
                   console: Optional[Console] = None) -> dict:
    """Load, evaluate and write one pretrained model's run of a checked config (the module docstring)."""
    console = console or terminal.console()
    device = resolve_device(spec.device)
    dtype = resolve_precision(spec.precision, device)  # auto: bf16 on a GPU that has it, fp32 on a CPU (no probe)
    lm, tokenizer, record = _load(spec, device, dtype)
    train_len = int(spec.train_len or record["context_length"])
    lengths = lengths_of(spec.eval, train_len)
    check_protocol(spec.eval.protocol, spec.eval.stride, spec.eval.last_k, lengths[0])
    if spec.eval.tokens < lengths[-1] and spec.task.name == "lm":
        raise ConfigError("eval.tokens", f"must be at least the longest eval length {lengths[-1]} (got "
                                         f"{spec.eval.tokens})")
    separator = document_separator(tokenizer, lm.config)
    corpus = _corpus(spec, tokenizer, separator, console)
    lm.bos = window_bos(spec.hf.bos, tokenizer, lm.config) if spec.task.name == "lm" else None
    check_fits(corpus, train_len, lengths[-1])
    console.print(f"[bold]posexp[/] pretrained [cyan]{lm.label}[/] · {record.get('parameters', 0):,} params · "
                  f"context {train_len} · {corpus.name} in its tokenizer ({corpus.val.size:,} val tokens) · "
                  f"{device} {str(dtype).replace('torch.', '')} · run dir {run_dir}", highlight=False)
    positions: list[dict] = []
    info = {**corpus.info(), "text": scored_text(corpus, tokenizer, separator, lm.bos)}
    evaluated = Evaluated(f"{HF_PREFIX}{spec.hf.model}", corpus.val, hf_tokens(tokenizer, separator), train_len)
    key_tokens = key_selector(spec.eval, evaluated, spec.data, device, hf_evaluator,
                              log=lambda m: console.print(m, highlight=False)) if spec.task.name == "lm" else None
    if spec.task.name == "passkey":
        task = TextPasskey(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], corpus.val,
                           len(tokenizer), digits=spec.task.digits)
        rows = evaluate_task(lm, task, spec.eval, train_len, device, dtype=dtype)
        info["task"] = {"name": task.name, "options": task.options(), "citation": task.citation, "zero_shot": True}
    else:
        progress = EvalProgress(console, lengths)
        try:
            rows = evaluate(lm, corpus.val, spec.eval, train_len, device, dtype=dtype,
                            hooks=EvalHooks(log=lambda m: console.print(f"[yellow]{m}[/]", highlight=False),
                                            progress=progress,
                                            positions=positions if spec.eval.loss_by_position else None,
                                            key_tokens=key_tokens))
        finally:
            progress.close()
    rows = with_model_scaling(rows, *carried_scaling(record))
    label = run_label(overrides)
    results: dict[str, Any] = {"run": _provenance(spec, label, overrides, train_len, info, record), "rows": rows}
    if positions:
        write_loss_by_position(run_dir, positions, train_len, label)
    write_results(run_dir, results)
    console.print(results_table(results))
    return results


def _load(spec: PretrainedConfig, device: torch.device, dtype: torch.dtype):
    """The model behind the seam, its tokenizer, and its provenance: the model's (:func:`posexp.hf.loading.provenance`),
    its ``context_length`` (``train_len``, else :func:`context_length`) and rotary base, and for a posexp run
    exported by ``posexp export`` the export's record (the run, its config hash)."""
    from posexp.hf import require_transformers

    require_transformers("posexp eval hf:MODEL")
    from transformers.utils import logging as hf_logging

    from posexp.hf.loading import load_pretrained, model_folder, provenance, read_export
    from posexp.hf.model import DEFAULT_CHUNK, HFLanguageModel
    from posexp.hf.rotary import rope_record

    hf_logging.disable_progress_bar()  # a bar per weight file would interleave with posexp's own lines
    h = spec.hf
    model, tokenizer = load_pretrained(h.model, revision=h.revision, trust_remote_code=h.trust_remote_code,
                                       device=str(device), dtype=dtype, device_map=h.device_map)
    lm = HFLanguageModel(model, h.model, chunk=h.query_chunk or DEFAULT_CHUNK)
    record = provenance(model, h.model, h.revision)
    folder = model_folder(h.model, h.revision)
    exported = read_export(folder) if folder is not None else None
    if exported is not None:
        record["posexp_export"] = exported
    length = spec.train_len or (exported or {}).get("train_len") or lm.context_length
    if not length:
        raise ConfigError("train_len", "the model's config names no context length; give it: train_len=N (tokens)")
    record.update(context_length=int(length), **(rope_record(model.config) if lm.has_rope else {"rope_theta": None}))
    return lm, tokenizer, record


def hf_tokens(tokenizer, separator: Optional[int]) -> str:
    """Which tokens a transformers model reads (key-token perplexity's evaluator must read the same): posexp's byte
    tokens when the tokenizer is the one ``posexp export`` writes for a ``tokenizer=byte`` run (the same definition
    and document separator, so the same ids for every text), else the tokenizer's fingerprint."""
    fingerprint = tokenizer_fingerprint(tokenizer, separator)
    if fingerprint == _exported_byte_fingerprint():
        return run_tokens({"tokenizer": "byte"})
    return f"the tokens of transformers tokenizer {fingerprint}"


@functools.lru_cache(maxsize=1)
def _exported_byte_fingerprint() -> str:
    """The :func:`tokenizer_fingerprint` of the byte tokenizer ``posexp export`` writes, with its separator."""
    from posexp.hf.tokenizer_export import BYTE_SEPARATOR, byte_tokenizer, fast_tokenizer

    return tokenizer_fingerprint(fast_tokenizer(byte_tokenizer(), eos_token=None), BYTE_SEPARATOR)


def hf_evaluator(name: str, device: torch.device) -> Evaluator:
    """``eval.key_tokens.evaluator=hf:NAME``: its tokenizer's identity, and its id, revision and weights' SHA-256
    for the cache key, read from its folder; the model itself loads only when a selection is not cached. It reads
    each window as ``posexp eval hf:NAME`` would (``hf.bos=auto``, ``precision=auto``)."""
    from posexp.hf import require_transformers

    require_transformers("eval.key_tokens.evaluator=hf:NAME")
    from posexp.hf.loading import model_folder, snapshot_revision, weight_files, weights_sha256

    spec = PretrainedConfig(hf=HFConfig(model=name), data=DataConfig(), eval=EvalConfig())
    dtype = resolve_precision(spec.precision, device)
    folder = model_folder(name, None)
    if folder is None or not weight_files(folder):  # not on disk as files: load it to know it
        lm, tokenizer, record = _load(spec, device, dtype)
        config, weights, revision, loaded = lm.config, record.get("weights_sha256"), record.get("revision"), lm
    else:
        from transformers import AutoConfig, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        weights, revision, loaded = weights_sha256(None, folder)[0], snapshot_revision(folder), None
    bos = window_bos(spec.hf.bos, tokenizer, config)
    identity = f"hf:{name} revision {revision} weights {weights} bos {bos} {str(dtype).removeprefix('torch.')}"

    def opener() -> OpenedEvaluator:
        lm = loaded if loaded is not None else _load(spec, device, dtype)[0]
        lm.bos = bos
        return OpenedEvaluator(lm, int(lm.context_length or 0), None, dtype)

    return Evaluator(f"{HF_PREFIX}{name}", identity, hf_tokens(tokenizer, document_separator(tokenizer, config)),
                     opener)
def carried_scaling(record: dict) -> tuple[Optional[str], Optional[float]]:
    """The scaling a pretrained model's config carries (``rope_parameters``' ``rope_type`` and ``factor``, of the
    layers a scaling stretches where they are per layer type: Gemma 3's full-attention ones), or ``(None, None)``
    for a model with none (``default``) or without rotary positions."""
    from posexp.hf.rotary import LOCAL_LAYER_TYPES

    params = record.get("rope_parameters")
    if not isinstance(params, dict):
        return None, None
    if "rope_type" not in params:  # per layer type
        scaled = [v for k, v in sorted(params.items()) if k not in LOCAL_LAYER_TYPES and isinstance(v, dict)]
        params = scaled[0] if scaled else {}
    kind = params.get("rope_type") or params.get("type")
    if kind in (None, "default"):
        return None, None
    factor = params.get("factor")
    return str(kind), float(factor) if isinstance(factor, (int, float)) else None


def document_separator(tokenizer, config) -> Optional[int]:
    """The id between two documents: the end-of-sequence token of the tokenizer, else its beginning-of-sequence
    token, else the model config's (an exported posexp run keeps its byte 0 there); the first of a list."""
    for value in (tokenizer.eos_token_id, tokenizer.bos_token_id, getattr(config, "eos_token_id", None),
                  getattr(config, "bos_token_id", None)):
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None


def window_bos(choice: str, tokenizer, config) -> Optional[int]:
    """The BOS id each perplexity window starts with (``hf.bos``), or None: ``auto`` gives the BOS the tokenizer
    itself adds to a text by default (Llama's does, GPT-2's does not), ``true`` the tokenizer's (else the config's)
    BOS token, ``false`` none.

    Raises:
        ConfigError: ``hf.bos=true`` for a model that names no BOS token.
    """
    choice = str(choice).lower()
    if choice == "false":
        return None
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else getattr(config, "bos_token_id", None)
    if isinstance(bos, (list, tuple)):
        bos = bos[0] if bos else None
    if choice == "true":
        if bos is None:
            raise ConfigError("hf.bos", "true needs a BOS token, and the model's tokenizer and config name none; "
                                        "use hf.bos=auto or hf.bos=false")
        return int(bos)
    added = tokenizer("a")["input_ids"]
    return int(added[0]) if bos is not None and added and added[0] == bos else None


def scored_text(corpus, tokenizer, separator: Optional[int], bos: Optional[int]) -> dict:
    """results.json's ``run.text``: what a row's ``targets: [first, last]`` index, for reproducing a cell with
    transformers alone. The validation tokens are each of ``documents`` (files under ``root``, in this order)
    tokenized without special tokens, joined by ``separator``; target ``t`` is token ``t`` of them, predicted from
    the window's tokens before it, the window's first input replaced by ``bos`` where it is not null."""
    def token(i: Optional[int]) -> Optional[str]:
        return None if i is None else tokenizer.convert_ids_to_tokens(int(i))

    return {"root": corpus.source, "documents": corpus.val_documents, "split": corpus.split,
            "val_tokens": int(corpus.val.size), "add_special_tokens": False,
            "separator": separator, "separator_token": token(separator), "bos": bos, "bos_token": token(bos)}


def _corpus(spec: PretrainedConfig, tokenizer, separator: Optional[int], console: Console):
    """``data`` tokenized by the model's own tokenizer (cached, keyed by the tokenizer's fingerprint and the
    separator)."""
    tokenizer_spec = TokenizerSpec(name=PRETRAINED, pretrained=tokenizer, separator=separator,
                                   fingerprint=tokenizer_fingerprint(tokenizer, separator))
    return load_corpus(spec.data, tokenizer_spec, log=lambda m: console.print(m, highlight=False),
                       warn=lambda m: console.print(f"[yellow]warning:[/] {m}", highlight=False))


def tokenizer_fingerprint(tokenizer, separator: Optional[int] = None) -> str:
    """16 hex digits of SHA-256 over what a transformers tokenizer tokenizes with: a fast tokenizer's whole
    definition (vocabulary, merges, normalizer, pre-tokenizer), else its vocabulary and special tokens; and the
    document separator."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    text += repr(sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())) + f"|{separator}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _provenance(spec: PretrainedConfig, label: str, overrides: list[str], train_len: int, corpus_info: dict,
                record: dict) -> dict:
    """results.json's ``run`` for a pretrained model: the fields a trained run has where they mean the same
    (``encoder`` is ``hf:NAME``, ``train_len`` the model's context length), the model's own in ``pretrained``."""
    config = OmegaConf.to_container(OmegaConf.structured(spec), resolve=True)
    blob = repr(sorted((str(k), repr(v)) for k, v in unset_keys_dropped(config).items()))  # type: ignore[arg-type]
    return {"label": label, "overrides": list(overrides), "encoder": f"{HF_PREFIX}{record['name']}",
            "base": record.get("rope_theta"), "train_len": int(train_len), "seed": int(spec.seed),
            "config": config, "config_hash": hashlib.sha256(blob.encode()).hexdigest()[:16],
            "pretrained": record, **corpus_info, "eval_settings": eval_settings_of(spec.eval),
            "versions": {**versions(), **record.get("versions", {})}, "python_version": platform.python_version(),
            "git_commit": git_commit(), "status": "completed", "params": record.get("parameters")}


def pretrained_of(run_dir: str | os.PathLike) -> Optional[dict]:
    """For the folder of a pretrained model's run (``posexp eval hf:MODEL``), finished or not: ``name`` (the model
    as given after ``hf:``), ``overrides`` (the others it was launched with) and ``rope_theta`` (where results.json
    records one); None for any other folder."""
    import yaml

    from posexp.runs.layout import HYDRA_CONFIG, load_overrides

    folder = Path(run_dir)
    run: dict = {}
    try:
        loaded = json.loads((folder / RESULTS_JSON).read_text()).get("run")
        run = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError, AttributeError):
        pass
    model = run.get("pretrained")
    name = model.get("name") if isinstance(model, dict) else None
    overrides = run.get("overrides")
    if name is None:  # an unfinished one: what Hydra saved before it started
        try:
            saved = yaml.safe_load((folder / HYDRA_CONFIG).read_text())
        except (OSError, ValueError, yaml.YAMLError):
            return None
        hf = saved.get("hf") if isinstance(saved, dict) else None
        if not isinstance(hf, dict) or "model" not in hf or "encoder" in saved:
            return None
        name = hf["model"]
    if overrides is None:
        try:
            overrides = load_overrides(folder)
        except Exception:  # noqa: BLE001 - no overrides.yaml: the model alone
            overrides = []
    kept = [str(o) for o in overrides if not str(o).startswith("hf.model=")]
    return {"name": str(name), "overrides": kept,
            "rope_theta": model.get("rope_theta") if isinstance(model, dict) else None,
            "train_len": run.get("train_len")}


def hf_argument(name: str) -> str:
    """``hf:NAME`` as a shell takes it: quoted for Hydra (and the shell) where the name has a comma or a space."""
    if set(name) & set(",[]{}()= '\"\\"):
        inner = name.replace("\\", "\\\\").replace("'", "\\'")
        return f"\"hf:'{inner}'\""
    return f"hf:{name}"


def pretrained_refusal(run_dir: str | os.PathLike, command: str) -> Optional[str]:
    """The line ``command`` (export, finetune, analyze, load_run) says of a pretrained model's run, whose weights
    stay in the model's folder: what it is, and what to type instead; None for any other folder."""
    found = pretrained_of(run_dir)
    if found is None:
        return None
    name, model = found["name"], hf_argument(found["name"])
    what = f"{run_dir}: the run of pretrained model {name}, whose weights stay in the model's own folder"
    if command == "export":
        return (f"{what}; posexp export writes posexp's own trained runs, and {name} is a transformers model "
                f"already: load it as it is, AutoModelForCausalLM.from_pretrained('{name}'), or "
                f"posexp.load_run('{run_dir}').model")
    if command == "finetune":
        kept = " ".join(o for o in found["overrides"] if not o.startswith("eval.scaling"))
        return (f"{what}; posexp finetune continues posexp's own trained runs: measure the model under a context "
                f"extension instead, e.g. posexp eval {model} {kept} eval.scaling=yarn".replace("  ", " "))
    if command == "analyze":
        theta, length = found.get("rope_theta"), found.get("train_len")
        if theta:
            return (f"{what}; posexp analyze reads posexp's own trained runs: the geometry of its rotary "
                    f"frequencies is posexp analyze encoder=rope base={theta:g}"
                    f"{f' train_len={length}' if length else ''}")
        return f"{what}; posexp analyze reads posexp's own trained runs and encoders, not a transformers model"
    return f"{what}; {command} reads posexp's own trained runs"


def rerun_command(folders: list[Path], given: Sequence[str] = ()) -> str:
    """The ``posexp eval`` line that measures again, as new runs, the pretrained models' runs in ``folders``: their
    models and the overrides they were launched with (one that differs between them swept, as their sweep did),
    ``given`` (the user's ``eval.KEY=VALUE``) in place of the recorded value of the same key."""
    records = [r for r in (pretrained_of(f) for f in folders) if r is not None]
    models = list(dict.fromkeys(r["name"] for r in records))
    values: dict[str, list[str]] = {}
    for r in records:
        for o in r["overrides"]:
            key, _, value = str(o).partition("=")
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    for o in given:
        key, _, value = str(o).partition("=")
        values[key] = [value]
    if len(models) == 1:
        model = hf_argument(models[0])
    else:
        names = [f"'{m}'" if hf_argument(m) != f"hf:{m}" else m for m in models]
        model = f"\"hf:{','.join(names)}\"" if any(n.startswith("'") for n in names) else f"hf:{','.join(names)}"
    sweep = len(models) > 1 or any(len(v) > 1 for v in values.values())
    settings = " ".join(f"{k}={','.join(v)}" for k, v in values.items())
    return " ".join(part for part in ("posexp eval", "-m" if sweep else "", model, settings) if part)


def pretrained_hint(run_dir: Path) -> Optional[str]:
    """For the run of a pretrained model (``posexp eval hf:MODEL``), which keeps no weights of its own: the command
    that measures the model again; None for any other run."""
    try:
        run = json.loads((run_dir / RESULTS_JSON).read_text()).get("run") or {}
    except (OSError, ValueError):
        return None
    model = run.get("pretrained") if isinstance(run, dict) else None
    if not isinstance(model, dict):
        return None
    kept = " ".join(o for o in run.get("overrides", []) if not o.startswith("hf.model="))
    return (f"{run_dir}: the run of pretrained model {model.get('name')}, whose weights stay in its own folder; "
            f"measure it again as a new run: posexp eval {hf_argument(str(model.get('name')))} {kept} eval.KEY=VALUE"
            .rstrip())


__all__ = ["HF_PREFIX", "check_pretrained", "hf_argument", "pretrained_hint", "pretrained_of", "pretrained_refusal",
           "pretrained_run", "rerun_command", "tokenizer_fingerprint"]
