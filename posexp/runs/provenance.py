"""What a run's results.json says about where its numbers came from: config, corpus, versions, commit.

Also the results.json of a run that did not finish (failed, diverged), so reports list it with its reason.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

import posexp
from posexp.config.identity import RunHash, config_dict, run_hash
from posexp.config.schema import Config, EvalConfig
from posexp.encoders.remapping import ALL_OPTION_KEYS
from posexp.model.positions import PositionPlan
from posexp.runs.atomic import atomic_write_json
from posexp.runs.longrope import longrope_settings
from posexp.runs.layout import write_results_json

PLUGIN_SOURCES = "encoder_source.json"  # the plugin code a run builds (encoder, task), recorded as training starts
SOURCE_KEYS = ("encoder_source", "layer_sources", "task_source")  # the keys of results.json's run that record it
# a line of a run's train.log, as configs/hydra/job_logging writes it: what a command outside Hydra appends matches
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def git_commit() -> Optional[str]:
    """The commit of the posexp source in use, with ``-dirty`` if it has local changes; None outside git."""
    src = Path(posexp.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    """What produced a result: posexp, torch and Python versions."""
    return {"posexp": posexp.__version__, "torch": torch.__version__, "python": platform.python_version()}


def source_fields(encoder: Mapping[str, Any]) -> dict:
    """What results.json records of the plugin code an ``encoder`` config builds: ``encoder_source`` (module,
    class, file, SHA-256, and distribution and version where installed) for a plugin encoder,
    ``layer_sources`` (layer name → the same record) for a ``mixed`` one with plugin layers; {} for built-ins,
    whose code posexp's version and commit name. A task of the user's is recorded with the training data
    (``task_source``, :meth:`posexp.tasks.source.TrainingSource.sources`)."""
    from posexp.encoders import plugin_sources

    sources = plugin_sources(encoder)
    if not sources:
        return {}
    name = str(encoder["name"])
    return {"encoder_source": sources[name]} if name in sources else {"layer_sources": sources}


def by_plugin(fields: Mapping[str, dict], encoder_name: str, task_name: str) -> dict[tuple[str, str], dict]:
    """The records of :func:`source_fields` (and ``task_source``) by plugin: ``("encoder", NAME)`` for a plugin
    encoder or each plugin layer of a ``mixed`` one, ``("task", NAME)`` for a task of the user's."""
    encoders = {encoder_name: fields["encoder_source"]} if "encoder_source" in fields else \
        fields.get("layer_sources", {})
    out = {("encoder", name): record for name, record in encoders.items()}
    if "task_source" in fields:
        out[("task", task_name)] = fields["task_source"]
    return out


def write_plugin_sources(run_dir: Path, fields: Mapping[str, dict]) -> None:
    """Record the plugin code a run builds (``fields``: :data:`SOURCE_KEYS`, as results.json has them) in the run
    folder as training starts, for ``posexp resume`` to find and compare with (results.json records it too, once
    the run finishes); nothing for built-ins."""
    if fields:
        atomic_write_json(run_dir / PLUGIN_SOURCES, dict(fields))


