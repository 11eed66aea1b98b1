"""Checks of a composed config that need the domain: encoders, data, positions, evaluation.

The schemas themselves (:mod:`posexp.config.schema`) catch unknown keys and wrong types at
compose time; what a type cannot say (ranges, combinations, an encoder's own options)
is checked here, before any data is read or any folder written. Everything raises
:class:`~posexp.errors.ConfigError` naming the key and what is allowed.

Imports the domain (encoders, model, positions, data, evaluation's scaling policy);
nothing of the domain imports it back but the commands, the CLI and analysis.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from posexp.config.schema import (
    DATASETS,
    DEVICES,
    OBJECTIVES,
    PARALLEL,
    PRECISIONS,
    Config,
    DataConfig,
    EvalConfig,
    FinetuneAppConfig,
    PretrainedConfig,
    ModelConfig,
    TaskConfig,
    TokenizerConfig,
    TrainConfig,
    config_dir,
    curve_lengths,
    default_max_position,
    eval_lengths,
    is_task,
)
from posexp.config.identity import config_dict
from posexp.data.corpus import BAD_FILE_CHOICES, data_kind, tokenizer_spec
from posexp.data.tokenizer import TokenizerSpec, check_spec
from posexp.encoders import PositionalEncoder, get, load_plugin, option_names, options_schema, registry
from posexp.encoders.plugins import MODULE_KEY, from_distribution
from posexp.errors import ConfigError, require
from posexp.encoders.scaling import LONGROPE, check_known
from posexp.encoders.remapping import ALL_OPTION_KEYS, OPTION_KEYS, Remapping, check_options
from posexp.encoders.extension import (NONE, REMAPPINGS, REROPE, SCALINGS, check_scaling, finetune_scaling_refusal,
                                         scaled_encoder)
from posexp.evaluation.perplexity import check_protocol
from posexp.model.factory import build_encoder, extend_encoder
from posexp.model.gpt import check_shape
from posexp.model.window import check_window
from posexp.model.positions import CURRICULA, POSITION_SCHEMES, default_start_len
from posexp.runtime.device import check_compile
from posexp.runtime.memory import check_memory
from posexp.runtime.threads import AUTO as AUTO_THREADS
from posexp.tasks import build_task, check_task_name
from posexp.tasks.source import DATA_TASKS, check_task_lengths


# what register_configs stored: each encoder class by its name (again only if its module was loaded anew), and
# under SCHEMAS the config groups' own schemas
_stored: dict = {}
SCHEMAS = ""  # not an encoder's name: those are identifiers


def register_configs() -> None:
    """Store the schemas; idempotent (Hydra may be started several times in one process). Each is stored once
    per process: turning the 18 encoders' schemas into configs again took 0.07 s of every command."""
    cs = ConfigStore.instance()
    if not _stored:
        cs.store(name="posexp_schema", node=Config)
        cs.store(name="posexp_finetune_schema", node=FinetuneAppConfig)
        cs.store(name="posexp_pretrained_schema", node=PretrainedConfig)
        cs.store(group="schema/data", name="data", node=DataConfig)
        cs.store(group="schema/tokenizer", name="tokenizer", node=TokenizerConfig)
        cs.store(group="schema/model", name="model", node=ModelConfig)
        cs.store(group="schema/train", name="train", node=TrainConfig)
        cs.store(group="schema/eval", name="eval", node=EvalConfig)
        cs.store(group="schema/task", name="task", node=TaskConfig)
        _stored[SCHEMAS] = Config
    for name, cls in registry().items():
        if _stored.get(name) is cls:
            continue
        _stored[name] = cls
        cs.store(group="schema/encoder", name=name, node=options_schema(cls))
        if from_distribution(cls):  # an installed plugin brings no yaml: encoder=NAME is its schema's defaults
            node = OmegaConf.structured(options_schema(cls))
            if "base" in node:
                node.base = "${base}"  # as the built-ins' yaml files have it: the top-level base=... reaches it
            cs.store(group="encoder", name=name, node=node)


