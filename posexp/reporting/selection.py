"""Choosing and describing runs: config values by dotted key, ``--by``, ``--where``, ``--metric``, ``--sort``.

Everything here parses a user's option or reads a run's config; nothing builds the table.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from posexp.errors import ConfigError, PosexpError
from posexp.reporting.metrics import DEFAULT_TOLERANCE, PERPLEXITY, Metric, metric_help, parse_metric
from posexp.reporting.formatting import MISSING, csv_cell
from posexp.reporting.runs import Run


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
    node: Any = run.config_data
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
        keys.update(dict.fromkeys(flatten_config(run.config_data)))
    return list(keys)


def did_you_mean(key: str, known: list[str]) -> str:
    """`` (did you mean KEY?)`` with the known key closest to ``key``; "" when none is close."""
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_key_error(option: str, key: str, runs: list[Run]) -> ConfigError:
    known = _known_keys(runs)
    return ConfigError(option, f"unknown config key {key!r}: no run has it{did_you_mean(key, known)}. "
                               f"Known keys: {', '.join(known)}")


def canon(value: Any) -> str:
    """A hashable, type-stable spelling of a config value: 10000 and 10000.0 are one group."""
    if value is ABSENT:
        return "<absent>"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, default=str)


def show_value(value: Any) -> str:
    """A config value as a person reads it in a table or label: as a csv cell spells it (booleans lowercase,
    dicts and lists as JSON), a float shortest (``1e-04``), an absent or null value as :data:`MISSING`."""
    if value is ABSENT or value is None:
        return MISSING
    return f"{value:g}" if isinstance(value, float) else csv_cell(value)


def option_items(value: Sequence[str] | str | None) -> list[str]:
    """The items of a repeatable, comma-separated option (``--by encoder,base --by seed``), stripped."""
    return [item.strip() for part in ([value] if isinstance(value, str) else list(value or []))
            for item in str(part).split(",")]


def parse_by(by: Sequence[str] | str | None) -> list[str]:
    """``--by encoder,base`` (repeatable) -> ``["encoder", "base"]``."""
    keys = option_items(by)
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
    if value is None:  # "none" is also a value of its own: NoPE's encoder=none
        return text.lower() in ("null", "none", "~")
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    if isinstance(value, (list, dict)):  # as typed on the command line: eval.multiples=[1,2,4], encoder.layers=[rope,none]
        import yaml

        try:
            return yaml.safe_load(text) == value
        except yaml.YAMLError:
            return False
    return show_value(value) == text


def _values(text: str) -> list[str]:
    """The values of ``--where KEY=VALUE``: VALUE split at the commas outside brackets (``rope,alibi`` is either of
    two; ``[1,2,4]`` one list, as Hydra spells it)."""
    values, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    return values + [text[start:].strip()]


def select_runs(runs: list[Run], filters: list[Filter], by_keys: Sequence[str] = ()) -> list[Run]:
    """The runs that pass ``filters`` (``--where``), after checking that each ``--by`` and ``--where`` key names
    something at least one of ``runs`` has.

    Raises:
        ConfigError: a key no run has, naming the keys they have.
        PosexpError: no run passes the filters.
    """
    for option, keys in (("--by", by_keys), ("--where", [f.key for f in filters])):
        for key in keys:
            if all(config_value(run, key) is ABSENT for run in runs):
                raise unknown_key_error(option, key, runs)
    kept = [run for run in runs if all(f.matches(run) for f in filters)]
    if filters and not kept:
        have = "; ".join(f"{key} {', '.join(_values_of(runs, key))}" for key in dict.fromkeys(f.key for f in filters))
        raise PosexpError(f"no run matches {' and '.join(str(f) for f in filters)} (of {len(runs)} runs; they have "
                          f"{have}); values are compared as in results.json, e.g. --where encoder=rope --where "
                          "base=10000")
    return kept


def _values_of(runs: list[Run], key: str, most: int = 12) -> list[str]:
    """The values ``runs`` have for ``key``, as ``--where`` takes them (null for none), the first ``most``."""
    found = [config_value(run, key) for run in runs]
    values = list(dict.fromkeys("null" if v is None else show_value(v) for v in found if v is not ABSENT))
    return values[:most] + (["…"] if len(values) > most else [])


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
        filters.append(Filter(match.group(1), tuple(_values(match.group(3))), match.group(2) == "!="))
    return filters


def check_tolerance(tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise ConfigError("--tolerance", f"must be a positive fraction, e.g. 0.1 for +10% (got {tolerance})")


def parse_metrics(metrics: Sequence[str] | str | None, tolerance: float = DEFAULT_TOLERANCE) -> list[Metric]:
    """``--metric ratio@8x,auc`` (repeatable); the defaults are ratio, maxlen at ``tolerance`` and auc."""
    check_tolerance(tolerance)
    if metrics is None or (not isinstance(metrics, str) and not list(metrics)):
        metrics = list(DEFAULT_METRICS)
    parsed = [parse_metric(n, tolerance) for n in option_items(metrics) if n]
    return list({m.name: m for m in parsed}.values())


@dataclass(frozen=True)
class SortKey:
    """``--sort METRIC`` (ascending) or ``--sort=-METRIC`` (descending); a metric, a ``--by`` key or ``n``."""

    name: str
    descending: bool
    metric: Optional[Metric] = None


def parse_sort(sort: Optional[str], metrics: list[Metric], by: list[str], tolerance: float,
               applies: str = PERPLEXITY) -> Optional[SortKey]:
    """``--sort`` of a table of ``applies`` runs (:data:`PERPLEXITY` or task runs) showing ``metrics``."""
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
        metric = parse_metric(name, tolerance, applies)
    except ConfigError:
        keys = ", ".join([*shown, *by, "n"])
        raise ConfigError("--sort", f"cannot sort by {name!r}; use a shown column ({keys}) or a metric "
                                    f"({metric_help(applies)}); prefix - for descending, e.g. --sort=-maxlen") from None
    return SortKey(metric.name, descending, metric)