def recorded_sources(run_dir: Path, results: Optional[dict] = None) -> dict[str, dict]:
    """The plugin code a run was built with, as :func:`source_fields` records it: from results.json, else from the
    record written when training started; {} for built-ins (or a run written before plugins existed)."""
    run = (results or {}).get("run") or {}
    fields = {key: run[key] for key in SOURCE_KEYS if isinstance(run.get(key), dict)}
    if fields:
        return fields
    try:
        recorded = json.loads((run_dir / PLUGIN_SOURCES).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    fields = {key: recorded[key] for key in SOURCE_KEYS if isinstance(recorded.get(key), dict)}
    return fields or {"encoder_source": recorded}  # a folder written when only a plugin encoder was recorded


def run_label(overrides: list[str]) -> str:
    return " ".join(overrides) if overrides else "default"


def provenance(cfg: Config, overrides: list[str], corpus_info: dict, model, train_result, identity: RunHash) -> dict:
    """results.json's ``run``: what the run was, and ``identity``, the hash (and its format) its folder records."""
    base = getattr(model.encoder, "base", None)
    return {
        "label": run_label(overrides),
        "overrides": list(overrides),
        "encoder": model.encoder.label,  # the registry name, or a per-layer mix: mixed[rope,rope,rope,none]
        "base": base,
        "train_len": int(cfg.train_len),
        "seed": int(cfg.seed),
        "config": config_dict(cfg),
        "config_hash": identity.value,
        "hash_format": identity.format,
        **source_fields(cfg.encoder),
        **corpus_info,
        "eval_settings": eval_settings(cfg),
        **lineage(cfg),
        "versions": versions(),
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "status": "completed",
        "params": model.num_params(),
        "train": {"steps": train_result.steps, "tokens": train_result.tokens,
                  "final_loss": train_result.final_loss, "wall_s": round(train_result.wall_s, 3),
                  "tokens_per_s": round(train_result.tokens_per_s, 1), "precision": train_result.precision,
                  **({"precision_choice": choice} if (choice := getattr(train_result, "precision_choice", None))
                     else {}),
                  "device": train_result.device, "threads": torch.get_num_threads(),
                  "processes": train_result.processes, "compile": train_result.compiled,
                  **({"tf32": True} if getattr(train_result, "tf32", False) else {}),
                  **({"resumed_at": train_result.resumed_at} if train_result.resumed_at else {}),
                  **({"positions": tricks} if (tricks := PositionPlan(cfg).describe()) else {})},
    }


def lineage(cfg: Config) -> dict:
    """A fine-tuned run's parent, scaling and budget (``posexp finetune``); {} for a run trained from scratch.

    ``parent``, ``scaling`` and ``scaling_factor`` are top-level keys of results.json's ``run``, so that
    ``posexp report --by scaling`` groups by them; ``finetune`` holds the whole record.
    """
    ft = cfg.finetune
    if ft is None:
        return {}
    t = cfg.train
    record = {**dataclasses.asdict(ft), "train_len": int(cfg.train_len), "steps": int(t.steps),
              "tokens": int(t.steps) * int(t.batch_size) * int(cfg.train_len), "lr": float(t.lr)}
    return {"parent": str(ft.parent), "scaling": str(ft.scaling), "scaling_factor": float(ft.scaling_factor),
            "parent_train_len": int(ft.parent_train_len), "finetune": record}


def write_run_status(run_dir: Path, cfg: Optional[Config], overrides: list[str], status: str, error: BaseException,
                     corpus_info: Optional[dict] = None, step: Optional[int] = None,
                     identity: Optional[RunHash] = None) -> Path:
    """A ``results.json`` without rows for a run that did not finish: ``status`` "failed" or "diverged".

    It carries what is known of the run and ``error`` (message, type, step), so
    ``posexp report`` and the sweep summary list the run with its reason instead
    of silently dropping it. ``identity`` is the hash the run's checkpoints record (a new run's by default).
    """
    run: dict[str, Any] = {
        "label": run_label(overrides), "overrides": list(overrides), "status": status,
        "error": {"message": str(error), "type": type(error).__name__,
                  **({"step": int(step)} if step is not None else {})},
        "versions": versions(), "python_version": platform.python_version(), "git_commit": git_commit()}
    if cfg is None:  # the config itself is what failed
        return write_results_json(run_dir, {"run": {**run, **(corpus_info or {})}, "rows": []}, default=str)
    try:
        base = cfg.encoder.get("base")  # as a finished run records it, so --by base groups a diverged run too
        run.update({"encoder": cfg.encoder["name"], "base": None if base is None else float(base),
                    "train_len": int(cfg.train_len), "seed": int(cfg.seed), "config": config_dict(cfg)})
        identity = identity or run_hash(cfg)
        run.update({"config_hash": identity.value, "hash_format": identity.format,
                    "eval_settings": eval_settings(cfg)})
        run.update(source_fields(cfg.encoder))
    except Exception:  # noqa: BLE001 - record what we can, the error message says the rest
        pass
    run.update(corpus_info or {})
    return write_results_json(run_dir, {"run": run, "rows": []}, default=str)


def eval_settings(cfg: Config) -> dict:
    """The evaluation settings the report compares runs by; keys beyond tokens/protocol only when in use."""
    return eval_settings_of(cfg.eval)


def eval_settings_of(e: EvalConfig) -> dict:
    """:func:`eval_settings` of an ``eval`` group (a run's, or a pretrained model's evaluation)."""
    settings = {"tokens": int(e.tokens), "protocol": e.protocol}
    if e.stride is not None:
        settings["stride"] = int(e.stride)
    if e.last_k is not None:
        settings["last_k"] = int(e.last_k)
    if e.scaling != "none":
        settings["scaling"] = e.scaling
        if e.scaling_factor is not None:
            settings["scaling_factor"] = float(e.scaling_factor)
        if e.rerope_window is not None:
            settings["rerope_window"] = int(e.rerope_window)
        if getattr(e, "longrope_file", None) is not None:
            settings["longrope_file"] = str(e.longrope_file)
        factors, start = longrope_settings(e) if e.scaling == "longrope" else (None, 0)
        if factors is not None:  # as given, or read from posexp search's file: what was evaluated
            settings["longrope_factors"] = factors
        if start:  # LongRoPE's n^, recorded only when set (0: every position scaled, as before the key existed)
            settings["longrope_start"] = int(start)
        for key in ALL_OPTION_KEYS:  # a position remapping's options, where set
            if getattr(e, key, None) is not None:
                settings[key] = getattr(e, key)
        if getattr(e, "longrope_factors", None) is not None:
            settings["longrope_factors"] = [float(f) for f in e.longrope_factors]
    if e.window is not None:  # a window baseline (posexp/model/window.py)
        settings["window"] = int(e.window)
        if e.sinks is not None:
            settings["sinks"] = int(e.sinks)
    return settings
