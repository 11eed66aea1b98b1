"""A finished run as Python objects: its config, its results rows and its trained model.

    import posexp

    run = posexp.load_run("outputs/2025-01-01/12-00-00")
    run.results  # a pandas DataFrame (a list of dicts without pandas): one row per length x protocol
    run.curve    # curve.csv (eval.during_training) the same way: one row per step x length
    logits = run.model(tokens)  # (B, L, vocab), the weights of the run's checkpoint
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posexp.commands.edge import SavedConfig, folder_run_hash, typed
from posexp.errors import PosexpError
from posexp.runs.curve import read_curve
from posexp.runs.layout import CHECKPOINT, HYDRA_CONFIG, read_results


@dataclass
class Run:
    """A finished run, read back from its folder by :func:`load_run`.

    Attributes:
        path: the run folder.
        config: the run's config as the typed :class:`posexp.config.schema.Config` (keys added to posexp since
            the run was written get their defaults; ``encoder`` is a mapping, as
            :func:`~posexp.commands.edge.typed` leaves it).
        results: the rows of ``results.json``, as a pandas DataFrame when pandas is installed, else a list of dicts.
        info: ``results.json``'s ``run`` record (encoder, seed, corpus, training time, versions, ...).
    """

    path: Path
    config: Any
    results: Any
    info: dict
    _saved: SavedConfig = field(repr=False)
    _model: Any = field(default=None, repr=False)

    @property
    def model(self):
        """The trained :class:`posexp.model.gpt.GPT` in eval mode on the CPU, ready for ``model(tokens)``.

        Built from the run's config and loaded from its checkpoint on first use (then kept), checked
        against the config hash and SHA-256 recorded when training wrote it. Tied input and output
        embeddings stay one tensor.

        Raises:
            PosexpError: the checkpoint is missing, corrupt or from another config.
        """
        if self._model is None:
            self._model = _load_model(self.path, self._saved, self.info)
        return self._model

    @property
    def curve(self) -> Any:
        """The rows of ``curve.csv`` (``eval.during_training``: step, length, multiple, ppl or accuracy, ...), as
        :attr:`results` is; empty for a run trained without the curve."""
        return _table(read_curve(self.path)[1])


def load_run(path: str | os.PathLike) -> Run:
    """Read the run in folder ``path`` (one that ``posexp train`` wrote). The weights load on first ``.model``.

    Raises:
        PosexpError: ``path`` is not a run folder, or its results or config cannot be read.
    """
    from posexp.commands.eval import apply_eval_overrides, load_run_config

    run_dir = Path(path)
    results = read_results(run_dir)
    raw = apply_eval_overrides(load_run_config(run_dir, results), [])
    saved = SavedConfig(raw, typed(raw))  # the edge: typed from here on
    return Run(path=run_dir, config=saved.spec, results=_table(results.get("rows") or []),
               info=results.get("run", {}), _saved=saved)


def _table(rows: list[dict]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        return rows
    return pd.DataFrame(rows)


def _load_model(run_dir: Path, saved: SavedConfig, info: dict):
    from posexp.commands.eval import _recorded_sha256
    from posexp.model.factory import build_model
    from posexp.training.checkpoint import load_weights

    vocab_size = info.get("vocab_size")
    if not isinstance(vocab_size, int):
        raise PosexpError(f"{run_dir}: results.json records no vocab_size; the model cannot be rebuilt")
    model = build_model(saved.spec, vocab_size)
    load_weights(model, run_dir / CHECKPOINT, folder_run_hash(run_dir, saved).value, sha256=_recorded_sha256(run_dir),
                 hint=f"the weights cannot be used; retrain the run with posexp train ({HYDRA_CONFIG} has its config)")
    return model.eval()
