"""What a ``posexp eval`` command line asks for: its run folders, its settings (``eval.*``, and where and how the
evaluation computes), and with ``-m`` every combination of the values given several, each a :class:`Setting`;
and a run's saved config with a setting applied.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from posexp.config.identity import position_range
from posexp.config.schema import EvalConfig
from posexp.encoders.remapping import ALL_OPTION_KEYS
from posexp.errors import ConfigError, PosexpError

# what posexp eval may change; eval.during_training was measured while the run trained, and stays as it was
TRAINING_ONLY = "during_training"
EVAL_KEYS = tuple(f.name for f in dataclasses.fields(EvalConfig) if f.name != TRAINING_ONLY)
VALUE_HINTS = {
    "lengths": "a list of integers, e.g. eval.lengths=[256,1024,8192]",
    "multiples": "a list of integers, e.g. eval.multiples=[1,2,4,8,16,32]",
    "tokens": "an integer",
    "protocol": "one of nonoverlap, sliding, last_k",
    "stride": "an integer, e.g. eval.stride=64",
    "last_k": "an integer, e.g. eval.last_k=64",
    "scaling": "one of none, linear, ntk, dynamic_ntk, yarn, llama3, longrope, rerope, self_extend, string, dca, ms_poe",
    "scaling_factor": "a number >= 1, e.g. eval.scaling_factor=4, or null",
    "rerope_window": "an integer number of tokens, e.g. eval.rerope_window=64, or null",
    "self_extend_group": "an integer group size, e.g. eval.self_extend_group=8, or null",
    "self_extend_window": "an integer number of tokens, e.g. eval.self_extend_window=32, or null",
    "string_offset": "an integer number of tokens, e.g. eval.string_offset=42, or null",
    "string_local": "an integer number of tokens, e.g. eval.string_local=8, or null",
    "dca_chunk": "an integer number of tokens, e.g. eval.dca_chunk=96, or null",
    "dca_local": "an integer number of tokens, e.g. eval.dca_local=8, or null",
    "ms_poe_min": "a ratio >= 1, e.g. eval.ms_poe_min=1.2, or null",
    "ms_poe_max": "a ratio >= 1, e.g. eval.ms_poe_max=1.8, or null",
    "ms_poe_skip_layers": "an integer number of layers, e.g. eval.ms_poe_skip_layers=2, or null",
    "longrope_factors": "a list of numbers > 0, one per rotary frequency, e.g. eval.longrope_factors=[1.0,1.5,...], or null",
    "longrope_start": "a whole number of positions >= 0 (LongRoPE's n^), e.g. eval.longrope_start=4",
    "longrope_file": "a factors file or folder posexp search wrote, e.g. eval.longrope_file=RUN/longrope/512, or null",
    "window": "a positive integer number of keys, e.g. eval.window=128, or null",
    "sinks": "a positive integer number of tokens, e.g. eval.sinks=4, or null (needs eval.window)",
    "batch_tokens": "an integer",
    "loss_by_position": "true or false",
    "examples": "a positive integer, e.g. eval.examples=256",
    "depths": "a list of depths in [0, 1], e.g. eval.depths=[0,0.5,1]",
    "key_tokens": "its settings one by one, e.g. eval.key_tokens.evaluator=RUN",
    "key_tokens.evaluator": "a run folder or hf:NAME, or null",
    "key_tokens.alpha": "a number of nats, e.g. eval.key_tokens.alpha=2", "key_tokens.beta": "a number of nats",
    "key_tokens.short_len": "an integer number of tokens, or null",
    "key_tokens.short_stride": "an integer number of tokens, or null",
    "key_tokens.cache_dir": "a folder, or null",
}
NESTED_KEYS = ("key_tokens",)  # eval groups set key by key: eval.key_tokens.evaluator=RUN
# where and how an evaluation computes: a run's evaluation may set them, since they leave the weights as trained
# (train.device and train.precision follow device and precision unless set themselves)
RUNTIME_KEYS = {"train.threads": ("train.threads",), "device": ("device", "train.device"),
                "train.device": ("train.device",), "precision": ("precision", "train.precision"),
                "train.precision": ("train.precision",)}
MULTIRUN_FLAGS = ("-m", "--multirun")
# posexp eval's options of a trained run (posexp.cli.options declares them; -m is read here)
EVAL_OPTIONS = ("-m", "--strict", "--allow-changed-encoder")
# Changing the first key without the second resets the second to its default:
# a stride belongs to the sliding protocol, a factor to the scaling it was given for, sinks to their window.
DEPENDENT_KEYS = {"protocol": ("stride", "last_k"),
                  "scaling": ("scaling_factor", "rerope_window", "longrope_factors", "longrope_start", "longrope_file",
                              *ALL_OPTION_KEYS),
                  "multiples": ("lengths",),
                  "window": ("sinks",)}


# -- arguments -------------------------------------------------------------------------------

def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Run folders and ``key=value`` overrides, in the order given (an existing path is always a folder);
    ``-m`` is left out (:func:`is_multirun`).

    Raises:
        PosexpError: an option posexp eval does not have (``--config-dir``, a typo), which would otherwise be looked
            for as a run folder.
    """
    folders, overrides = [], []
    for arg in args:
        if arg in MULTIRUN_FLAGS and not Path(arg).exists():
            continue
        if arg.startswith("-") and not Path(arg).exists():  # an option Typer let through: none of posexp eval's
            raise PosexpError(f"{arg}: no such option of posexp eval; its options: {', '.join(EVAL_OPTIONS)} (Hydra's "
                              "flags, --config-dir among them, are for posexp eval hf:MODEL; a run folder whose name "
                              f"starts with - is ./{arg})")
        if "=" in arg and not Path(arg).exists():
            overrides.append(arg)
        elif arg.startswith("eval.") and not Path(arg).exists():
            raise ConfigError(arg, f"an override needs a value, e.g. {arg}=...")
        else:
            folders.append(arg)
    return folders, overrides


