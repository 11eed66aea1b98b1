"""The configuration of ``posexp analyze``: the ``analyze.*`` keys, their schema and range checks.

``configs/analyze.yaml`` composes the training config and then this schema, so every
key ``posexp train`` reads applies to an analysis too. A job's config is registered with Hydra and checked
here too (:func:`register_analyze_schema`, :func:`check_analyze_job`), beside the schema it is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from posexp.config.schema import Config
from posexp.errors import ConfigError, require


@dataclass
class AnalyzeConfig:
    """``analyze.*`` keys (``configs/analyze.yaml`` documents each)."""

    length: Optional[int] = None
    heatmap_len: Optional[int] = None
    fit_from: int = 1
    multiples: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    tokens: int = 8192
    figures: bool = True


def _analyze_root_schema() -> type:
    """The training schema plus ``analyze``; ``configs/analyze.yaml`` merges it after ``config``.

    A subclass of :class:`posexp.config.schema.Config` whose inherited fields are all MISSING,
    so merging it keeps every value ``configs/config.yaml`` set (a MISSING value never
    overrides one that is set) and only adds the ``analyze`` node.
    """
    import dataclasses
    import typing

    from omegaconf import MISSING

    hints = typing.get_type_hints(Config)  # real types: this module's annotations are strings
    inherited = [(f.name, hints[f.name], field(default=MISSING)) for f in dataclasses.fields(Config)]
    schema = dataclasses.make_dataclass("AnalyzeRootConfig", inherited + [
        ("analyze", AnalyzeConfig, field(default_factory=AnalyzeConfig))], bases=(Config,))
    schema.__module__ = __name__
    return schema


AnalyzeRootConfig = _analyze_root_schema()


def analyze_settings(overrides: dict[str, Any]) -> AnalyzeConfig:
    """The ``analyze.*`` settings of ``posexp analyze RUN_DIR``: the defaults with ``overrides`` (key without the
    ``analyze.`` prefix -> parsed value) applied, typed by the schema and range-checked.

    Raises:
        ConfigError: naming the first key whose value does not fit its type or range.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    node: Any = OmegaConf.structured(AnalyzeConfig)
    for k, v in overrides.items():
        try:
            node[k] = v
        except OmegaConfBaseException:
            raise ConfigError(f"analyze.{k}", f"{v!r} is not a valid value") from None
    settings = OmegaConf.to_object(node)
    assert isinstance(settings, AnalyzeConfig)
    check_analyze(settings)
    return settings


def check_analyze(a: AnalyzeConfig) -> None:
    """Range checks of the ``analyze`` keys. Raises :class:`ConfigError` naming the key."""
    require(a.length is None or a.length >= 2, "analyze.length",
            f"must be at least 2 positions, or null for the longest eval length (got {a.length})")
    require(a.heatmap_len is None or a.heatmap_len >= 2, "analyze.heatmap_len",
            f"must be at least 2 positions, or null for twice train_len (got {a.heatmap_len})")
    require(a.fit_from >= 1, "analyze.fit_from", f"must be a distance >= 1 (got {a.fit_from})")
    require(len(a.multiples) > 0 and all(m > 0 for m in a.multiples), "analyze.multiples",
            f"must list positive multiples of train_len, e.g. analyze.multiples=[1,2,4,8] (got {list(a.multiples)})")
    require(a.tokens > 0, "analyze.tokens", f"must be a positive number of tokens (got {a.tokens})")


def register_analyze_schema() -> None:
    """Store the ``posexp analyze`` schema with Hydra: the training config plus ``analyze.*``; idempotent."""
    from hydra.core.config_store import ConfigStore

    from posexp.commands.validation import register_configs

    register_configs()
    ConfigStore.instance().store(name="posexp_analyze_schema", node=AnalyzeRootConfig)


def check_analyze_job(cfg: Any) -> Any:
    """``posexp analyze``'s job config (a DictConfig Hydra composed) typed, a :class:`Config` with the ``analyze``
    group, and checked: the encoder's config as training's (a new run's: :func:`~posexp.commands.train.new_run_encoder`),
    no model built."""
    from posexp.commands.edge import typed
    from posexp.commands.train import new_run_encoder
    from posexp.commands.validation import validate

    spec: Any = typed(cfg, AnalyzeRootConfig)
    validate(spec, memory=None)
    spec.encoder = new_run_encoder(spec)
    check_analyze(spec.analyze)
    return spec