def validate(cfg: Config, memory: Optional[str] = "train") -> None:
    """Range and consistency checks a type cannot express. Raises :class:`ConfigError`.

    Args:
        memory: what must fit in the memory of the run's device (:func:`check_memory`): ``"train"`` (weights,
            gradients, optimizer state and activations), ``"weights"`` (evaluating a trained run), or None.
    """
    check_finite(cfg)
    resolve_encoder(cfg)
    require(cfg.base > 1, "base", f"must be > 1 (got {cfg.base:g})")
    require(cfg.train_len > 0, "train_len", f"must be a positive integer (got {cfg.train_len})")
    # torch.manual_seed takes 64 bits; a larger seed was an overflow traceback after the run folder was made
    require(0 <= cfg.seed < 2 ** 63, "seed", f"must be an integer from 0 to 2**63 - 1 (got {cfg.seed})")
    if "base" in option_names(cfg.encoder["name"]):
        require(cfg.encoder["base"] > 1, "base", f"must be > 1 (got {cfg.encoder['base']:g})")
    check_shape(cfg.model)
    # the encoder checks its own options and their combinations, before any data is read
    encoder = build_encoder(cfg)
    if cfg.finetune is not None:
        encoder = validate_finetune(cfg, encoder)
    check_fits_train_len(cfg, encoder)

    validate_train(cfg)
    validate_positions(cfg, encoder)
    check_context_parallel(cfg, encoder)

    e = cfg.eval
    if e.lengths is not None:
        require(len(e.lengths) > 0, "eval.lengths", "must list at least one length, e.g. eval.lengths=[128,256]")
        bad = [n for n in e.lengths if n <= 0]
        require(not bad, "eval.lengths", f"lengths must be positive integers (got {bad})")
    else:
        require(len(e.multiples) > 0, "eval.multiples", "must list at least one multiple of train_len")
        bad = [m for m in e.multiples if m <= 0]
        require(not bad, "eval.multiples", f"multiples must be positive integers (got {bad})")
    require(e.tokens > 0, "eval.tokens", f"must be a positive integer (got {e.tokens})")
    require(e.batch_tokens > 0, "eval.batch_tokens", f"must be a positive integer (got {e.batch_tokens})")
    validate_eval(cfg, encoder)

    validate_data(cfg)
    validate_task(cfg)
    validate_curve(cfg)
    require(str(cfg.cache_dir).strip() != "", "cache_dir",
            "must name a folder (absolute, or relative to the folder posexp is started in)")
    check_objective(cfg)
    if memory is not None:
        check_memory(cfg, training=memory == "train")