def is_multirun(args: Sequence[str]) -> bool:
    """Whether ``-m`` (``--multirun``) is among the arguments: several values of a key each make a setting."""
    return any(a in MULTIRUN_FLAGS and not Path(a).exists() for a in args)


@dataclass(frozen=True)
class Setting:
    """One evaluation setting of a ``posexp eval`` command: its ``eval.*`` values (``(name, value)``, the name
    without ``eval.``), where and how it computes (``(key, value)`` of :data:`RUNTIME_KEYS`), and the overrides
    as text (what ``results.json``'s ``evaluations`` record, and a command that repeats it)."""

    eval: tuple = ()
    runtime: tuple = ()
    texts: tuple = ()


def parse_settings(overrides: Sequence[str], multirun: bool = False) -> list[Setting]:
    """The settings ``overrides`` ask for: one, or with ``multirun`` each combination of the values of keys given
    several (``eval.scaling=linear,yarn``, ``range(...)``), the first key's values varying slowest, as Hydra's
    basic sweeper orders the jobs of ``posexp train -m``.

    Raises:
        ConfigError: as :func:`parse_eval_overrides`; a sweep without ``multirun``; a sweep that cannot be
            enumerated (an interval, a glob).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    choices: list[list[str]] = []
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException:
            choices.append([text])  # its one-line message comes from parse_eval_overrides
            continue
        if not (ov.is_sweep_override() and multirun):
            choices.append([text])
            continue
        try:
            values = list(ov.sweep_string_iterator())
        except HydraException:
            raise ConfigError(key, f"{text}: posexp eval -m sweeps lists of values (a,b,c) and ranges "
                                   "(range(START,STOP,STEP)); give the values one by one") from None
        choices.append([f"{key}={value}" for value in values])
    settings = []
    for combination in itertools.product(*choices):
        parsed = parse_eval_overrides(combination, runtime=True)
        settings.append(Setting(eval=tuple((k, v) for k, v in parsed if k not in RUNTIME_KEYS),
                                runtime=tuple((k, v) for k, v in parsed if k in RUNTIME_KEYS),
                                texts=tuple(combination)))
    return settings


def parse_eval_overrides(overrides: Sequence[str], runtime: bool = False) -> list[tuple[str, Any]]:
    """``[(key, value)]`` for ``eval.KEY=VALUE`` overrides, parsed with Hydra's override grammar (the key without
    ``eval.``); with ``runtime``, also :data:`RUNTIME_KEYS` (the key as given).

    Raises:
        ConfigError: a key outside ``eval.`` (and the runtime keys), an unknown ``eval`` key, a sweep, or bad
            syntax.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        if runtime and key in RUNTIME_KEYS:
            try:
                (ov,) = parser.parse_overrides([text])
            except HydraException as e:
                raise ConfigError(key, f"cannot parse {text!r}: {str(e).splitlines()[0]}") from None
            if ov.type != OverrideType.CHANGE or ov.is_sweep_override():
                raise ConfigError(key, f"write it as a plain {key}=VALUE (one value, no + or ~ prefix; -m sweeps "
                                       "several)")
            parsed.append((key, ov.value()))
            continue
        if not key.startswith("eval."):
            raise ConfigError(key, f"posexp eval changes evaluation settings only (eval.*): the weights were trained "
                                   f"with the rest of the config. To change {key}, train a new run: "
                                   f"posexp train ... {text}")
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as e:
            raise ConfigError(key, f"cannot parse {text!r}: {str(e).splitlines()[0]}") from None
        if ov.type != OverrideType.CHANGE:
            raise ConfigError(key, f"write it as a plain {key}=VALUE (no + or ~ prefix)")
        if ov.is_sweep_override():
            raise ConfigError(key, "posexp eval evaluates one setting at a time; run it once per value, or sweep "
                                   f"the values with -m: posexp eval -m RUN {text}")
        name = key[len("eval."):]
        if name.split(".")[0] == TRAINING_ONLY:
            raise ConfigError(key, "is measured while a run trains (curve.csv); posexp eval evaluates the trained "
                                   f"weights only. To measure the curve, train a run with {text}")
        if name not in EVAL_KEYS and not (name.split(".")[0] in NESTED_KEYS and name.count(".") == 1):
            raise ConfigError(key, f"not an evaluation setting; choose one of: "
                                   f"{', '.join('eval.' + k for k in EVAL_KEYS)}")
        parsed.append((name, ov.value()))
    return parsed


