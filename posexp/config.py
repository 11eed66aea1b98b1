"""Config schema: one dataclass per group, stored in Hydra's ConfigStore.

Hydra merges ``configs/*.yaml`` onto these schemas at compose time, so an
unknown key or a value of the wrong type fails with the key's name before
anything runs. Range checks that a type cannot express (``base > 1``, lengths
positive, ``d_model`` divisible by the heads) live in :func:`validate`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from posexp.errors import ConfigError, require

def config_dir() -> Path:
    """The shipped ``configs/`` folder: beside the package in a checkout, inside it in a wheel."""
    import posexp.configs as shipped  # the top-level configs/ folder, mapped as a package

    return Path(shipped.__file__).resolve().parent


@dataclass
class DataConfig:
    """``configs/data/*.yaml`` document the keys; ``posexp/data.py`` loads, splits and caches."""

    name: Optional[str] = "stdlib"  # stdlib/text: the corpus; hf: a Hub id or a local data set folder
    # the loader: stdlib, text or hf (unset: the name, as in configs written before data=hf existed)
    kind: Optional[str] = None
    description: str = ""
    path: Optional[str] = None
    val_fraction: float = 0.05
    cache_dir: Optional[str] = None
    # data=hf only
    config: Optional[str] = None
    revision: Optional[str] = None
    train_split: str = "train"
    validation_split: Optional[str] = "validation"
    text_column: str = "text"
    separate_rows: bool = True
    max_train_docs: Optional[int] = None


@dataclass
class TokenizerConfig:
    """``configs/tokenizer/*.yaml``; ``posexp/tokenizer.py`` builds them."""

    name: str = "byte"
    description: str = ""
    vocab_size: Optional[int] = None  # bpe: vocabulary incl. the document separator (unset: 4096); byte: 256
    min_frequency: int = 2


@dataclass
class ModelConfig:
    d_model: int = 128  # width of the residual stream (embedding size)
    n_layers: int = 2  # Transformer blocks
    n_heads: int = 4  # attention heads per layer; d_model must divide by it
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    attn_block_size: int = 256


@dataclass
class TrainConfig:
    steps: int = 500  # optimizer steps
    batch_size: int = 32  # windows of train_len tokens per step (the global batch under torchrun)
    lr: float = 3e-3  # peak learning rate (AdamW, linear warmup then cosine decay)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 60  # steps of linear learning-rate warmup
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # configs/train/default.yaml sets these to ${precision} / ${device}, the top-level keys users type
    precision: str = "auto"
    device: str = "auto"
    threads: Optional[int] = None
    log_every: int = 25
    progress: bool = True
    # Resumable checkpoints (posexp resume RUN_DIR): every N steps and/or every M minutes; 0 turns either off.
    # One is always written when training ends or is interrupted.
    checkpoint_every: int = 100  # steps between resumable checkpoints; 0 = off
    checkpoint_minutes: float = 10.0
    # Training-time position tricks for any encoding (posexp/positions.py):
    # randomized positions (Ruoss et al. 2023) and sequence-length warmup (Li et al. 2022).
    positions: str = "contiguous"  # contiguous | randomized (Ruoss et al. 2023)
    max_position: Optional[int] = None
    curriculum: str = "none"  # none | linear: sequence-length warmup (Li et al. 2022)
    curriculum_start_len: Optional[int] = None
    curriculum_steps: Optional[int] = None


@dataclass
class EvalConfig:
    """How perplexity is measured; the only group ``posexp eval`` lets a user change after training.

    ``configs/eval/default.yaml`` documents each key; ``posexp/evaluate.py`` says
    exactly which tokens each protocol scores.
    """

    lengths: Optional[List[int]] = None  # eval lengths in tokens; null = eval.multiples x train_len
    multiples: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # eval lengths as multiples of train_len
    tokens: int = 65536  # target tokens scored at every length
    protocol: str = "nonoverlap"  # which tokens are scored: nonoverlap | sliding | last_k
    stride: Optional[int] = None
    last_k: Optional[int] = None
    scaling: str = "none"  # eval-time context extension: none | linear | ntk | dynamic_ntk | yarn | llama3 | rerope
    scaling_factor: Optional[float] = None
    rerope_window: Optional[int] = None
    batch_tokens: int = 16384
    loss_by_position: bool = True


@dataclass
class Config:
    encoder: Any = MISSING
    data: DataConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    model: ModelConfig = MISSING
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    base: float = 10000.0  # base frequency of sinusoidal and rotary encodings (ignored by the others)
    train_len: int = 128  # training context length in tokens
    seed: int = 0  # seeds model initialisation and data order
    device: str = "auto"  # auto | cpu | cuda | mps (auto: cuda, else mps, else cpu)
    precision: str = "auto"  # auto | fp32 | bf16 (auto: bf16 autocast where the hardware has it)
    compile: bool = False  # torch.compile the training step
    # Sweep cache (posexp/cache.py): reuse the weights of a finished run with the same training config.
    cache: bool = False  # reuse the weights of a finished run with the same training config
    cache_dir: str = "outputs/cache"
    # What the train task returns to a Hydra sweeper (posexp/sweeps.py): "longest", "mean" or an eval length.
    objective: Any = "longest"  # what a sweeper minimises: longest | mean | an eval length


PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda", "mps")
PROTOCOLS = ("nonoverlap", "sliding", "last_k")
DATASETS = ("stdlib", "text", "hf")  # data.kind: the loaders


def register_configs() -> None:
    """Store the schemas; idempotent (Hydra may be started several times in one process)."""
    from posexp.encoders import options_schema, registry

    cs = ConfigStore.instance()
    cs.store(name="posexp_schema", node=Config)
    cs.store(group="schema/data", name="data", node=DataConfig)
    cs.store(group="schema/tokenizer", name="tokenizer", node=TokenizerConfig)
    cs.store(group="schema/model", name="model", node=ModelConfig)
    cs.store(group="schema/train", name="train", node=TrainConfig)
    cs.store(group="schema/eval", name="eval", node=EvalConfig)
    for name, cls in registry().items():
        cs.store(group="schema/encoder", name=name, node=options_schema(cls))


def eval_lengths(cfg: DictConfig) -> list[int]:
    """``eval.lengths`` if given, else ``eval.multiples`` times ``train_len``; sorted, unique."""
    if cfg.eval.lengths is not None:
        return sorted(set(int(n) for n in cfg.eval.lengths))
    return sorted(set(int(m) * int(cfg.train_len) for m in cfg.eval.multiples))


def validate(cfg: DictConfig) -> None:
    """Range and consistency checks a type cannot express. Raises :class:`ConfigError`."""
    from posexp.encoders import option_names, registry
    from posexp.model import ModelShape, check_shape

    require(cfg.encoder.name in registry(), "encoder",
            f"unknown encoder {cfg.encoder.name!r}; choose one of: {', '.join(registry())}")
    require(cfg.base > 1, "base", f"must be > 1 (got {cfg.base:g})")
    require(cfg.train_len > 0, "train_len", f"must be a positive integer (got {cfg.train_len})")
    require(cfg.seed >= 0, "seed", f"must be >= 0 (got {cfg.seed})")
    if "base" in option_names(cfg.encoder.name):
        require(cfg.encoder.base > 1, "base", f"must be > 1 (got {cfg.encoder.base:g})")
    check_shape(ModelShape(**{k: cfg.model[k] for k in ("d_model", "n_layers", "n_heads", "mlp_ratio",
                                                          "dropout", "attn_block_size")}))
    # the encoder checks its own options and their combinations, before any data is read
    encoder = build_encoder(cfg)

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
    require(cfg.get("device", "auto") in DEVICES, "device",
            f"unknown device {cfg.get('device')!r}; choose one of: {', '.join(DEVICES)}")
    require(cfg.get("precision", "auto") in PRECISIONS, "precision",
            f"unknown precision {cfg.get('precision')!r}; choose one of: {', '.join(PRECISIONS)}")
    require(t.precision in PRECISIONS, "train.precision",
            f"unknown precision {t.precision!r}; choose one of: {', '.join(PRECISIONS)}")
    require(t.device in DEVICES, "train.device",
            f"unknown device {t.device!r}; choose one of: {', '.join(DEVICES)}")
    require(t.threads is None or t.threads > 0, "train.threads", f"must be a positive integer (got {t.threads})")
    require(t.log_every > 0, "train.log_every", f"must be a positive integer (got {t.log_every})")
    require(t.checkpoint_every >= 0, "train.checkpoint_every",
            f"must be >= 0 steps, 0 turns periodic checkpoints off (got {t.checkpoint_every})")
    require(t.checkpoint_minutes >= 0, "train.checkpoint_minutes",
            f"must be >= 0 minutes, 0 turns timed checkpoints off (got {t.checkpoint_minutes})")
    validate_positions(cfg, encoder)

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
    require(str(cfg.get("cache_dir", "outputs/cache")).strip() != "", "cache_dir",
            "must name a folder (absolute, or relative to the folder posexp is started in)")
    from posexp.commands.sweeps import check_objective

    check_objective(cfg)


def validate_positions(cfg: DictConfig, encoder) -> None:
    """``train.positions`` / ``train.curriculum`` and their options (posexp/positions.py)."""
    from posexp.positions import CURRICULA, POSITION_SCHEMES, default_start_len

    t = cfg.train
    require(t.positions in POSITION_SCHEMES, "train.positions",
            f"unknown scheme {t.positions!r}; choose one of: {', '.join(POSITION_SCHEMES)}")
    require(t.curriculum in CURRICULA, "train.curriculum",
            f"unknown curriculum {t.curriculum!r}; choose one of: {', '.join(CURRICULA)}")
    if t.positions == "randomized":
        longest = max(eval_lengths(cfg)) if _lengths_valid(cfg) else cfg.train_len
        max_position = t.max_position if t.max_position is not None else max(cfg.train_len, longest)
        require(max_position >= cfg.train_len, "train.max_position",
                f"must be >= train_len = {cfg.train_len}: training draws train_len distinct positions "
                f"from 0..max_position-1 (got {max_position})")
        if encoder.max_length is not None:
            require(max_position <= encoder.max_length, "train.max_position",
                    f"positions up to {max_position - 1} are drawn, but encoder {cfg.encoder.name!r} represents "
                    f"0..{encoder.max_length - 1}; lower train.max_position or raise the encoder's length "
                    f"(e.g. encoder.max_length={max_position})")
    else:
        require(t.max_position is None, "train.max_position", "only applies with train.positions=randomized")
    if t.curriculum == "linear":
        start = t.curriculum_start_len if t.curriculum_start_len is not None else default_start_len(cfg.train_len)
        require(0 < start <= cfg.train_len, "train.curriculum_start_len",
                f"must be in 1..train_len = {cfg.train_len} (got {start})")
        require(t.curriculum_steps is None or 0 <= t.curriculum_steps <= t.steps, "train.curriculum_steps",
                f"must be in 0..train.steps = {t.steps} (got {t.curriculum_steps})")
    else:
        for key in ("curriculum_start_len", "curriculum_steps"):
            require(t[key] is None, f"train.{key}", "only applies with train.curriculum=linear")


def _lengths_valid(cfg: DictConfig) -> bool:
    e = cfg.eval
    values = e.lengths if e.lengths is not None else e.multiples
    return len(values) > 0 and all(v > 0 for v in values)


def validate_data(cfg: DictConfig) -> None:
    """``data.*`` and ``tokenizer.*``: a known loader, what it needs, a tokenizer it can build."""
    from posexp.data.corpus import data_kind, tokenizer_spec
    from posexp.data.tokenizer import check_spec

    d = cfg.data
    kind = data_kind(d)
    if kind not in DATASETS:
        shipped = sorted(p.stem for p in (config_dir() / "data").glob("*.yaml"))
        raise ConfigError("data", f"unknown data set {kind!r}; choose one of: {', '.join(shipped)} "
                                  f"(data.kind is one of: {', '.join(DATASETS)})")
    require(0 < d.val_fraction < 1, "data.val_fraction", f"must be in (0, 1) (got {d.val_fraction})")
    if kind == "text":
        require(d.path is not None and str(d.path).strip() != "", "data.path",
                "data=text needs the text to train on: data.path=FILE_OR_DIR (UTF-8 text)")
    if kind == "hf":
        require(d.name is not None and str(d.name).strip() != "", "data.name",
                "data=hf needs a data set: data.name=OWNER/NAME (a Hub id, e.g. Salesforce/wikitext) or a local "
                "folder (datasets' save_to_disk output, or data files)")
        require(str(d.get("text_column") or "").strip() != "", "data.text_column",
                "must name the data set's text column (e.g. text)")
        require(str(d.get("train_split") or "").strip() != "", "data.train_split",
                "must name the split to train on (e.g. train)")
        require(d.get("max_train_docs") is None or d.max_train_docs > 0, "data.max_train_docs",
                f"must be a positive number of rows, or null for all (got {d.get('max_train_docs')})")
    check_spec(tokenizer_spec(cfg))


def build_encoder(cfg: DictConfig):
    """The encoder of ``cfg.encoder`` for the model of ``cfg.model``, bound to its layers.

    Raises:
        ConfigError: an unknown option, a value out of range, or options that do not go together.
    """
    from posexp.encoders import create

    options = {k: v for k, v in to_container(cfg.encoder).items() if k != "name"}
    encoder = create(cfg.encoder.name, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, **options)
    encoder.for_layers(int(cfg.model.n_layers))
    return encoder


def validate_eval(cfg: DictConfig, encoder=None) -> None:
    """Checks of the protocol and scaling keys that depend on the eval lengths and the encoder."""
    e = cfg.eval
    check_protocol(e.protocol, e.stride, e.last_k, min(eval_lengths(cfg)))
    check_scaling_options(e.scaling, e.scaling_factor, cfg.encoder.name, encoder=encoder,
                          rerope_window=e.get("rerope_window"), train_len=int(cfg.train_len))


def check_protocol(protocol: str, stride: Optional[int], last_k: Optional[int], shortest: int) -> None:
    """``eval.protocol`` known, and ``eval.stride`` / ``eval.last_k`` set exactly when it uses them, within range."""
    require(protocol in PROTOCOLS, "eval.protocol",
            f"unknown protocol {protocol!r}; choose one of: {', '.join(PROTOCOLS)}")
    if protocol == "sliding":
        require(stride is not None, "eval.stride",
                f"protocol sliding needs a stride: eval.stride=S with 1 <= S <= {shortest} (the shortest eval "
                "length); S=1 is Press et al. 2022's setting, larger S is proportionally faster")
        require(1 <= stride <= shortest, "eval.stride",
                f"must be between 1 and the shortest eval length {shortest} (got {stride})")
    else:
        require(stride is None, "eval.stride",
                f"only applies to eval.protocol=sliding (protocol is {protocol}); drop it or set eval.protocol=sliding")
    if protocol == "last_k":
        require(last_k is not None, "eval.last_k",
                f"protocol last_k needs K: eval.last_k=K with 1 <= K <= {shortest} (the shortest eval length)")
        require(1 <= last_k <= shortest, "eval.last_k",
                f"must be between 1 and the shortest eval length {shortest} (got {last_k})")
    else:
        require(last_k is None, "eval.last_k",
                f"only applies to eval.protocol=last_k (protocol is {protocol}); drop it or set eval.protocol=last_k")


def check_scaling_options(scaling: str, factor: Optional[float], encoder_name: str, encoder=None,
                          rerope_window: Optional[int] = None, train_len: Optional[int] = None) -> None:
    """``eval.scaling`` known and offered by the encoder (as configured, when ``encoder`` is given);
    ``eval.scaling_factor`` >= 1 and only with a scaling that has a factor; ``eval.rerope_window``
    only with ``rerope``, between 1 and ``train_len``."""
    from posexp.encoders.scaling import NONE, REROPE, SCALINGS, check_scaling

    require(scaling in SCALINGS, "eval.scaling", f"unknown scaling {scaling!r}; choose one of: {', '.join(SCALINGS)}")
    check_scaling(scaling, encoder_name, encoder)
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


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


TRAINING_KEYS = ("encoder", "data", "tokenizer", "model", "train", "train_len", "seed")
# train.* keys that change how a run reports and saves itself, not the weights it ends with
NOT_TRAINING_KEYS = ("progress", "log_every", "checkpoint_every", "checkpoint_minutes")


def config_hash(cfg: DictConfig) -> str:
    """Hash of everything that shapes the trained weights (not evaluation, not the output folder)."""
    c = to_container(cfg)
    relevant = {k: c[k] for k in TRAINING_KEYS if k in c}
    relevant["train"] = {k: v for k, v in relevant["train"].items() if k not in NOT_TRAINING_KEYS}
    if isinstance(relevant.get("encoder"), dict) and relevant["encoder"].get("lr_mult") == 1.0:
        # the plain rate, which every run had before encoder.lr_mult existed: same weights, same hash
        relevant["encoder"] = {k: v for k, v in relevant["encoder"].items() if k != "lr_mult"}
    blob = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


HYDRA_CONFIG = Path(".hydra") / "config.yaml"


def read_saved_config(run_dir: Path) -> DictConfig:
    """A run's ``.hydra/config.yaml`` as written by Hydra, or a :class:`PosexpError` naming the file.

    Shared by ``posexp resume`` and ``posexp eval``, so a damaged file gets the same
    one-line message from both instead of a YAML traceback.
    """
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    from posexp.errors import PosexpError

    path = Path(run_dir) / HYDRA_CONFIG
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as e:
        raise PosexpError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    except (OSError, UnicodeDecodeError, ValueError, OmegaConfBaseException) as e:
        raise PosexpError(f"{path}: cannot be read ({str(e).splitlines()[0]})") from None
    if not isinstance(loaded, DictConfig):
        raise PosexpError(f"{path}: not a config (expected a mapping of groups and keys)")
    encoder = loaded.get("encoder")
    if isinstance(encoder, DictConfig) and "lr_mult" not in encoder:
        # written before encoder.lr_mult existed: the encoder trained at train.lr (t5's default is now 10)
        encoder.lr_mult = 1.0
    return loaded
