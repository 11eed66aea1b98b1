"""A run: one run folder's ``results.json``, its overrides and config, as the reports and :func:`posexp.load_run`
read it (one :class:`Run`; the typed config and the model come from its :class:`RunSide`, imported only by
:func:`posexp.load_run`, so a report stays light).

Reading the files is :mod:`posexp.runs.layout`'s job; this module only shapes them into :class:`Run`.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Protocol

from posexp.errors import PosexpError
from posexp.runs.curve import read_curve
from posexp.runs.row import VIEW_KEY
from posexp.runs.layout import CHECKPOINT, read_config_dict, read_overrides, read_results, results_file, sha256_file


class RunSide(Protocol):
    """What a run has beyond its files, supplied by the one that opened it: :func:`posexp.load_run`
    (:class:`posexp.commands.loading.RunOpener`) types its config and builds its model. Reporting reads a run
    without one, so it never imports the model side."""

    def config(self, run: "Run") -> Any: ...

    def results(self, run: "Run") -> Any: ...

    def model(self, run: "Run") -> Any: ...


@dataclass
class Run:
    """A finished run, read back from its folder: :func:`posexp.load_run` (the library: typed config, results
    table and model) and the reports (its files only) read this one class.

    Example::

        run = posexp.load_run("outputs/2026-11-22/10-00-00")
        run.config.train_len, run.config.encoder["name"]       # 128, 'rope'
        run.results.pivot_table(index="protocol", columns="length", values="ppl")
        run.curve[run.curve.length == 512].plot(x="step", y="ppl")   # with eval.during_training.every=N
        with torch.no_grad():
            logits = run.model(tokens)                          # tokens: (B, L) long -> (B, L, vocab)

    Attributes:
        path: the run folder.
        info: ``results.json``'s ``run`` record (label, encoder, seed, corpus, training time, versions, ...).
        rows: the ``rows`` list, one per evaluated (length, protocol, scaling).
        overrides: the Hydra overrides the run was launched with, or None when unknown.
        config: see :attr:`config`; :attr:`config_data` is the same config as plain data.
        results: see :attr:`results`.
        curve: see :attr:`curve`.
        model: see :attr:`model`.
    """

    path: Path
    info: dict
    rows: list[dict]
    overrides: Optional[list[str]]
    side: Optional[RunSide] = field(default=None, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def config_data(self) -> dict:
        """The resolved config as plain data: from results.json, else the run's ``.hydra/config.yaml``; {} when
        neither."""
        if "data" not in self._cache:
            config = self.info.get("config")
            self._cache["data"] = config if isinstance(config, dict) else read_config_dict(self.path)
        return self._cache["data"]

    @property
    def config(self) -> Any:
        """The run's config as the typed :class:`posexp.config.schema.Config` (keys added to posexp since the run
        was written get their defaults; ``encoder`` is a mapping, as :func:`~posexp.commands.edge.typed` leaves
        it); a pretrained model's run: :class:`~posexp.config.schema.PretrainedConfig`."""
        return self._side_value("config")

    @property
    def results(self) -> Any:
        """The rows of ``results.json`` as a pandas DataFrame, one line per measured length x protocol x scaling x
        window (task runs: x depth), each with the run's columns joined as :func:`posexp.load_runs` joins them:
        ``encoder``, ``base``, ``seed``, ``train_len``, ``task``, ``run``, ``config_hash``, ``status``, and for a
        fine-tune ``ft_scaling`` and ``parent``. The row's own fields follow: ``metric``, ``length``,
        ``multiple``, ``protocol``, ``scaling`` (of evaluation, ``none`` without), ``ppl``, ``ppl_low``,
        ``ppl_high``, ``loss``, or ``exact_match``, ... ."""
        return self._side_value("results")

    @property
    def model(self) -> Any:
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
        return self._side_value("model")

    @property
    def curve(self) -> Any:
        """The points of ``curve.csv`` (``eval.during_training.every=N``) as a pandas DataFrame: one line per
        ``step`` x ``length``, with ``multiple``, ``ppl`` and ``loss`` (a task run: ``exact_match``,
        ``token_accuracy``); empty for a run trained without it."""
        import pandas as pd

        return pd.DataFrame(read_curve(self.path)[1])

    @property
    def status(self) -> str:
        return str(self.info.get("status") or "unknown")

    @property
    def train_len(self) -> Optional[int]:
        value = self.info.get("train_len")
        return int(value) if isinstance(value, (int, float)) else None

    def _side_value(self, name: str) -> Any:
        """``config``, ``results`` or ``model`` from the run's side, made on first use and then kept."""
        if name not in self._cache:
            if self.side is None:
                raise PosexpError(f"{self.path}: read for a report, without its {name}; open it with "
                                  "posexp.load_run")
            self._cache[name] = getattr(self.side, name)(self)
        return self._cache[name]


def read_run(path: str | os.PathLike, side: Optional[RunSide] = None) -> Run:
    """Read one run folder's ``results.json`` (the files only; :func:`posexp.load_run` gives it its ``side``).

    Args:
        path: the run folder (or its ``results.json``).
        side: what types its config and builds its model, or None for a report.

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
    return Run(path=folder, info=info, rows=data["rows"], overrides=overrides, side=side)


def read_runs(folders: Iterable[str | os.PathLike], strict: bool = False) -> tuple[list[Run], list[str]]:
    """The runs of ``folders`` that can be read, and why each of the others cannot (one damaged results.json in a
    sweep must not hide the others); with ``strict``, the first that cannot be read raises its PosexpError."""
    runs: list[Run] = []
    problems: list[str] = []
    for folder in folders:
        try:
            runs.append(read_run(folder))
        except PosexpError as e:
            if strict:
                raise
            problems.append(str(e))
    return runs, problems


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


def run_labels(runs: list[Run]) -> tuple[list[str], list[str]]:
    """Label each run by the overrides that set it apart; make duplicates unique by folder.

    Overrides shared by every run (``train.steps=50`` given to a whole sweep) say
    nothing about the difference between rows, so they move to the header.
    """
    known = [r.overrides for r in runs if r.overrides is not None]
    shared: list[str] = []
    if len(runs) > 1 and len(known) == len(runs):
        shared = [o for o in known[0] if all(o in other for other in known[1:])]
    labels = []
    for run in runs:
        if run.overrides is None:
            labels.append(str(run.info.get("label") or run.path.name))
        else:
            labels.append(" ".join(short_override(o) for o in run.overrides if o not in shared) or "default")

    counts = Counter(labels)
    if max(counts.values()) > 1:
        root = Path(os.path.commonpath([str(r.path.resolve()) for r in runs]))
        for i, run in enumerate(runs):
            if counts[labels[i]] > 1:
                where = run.path.resolve().relative_to(root).as_posix() if run.path.resolve() != root else run.path.name
                labels[i] = f"{labels[i]} [{where or run.path.name}]"
        # Still clashing (same folder names in different places): a counter is the last resort.
        seen: Counter = Counter()
        for i, label in enumerate(labels):
            seen[label] += 1
            if seen[label] > 1:
                labels[i] = f"{label} #{seen[label]}"
    return labels, shared


def short_override(override: str) -> str:
    """An override as a label shows it: a folder value (``parent=/home/me/outputs/sweep/0``) by its last two parts
    (``parent=sweep/0``), which is what tells runs apart; the table's runs section has the whole path."""
    key, sep, value = override.partition("=")
    if sep and os.sep in value and len(Path(value).parts) > 2:
        return f"{key}={Path(*Path(value).parts[-2:]).as_posix()}"
    return override