def apply_eval_overrides(cfg: DictConfig, overrides: list[tuple[str, Any]]) -> DictConfig:
    """A copy of ``cfg`` whose ``eval`` group is the typed schema, the run's values, then the overrides."""
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[assignment]
    # a position range the run's own eval lengths gave stays the one it trained with, whatever lengths come next
    for key, value in position_range(OmegaConf.to_container(cfg, resolve=True)).items():  # type: ignore[arg-type]
        cfg.train[key] = value
    stored: dict = OmegaConf.to_container(cfg.get("eval") or OmegaConf.create({}))  # type: ignore[assignment]
    kept = (*EVAL_KEYS, TRAINING_ONLY)  # the run's curve settings stay in the config it records
    ev: Any = OmegaConf.merge(OmegaConf.structured(EvalConfig), {k: v for k, v in stored.items() if k in kept})
    given = {name for name, _ in overrides}
    for key, dependents in DEPENDENT_KEYS.items():
        if key in given:
            for dep in dependents:
                if dep not in given:
                    ev[dep] = EvalConfig.__dataclass_fields__[dep].default  # None, or longrope_start's 0
    for name, value in overrides:
        try:
            OmegaConf.update(ev, name, value, merge=False)
        except OmegaConfBaseException:
            raise ConfigError(f"eval.{name}", f"{value!r} is not a valid value; expected "
                                              f"{VALUE_HINTS.get(name, 'a value of the schema type')}") from None
    cfg.eval = ev
    return cfg


def apply_runtime_overrides(cfg: DictConfig, runtime: Sequence[tuple[str, Any]]) -> DictConfig:
    """A copy of ``cfg`` computing where and how ``runtime`` says (:data:`RUNTIME_KEYS`): ``device`` sets
    ``train.device`` too, as the shipped config's ``${device}`` would, also in a fine-tune's config (written
    resolved)."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[assignment]
    for key, value in runtime:
        for target in RUNTIME_KEYS[key]:
            OmegaConf.update(cfg, target, value, force_add=True)
    return cfg