def validate_train(cfg: Config) -> None:
    """``train.*``: the optimiser's and the schedule's ranges, and where and how the run computes (``device``,
    ``precision``, ``compile``, ``train.threads``), the checkpoint cadence and the logging interval."""
    t = cfg.train
    require(t.steps > 0, "train.steps", f"must be a positive integer (got {t.steps})")
    require(t.batch_size > 0, "train.batch_size", f"must be a positive integer (got {t.batch_size})")
    require(t.lr > 0, "train.lr", f"must be > 0 (got {t.lr})")
    require(0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", f"must be in [0, 1] (got {t.min_lr_ratio})")
    require(0 <= t.warmup_steps, "train.warmup_steps", f"must be >= 0 (got {t.warmup_steps})")
    require(t.weight_decay >= 0, "train.weight_decay", f"must be >= 0 (got {t.weight_decay})")
    require(0 <= t.beta1 < 1 and 0 <= t.beta2 < 1, "train.beta1/beta2", "must be in [0, 1)")
    require(t.grad_clip >= 0, "train.grad_clip", f"must be >= 0, 0 disables clipping (got {t.grad_clip})")
    # the top-level keys first: train.device / train.precision follow them unless set themselves
    require(cfg.device in DEVICES, "device", f"unknown device {cfg.device!r}; choose one of: {', '.join(DEVICES)}")
    require(cfg.precision in PRECISIONS, "precision",
            f"unknown precision {cfg.precision!r}; choose one of: {', '.join(PRECISIONS)}")
    require(t.precision in PRECISIONS, "train.precision",
            f"unknown precision {t.precision!r}; choose one of: {', '.join(PRECISIONS)}")
    require(t.device in DEVICES, "train.device",
            f"unknown device {t.device!r}; choose one of: {', '.join(DEVICES)}")
    check_compile(cfg.compile)
    require(t.threads is None or t.threads == AUTO_THREADS
            or (isinstance(t.threads, int) and not isinstance(t.threads, bool) and t.threads > 0),
            "train.threads", f"must be auto (the cores free to this process) or a positive integer (got {t.threads})")
    require(t.parallel in PARALLEL, "train.parallel",
            f"unknown value {t.parallel!r}; choose one of: {', '.join(PARALLEL)}")
    require(t.parallel != "fsdp" or not cfg.eval.during_training.every, "eval.during_training.every",
            "the curve measures the whole model on rank 0, which train.parallel=fsdp shards over the ranks; "
            "set eval.during_training.every=0 or train.parallel=ddp")
    require(t.log_every > 0, "train.log_every", f"must be a positive integer (got {t.log_every})")
    require(t.checkpoint_every >= 0, "train.checkpoint_every",
            f"must be >= 0 steps, 0 turns periodic checkpoints off (got {t.checkpoint_every})")
    require(t.checkpoint_minutes >= 0, "train.checkpoint_minutes",
            f"must be >= 0 minutes, 0 turns timed checkpoints off (got {t.checkpoint_minutes})")


def check_context_parallel(cfg: Config, encoder: PositionalEncoder) -> None:
    """``train.context_parallel``: an encoding a shard computes alone, on CUDA, one shard per process."""
    from posexp.runtime.device import resolve_device, world
    from posexp.training.context import refusal

    n = cfg.train.context_parallel
    if n == 1:
        return
    why = refusal(n, encoder, resolve_device(cfg.train.device), world().size)
    require(why is None, "train.context_parallel", str(why))


def resolve_encoder(cfg: Config) -> type:
    """The class of the run's encoder: a built-in, an installed plugin, or one of the module ``encoder.module``
    names (imported here, as in a process that did not compose the config: eval, resume, a launcher's worker).

    Raises:
        ConfigError: no such encoder, or its module cannot be imported.
    """
    name, module = str(cfg.encoder["name"]), cfg.encoder.get(MODULE_KEY)
    return load_plugin(name, str(module)) if module else get(name)


def validate_finetune(cfg: Config, parent_encoder: PositionalEncoder) -> PositionalEncoder:
    """A fine-tuned run's lineage: a longer ``train_len`` than the parent's, a scaling its encoding offers for
    training, a factor >= 1, and no evaluation-time scaling on top of a trained one.

    Returns:
        The encoder the run trains (the parent's, extended).
    """
    ft = cfg.finetune
    parent_len = int(ft.parent_train_len)
    require(cfg.train_len >= parent_len, "train_len",
            f"must be at least the parent's training length {parent_len} (got {cfg.train_len}): posexp finetune "
            "extends a trained context; to train at a shorter length, use posexp train")
    reason = finetune_scaling_refusal(str(ft.scaling), parent_encoder)
    require(reason is None, "scaling", reason or "")
    require(ft.scaling_factor >= 1, "scaling_factor",
            f"must be >= 1, the factor the context is extended by (got {ft.scaling_factor:g}); leave it unset for "
            f"train_len / the parent's ({cfg.train_len} / {parent_len})")
    require(ft.scaling == NONE or cfg.eval.scaling == NONE, "eval.scaling",
            f"this run fine-tunes with scaling={ft.scaling}, which evaluation applies as trained; another "
            f"evaluation-time scaling on top ({cfg.eval.scaling}) is not defined: use eval.scaling=none")
    try:
        return extend_encoder(parent_encoder, cfg)
    except ConfigError as e:  # the scaling's check names the eval key; a fine-tune sets it as longrope_factors
        if e.key != "eval.longrope_factors":
            raise
        message = str(e).split(": ", 1)[1].replace("eval.longrope_factors", "longrope_factors")
        raise ConfigError("longrope_factors", message) from None


def check_finite(cfg: Config) -> None:
    """Every number in the config is finite: ``base=inf`` or ``train.lr=nan`` would train (or evaluate) to
    numbers that mean nothing, and a result JSON cannot hold."""
    # top-level keys first: base=inf reaches encoder.base through ${base}, and the user typed base
    for key, value in sorted(_leaves(config_dict(cfg)), key=lambda kv: kv[0].count(".")):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number (got {value})")


def _leaves(node, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k != "hydra":
                yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix[:-1]}[{i}].")
    else:
        yield prefix[:-1], node


def check_fits_train_len(cfg: Config, encoder: PositionalEncoder) -> None:
    """An encoding that represents fewer positions than ``train_len`` cannot train at that length."""
    if encoder.max_length is None or encoder.max_length >= cfg.train_len:
        return
    options = option_names(cfg.encoder["name"])
    key = next((f"encoder.{k}" for k in ("max_length", "bits") if k in options), "encoder")
    raise ConfigError(key, f"encoder {cfg.encoder['name']!r} represents positions 0..{encoder.max_length - 1}, "
                           f"fewer than train_len={cfg.train_len}; raise {key} or lower train_len")


def validate_positions(cfg: Config, encoder) -> None:
    """``train.positions`` / ``train.curriculum`` and their options (posexp/model/positions.py)."""
    t = cfg.train
    require(t.positions in POSITION_SCHEMES, "train.positions",
            f"unknown scheme {t.positions!r}; choose one of: {', '.join(POSITION_SCHEMES)}")
    require(t.curriculum in CURRICULA, "train.curriculum",
            f"unknown curriculum {t.curriculum!r}; choose one of: {', '.join(CURRICULA)}")
    if t.positions == "randomized":
        longest = max(eval_lengths(cfg)) if _lengths_valid(cfg) else cfg.train_len
        max_position = t.max_position if t.max_position is not None else default_max_position(cfg.train_len, longest)
        require(max_position >= cfg.train_len, "train.max_position",
                f"must be >= train_len = {cfg.train_len}: training draws train_len distinct positions "
                f"from 0..max_position-1 (got {max_position})")
        if encoder.max_length is not None:
            require(max_position <= encoder.max_length, "train.max_position",
                    f"positions up to {max_position - 1} are drawn, but encoder {cfg.encoder['name']!r} represents "
                    f"0..{encoder.max_length - 1}; lower train.max_position or raise the encoder's length "
                    f"(e.g. encoder.max_length={max_position})")
    else:
        require(t.max_position is None, "train.max_position", "only applies with train.positions=randomized")
    _validate_pose(cfg, encoder)
    if t.curriculum == "linear":
        start = t.curriculum_start_len if t.curriculum_start_len is not None else default_start_len(cfg.train_len)
        require(0 < start <= cfg.train_len, "train.curriculum_start_len",
                f"must be in 1..train_len = {cfg.train_len} (got {start})")
        require(t.curriculum_steps is None or 0 <= t.curriculum_steps <= t.steps, "train.curriculum_steps",
                f"must be in 0..train.steps = {t.steps} (got {t.curriculum_steps})")
    else:
        for key in ("curriculum_start_len", "curriculum_steps"):
            require(getattr(t, key) is None, f"train.{key}", "only applies with train.curriculum=linear")


def _validate_pose(cfg: Config, encoder) -> None:
    """``train.pose_target_len``: at least ``train_len``, within what the encoding represents, only with pose."""
    t = cfg.train
    if t.positions != "pose":
        require(t.pose_target_len is None, "train.pose_target_len", "only applies with train.positions=pose")
        return
    longest = max(eval_lengths(cfg)) if _lengths_valid(cfg) else cfg.train_len
    target = t.pose_target_len if t.pose_target_len is not None else longest
    require(target >= cfg.train_len, "train.pose_target_len",
            f"must be >= train_len = {cfg.train_len}: PoSE reads a train_len window at positions up to the "
            f"target (got {target})")
    if encoder.max_length is not None:
        require(target <= encoder.max_length, "train.pose_target_len",
                f"positions up to {target - 1} are trained, but encoder {cfg.encoder['name']!r} represents "
                f"0..{encoder.max_length - 1}; lower train.pose_target_len or raise encoder.max_length")


def _lengths_valid(cfg: Config) -> bool:
    e = cfg.eval
    values = e.lengths if e.lengths is not None else e.multiples
    return len(values) > 0 and all(v > 0 for v in values)


def validate_data(cfg: Config) -> None:
    """``data.*`` and ``tokenizer.*``: a known loader, what it needs, a tokenizer it can build."""
    check_data(cfg.data, tokenizer_spec(cfg))


def check_data(d: DataConfig, tokenizer: Optional[TokenizerSpec]) -> None:
    """``data.*``: a known loader and what it needs; and ``tokenizer`` one it can build (None: the data is read
    with a pretrained model's own tokenizer, ``posexp eval hf:MODEL``)."""
    kind = data_kind(d)
    if kind not in DATASETS:
        shipped = sorted(p.stem for p in (config_dir() / "data").glob("*.yaml"))
        raise ConfigError("data", f"unknown data set {kind!r}; choose one of: {', '.join(shipped)} "
                                  f"(data.kind is one of: {', '.join(DATASETS)})")
    require(0 < d.val_fraction < 1, "data.val_fraction", f"must be in (0, 1) (got {d.val_fraction})")
    if kind == "text":
        require(d.path is not None and str(d.path).strip() != "", "data.path",
                "data=text needs the text to train on: data.path=FILE_OR_DIR (UTF-8 text)")
        require(d.on_bad_file in BAD_FILE_CHOICES, "data.on_bad_file",
                f"must be one of: {', '.join(BAD_FILE_CHOICES)} (got {d.on_bad_file!r})")
    if kind == "hf":
        require(d.name is not None and str(d.name).strip() != "", "data.name",
                "data=hf needs a data set: data.name=OWNER/NAME (a Hub id, e.g. Salesforce/wikitext) or a local "
                "folder (datasets' save_to_disk output, or data files)")
        require(str(d.text_column or "").strip() != "", "data.text_column",
                "must name the data set's text column (e.g. text)")
        require(str(d.train_split or "").strip() != "", "data.train_split",
                "must name the split to train on (e.g. train)")
        require(d.max_train_docs is None or d.max_train_docs > 0, "data.max_train_docs",
                f"must be a positive number of rows, or null for all (got {d.max_train_docs})")
    if tokenizer is not None:
        check_spec(tokenizer)


def validate_task(cfg: Config) -> None:
    """``task`` (posexp/tasks/): a known task, options and lengths it can build, eval keys of tasks, and a
    ``data`` it can use (the generated tasks read none; passkey reads bytes)."""
    task_cfg = cfg.task
    check_task_name(str(task_cfg.name))
    if not is_task(cfg):
        return
    e, name = cfg.eval, str(task_cfg.name)
    require(e.examples > 0, "eval.examples", f"must be a positive number of instances per length (got {e.examples})")
    depths = list(e.depths or [])
    require(len(depths) > 0 and all(0 <= d <= 1 for d in depths), "eval.depths",
            f"must list depths in [0, 1] (0 = key before all the filler, 1 = right before the question; got {depths})")
    require(e.protocol == "nonoverlap", "eval.protocol",
            f"applies to task=lm (perplexity); task={name} scores its answers teacher-forced: drop eval.protocol")
    if name in DATA_TASKS:
        require(tokenizer_spec(cfg).name == "byte", "tokenizer",
                f"task={name} reads its filler text as bytes: use tokenizer=byte (got {tokenizer_spec(cfg).name})")
    else:
        require(data_kind(cfg.data) == "stdlib" and tokenizer_spec(cfg).name == "byte", "data",
                f"task={name} generates its own sequences and reads no data (only task=lm and task=passkey do); "
                "drop the data= / tokenizer= overrides")
    task = build_task(task_cfg)
    check_task_lengths(task, int(cfg.train_len), eval_lengths(cfg) if _lengths_valid(cfg) else [])
    t = cfg.train
    if t.curriculum == "linear":
        start = t.curriculum_start_len if t.curriculum_start_len is not None else default_start_len(cfg.train_len)
        require(start >= task.shortest_length(), "train.curriculum_start_len",
                f"must hold one instance of task={name}: at least {task.shortest_length()} tokens (got {start})")


def validate_eval(cfg: Config, encoder=None) -> None:
    """Checks of the protocol and scaling keys that depend on the eval lengths and the encoder."""
    e = cfg.eval
    check_protocol(e.protocol, e.stride, e.last_k, min(eval_lengths(cfg)))
    check_scaling_options(e.scaling, e.scaling_factor, cfg.encoder["name"], encoder=encoder,
                          rerope_window=e.rerope_window, train_len=int(cfg.train_len))
    check_remap_options(e, int(cfg.train_len))
    factors = getattr(e, "longrope_factors", None)
    require(factors is None or e.scaling == LONGROPE, "eval.longrope_factors",
            f"only applies with eval.scaling=longrope (scaling is {e.scaling}); drop it or set eval.scaling=longrope")
    if e.scaling == LONGROPE and encoder is not None:  # their count and values, read as past the training length
        scaled_encoder(encoder, LONGROPE, 2.0, int(cfg.train_len), None if factors is None else list(factors))
    check_window(e.window, e.sinks)


def validate_curve(cfg: Config) -> None:
    """``eval.during_training``: a step count (0 or null: off), positive multiples, a budget that holds one window
    of the longest curve length (a task: one instance per length, of a length the task can build)."""
    c = cfg.eval.during_training
    require(c.every is None or c.every >= 0, "eval.during_training.every",
            f"must be a number of steps >= 0; 0 or null turns the curve off (got {c.every})")
    if not c.every:
        return
    require(len(c.multiples) > 0, "eval.during_training.multiples",
            "must list at least one multiple of train_len, e.g. eval.during_training.multiples=[1,2,4]")
    bad = [m for m in c.multiples if m <= 0]
    require(not bad, "eval.during_training.multiples", f"multiples must be positive integers (got {bad})")
    longest = max(curve_lengths(cfg))
    if not is_task(cfg):
        require(c.tokens >= longest, "eval.during_training.tokens",
                f"must be at least the longest curve length {longest} (got {c.tokens})")
        return
    require(c.examples > 0, "eval.during_training.examples",
            f"must be a positive number of instances per length (got {c.examples})")
    task = build_task(cfg.task)
    for length in curve_lengths(cfg):
        task.check_length(length, "eval.during_training.multiples")


def check_scaling_options(scaling: str, factor: Optional[float], encoder_name: str, encoder=None,
                          rerope_window: Optional[int] = None, train_len: Optional[int] = None) -> None:
    """``eval.scaling`` known and offered by the encoder (as configured, when ``encoder`` is given), and its
    settings as :func:`check_scaling_settings` checks them."""
    check_known(scaling)
    check_scaling(scaling, encoder_name, encoder)
    check_scaling_settings(scaling, factor, rerope_window, train_len)


def check_scaling_settings(scaling: str, factor: Optional[float], rerope_window: Optional[int] = None,
                           train_len: Optional[int] = None) -> None:
    """Whatever the model: ``eval.scaling`` known; ``eval.scaling_factor`` >= 1 and only with a scaling that has a
    factor; ``eval.rerope_window`` only with ``rerope``, between 1 and ``train_len`` (when known)."""
    check_known(scaling)
    if rerope_window is not None:
        require(scaling == REROPE, "eval.rerope_window",
                f"only applies with eval.scaling=rerope (scaling is {scaling}); drop it or set eval.scaling=rerope")
        limit = f" and train_len={train_len}" if train_len is not None else ""
        require(rerope_window >= 1 and (train_len is None or rerope_window <= train_len), "eval.rerope_window",
                f"must be between 1{limit}, the window of relative positions kept exact; "
                f"distances beyond it are read as the window (got {rerope_window})")
    if scaling == REROPE:
        require(factor is None, "eval.scaling_factor",
                "rerope has no factor: its one setting is the window, eval.rerope_window=W "
                "(tokens; unset = train_len / 2); drop eval.scaling_factor")
    if factor is not None:
        require(scaling != NONE, "eval.scaling_factor",
                f"only applies with an eval.scaling ({', '.join(SCALINGS[1:])}); drop it or set one")
        require(factor >= 1, "eval.scaling_factor",
                f"must be >= 1, the factor the context is extended by (got {factor:g}); leave it unset "
                "for eval length / train length at each length")


def check_remap_options(e: Any, train_len: Optional[int]) -> None:
    """A remapping's ``eval.`` options: each with its method, in range (defaults filled in); no factor, no window."""
    check_options(e.scaling, given := {key: getattr(e, key, None) for key in ALL_OPTION_KEYS}, train_len)
    if e.scaling in REMAPPINGS[1:] and train_len is not None:  # a local window against its default chunk, say
        Remapping.of(e.scaling, given, train_len, train_len)
    if e.scaling in REMAPPINGS[1:]:
        require(e.scaling_factor is None, "eval.scaling_factor", f"{e.scaling} has no factor: its settings are "
                f"{', '.join(f'eval.{k}' for k in OPTION_KEYS[e.scaling])} (null = defaults); drop eval.scaling_factor")
        require(getattr(e, "window", None) is None, "eval.window",
                f"{e.scaling} remaps positions over the whole causal past; evaluate it without eval.window")


def check_objective(cfg: Config) -> None:
    """``objective`` is ``longest``, ``mean`` or a positive integer eval length.

    Raises:
        ConfigError: naming ``objective`` and the allowed values.
    """
    objective = cfg.objective
    if isinstance(objective, str) and objective in OBJECTIVES:
        return
    if isinstance(objective, int) and not isinstance(objective, bool) and objective > 0:
        return
    raise ConfigError("objective", f"must be longest, mean or an eval length in tokens, e.g. objective=512 "
                                   f"(got {objective!r})")


def config_warnings(cfg: Config) -> list[str]:
    """Settings that are allowed but probably not meant; the run goes on and says so."""
    t = cfg.train
    notes = []
    every = cfg.eval.during_training.every
    if every and every > t.steps:
        notes.append(f"eval.during_training.every={every} is more than train.steps={t.steps}: the curve has one "
                     f"point, at the last step; lower it (e.g. eval.during_training.every={max(1, t.steps // 10)})")
    if t.warmup_steps >= t.steps:
        peak = "reaches train.lr only at the last step" if t.warmup_steps == t.steps else \
            f"never reaches train.lr (it ends at {t.steps / t.warmup_steps:.0%} of it)"
        notes.append(f"train.warmup_steps={t.warmup_steps} is not shorter than train.steps={t.steps}: the learning "
                     f"rate rises for the whole run, {peak}, and never decays; lower train.warmup_steps "
                     f"(e.g. train.warmup_steps={t.steps // 10})")
    elif 3 * t.warmup_steps > t.steps:
        notes.append(f"train.warmup_steps={t.warmup_steps} is more than a third of train.steps={t.steps}: the "
                     f"learning rate is still rising for {t.warmup_steps / t.steps:.0%} of the run, leaving little "
                     f"of the cosine decay; a warmup of 2-10% of the steps is usual "
                     f"(e.g. train.warmup_steps={t.steps // 20})")
    return notes
