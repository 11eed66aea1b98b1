"""The one registry of report metrics: every ``--metric`` of ``posexp report``, perplexity and task alike.

A metric is declared once, as a subclass of :class:`MetricSpec` in a module of this package. Every module of
the package is imported the first time the registry is read, and defining the class registers it: a new
metric is one new file, with no list to edit. The parser (:func:`parse_metric`), the ``--metric`` help and
its shell completion (:func:`metric_help`, :func:`metric_examples`), the number of decimals a table shows
and the direction a better/worse verdict takes all read the declaration. A class that names no direction
(``better``) fails when it is defined, for a silent default would flip every verdict on it.

A whole new metric, e.g. ``posexp/reporting/metrics/median_ppl.py``::

    from posexp.reporting.metrics import LOWER, PERPLEXITY, Metric, MetricSpec, Value


    class MedianPpl(MetricSpec):
        kind = "median_ppl"            # unique; what a parsed Metric points back to
        pattern = "median@{x}"         # {x}: a multiple of the training length (8x); {at}: 8x or tokens
                                       # (1024); {pct}: a percentage (10%, read as 0.10)
        forms = "median@Kx"            # how --metric's help and errors spell it
        examples = ("median@4x",)      # what shell completion offers
        applies = PERPLEXITY           # which runs: PERPLEXITY (language-model runs) or ACCURACY (task runs)
        better = LOWER                 # LOWER or HIGHER: required
        decimals = 2

        def value(self, metric: Metric, row, report) -> Value:
            ...
            return True, 3.2            # (True, v); (False, None) = n/a; (None, None) = not evaluated

        def describe(self, metric: Metric, report) -> str:
            return f"{metric.name} = the median perplexity from 1x to {metric.multiple:g}x the training length."

Every metric's ``value`` gets the run's :class:`~posexp.reporting.table.ReportRow` (``row.cells``: length -> Stat of
the field the table shows, ``row.run``: the run with all its result rows) and the
:class:`~posexp.reporting.table.Report`. A metric of the value at one length subclasses :class:`ValueAt`; one of
another field of the result rows (``ppl_key`` beside ``ppl``, ``token_accuracy`` beside ``exact_match``) reads it,
in the view the table shows, with :func:`shown_values` (length -> (applicable, value)).

A metric from outside the package enters the same way: importing the module that defines the class registers it.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from posexp.errors import ConfigError

PERPLEXITY, ACCURACY = "perplexity", "accuracy"
# what a table's cell shows of the rows of each kind of run: the field, its scale (accuracy in %) and the bounds of
# a value (stats.aggregate_stat cuts an interval over runs at them), None: unbounded
CELLS: dict[str, tuple[str, float, Optional[tuple[float, float]]]] = {
    PERPLEXITY: ("ppl", 1.0, None), ACCURACY: ("exact_match", 100.0, (0.0, 100.0))}
LOWER, HIGHER = "lower", "higher"
DEFAULT_TOLERANCE = 0.1  # what a bare maxlen stands for: ppl within +10% of the training length's (--tolerance)
Value = tuple[Optional[bool], Optional[float]]

# what each {slot} of a pattern matches, loosely (a bad value is then named by the metric's own message)
_SLOTS = {"at": r"(?P<at>[^@%]*)", "x": r"(?P<x>[^@%]*?)x?", "pct": r"(?P<pct>[^@%]*?)"}
_NUMBER = r"\d+(?:\.\d+)?"


@dataclass(frozen=True)
class Metric:
    """One ``--metric`` as the user typed it, parsed by its :class:`MetricSpec`.

    Attributes:
        name: e.g. ``ratio@8x``, ``maxlen@10%``, ``acc@2x``: the column's title.
        kind: the :attr:`MetricSpec.kind` that computes it.
        multiple: the length as a multiple of each run's own training length (``@8x``).
        length: the length in tokens (``@1024``).
        fraction: a percentage of the name as a fraction (``maxlen@10%``: 0.1; ``maxlen@acc90``: 0.9).
        of_parent: measured on a fine-tuned run's parent (``posexp finetune``), beside the run's own.
    """

    name: str
    kind: str
    multiple: Optional[float] = None
    length: Optional[int] = None
    fraction: Optional[float] = None
    of_parent: bool = False

    @property
    def spec(self) -> "MetricSpec":
        _load()
        return _REGISTRY[self.kind]

    @property
    def decimals(self) -> int:
        return self.spec.decimals

    @property
    def higher_is_better(self) -> bool:
        return self.spec.better == HIGHER

    @property
    def relative(self) -> bool:
        return self.spec.relative

    @property
    def share(self) -> float:
        return self.fraction if self.fraction is not None else 0.9

    def at(self, train_len: Optional[int]) -> Optional[int]:
        """The length this metric looks at for a run trained at ``train_len``."""
        if self.length is not None:
            return self.length
        if self.multiple is not None and train_len is not None:
            return int(round(self.multiple * train_len))
        return None

    def where(self, times: str = "×") -> str:
        """Where the metric looks, in words: ``1024 tokens`` or ``4× the training length``."""
        if self.length is not None:
            return f"{self.length} tokens"
        return f"{self.multiple or 1:g}{times} the training length"

    def describe(self, report: Any = None) -> str:
        """One sentence for the notes under the table."""
        if self.of_parent:
            return (f"{self.name} = {self.name.removeprefix('parent ')} of the run each fine-tune started from "
                    "(its parent, at the parent's own training length for multiples).")
        return self.spec.describe(self, report)


class MetricSpec:
    """The declaration of one metric; subclass it in a module of this package (see the module docstring).

    Class attributes:
        kind: a unique id.
        pattern: the name, with at most one slot: ``{at}`` (``8x`` or ``1024`` tokens), ``{x}`` (a multiple,
            ``8x``) or ``{pct}`` (a percentage, ``10``); a regular expression otherwise (``%?``).
        forms: how help and errors spell it (``ppl@Kx, ppl@N``).
        examples: what shell completion offers.
        applies: :data:`PERPLEXITY` or :data:`ACCURACY`: which runs it is computed for.
        better: :data:`LOWER` or :data:`HIGHER`: the direction of every better/worse verdict. Required.
        decimals: the decimals a table shows.
        reads: the field of the result rows a :class:`ValueAt` reads (``exact_match``, ``token_accuracy``).
        relative: a difference says something in % of the reference's mean (a comparison's ``+2.4%``, a ``--margin``
            of ``2%``): the metric's zero is no value a run can have (perplexity, a ratio, a length). False for a
            difference or an exponent (``gain``, ``slope``), whose 0 is an ordinary value: a % of a mean near it
            reads as a huge change.
        bounds: the lowest and highest value a run can have (an accuracy in %: 0 and 100; a length: 0 and inf),
            where an interval over runs is cut (:func:`~posexp.reporting.stats.aggregate_stat`); None: unbounded.
    """

    kind: ClassVar[str]
    pattern: ClassVar[str]
    forms: ClassVar[str]
    examples: ClassVar[tuple[str, ...]] = ()
    applies: ClassVar[str] = PERPLEXITY
    better: ClassVar[Optional[str]] = None
    decimals: ClassVar[int] = 2
    reads: ClassVar[str] = "exact_match"
    relative: ClassVar[bool] = True
    bounds: ClassVar[Optional[tuple[float, float]]] = None
    max_pct: ClassVar[float] = float("inf")  # the largest {pct} allowed
    min_multiple: ClassVar[float] = 0.0  # {x} must be above this

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not abstract:  # a shape other metrics share (ValueAt) is no metric of its own
            register(cls())

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        """The metric of one run (its :class:`~posexp.reporting.table.ReportRow`, in the
        :class:`~posexp.reporting.table.Report`): (True, value), (False, None) = not applicable, (None, None) = not
        evaluated."""
        raise NotImplementedError

    def describe(self, metric: Metric, report: Any) -> str:
        raise NotImplementedError

    def argument(self, raw: str, text: str) -> Optional[Metric]:
        """The :class:`Metric` of ``raw`` whose slot holds ``text``; None when ``text`` is no value of the slot."""
        if self.slot == "pct":
            if re.fullmatch(_NUMBER, text) and 0 < float(text) <= self.max_pct:
                return Metric(raw, self.kind, fraction=float(text) / 100)
        elif self.slot == "x":
            if re.fullmatch(_NUMBER, text) and float(text) > self.min_multiple and raw.endswith("x"):
                return Metric(raw, self.kind, multiple=float(text))
        else:
            if (m := re.fullmatch(rf"({_NUMBER})x", text)) and float(m.group(1)) > 0:
                return Metric(raw, self.kind, multiple=float(m.group(1)))
            if re.fullmatch(r"\d+", text) and int(text) > 0:
                return Metric(raw, self.kind, length=int(text))
        return None

    def error(self, raw: str, text: str) -> str:
        """What is wrong with ``raw``, whose slot holds ``text``, in one line."""
        if self.slot == "at":
            return f"{raw!r}: {text!r} is not a length; use a multiple like 8x or tokens like 1024"
        return f"{raw!r} is not of the form {self.forms}"

    def bare(self, tolerance: float) -> Optional[str]:
        """The full name the bare family name stands for (``maxlen`` -> ``maxlen@10%``); None: not bare-able."""
        return None

    @property
    def family(self) -> str:
        return self.pattern.split("@")[0]

    @property
    def slot(self) -> Optional[str]:
        found = re.search(r"\{(at|x|pct)\}", self.pattern)
        return found.group(1) if found else None

    def match(self, raw: str) -> Optional[re.Match]:
        regex = self.pattern
        for slot, loose in _SLOTS.items():
            regex = regex.replace("{" + slot + "}", loose)
        return re.fullmatch(regex, raw)


class ValueAt(MetricSpec, abstract=True):
    """A metric of the value at one length (``{at}``), of :meth:`values`, times :attr:`scale`."""

    scale: ClassVar[float] = 1.0

    def values(self, row: Any, report: Any) -> dict[int, Value]:
        """length -> (applicable, value) the metric picks from: the field :attr:`reads` of the rows shown."""
        return shown_values(row, report, self.reads)

    def value(self, metric: Metric, row: Any, report: Any) -> Value:
        length = metric.at(row.run.train_len)
        ok, value = self.values(row, report).get(length, (None, None)) if length is not None else (None, None)
        return (True, self.scale * value) if ok else (ok, None)


def read_values(rows: list[dict], name: str) -> dict[int, tuple[bool, Optional[float], Any, Any]]:
    """length -> (applicable, value, low, high) of the result rows' field ``name`` (``ppl``, ``exact_match``...), with
    the row's ``{name}_low``/``{name}_high``. The first row of a length (and depth) counts; several depths of a length
    (passkey) give their mean, without an interval. A missing or non-finite value is not applicable."""
    firsts: dict[int, dict] = {}
    for row in rows:
        firsts.setdefault(int(row["length"]), {}).setdefault(row.get("depth"), row)
    out: dict[int, tuple[bool, Optional[float], Any, Any]] = {}
    for length, by_depth in firsts.items():
        picked = list(by_depth.values())
        values = [row.get(name) for row in picked]
        ok = all(row.get("applicable", True) and isinstance(v, (int, float)) and not isinstance(v, bool)
                 and math.isfinite(v) for row, v in zip(picked, values))
        low, high = (float(b) if len(picked) == 1 and isinstance(b := picked[0].get(f"{name}_{end}"), (int, float))
                     and not isinstance(b, bool) else None for end in ("low", "high"))
        out[length] = (ok, math.fsum(values) / len(values) if ok else None, low, high)
    return out


def shown_values(row: Any, report: Any, name: str) -> dict[int, Value]:
    """length -> (applicable, value of the result rows' field ``name``) of the run's rows in the view the table shows
    (:meth:`~posexp.reporting.table.Report.shown`), as :func:`read_values` reads them."""
    return {n: (ok, value) for n, (ok, value, *_) in read_values(report.shown(row.run), name).items()}


def longest(values: dict[int, Value], start: int, passes: Any, best: Optional[int] = None) -> Optional[int]:
    """The longest length from ``start`` up to which every length's value is applicable and ``passes``; ``best``
    when not even the first does."""
    for length in sorted(n for n in values if n >= start):
        ok, value = values[length]
        if not ok or value is None or not passes(value):
            break
        best = length
    return best


_REGISTRY: dict[str, MetricSpec] = {}
_loaded = False


def register(spec: MetricSpec) -> MetricSpec:
    """Add ``spec`` to the registry (done by subclassing :class:`MetricSpec`).

    Raises:
        ValueError: it names no direction, or another kind, pattern or value than allowed.
    """
    name = type(spec).__name__
    if spec.better not in (LOWER, HIGHER):
        raise ValueError(f"metric {name} declares no direction: set better = LOWER or HIGHER (got {spec.better!r}); "
                         "without it every better/worse verdict on it would be a guess")
    for attribute in ("kind", "pattern", "forms"):
        if not isinstance(getattr(spec, attribute, None), str):
            raise ValueError(f"metric {name} declares no {attribute}")
    if spec.applies not in (PERPLEXITY, ACCURACY):
        raise ValueError(f"metric {name}: applies must be {PERPLEXITY!r} or {ACCURACY!r} (got {spec.applies!r})")
    if spec.kind in _REGISTRY and type(_REGISTRY[spec.kind]).__qualname__ != type(spec).__qualname__:
        raise ValueError(f"metric {name}: kind {spec.kind!r} is {type(_REGISTRY[spec.kind]).__name__}'s already")
    _REGISTRY[spec.kind] = spec
    return spec


def _load() -> None:
    """Import every module of this package once: each declares its metrics."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


def specs(applies: Optional[str] = None) -> list[MetricSpec]:
    """Every registered metric (of runs of one kind), in the order declared."""
    _load()
    return [s for s in _REGISTRY.values() if applies is None or s.applies == applies]


def metric_value(metric: Metric, row: Any, report: Any) -> Value:
    """One run's value of ``metric`` (see :meth:`MetricSpec.value` for what ``row`` and ``report`` are)."""
    return metric.spec.value(metric, row, report)


def metric_help(applies: str) -> str:
    """The forms of ``--metric`` for runs of one kind, for help and errors."""
    return ", ".join(s.forms for s in specs(applies))


def metric_examples() -> list[str]:
    """What shell completion offers for ``--metric``."""
    return [e for s in specs() for e in s.examples]


def applies_to(text: str) -> Optional[str]:
    """Which runs a ``--metric`` name is for (:data:`PERPLEXITY` or :data:`ACCURACY`), by the first declaration
    whose pattern it matches, else whose literal start it begins with, else whose family it names without its
    argument (``acc``), when every metric of that family is for the same runs; None: neither."""
    raw = text.strip().lower()
    for spec in specs():
        if spec.match(raw):
            return spec.applies
    for spec in specs():
        start = re.split(r"[{(\[\\?]", spec.pattern)[0]
        if "@" in start and raw.startswith(start):
            return spec.applies
    kinds = {spec.applies for spec in specs() if spec.family == raw}
    return kinds.pop() if len(kinds) == 1 else None


def parse_metric(text: str, tolerance: float = DEFAULT_TOLERANCE, applies: str = PERPLEXITY) -> Metric:
    """Parse one ``--metric`` name of runs of one kind (``ratio@8x``, ``maxlen``, ``acc@2x``...).

    Args:
        text: the name as typed.
        tolerance: what a bare ``maxlen`` stands for (``--tolerance``).
        applies: :data:`PERPLEXITY` or :data:`ACCURACY`.

    Raises:
        ConfigError: for ``--metric``, naming the allowed forms.
    """
    raw = str(text).strip()
    if applies == ACCURACY:
        raw = raw.lower()
    chosen = specs(applies)
    for spec in chosen:
        if "@" not in raw and spec.family == raw and (full := spec.bare(tolerance)) is not None:
            raw = full
            break
    for spec in chosen:
        found = spec.match(raw)
        if found is None:
            continue
        if spec.slot is None:
            return Metric(raw, spec.kind)
        metric = spec.argument(raw, found.group(spec.slot))
        if metric is not None:
            return metric
        if applies == PERPLEXITY:
            raise ConfigError("--metric", spec.error(raw, found.group(spec.slot)))
    if applies == ACCURACY:
        raise ConfigError("--metric", f"unknown task metric {text!r}; choose from {metric_help(ACCURACY)}")
    family, _, text = raw.partition("@")
    slotted = [s for s in chosen if s.family == family and s.slot is not None]
    if "@" in raw and slotted:
        raise ConfigError("--metric", slotted[0].error(raw, text))
    if "@" not in raw and slotted and slotted[0].slot == "at":
        raise ConfigError("--metric", f"{family} needs a length: {family}@8x (8× the training length) or "
                                      f"{family}@1024 (tokens)")
    if "@" not in raw and slotted:
        raise ConfigError("--metric", f"{family} needs its argument: {slotted[0].forms}")
    raise ConfigError("--metric", f"unknown metric {raw!r}; choose from {metric_help(applies)}")
