"""A result row, declared once: how one number was measured, and what was measured.

Every row of ``results.json`` is a :class:`ResultRow`. Its fields fall in three parts, told apart by
field metadata rather than by lists kept elsewhere:

- the **key** (``key=True``): what makes two rows the same measurement (metric, length, protocol with its
  stride or K, scaling and its factor, window and sinks, the passkey's depth). A later ``posexp eval`` of the
  same key replaces the row; any other key adds one.
- the **settings** (``setting=True``): the rest of how it was measured (the token budget or the number of
  examples asked for, the task, the evaluation seed). They live on the row, not on the run, because rows
  of one run are added by different commands with different settings; a report compares rows by them.
- the **measurement**: the numbers (perplexity and its interval, accuracy, throughput, memory) and why a
  row is not applicable.

Writers (``results.json`` / ``results.csv``, ``loss_by_position.csv``, the trackers) and readers (the
report, :func:`posexp.load_runs`) take their columns from here; ``tests/unit/project/test_layout.py`` fails if a second
list of the key appears in the package. Rows written before a field existed load with it empty (the
run-level ``eval_settings`` fill in the budget of rows that predate per-row settings).

This module is torch-free and imports only the standard library and :mod:`posexp.errors`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from posexp.errors import PosexpError

PERPLEXITY, ACCURACY = "perplexity", "accuracy"


def _key(**meta: Any) -> Any:
    return field(default=None, metadata={"key": True, **meta})


def _setting(**meta: Any) -> Any:
    return field(default=None, metadata={"setting": True, **meta})


def _measured(**meta: Any) -> Any:
    return field(default=None, metadata=meta)


@dataclass
class ResultRow:
    """One measurement of one run.

    Key (what makes two rows the same measurement):
        metric: ``perplexity`` or ``accuracy`` (a task); rows of different metrics never share a table.
        length: the context length in tokens; multiple: ``length / train_len``.
        protocol, stride, last_k: which targets are scored (:mod:`posexp.evaluation.perplexity`).
        scaling, scaling_factor: evaluation-time context extension and its number (None: as trained).
        scaling_options: a position remapping's other options, ``"window=32"`` (``posexp/encoders/remapping.py``);
            with ``scaling_factor`` (rerope's window, self_extend's group) they are all of the method's options;
            LongRoPE's factors and ``n^``, ``"factors=3f2a9c1e start=4"`` (``posexp/runs/longrope.py``).
        window, sinks: each query attended only to its last ``window`` keys (and the first ``sinks``).
        depth: where the passkey sat (``task=passkey``), in [0, 1].

    Settings (how it was measured, beside the key):
        eval_tokens: the scored-token budget asked for (``eval.tokens``); ``tokens`` is what was scored.
        examples_asked: instances asked for per length (``eval.examples``) of a task row.
        task, size: the task of an accuracy row and its instance size at this length.
        eval_seed: the seed of generated evaluation instances (task rows); None where evaluation draws nothing.

    Model: ``model_scaling`` and ``model_scaling_factor``, the scaling the model carried when measured, apart from
    any evaluation-time ``scaling`` on top: a fine-tune's (``posexp finetune RUN scaling=yarn``), or the one in a
    pretrained model's config; absent for a model that carries none.

    Measurement: ``applicable`` (False: the encoding cannot represent the length, ``reason`` says why),
    ``ppl`` with ``ppl_low``/``ppl_high`` (95%), ``loss`` (nats/token) and ``loss_se``, ``ppl_key`` (LongPPL over
    the ``key_tokens`` an evaluator picked) with its interval, ``loss_key`` and ``loss_key_se``, ``exact_match`` and
    ``token_accuracy`` with Wilson intervals, what was scored (``tokens``, ``targets``, ``windows``,
    ``examples``), throughput and memory, and ``note`` (e.g. a non-finite number written as null).
    """

    metric: str = _key(default=PERPLEXITY)
    task: Optional[str] = _setting(omit_none=True)
    length: int = _key()
    multiple: Optional[float] = _setting()
    depth: Optional[float] = _key(omit_none=True)
    protocol: Optional[str] = _key()
    stride: Optional[int] = _key()
    last_k: Optional[int] = _key()
    scaling: Optional[str] = _key()
    scaling_factor: Optional[float] = _key()
    scaling_options: Optional[str] = _key(omit_none=True)
    size: Optional[int] = _setting(omit_none=True)
    window: Optional[int] = _key(omit_none=True)
    sinks: Optional[int] = _key(omit_none=True, beside="window")  # written with a window, even when None
    eval_tokens: Optional[int] = _setting(omit_none=True)
    examples_asked: Optional[int] = _setting(omit_none=True)
    eval_seed: Optional[int] = _setting(omit_none=True)
    model_scaling: Optional[str] = field(default=None, metadata={"omit_none": True})
    model_scaling_factor: Optional[float] = field(default=None, metadata={"omit_none": True})

    applicable: bool = _measured(default=True)
    # perplexity rows (posexp/evaluation/perplexity.py)
    ppl: Optional[float] = _measured(of=PERPLEXITY)
    loss: Optional[float] = _measured(of=PERPLEXITY)
    loss_se: Optional[float] = _measured(of=PERPLEXITY)
    ppl_low: Optional[float] = _measured(of=PERPLEXITY)
    ppl_high: Optional[float] = _measured(of=PERPLEXITY)
    # key-token perplexity (eval.key_tokens; posexp/evaluation/key_tokens.py): on the targets the evaluator picked
    ppl_key: Optional[float] = _measured(of=PERPLEXITY, omit_none=True)
    ppl_key_low: Optional[float] = _measured(of=PERPLEXITY, omit_none=True)
    ppl_key_high: Optional[float] = _measured(of=PERPLEXITY, omit_none=True)
    loss_key: Optional[float] = _measured(of=PERPLEXITY, omit_none=True)
    loss_key_se: Optional[float] = _measured(of=PERPLEXITY, omit_none=True)
    key_tokens: Optional[int] = _measured(of=PERPLEXITY, omit_none=True)
    se_blocks: Optional[int] = _measured(of=PERPLEXITY)
    tokens: Optional[int] = _measured(of=PERPLEXITY)
    targets: Optional[list] = _measured(of=PERPLEXITY)
    windows: Optional[int] = _measured(of=PERPLEXITY)
    forward_tokens: Optional[int] = _measured(of=PERPLEXITY)
    # accuracy rows (posexp/evaluation/accuracy.py)
    exact_match: Optional[float] = _measured(of=ACCURACY)
    exact_match_low: Optional[float] = _measured(of=ACCURACY)
    exact_match_high: Optional[float] = _measured(of=ACCURACY)
    token_accuracy: Optional[float] = _measured(of=ACCURACY)
    token_accuracy_low: Optional[float] = _measured(of=ACCURACY)
    token_accuracy_high: Optional[float] = _measured(of=ACCURACY)
    answer_loss: Optional[float] = _measured(of=ACCURACY)
    examples: Optional[int] = _measured(of=ACCURACY)
    answer_tokens: Optional[int] = _measured(of=ACCURACY)
    # cost, either metric
    tokens_per_s: Optional[float] = _measured()
    peak_mem_mb: Optional[float] = _measured()
    peak_rss_mb: Optional[float] = _measured(of=PERPLEXITY)
    reason: Optional[str] = _measured(omit_none=True)
    note: Optional[str] = _measured(omit_none=True)
    extra: dict = field(default_factory=dict, metadata={"omit_none": True})  # anything else, in the order written

    def __post_init__(self) -> None:
        if self.metric is None:  # rows written before the field existed are perplexity rows
            self.metric = PERPLEXITY

    # -- the three parts ------------------------------------------------------------------------------

    def key(self) -> tuple:
        """What makes two rows the same measurement (a float factor rounded so 4 and 4.0000000001 agree)."""
        return row_key(self.to_dict())

    def view(self) -> tuple:
        """The rows of one curve over length: the key less the length (and less the metric and depth)."""
        return tuple(getattr(self, n) for n in VIEW_KEY)

    def settings(self) -> dict:
        """How the row was measured beyond its key, for comparing rows of different runs."""
        return {n: getattr(self, n) for n in SETTINGS if getattr(self, n) is not None and n not in ("multiple",)}

    def get(self, name: str, default: Any = None) -> Any:
        """A field or a measured number by name (None when absent), as a dict row answers."""
        if name in FIELD_NAMES:
            value = getattr(self, name)
            return default if value is None else value
        return self.extra.get(name, default)

    # -- to and from results.json ----------------------------------------------------------------------

    @classmethod
    def from_dict(cls, raw: dict, run: Optional[dict] = None, where: str = "row") -> "ResultRow":
        """A row of ``results.json``, its declared fields checked for type.

        Args:
            raw: the row as stored.
            run: the run record (``results.json``'s ``run``): a row written before settings were per row gets
                its budget from the run's ``eval_settings``.
            where: how to name the row in an error (``results.json: row 3``).

        Raises:
            PosexpError: a declared field holds a value of the wrong type (a hand-edited file).
        """
        if not isinstance(raw, dict):
            raise PosexpError(f"{where}: not an object")
        values: dict[str, Any] = {}
        extra = {}
        for name, value in raw.items():
            if name in FIELD_NAMES and name != "extra":
                values[name] = _checked(name, value, where)
            else:
                extra[name] = value
        row = cls(**values, extra=extra)
        if row.eval_tokens is None and row.metric == PERPLEXITY and isinstance(run, dict):
            settings = run.get("eval_settings")
            tokens = settings.get("tokens") if isinstance(settings, dict) else None
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                row.eval_tokens = tokens
        return row

    def to_dict(self) -> dict:
        """The row as ``results.json`` stores it: declared fields first (optional ones only when set), then the
        measured numbers in the order they were added."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            beside = f.metadata.get("beside")
            if beside is not None and getattr(self, beside) is not None:
                pass
            elif value is None and (f.metadata.get("omit_none") or f.metadata.get("of", self.metric) != self.metric):
                continue
            out[f.name] = value
        out.update(self.extra)
        return out


# The key, the view and the settings, derived from the declaration above: the one place they are listed.
FIELD_NAMES = frozenset(f.name for f in fields(ResultRow))
ROW_KEY = tuple(f.name for f in fields(ResultRow) if f.metadata.get("key"))
SETTINGS = tuple(f.name for f in fields(ResultRow) if f.metadata.get("setting"))
VIEW_KEY = tuple(n for n in ROW_KEY if n not in ("metric", "length", "scaling_factor", "depth"))
# the key without the metric: a per-position loss belongs to one perplexity row
POSITION_KEY = tuple(n for n in ROW_KEY if n not in ("metric", "depth"))

_INTEGERS = ("length", "stride", "last_k", "window", "sinks", "size", "eval_tokens", "examples_asked", "eval_seed",
             "se_blocks", "tokens", "windows", "forward_tokens", "examples", "answer_tokens", "key_tokens")
_TEXTS = ("metric", "protocol", "scaling", "scaling_options", "model_scaling", "task", "reason", "note")
# numbers of the key must be finite; a measurement may not be (a diverged model), and is written as null
_KEY_NUMBERS = ("scaling_factor", "depth", "multiple")


def _checked(name: str, value: Any, where: str) -> Any:
    """``value`` of field ``name`` if it has the declared type (None always does); an integral float of an
    integer field becomes an int (JSON written by other tools)."""
    if value is None:
        return None
    if name in _INTEGERS and isinstance(value, float) and value.is_integer():
        value = int(value)
    if name in _INTEGERS:
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif name in _TEXTS:
        ok, kind = isinstance(value, str), "text"
    elif name == "applicable":
        ok, kind = isinstance(value, bool), "true or false"
    elif name == "targets":
        ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
        kind = "[first, last]"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok, kind = ok and (name not in _KEY_NUMBERS or math.isfinite(value)), "a number"
    if not ok:
        raise PosexpError(f"{where}: {name} is {value!r}, not {kind}; restore the file (or evaluate the run "
                          "again with posexp eval)")
    return value


def row_key(row: dict) -> tuple:
    """What makes two rows (as stored, or typed) the same measurement."""
    values = {n: row.get(n) for n in ROW_KEY}
    values["metric"] = values["metric"] or PERPLEXITY
    factor = values["scaling_factor"]
    values["scaling_factor"] = None if factor is None else round(float(factor), 9)
    return tuple(values.values())


def view_of(row: dict | ResultRow) -> tuple:
    """The ``VIEW_KEY`` values of a row: rows with the same view form one curve over length."""
    if isinstance(row, ResultRow):
        return row.view()
    return tuple(row.get(n) for n in VIEW_KEY)


def factor_text(scaling: Optional[str], factor: float) -> str:
    """`` ×4`` after a scaling's name, `` w=64`` after ``rerope`` (a window in tokens), `` group=8`` after
    ``self_extend``."""
    return f" w={factor:g}" if scaling == "rerope" else f" group={factor:g}" if scaling == "self_extend" else \
        f" ×{factor:g}"


def fixed_factor(row: dict, train_len: int) -> Optional[float]:
    """A scaled row's ``scaling_factor`` when it was set rather than the method's default for the row's length, else
    None: rows of one view with the same fixed factor (or all with the default) form one curve over length.

    The defaults are ``s = max(1, length / train_len)`` (``eval.scaling_factor`` unset), ``a = 1`` for
    ``dynamic_ntk``, and for ``self_extend`` the smallest group reaching the length, ``ceil((L - W) / (train_len -
    W))`` (as ``posexp.encoders.remapping.default_group``); ``rerope``'s factor is its window, the same at every
    length, so it is always fixed.
    """
    factor = row.get("scaling_factor")
    if factor is None:
        return None
    scaling, length = row.get("scaling"), int(row["length"])
    if scaling == "rerope":
        return float(factor)
    default = max(1.0, length / train_len)
    if scaling == "dynamic_ntk":
        default = 1.0
    elif scaling == "self_extend":
        options = dict(o.split("=", 1) for o in str(row.get("scaling_options") or "").split() if "=" in o)
        window = int(float(options["window"])) if "window" in options else max(1, int(train_len) // 4)
        default = max(1, math.ceil((length - window) / max(1, int(train_len) - window)))
    return None if abs(factor - default) < 1e-9 else float(factor)


def position_key(row: dict) -> dict:
    """The ``POSITION_KEY`` fields of a row (what a line of ``loss_by_position.csv`` belongs to)."""
    return {n: row.get(n) for n in POSITION_KEY}


def row_metric(row: dict) -> str:
    """A row's metric; rows written before the field existed are perplexity rows."""
    return str(row.get("metric") or PERPLEXITY)


def replace(row: ResultRow, **changes: Any) -> ResultRow:
    """A copy of ``row`` with ``changes``."""
    return dataclasses.replace(row, **changes)


# what a results.csv leaves out: the metric (one file holds one metric's rows) and what only results.json
# needs (which rows were measured how, internally)
_NOT_IN_CSV = ("metric", "task", "reason", "note", "extra")


def csv_columns(rows: list[dict], metric: str = PERPLEXITY) -> list[str]:
    """The columns of a run's ``results.csv`` for rows of ``metric``: the declared fields of that metric in
    declaration order (``targets`` as ``first_target``, ``last_target``), optional ones only when a row has them
    (a windowed evaluation's ``window`` and ``sinks``, a task's ``depth``), then the throughput."""
    present = {k for r in rows for k, v in r.items() if v is not None}
    columns: list[str] = []
    for f in fields(ResultRow):
        if f.name in _NOT_IN_CSV or f.metadata.get("of", metric) != metric:
            continue
        if f.metadata.get("omit_none") and f.name not in present and f.metadata.get("beside") not in present:
            continue
        columns += ["first_target", "last_target"] if f.name == "targets" else [f.name]
    return columns


def csv_record(row: dict) -> dict:
    """``row`` as a line of ``results.csv`` (its ``targets`` pair in two columns)."""
    targets = row.get("targets") or (None, None)
    return {**row, "first_target": targets[0], "last_target": targets[1]}
