"""A run as the report sees it: one run folder's ``results.json``, its overrides and config.

Reading the files is :mod:`posexp.runs.layout`'s job; this module only shapes them into :class:`Run`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from posexp.runs.row import VIEW_KEY
from posexp.runs.layout import CHECKPOINT, read_config_dict, read_overrides, read_results, results_file, sha256_file


@dataclass
class Run:
    """One run folder's ``results.json``.

    Attributes:
        path: the run folder.
        info: the ``run`` object (label, encoder, config, ...).
        rows: the ``rows`` list, one per evaluated (length, protocol, scaling).
        overrides: the Hydra overrides the run was launched with, or None when unknown.
    """

    path: Path
    info: dict
    rows: list[dict]
    overrides: Optional[list[str]]
    _config: Optional[dict] = field(default=None, repr=False)

    @property
    def config(self) -> dict:
        """The resolved config: from results.json, else the run's ``.hydra/config.yaml``; {} when neither."""
        if self._config is None:
            self._config = _run_config(self)
        return self._config

    @property
    def status(self) -> str:
        return str(self.info.get("status") or "unknown")

    @property
    def train_len(self) -> Optional[int]:
        value = self.info.get("train_len")
        return int(value) if isinstance(value, (int, float)) else None


def load_run(path: str | os.PathLike) -> Run:
    """Read one run folder's ``results.json``.

    Args:
        path: the run folder (or its ``results.json``).

    Returns:
        The parsed :class:`Run`.

    Raises:
        PosexpError: the file is missing, unreadable, not JSON, or not shaped like results.
    """
    folder = results_file(path).parent
    data = read_results(path)
    info = data["run"]
    overrides = info.get("overrides")
    # Overrides from results.json, else from Hydra's own record of the launch.
    overrides = [str(o) for o in overrides] if isinstance(overrides, list) else read_overrides(folder)
    return Run(path=folder, info=info, rows=data["rows"], overrides=overrides)


def _run_config(run: Run) -> dict:
    config = run.info.get("config")
    if isinstance(config, dict):
        return config
    return read_config_dict(run.path)


def base_train_len(run: Run) -> Optional[int]:
    """The training length a run is compared at: its own, or for a fine-tune (``posexp finetune``) its parent's,
    since extending the context is what a fine-tune does."""
    parent = run.info.get("parent_train_len")
    return int(parent) if isinstance(parent, int) and run.info.get("parent") else run.train_len


def shown_settings(run: Run, rows: list[dict]) -> Optional[dict]:
    """How the rows a report shows of ``run`` were measured (each row carries its own settings,
    :class:`posexp.runs.row.ResultRow`): their protocol, stride or K, scaling, window and token budget; a setting
    that differs between the rows is a sorted list. None when the run shows no row."""
    if not rows:
        return None
    settings: dict = {}
    for name in (*VIEW_KEY, "eval_tokens"):
        values = sorted({r.get(name) for r in rows if r.get(name) is not None}, key=str)
        if values:
            settings["tokens" if name == "eval_tokens" else name] = values[0] if len(values) == 1 else values
    return settings


def window_key(row: dict) -> Optional[tuple]:
    """(window, sinks) of a windowed row (``eval.window``), None for a row that attended to its whole past."""
    return None if row.get("window") is None else (row.get("window"), row.get("sinks"))


def context_gain(run: Run, train_len: int, length: Optional[int],
                 window: Optional[tuple] = None) -> tuple[Optional[bool], Optional[float]]:
    """Loss of the run's ``last_k`` rows at ``train_len`` minus at ``length`` (None: the longest one), unscaled:
    the same last K tokens scored with more context (Kazemnejad et al. 2023). (None, None) without them.
    ``window``: (window, sinks) of the windowed rows to read (``eval.window``); None = the plain rows."""
    losses = {int(r["length"]): r.get("loss") for r in run.rows
              if r.get("protocol") == "last_k" and r.get("scaling") is None and window_key(r) == window}
    if train_len not in losses:
        return None, None
    target = length if length is not None else max(losses)
    if target not in losses or target == train_len and length is None:
        return None, None
    if losses[train_len] is None or losses[target] is None:
        return False, None
    return True, losses[train_len] - losses[target]


def parent_changed(child: Run, parent_dir: str | os.PathLike) -> Optional[str]:
    """Why a fine-tune's parent is no longer the one it started from (its weights overwritten or changed since,
    or gone), in words; None when the parent's weights are those the fine-tune recorded, or it recorded none."""
    recorded = (child.info.get("finetune") or {}).get("parent_weights_sha256")
    if not recorded:
        return None
    weights = Path(parent_dir) / CHECKPOINT
    try:
        now = sha256_file(weights)
    except OSError:
        return f"its parent's weights {weights} are gone"
    if now != recorded:
        return (f"its parent {parent_dir} was overwritten or changed since the fine-tune (weights SHA-256 "
                f"{recorded[:12]} then, {now[:12]} now)")
    return None


def model_identity(run: Run) -> tuple:
    """Which model a run measured, whatever folder holds the rows: a pretrained model's weights (their SHA-256, else
    its Hugging Face id and revision); a trained run's config hash (what shapes its weights, evaluation settings
    left out: :func:`posexp.config.identity.config_hash`), else its folder."""
    model = run.info.get("pretrained")
    if isinstance(model, dict):
        sha = model.get("weights_sha256")
        return ("weights", sha) if sha else ("hf", model.get("name"), model.get("revision"))
    digest = run.info.get("config_hash")
    return ("config", digest) if isinstance(digest, str) and digest else ("folder", str(run.path.resolve()))


# what a row was measured on, beside its length: two rows of one model differ only by their view where these agree
MEASURED_ON = ("eval_tokens", "tokens", "examples_asked", "eval_seed")


def measured_on(row: dict) -> tuple:
    """The tokens (or task instances) a row scored: its budget, what was scored, its examples and their seed."""
    return tuple(row.get(name) for name in MEASURED_ON)


def measured_text(row: dict) -> str:
    """:func:`measured_on` in words, for a note saying why two rows are not differenced."""
    return ", ".join(f"{name}={row.get(name)}" for name in MEASURED_ON if row.get(name) is not None) or "unrecorded"
