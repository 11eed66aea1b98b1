"""Choosing and describing runs: config values by dotted key, ``--by``, ``--where``, ``--metric``, ``--sort``.

Everything here parses a user's option or reads a run's config; nothing builds the table.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from posexp.errors import ConfigError
from posexp.reporting.formatting import MISSING
from posexp.reporting.runs import Run


DEFAULT_TOLERANCE = 0.1


DEFAULT_METRICS = ("ratio", "maxlen", "auc")


# Settings that change how a run was executed or logged, not what it learned; runs that
# differ only in these (and the seed) are replicates of one configuration.
EXECUTION_KEYS = frozenset({
    "seed", "train.threads", "train.progress", "train.device", "train.log_every", "train.checkpoint_every",
    "train.checkpoint_minutes", "data.cache_dir", "data.description",
})


# Top-level keys of results.json's "run" that a user can group or filter by directly;
# "encoder" and "base" are the effective ones (a per-layer mix's label, null when unused).
RUN_KEYS = ("encoder", "base", "train_len", "seed", "corpus", "corpus_fingerprint", "tokenizer", "status",
            "params", "config_hash", "git_commit", "parent", "scaling", "scaling_factor", "parent_train_len")


ABSENT = object()  # the key is not in this run's config at all (e.g. encoder.rotary_fraction for alibi)


METRIC_HELP = ("ratio, ratio@Kx (e.g. ratio@8x), ratio@N (N tokens), ppl@Kx, ppl@N, gain, gain@Kx, maxlen, "
                "maxlen@P% (e.g. maxlen@10%), auc, auc@Kx")


def config_value(run: Run, key: str) -> Any:
    """A run's value for a dotted config key, as ``--by``/``--where`` see it.

    Top-level keys of results.json's ``run`` object come first (``encoder``, ``base``,
    ``train_len``, ``seed``, ``corpus``, ``status``...), then the resolved config stored
    with the results, then the run's ``.hydra/config.yaml`` (for runs that failed before
    their config was recorded).

    Args:
        run: the loaded run.
        key: e.g. ``encoder``, ``model.n_layers``, ``encoder.rotary_fraction``.

    Returns:
        The value, or a sentinel (never None) when the run's config has no such key.
    """
    if "." not in key and key in run.info and not isinstance(run.info[key], (dict, list)):
        return run.info[key]
    if key in ("encoder", "base"):
        return run.info.get(key)
    node: Any = run.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def flatten_config(node: dict, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"n_layers": 2}}`` -> ``{"model.n_layers": 2}``."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, name + "."))
        else:
            flat[name] = value
    return flat


def _known_keys(runs: list[Run]) -> list[str]:
    keys = dict.fromkeys(k for k in RUN_KEYS if any(k in r.info for r in runs))
    for run in runs[:20]:  # enough to name the keys; every run's config has the same shape
        keys.update(dict.fromkeys(flatten_config(run.config)))
    return list(keys)


def unknown_key_error(option: str, key: str, runs: list[Run]) -> ConfigError:
    import difflib

    known = _known_keys(runs)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(option, f"unknown config key {key!r}: no run has it{hint}. Known keys: {', '.join(known)}")


def canon(value: Any) -> str:
    """A hashable, type-stable spelling of a config value: 10000 and 10000.0 are one group."""
    if value is ABSENT:
        return "<absent>"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, default=str)


def show_value(value: Any) -> str:
    """A config value as a person reads it in a table or label."""
    if value is ABSENT or value is None:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def parse_by(by: Sequence[str] | str | None) -> list[str]:
    """``--by encoder,base`` (repeatable) -> ``["encoder", "base"]``."""
    if by is None:
        return []
    if isinstance(by, str):
        by = [by]
    keys = [k.strip() for item in by for k in str(item).split(",")]
    if any(not k for k in keys):
        raise ConfigError("--by", "empty key; give dotted config keys separated by commas, e.g. --by encoder,base")
    return list(dict.fromkeys(keys))


@dataclass(frozen=True)
class Filter:
    """One ``--where KEY=VALUE`` (or ``KEY!=VALUE``); a comma in VALUE means any of them."""

    key: str
    values: tuple[str, ...]
    negate: bool = False

    def matches(self, run: Run) -> bool:
        value = config_value(run, self.key)
        hit = any(_same_value(value, want) for want in self.values)
        return hit != self.negate

    def __str__(self) -> str:
        return f"{self.key}{'!=' if self.negate else '='}{','.join(self.values)}"


def _same_value(value: Any, text: str) -> bool:
    if value is ABSENT:
        return False
    if text.lower() in ("null", "none", "~"):
        return value is None
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return show_value(value) == text


def parse_where(where: Sequence[str] | str | None) -> list[Filter]:
    """``--where encoder=rope --where base!=100`` -> filters."""
    if where is None:
        return []
    if isinstance(where, str):
        where = [where]
    filters = []
    for item in where:
        match = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*(!?=)\s*(.*?)\s*", str(item))
        if not match or not match.group(3):
            raise ConfigError("--where", f"{item!r} is not KEY=VALUE; e.g. --where encoder=rope, --where base!=100, "
                                         "--where encoder=rope,alibi (any of)")
        filters.append(Filter(match.group(1), tuple(v.strip() for v in match.group(3).split(",")),
                              match.group(2) == "!="))
    return filters


@dataclass(frozen=True)
class Metric:
    """A one-number summary of a perplexity-vs-length curve, named as the user typed it.

    Attributes:
        name: e.g. ``ratio@8x``, ``maxlen@10%``, ``auc``.
        kind: ``ratio`` (at the common length of the table), ``ratio_at``, ``ppl_at``, ``maxlen`` or ``auc``.
        multiple: the length as a multiple of each run's own training length (``@8x``).
        length: the length in tokens (``@1024``).
        tolerance: for ``maxlen``: the allowed relative rise over the training-length perplexity.
    """

    name: str
    kind: str
    multiple: Optional[float] = None
    length: Optional[int] = None
    tolerance: Optional[float] = None
    of_parent: bool = False  # measured on a fine-tuned run's parent (posexp finetune), beside the run's own

    def at(self, train_len: Optional[int]) -> Optional[int]:
        """The length this metric looks at for a run trained at ``train_len``."""
        if self.length is not None:
            return self.length
        if self.multiple is not None and train_len is not None:
            return int(round(self.multiple * train_len))
        return None

    @property
    def decimals(self) -> int:
        return 0 if self.kind == "maxlen" else 3 if self.kind == "gain" else 2

    def describe(self, report: Any) -> str:
        """One sentence for the notes under the table (``report``: the :class:`~posexp.reporting.lm_report.Report`)."""
        if self.of_parent:
            return (f"{self.name} = {self.name.removeprefix('parent ')} of the run each fine-tune started from "
                    "(its parent, at the parent's own training length for multiples).")
        if self.length is not None:
            where = f"{self.length} tokens"
        else:
            where = f"{self.multiple or 1:g}× the training length"
        if self.kind == "ratio":
            return ratio_note(report)
        if self.kind == "ratio_at":
            return f"{self.name} = ppl at {where} / ppl at the training length (lower is better; 1 = no loss)."
        if self.kind == "ppl_at":
            return f"{self.name} = perplexity at {where}."
        if self.kind == "gain":
            at = where if self.length is not None or self.multiple is not None else "the longest last_k length"
            return (f"{self.name} = context gain: loss (nats/token) of the same last K tokens at the training length "
                    f"minus at {at}, from eval.protocol=last_k rows (Kazemnejad et al. 2023's setting, which scores "
                    "the same tokens at every length); > 0: the model profits from context longer than it trained "
                    "with; n/a without last_k rows.")
        if self.kind == "maxlen":
            return (f"{self.name} = the longest evaluated length (tokens) up to which every evaluated length keeps "
                    f"ppl within +{self.tolerance:.0%} of the training-length ppl (higher is better; capped at the "
                    "longest length evaluated).")
        upper = self.multiple if self.multiple is not None else report.auc_multiple
        span = f"1× to {upper:g}× the training length" if upper else "1× to the longest common multiple (none here)"
        return (f"{self.name} = area under ln(ppl) over log2(context length), trapezoid rule over the evaluated "
                f"lengths from {span} (nats × octaves; lower is better; n/a when a length in the span is n/a).")


def parse_metric(text: str, tolerance: float = DEFAULT_TOLERANCE) -> Metric:
    """Parse ``ratio``, ``ratio@8x``, ``ratio@1024``, ``ppl@8x``, ``maxlen``, ``maxlen@10%``, ``auc``, ``auc@16x``.

    Raises:
        ConfigError: for ``--metric`` (or ``--tolerance``), naming the allowed forms.
    """
    raw = str(text).strip()
    match = re.fullmatch(r"(ratio|ppl|maxlen|auc|gain)(?:@(.+))?", raw)
    if not match:
        raise ConfigError("--metric", f"unknown metric {raw!r}; choose from {METRIC_HELP}")
    kind, arg = match.group(1), match.group(2)

    def at_length() -> tuple[Optional[float], Optional[int]]:
        if arg is None:
            raise ConfigError("--metric", f"{kind} needs a length: {kind}@8x (8× the training length) or "
                                          f"{kind}@1024 (tokens)")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)x", arg)
        if m and float(m.group(1)) > 0:
            return float(m.group(1)), None
        if re.fullmatch(r"\d+", arg) and int(arg) > 0:
            return None, int(arg)
        raise ConfigError("--metric", f"{raw!r}: {arg!r} is not a length; use a multiple like 8x or tokens like "
                                      "1024")

    if kind == "ratio":
        if arg is None:
            return Metric("ratio", "ratio")
        multiple, length = at_length()
        return Metric(raw, "ratio_at", multiple, length)
    if kind == "ppl":
        multiple, length = at_length()
        return Metric(raw, "ppl_at", multiple, length)
    if kind == "gain":
        if arg is None:
            return Metric("gain", "gain")
        multiple, length = at_length()
        return Metric(raw, "gain", multiple, length)
    if kind == "maxlen":
        if arg is None:
            check_tolerance(tolerance)
            return Metric(f"maxlen@{tolerance * 100:g}%", "maxlen", tolerance=tolerance)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)%", arg)
        if not m or float(m.group(1)) <= 0:
            raise ConfigError("--metric", f"{raw!r}: the tolerance is a percentage, e.g. maxlen@10% "
                                          "(ppl within +10% of the training-length value)")
        return Metric(raw, "maxlen", tolerance=float(m.group(1)) / 100)
    if arg is None:
        return Metric("auc", "auc")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)x", arg)
    if not m or float(m.group(1)) <= 1:
        raise ConfigError("--metric", f"{raw!r}: auc takes the upper end of its span as a multiple above 1, "
                                      "e.g. auc@16x")
    return Metric(raw, "auc", multiple=float(m.group(1)))


def check_tolerance(tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise ConfigError("--tolerance", f"must be a positive fraction, e.g. 0.1 for +10% (got {tolerance})")


def parse_metrics(metrics: Sequence[str] | str | None, tolerance: float = DEFAULT_TOLERANCE) -> list[Metric]:
    """``--metric ratio@8x,auc`` (repeatable); the defaults are ratio, maxlen at ``tolerance`` and auc."""
    check_tolerance(tolerance)
    if metrics is None or (not isinstance(metrics, str) and not list(metrics)):
        metrics = list(DEFAULT_METRICS)
    if isinstance(metrics, str):
        metrics = [metrics]
    names = [m.strip() for item in metrics for m in str(item).split(",") if m.strip()]
    parsed = [parse_metric(n, tolerance) for n in names]
    return list({m.name: m for m in parsed}.values())


@dataclass(frozen=True)
class SortKey:
    """``--sort METRIC`` (ascending) or ``--sort=-METRIC`` (descending); a metric, a ``--by`` key or ``n``."""

    name: str
    descending: bool
    metric: Optional[Metric] = None


def parse_sort(sort: Optional[str], metrics: list[Metric], by: list[str], tolerance: float) -> Optional[SortKey]:
    if sort is None or not str(sort).strip():
        return None
    text = str(sort).strip()
    descending = text.startswith("-")
    name = text.lstrip("-+")
    if name in by or name == "n":
        return SortKey(name, descending)
    shown = {m.name: m for m in metrics}
    if name in shown:
        return SortKey(name, descending, shown[name])
    try:
        metric = parse_metric(name, tolerance)
    except ConfigError:
        keys = ", ".join([*shown, *by, "n"])
        raise ConfigError("--sort", f"cannot sort by {name!r}; use a shown column ({keys}) or a metric "
                                    f"({METRIC_HELP}); prefix - for descending, e.g. --sort=-maxlen") from None
    return SortKey(metric.name, descending, metric)


def ratio_note(report: Any) -> str:
    if report.ratio_length is None:
        return ("ratio = ppl at the longest length / ppl at the training length; n/a here because no length beyond "
                "the training length has a perplexity for every run.")
    return (f"ratio = ppl at {report.ratio_length} / ppl at the training length ({report.train_len}); "
            f"{report.ratio_length} is the longest length every run that goes past its training length reaches.")
