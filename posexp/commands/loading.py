"""A finished run as Python objects: its config, its results rows and its trained model.

    import posexp

    run = posexp.load_run("outputs/2025-01-01/12-00-00")
    run.results  # a pandas DataFrame: one line per length x protocol x scaling, with encoder, seed, ... columns
    run.curve    # curve.csv (eval.during_training) the same way: one line per step x length
    logits = run.model(tokens)  # (B, L, vocab), the weights of the run's checkpoint

Many runs at once, as one table: :func:`posexp.load_runs` (:mod:`posexp.reporting.frame`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posexp.commands.edge import SavedConfig, folder_run_hash, typed
from posexp.config.schema import PretrainedConfig
from posexp.errors import PosexpError
from posexp.reporting.frame import records_table, run_records
from posexp.reporting.runs import load_run as read_run
from posexp.runs.curve import read_curve
from posexp.runs.layout import CHECKPOINT, HYDRA_CONFIG

ALLOW_KEYWORD = "allow_changed_encoder=True to posexp.load_run"  # the Python twin of --allow-changed-encoder


@dataclass
class Run:
    """A finished run, read back from its folder by :func:`load_run`.

    Example::

        run = posexp.load_run("outputs/2026-11-22/10-00-00")
        run.config.train_len, run.config.encoder["name"]       # 128, 'rope'
        run.results.pivot_table(index="protocol", columns="length", values="ppl")
        run.curve[run.curve.length == 512].plot(x="step", y="ppl")   # with eval.during_training.every=N
        with torch.no_grad():
            logits = run.model(tokens)                          # tokens: (B, L) long -> (B, L, vocab)

    Attributes:
        path: the run folder.
        config: the run's config as the typed :class:`posexp.config.schema.Config` (keys added to posexp since
            the run was written get their defaults; ``encoder`` is a mapping, as
            :func:`~posexp.commands.edge.typed` leaves it).
        results: the rows of ``results.json`` as a pandas DataFrame, one line per measured length x protocol x
            scaling x window (task runs: x depth), each with the run's columns joined as
            :func:`posexp.load_runs` joins them: ``encoder``, ``base``, ``seed``, ``train_len``, ``task``,
            ``run``, ``config_hash``, ``status``, and for a fine-tune ``ft_scaling`` and ``parent``. The row's
            own fields follow: ``metric``, ``length``, ``multiple``, ``protocol``, ``scaling`` (of evaluation,
            ``none`` without), ``ppl``, ``ppl_low``, ``ppl_high``, ``loss``, or ``exact_match``, ... .
        curve: see :attr:`curve`.
        model: see :attr:`model`.
        info: ``results.json``'s ``run`` record (encoder, seed, corpus, training time, versions, ...).
    """

    path: Path
    config: Any
    results: Any
    info: dict
    _saved: SavedConfig = field(repr=False)
    _allow_changed_encoder: bool = field(default=False, repr=False)
    _model: Any = field(default=None, repr=False)

    @property
    def model(self):
        """The trained :class:`posexp.model.gpt.GPT` in eval mode on the CPU, ready for ``model(tokens)``; for the
        run of a pretrained model (``posexp eval hf:MODEL``) the transformers model it measured, read from the
        model's own folder (fp32, CPU; ``model(tokens).logits``), checked against the weights' SHA-256 the run
        recorded.

        Built from the run's config and loaded from its checkpoint on first use (then kept), checked
        against the config hash and SHA-256 recorded when training wrote it. Tied input and output
        embeddings stay one tensor. A plugin encoder (``--config-dir`` with ``module:``) is imported from the
        working folder, else from the file the run recorded, and must be the code the run was trained with,
        as ``posexp eval`` requires.

        Raises:
            PosexpError: the checkpoint is missing, corrupt or from another config; a plugin encoder cannot be
                imported, or its source changed since training (``load_run(..., allow_changed_encoder=True)``
                goes on with a warning); a pretrained model's folder is gone or holds other weights now.
        """
        if self._model is None:
            if isinstance(self.info.get("pretrained"), dict):
                self._model = _load_pretrained_model(self.path, self.info["pretrained"], self.config)
            else:
                self._model = _load_model(self.path, self._saved, self.info, self._allow_changed_encoder)
        return self._model

    @property
    def curve(self) -> Any:
        """The points of ``curve.csv`` (``eval.during_training.every=N``) as a pandas DataFrame: one line per
        ``step`` x ``length``, with ``multiple``, ``ppl`` and ``loss`` (a task run: ``exact_match``,
        ``token_accuracy``); empty for a run trained without it."""
        return _table(read_curve(self.path)[1])


def load_run(path: str | os.PathLike, allow_changed_encoder: bool = False) -> Run:
    """Read the run in folder ``path`` (one that ``posexp train`` wrote). The weights load on first ``.model``.

    Args:
        path: the run folder, or its ``results.json``.
        allow_changed_encoder: build ``.model`` even when a plugin encoder's source changed since training
            (with a warning), as ``posexp eval --allow-changed-encoder`` does.

    Raises:
        PosexpError: ``path`` is not a run folder, or its results or config cannot be read.
    """
    from posexp.commands.eval import apply_eval_overrides, load_run_config

    report_run = read_run(path)  # a results.json named directly reads as its folder
    run_dir, results = report_run.path, {"run": report_run.info, "rows": report_run.rows}
    if isinstance(report_run.info.get("pretrained"), dict):  # posexp eval hf:MODEL: its config is that app's
        raw = load_run_config(run_dir, results)
        saved = SavedConfig(raw, typed(raw, PretrainedConfig))  # type: ignore[arg-type]
        return Run(path=run_dir, config=saved.spec, results=records_table(run_records(report_run)),
                   info=report_run.info, _saved=saved)
    raw = apply_eval_overrides(load_run_config(run_dir, results), [])
    saved = SavedConfig(raw, typed(raw))  # the edge: typed from here on
    return Run(path=run_dir, config=saved.spec, results=records_table(run_records(report_run)), info=report_run.info,
               _saved=saved, _allow_changed_encoder=allow_changed_encoder)


def _table(rows: list[dict]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


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
    from posexp.commands.encoder_source import check_encoder_source
    from posexp.commands.eval import _recorded_sha256
    from posexp.model.factory import build_model
    from posexp.training.checkpoint import load_weights

    vocab_size = info.get("vocab_size")
    if not isinstance(vocab_size, int):
        raise PosexpError(f"{run_dir}: results.json records no vocab_size; the model cannot be rebuilt")
    # a plugin encoder: from the working folder, else from where the run found it, and the same code
    check_encoder_source(run_dir, saved.raw.encoder, {"run": info}, allow_changed_encoder,
                         warn=lambda message: warnings.warn(message, stacklevel=4), allow_option=ALLOW_KEYWORD)
    model = build_model(saved.spec, vocab_size)
    load_weights(model, run_dir / CHECKPOINT, folder_run_hash(run_dir, saved).value, sha256=_recorded_sha256(run_dir),
                 hint=f"the weights cannot be used; retrain the run with posexp train ({HYDRA_CONFIG} has its config)")
    return model.eval()
