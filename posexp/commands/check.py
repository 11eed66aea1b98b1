"""``posexp check ENCODER [KEY=VALUE ...]``: hold an encoding to the encoder contract, no training.

The encoder is found by name in the registry (:func:`posexp.encoders.registry`), so a built-in and a plugin are
checked alike; its options are typed as ``posexp train encoder.KEY=VALUE`` types them (Hydra's override
grammar: ``layers=[rope,none]``, ``options={rope:{rotary_fraction:0.5}}``); ``train_len=N`` is the training
length the length check reaches 16x of (default: posexp train's 128). The checks themselves are
:mod:`posexp.evaluation.conformance`. Exit status: 0 when nothing fails, 1 when a check fails (an encoder that
cannot be built fails its one check, ``build``), 2 for a bad encoder name or option
(:class:`posexp.errors.PosexpError`), 3 when nothing fails but a check could not measure (out of memory).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posexp.encoders import broken, create, get, option_names, registry
from posexp.errors import ConfigError, PosexpError
from posexp.registry import did_you_mean, init_raised
from posexp.evaluation.conformance import ERROR, FAIL, PASS, Check, Probe, run_checks
from posexp.runtime import terminal

FORMATS = ("table", "json", "markdown")
_STYLE = {PASS: "green", FAIL: "bold red", ERROR: "yellow"}
UNMEASURED_EXIT = 3  # nothing failed, something could not be measured


def parse_options(name: str, args: Sequence[str]) -> dict[str, Any]:
    """The encoder options of ``KEY=VALUE`` arguments (``encoder.KEY=VALUE`` too), typed by Hydra's grammar.

    Raises:
        ConfigError: an unknown encoder, an argument that is not ``KEY=VALUE``, or an option the encoder lacks.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    encoders = list(registry())
    if name not in encoders:
        raise ConfigError("encoder", f"no such encoder {name!r}; {did_you_mean(name, encoders)}"
                                     f"choose one of: {', '.join(encoders)}")
    parser, options = OverridesParser.create(), {}
    for arg in args:
        try:
            override = parser.parse_override(arg)
        except HydraException:
            override = None
        if override is None or "=" not in arg:
            raise ConfigError("encoder", f"{arg}: not an option KEY=VALUE (e.g. posexp check rope base=500)")
        key = override.key_or_group.removeprefix("encoder.")
        if key not in option_names(name) + ["lr_mult"]:
            raise _not_an_option(name, key)
        options[key] = override.value()
    return _typed(name, options)


def _not_an_option(name: str, key: str) -> ConfigError:
    """``encoder.KEY`` is no option of encoder ``name``: the one line naming the close one and every option."""
    allowed = option_names(name) + ["lr_mult"]
    return ConfigError(f"encoder.{key}", f"not an option of encoder {name!r}; {did_you_mean(key, allowed)}its options "
                                         f"are: {', '.join(allowed)}")


