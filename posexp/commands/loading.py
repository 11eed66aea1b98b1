"""A finished run as Python objects: its config, its results rows and its trained model.

    import posexp

    run = posexp.load_run("outputs/2025-01-01/12-00-00")
    run.results  # a pandas DataFrame: one line per length x protocol x scaling, with encoder, seed, ... columns
    run.curve    # curve.csv (eval.during_training) the same way: one line per step x length
    logits = run.model(tokens)  # (B, L, vocab), the weights of the run's checkpoint

The run is the one :class:`posexp.reporting.runs.Run` the reports read too; this module is its library side
(:class:`RunOpener`): the config typed, the results as a table, the model. Many runs at once, as one table:
:func:`posexp.load_runs` (:mod:`posexp.reporting.frame`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from posexp.commands.edge import SavedConfig, folder_run_hash, typed
from posexp.config.schema import PretrainedConfig
from posexp.errors import PosexpError
from posexp.reporting.frame import records_table, run_records
from posexp.reporting.runs import Run, read_run
from posexp.runs.layout import CHECKPOINT, HYDRA_CONFIG
from posexp.runs.lock import refuse_running

ALLOW_KEYWORD = "allow_changed_encoder=True to posexp.load_run"  # the Python twin of --allow-changed-encoder


@dataclass
class RunOpener:
    """The library side of a :class:`~posexp.reporting.runs.Run` (its :class:`~posexp.reporting.runs.RunSide`):
    the raw saved config is typed here, at the edge; the results table and the model are made on first use."""

    allow_changed_encoder: bool = False
    _saved: Optional[SavedConfig] = field(default=None, repr=False)

    def saved(self, run: Run) -> SavedConfig:
        """The run's saved config, raw and typed (read once)."""
        if self._saved is None:
            self._saved = _saved_config(run)
        return self._saved

    def config(self, run: Run) -> Any:
        return self.saved(run).spec

    def results(self, run: Run) -> Any:
        return records_table(run_records(run))

    def model(self, run: Run) -> Any:
        if isinstance(run.info.get("pretrained"), dict):
            return _load_pretrained_model(run.path, run.info["pretrained"], run.config)
        return _load_model(run.path, self.saved(run), run.info, self.allow_changed_encoder)


def load_run(path: str | os.PathLike, allow_changed_encoder: bool = False) -> Run:
    """Read the run in folder ``path`` (one that ``posexp train`` wrote): a :class:`~posexp.reporting.runs.Run`
    whose config, results, curve and model (weights loaded on first ``.model``) are at hand.

    Args:
        path: the run folder, or its ``results.json``.
        allow_changed_encoder: build ``.model`` even when a plugin encoder's source changed since training
            (with a warning), as ``posexp eval --allow-changed-encoder`` does.

    Raises:
        PosexpError: ``path`` is not a run folder, or its results or config cannot be read.
    """
    refuse_running(path)
    opener = RunOpener(allow_changed_encoder)
    run = read_run(path, opener)  # a results.json named directly reads as its folder
    opener.saved(run)  # a config that cannot be read is refused now, not on first use
    return run


def _saved_config(run: Run) -> SavedConfig:
    """The run's config as saved, typed: a pretrained model's by that app's schema (``posexp eval hf:MODEL``)."""
    from posexp.commands.eval import apply_eval_overrides, load_run_config

    results = {"run": run.info, "rows": run.rows}
    if isinstance(run.info.get("pretrained"), dict):
        raw = load_run_config(run.path, results)
        return SavedConfig(raw, typed(raw, PretrainedConfig))  # type: ignore[arg-type]
    raw = apply_eval_overrides(load_run_config(run.path, results), [])
    return SavedConfig(raw, typed(raw))  # the edge: typed from here on


def _load_pretrained_model(run_dir: Path, record: dict, spec: Any):
    """The transformers model a pretrained run measured, from the model's folder (or the Hugging Face cache), in
    eval mode, fp32 on the CPU; refused when its weights are no longer those the run recorded."""
    from posexp.hf import require_transformers

    require_transformers("posexp.load_run(...).model of a pretrained model's run")
    from posexp.hf.loading import load_pretrained, provenance

    from transformers.utils import logging as hf_logging

    name, revision = str(record.get("name")), record.get("revision")
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one bar per load, in the middle of a user's notebook cell
    try:
        model, _ = load_pretrained(name, revision=revision, trust_remote_code=bool(spec.hf.trust_remote_code))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    recorded = record.get("weights_sha256")
    now = provenance(model, name, revision).get("weights_sha256")
    if recorded and now != recorded:
        raise PosexpError(f"{run_dir}: the weights of pretrained model {name} changed since the run measured them "
                          f"(SHA-256 {str(now)[:12]}... now, {str(recorded)[:12]}... in results.json); its results are "
                          "not of this model: measure it again with posexp eval hf:MODEL")
    return model


def _load_model(run_dir: Path, saved: SavedConfig, info: dict, allow_changed_encoder: bool = False):
    from posexp.commands.plugin_source import check_plugin_sources
    from posexp.commands.eval import _recorded_sha256
    from posexp.model.factory import build_model
    from posexp.training.checkpoint import load_weights

    vocab_size = info.get("vocab_size")
    if not isinstance(vocab_size, int):
        raise PosexpError(f"{run_dir}: results.json records no vocab_size; the model cannot be rebuilt")
    # a plugin encoder: from the working folder, else from where the run found it, and the same code
    check_plugin_sources(run_dir, saved.raw, {"run": info}, allow_changed_encoder,
                         warn=lambda message: warnings.warn(message, stacklevel=4), allow_option=ALLOW_KEYWORD)
    model = build_model(saved.spec, vocab_size)
    load_weights(model, run_dir / CHECKPOINT, folder_run_hash(run_dir, saved).value, sha256=_recorded_sha256(run_dir),
                 hint=f"the weights cannot be used; retrain the run with posexp train ({HYDRA_CONFIG} has its config)")
    return model.eval()