def _typed(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options as ``posexp train`` types them (the encoder's schema, from its ``__init__``): a value of the
    wrong type, or a number that is not finite, is one line naming the key.

    Raises:
        ConfigError: naming ``encoder.KEY``, the value and the type it must have.
    """
    import math

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from posexp.encoders import options_schema

    schema = OmegaConf.structured(options_schema(get(name)))
    for key, value in options.items():
        try:
            schema[key] = value
        except OmegaConfBaseException:
            hint = getattr(OmegaConf.get_type(schema, key), "__name__", "value of its type")
            raise ConfigError(f"encoder.{key}", f"{value!r} is not a {hint}") from None
        if isinstance(schema[key], float) and not math.isfinite(schema[key]):
            raise ConfigError(f"encoder.{key}", f"must be a finite number (got {value})")
    typed = OmegaConf.to_container(schema)
    assert isinstance(typed, dict)
    return {key: typed[key] for key in options}


def _measured(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.2g}" if abs(value) < 1e-2 else f"{value:.3g}"


def _markdown_cell(text: object) -> str:
    return str(text).replace("|", "\\|")


def _title(name: str, options: dict, results: list[Check], seconds: float) -> str:
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, "n/a", ERROR)}
    given = f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""
    errors = f", {counts[ERROR]} error (not measured)" if counts[ERROR] else ""
    return (f"posexp check {name}{given}: {counts[PASS]} pass, {counts[FAIL]} fail, {counts['n/a']} n/a{errors} "
            f"in {seconds:.1f} s")


def render(name: str, options: dict, results: list[Check], seconds: float, fmt: str, console: Console,
           probe: Probe) -> None:
    """Print the results as a rich table, a markdown table or JSON (the last two alone on stdout)."""
    title = _title(name, options, results, seconds)
    if fmt == "json":
        console.print_json(json.dumps({"encoder": name, "options": options, "passed": all(r.status != FAIL
                                       for r in results), "complete": all(r.status != ERROR for r in results),
                                       "seconds": round(seconds, 2), "probe": asdict(probe),
                                       "checks": [r.as_dict() for r in results]}, default=str))
    elif fmt == "markdown":
        cell = _markdown_cell
        lines = [f"**{cell(title)}**", "", "| check | status | measured | tolerance | detail |", "|---|---|---|---|---|"]
        lines += [f"| {cell(r.name)} | {r.status} | {_measured(r.measured)} | {cell(r.tolerance)} | {cell(r.detail)} |"
                  for r in results]
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    else:
        table = Table(title=escape(title), title_justify="left")
        for column in ("check", "status", "measured", "tolerance", "detail"):
            table.add_column(column, overflow="fold")
        for r in results:
            style = _STYLE.get(r.status, "dim")
            table.add_row(escape(r.name), f"[{style}]{r.status}[/]", _measured(r.measured), escape(r.tolerance),
                          escape(r.detail))
        console.print(table)


def split_probe(args: Sequence[str], probe: Probe) -> tuple[list[str], Probe]:
    """``train_len=N`` among the arguments sets the probe's nominal training length; the rest are options.

    Raises:
        ConfigError: a ``train_len`` that is not a positive integer.
    """
    rest = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") != "train_len":
            rest.append(arg)
            continue
        try:
            train_len = int(value)
        except ValueError:
            train_len = 0
        if train_len <= 0 or str(train_len) != value.strip():
            raise ConfigError("train_len", f"must be a positive integer, the training length the length check "
                                           f"reaches 16x of (got {value!r})")
        probe = replace(probe, train_len=train_len)
    return rest, probe


def yaml_options(name: str, dirs: Sequence[Path] = (), train_len: int = Probe.train_len) -> dict[str, Any]:
    """The options ``encoder=NAME`` gives the encoder in ``posexp train train_len=TRAIN_LEN`` (its yaml's values,
    ``${base}`` and ``${train_len}`` resolved), composed by Hydra as train composes them, the user's config folders
    ``dirs`` searched too; {} for an encoder without a yaml (an installed plugin: its ``__init__`` defaults).

    Raises:
        PosexpError: the yaml gives a value its encoder cannot take, in one line naming the key.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    from posexp.commands.validation import register_configs
    from posexp.config.schema import config_dir

    yaml = next((p for p in (folder / "encoder" / f"{name}.yaml" for folder in (*dirs, config_dir())) if p.is_file()),
                None)
    if yaml is None:
        return {}
    register_configs()
    searched = [f"hydra.searchpath=[{','.join(f'file://{folder}' for folder in dirs)}]"] if dirs else []
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            overrides = [f"encoder={name}", f"train_len={train_len}", *searched]
            encoder = OmegaConf.to_container(compose("config", overrides).encoder, resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        cause: Optional[BaseException] = e  # the value's own error, naming its key, if Hydra's chain has one
        while cause is not None and not getattr(cause, "full_key", None):
            cause = cause.__cause__ or cause.__context__
        key, text = (getattr(cause, "full_key"), getattr(cause, "msg", None) or cause) if cause else ("encoder", e)
        if isinstance(cause, ConfigKeyError) and str(key).startswith("encoder."):  # a key no option names
            raise PosexpError(f"{yaml}: {_not_an_option(name, str(key).removeprefix('encoder.'))}") from None
        raise PosexpError(f"{yaml}: {key}: {str(text).splitlines()[0]}") from None
    assert isinstance(encoder, dict)
    return {key: value for key, value in encoder.items() if key in option_names(name)}


def unbuildable(name: str, options: dict, probe: Probe) -> Optional[str]:
    """Why the encoder cannot be built with ``options`` (a broken plugin, or its ``__init__`` raises); None when
    it can. A value posexp's own checks refuse (:class:`PosexpError`) is raised, as a bad option."""
    reason = broken().get(name)
    if reason is not None:
        return reason
    try:
        create(name, d_model=probe.d_model, n_heads=probe.n_heads, **options)
    except PosexpError:
        raise
    except Exception as e:  # noqa: BLE001 - the encoder's own code: what it raised is the finding
        return init_raised(get(name), {"d_model": probe.d_model, "n_heads": probe.n_heads, **options}, e)
    return None


def check_main(name: str, args: Sequence[str], fmt: str = "table", console: Optional[Console] = None,
               probe: Optional[Probe] = None, dirs: Sequence[Path] = ()) -> int:
    """Run every conformance check on encoder ``name`` with options ``args`` and print the results.

    Args:
        probe: the probe model (default :class:`~posexp.evaluation.conformance.Probe`); ``train_len=N`` among
            ``args`` sets its training length.
        dirs: the user's config folders (``--config-dir``): the encoder is built with its yaml's values
            (:func:`yaml_options`), as ``posexp train`` builds it, ``args`` over them.

    Returns:
        The exit status: 1 when a check fails, 3 when none fails but one could not measure, else 0.

    Raises:
        PosexpError: an unknown format, encoder or option, or an option value the encoder refuses.
    """
    if fmt not in FORMATS:
        raise PosexpError(f"--format {fmt}: choose one of: {', '.join(FORMATS)}")
    args, probe = split_probe(args, probe or Probe())
    options = parse_options(name, args) if name not in broken() else {}
    built = {**yaml_options(name, dirs, probe.train_len), **options} if name not in broken() else {}
    start = time.perf_counter()
    reason = unbuildable(name, built, probe)  # a bad value fails here, in one line
    if reason is not None:
        results = [Check("build", FAIL, None, "", reason)]
    else:
        results = run_checks(lambda d_model, n_heads: create(name, d_model=d_model, n_heads=n_heads, **built),
                             probe)
    render(name, options, results, time.perf_counter() - start, fmt, console or terminal.console(), probe)
    if any(r.status == FAIL for r in results):
        return 1
    return UNMEASURED_EXIT if any(r.status == ERROR for r in results) else 0


__all__ = ["FORMATS", "check_main", "parse_options", "render", "split_probe", "unbuildable", "yaml_options"]
