"""Config schema: one dataclass per group, which :func:`posexp.validate.register_configs` stores in Hydra's
ConfigStore, and the one rule of what shapes the trained weights (:func:`weights_config`, :func:`config_hash`).

Hydra merges ``configs/*.yaml`` onto these schemas at compose time, so an
unknown key or a value of the wrong type fails with the key's name before
anything runs. Range checks that a type cannot express (``base > 1``, lengths
positive, ``d_model`` divisible by the heads) live in :mod:`posexp.validate`.

A leaf: imports nothing of posexp, so every module may import it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf


def config_dir() -> Path:
    """The shipped ``configs/`` folder: beside the package in a checkout, inside it in a wheel."""
    import posexp.configs as shipped  # the top-level configs/ folder, mapped as a package

    return Path(shipped.__file__).resolve().parent


@dataclass
class DataConfig:
    """``configs/data/*.yaml`` document the keys; ``posexp/data/`` loads, splits and caches."""

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
    """``configs/tokenizer/*.yaml``; ``posexp/data/tokenizer.py`` builds them."""

    name: str = "byte"
    description: str = ""
    vocab_size: Optional[int] = None  # bpe: vocabulary incl. the document separator (unset: 4096); byte: 256
    min_frequency: int = 2


@dataclass
class ModelConfig:
    """``configs/model/*.yaml``; :class:`posexp.model.ModelShape` adds the vocabulary size to it."""

    d_model: int = 128  # width of the residual stream (embedding size)
    n_layers: int = 2  # Transformer blocks
    n_heads: int = 4  # attention heads per layer; d_model must divide by it
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    # Queries per block on the bias / scores paths; memory per layer is
    # O(block * L * heads) instead of O(L^2 * heads).
    attn_block_size: int = 256
    # How the weights start. gpt2: N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 n_layers))
    # (Radford et al. 2019, §2.3). pytorch: each layer's own default (nn.Linear: U(+-1/sqrt(fan_in)), nn.Embedding:
    # N(0, 1)), which small task models need (configs/task/mqar.yaml). Encoders initialise their own parameters.
    init: str = "gpt2"
    # The output layer shares the token embedding's weights (Press & Wolf 2017); false: a separate output layer.
    tie_embeddings: bool = True

    def param_count(self, vocab_size: int = 0) -> int:
        """Trainable parameters of a model of this shape (:class:`posexp.model.GPT`): its blocks and final
        LayerNorm, plus ``vocab_size x d_model`` for the token embeddings (twice when the output layer is not
        tied to them). An encoding's own parameters (learned, t5, ...) come on top."""
        d, hidden = self.d_model, int(self.mlp_ratio * self.d_model)
        # attention's qkv and output projections, the MLP's two, two LayerNorms (weight and bias); no linear biases
        block = 4 * d * d + 2 * d * hidden + 2 * 2 * d
        return self.n_layers * block + 2 * d + vocab_size * d * (1 if self.tie_embeddings else 2)


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
class TaskConfig:
    """``configs/task/*.yaml``; ``posexp/tasks/`` generates the instances. ``lm`` is language modelling on ``data``."""

    name: str = "lm"  # lm | copy | reverse | sort | addition | parity | mqar | passkey | flipflop
    description: str = ""
    # alphabet size of copy / reverse / sort, keys (and values) of mqar; null = the task's default
    symbols: Optional[int] = None
    # smallest instance trained on (symbols, digits, bits, pairs, instructions, filler tokens); null = the task's own
    min_size: Optional[int] = None
    digits: int = 5  # passkey: digits of the key


@dataclass
class EvalConfig:
    """How perplexity is measured; the only group ``posexp eval`` lets a user change after training.

    ``configs/eval/default.yaml`` documents each key; ``posexp/evaluation/perplexity.py`` says
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
    # task runs (task != lm): instances per length (and depth), and the passkey's depths in [0, 1]
    examples: int = 256
    depths: List[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])


@dataclass
class FinetuneConfig:
    """A fine-tuned run's lineage (``posexp finetune``): the parent it started from and how its encoding was
    extended. None on a run trained from scratch; ``posexp/commands/finetune.py`` fills it in."""

    parent: str = MISSING  # the parent run folder
    parent_config_hash: str = MISSING
    parent_weights_sha256: str = MISSING  # SHA-256 of the parent's checkpoint/model.safetensors
    parent_train_len: int = MISSING  # the length the parent trained at; train_len is the new one
    parent_corpus_fingerprint: Optional[str] = None  # the tokens the parent trained on
    scaling: str = "none"  # none (direct fine-tuning) | linear | ntk | dynamic_ntk | yarn | llama3
    scaling_factor: float = 1.0  # s (for dynamic_ntk the factor a of its formula)


@dataclass
class TensorBoardConfig:
    """``configs/logger/tensorboard.yaml``: event files ``tensorboard --logdir`` reads."""

    log_dir: Optional[str] = None  # null = RUN_DIR/tensorboard (a sweep's jobs side by side under its folder)


@dataclass
class MLflowConfig:
    """``configs/logger/mlflow.yaml``."""

    tracking_uri: Optional[str] = None  # null = $MLFLOW_TRACKING_URI, else MLflow's own local default
    experiment: str = "posexp"


@dataclass
class WandbConfig:
    """``configs/logger/wandb.yaml``."""

    project: str = "posexp"
    entity: Optional[str] = None
    # online | offline | disabled; null = $WANDB_MODE, else online only where an API key is configured
    mode: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class LoggerConfig:
    """The experiment trackers a run reports to (``logger=tensorboard``, ``logger=[tensorboard,mlflow]``); each
    ``configs/logger/*.yaml`` fills in its own key, and the keys left null are trackers not used."""

    tensorboard: Optional[TensorBoardConfig] = None
    mlflow: Optional[MLflowConfig] = None
    wandb: Optional[WandbConfig] = None


@dataclass
class Config:
    encoder: Any = MISSING
    data: DataConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    model: ModelConfig = MISSING
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    task: TaskConfig = field(default_factory=TaskConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # experiment trackers: none by default
    base: float = 10000.0  # base frequency of sinusoidal and rotary encodings (ignored by the others)
    train_len: int = 128  # training context length in tokens
    seed: int = 0  # seeds model initialisation and data order
    device: str = "auto"  # auto | cpu | cuda | mps (auto: cuda, else mps, else cpu)
    precision: str = "auto"  # auto | fp32 | bf16 (auto: bf16 on GPUs that have it, the faster one measured on CPUs)
    compile: Any = "auto"  # torch.compile the training step: auto (on CUDA only) | true | false
    # Sweep cache (posexp/training/cache.py): reuse the weights of a finished run with the same training config.
    cache: bool = False  # reuse the weights of a finished run with the same training config
    cache_dir: str = "outputs/cache"
    # What the train task returns to a Hydra sweeper (posexp/commands/sweeps.py): "longest", "mean" or an eval length.
    objective: Any = "longest"  # what a sweeper minimises: longest | mean | an eval length
    finetune: Optional[FinetuneConfig] = None  # lineage of a fine-tuned run (posexp finetune); None otherwise


@dataclass
class FinetuneAppConfig:
    """What ``posexp finetune RUN_DIR`` lets a user set (``configs/finetune.yaml``); the rest is the parent's.

    :func:`posexp.commands.finetune.child_config` turns it and the parent's config into the new run's
    :class:`Config`.
    """

    parent: str = MISSING  # the parent run folder (the command's RUN_DIR)
    scaling: str = "none"  # none | linear | ntk | dynamic_ntk | yarn | llama3 (what the encoding offers)
    scaling_factor: Optional[float] = None  # null: new train_len / parent's (dynamic_ntk: 1)
    train_len: Optional[int] = None  # the new training length; null: 4x the parent's
    data: Any = None  # null: the parent's corpus; naming one checks that it is the parent's
    logger: Any = None  # null: the parent's experiment trackers; logger=NAME chooses others (logger=none: none)
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    seed: int = 0  # seeds the fine-tuning data order (and any new table rows)
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    cache: bool = False
    cache_dir: str = "outputs/cache"
    objective: Any = "longest"


PRECISIONS = ("auto", "fp32", "bf16")
LM = "lm"  # task=lm: language modelling on data, measured by perplexity
DEVICES = ("auto", "cpu", "cuda", "mps")
PROTOCOLS = ("nonoverlap", "sliding", "last_k")
DATASETS = ("stdlib", "text", "hf")  # data.kind: the loaders
OBJECTIVES = ("longest", "mean")  # objective: besides an eval length in tokens


def eval_lengths(cfg: Config | DictConfig) -> list[int]:
    """``eval.lengths`` if given, else ``eval.multiples`` times ``train_len``; sorted, unique."""
    if cfg.eval.lengths is not None:
        return sorted(set(int(n) for n in cfg.eval.lengths))
    return sorted(set(int(m) * int(cfg.train_len) for m in cfg.eval.multiples))


def typed(cfg: DictConfig) -> Config:
    """The composed config as the :class:`Config` dataclass (its groups as their dataclasses), interpolations
    resolved: what commands hand down from the edge. ``encoder`` stays open (``Any``): the encoder's own schema
    when Hydra composed it, a mapping when a saved run's config was merged; only the factory reads it."""
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


# ---------------------------------------------------------------------------- what shapes the weights

# The one rule: the resolved config shapes the trained weights, except these keys, each for its reason.
# The sweep cache (training/cache.py) keys on it; the run-folder hash (config_hash) derives from it.
NOT_WEIGHTS: dict[str, str] = {
    "eval": "evaluation reads the weights, it never changes them",
    "cache": "whether a finished training is reused, not how a training goes",
    "cache_dir": "where reused trainings are kept",
    "objective": "what a sweeper is told after training",
    "hydra": "Hydra's own settings: output folders, launchers, logging",
    "logger": "which experiment trackers hear about the run",
    "train.progress": "the progress bar",
    "train.log_every": "how often metrics.csv gets a row",
    "train.checkpoint_every": "when resumable checkpoints are written; a resumed run is bit-identical",
    "train.checkpoint_minutes": "when resumable checkpoints are written; a resumed run is bit-identical",
    "train.threads": "how many CPU threads run the same computation",
    "data.cache_dir": "where the token cache is kept; the corpus fingerprint says what it holds",
    "data.description": "text for posexp list",
    "tokenizer.description": "text for posexp list",
    "task.description": "text for posexp list",
    "finetune.parent": "where the parent run lies; its weights' SHA-256 says what it was",
}


def is_task(cfg: Any) -> bool:
    """Whether a run trains on a generated task (measured by accuracy) rather than language modelling."""
    task = cfg.get("task") if hasattr(cfg, "get") else getattr(cfg, "task", None)
    name = (task.get("name") if hasattr(task, "get") else getattr(task, "name", None)) if task is not None else None
    return name is not None and str(name) != LM


def default_max_position(train_len: int, longest_eval: int) -> int:
    """``train.max_position`` when unset: every position training or evaluation reads (Ruoss et al. 2023 draw
    training positions from a range that covers the longest evaluated length)."""
    return max(int(train_len), int(longest_eval))


# model keys added after runs were written, with the value every one of those runs had: at that value they stay
# out of weights_config, so earlier run folders keep their hash and earlier cache entries their key
MODEL_KEYS_BEFORE = {"init": "gpt2", "tie_embeddings": True}


def weights_config(cfg: DictConfig) -> dict:
    """The resolved config less :data:`NOT_WEIGHTS`: everything that shapes the trained weights.

    A derived value that shapes them is made explicit: with ``train.positions=randomized`` and no
    ``train.max_position``, the range comes from the eval lengths (excluded above), so it is filled in.
    """
    out = to_container(cfg)
    if out.get("compile") == "auto":
        # written as false, the value of every training cached before compile=auto: compiled or eager, a step
        # computes the same thing up to float rounding (as with train.threads), and auto is eager but on CUDA
        out["compile"] = False
    if out.get("finetune", 0) is None:
        del out["finetune"]  # a run trained from scratch: its key as before fine-tuning existed
    for dotted in NOT_WEIGHTS:
        group, _, key = dotted.rpartition(".")
        node = out.get(group) if group else out
        if isinstance(node, dict):
            node.pop(key, None)
    model = out.get("model")
    if isinstance(model, dict):
        for key, before in MODEL_KEYS_BEFORE.items():
            if key in model and model[key] == before:
                del model[key]
    if isinstance(out.get("task"), dict) and out["task"].get("name", LM) == LM:
        out.pop("task")  # language modelling, as before tasks existed: the cache keys of earlier runs hold
    t = out.get("train")
    if isinstance(t, dict) and t.get("positions") == "randomized" and t.get("max_position") is None:
        t["max_position"] = default_max_position(cfg.train_len, max(eval_lengths(cfg)))
    return out


# The run-folder hash (results.json's config_hash, checkpoints, resume) is format 1, kept byte for byte so
# that every run folder written so far keeps its hash: it covers these top-level keys of weights_config
# (base, device, precision and compile reach the weights through encoder.* and train.*; task only when it is
# not lm, so language-modelling runs keep the hash they had before tasks existed), ...
HASH_KEYS = ("encoder", "data", "tokenizer", "model", "train", "train_len", "seed", "task")
# ... with these keys put back, which format 1 hashed although they do not shape the weights ...
HASH_ALSO = ("train.threads", "data.cache_dir", "data.description", "tokenizer.description")


def config_hash(cfg: DictConfig) -> str:
    """16 hex digits of SHA-256 over what shapes the trained weights (:func:`weights_config`), format 1."""
    written = to_container(cfg)
    weights = weights_config(cfg)
    relevant = {k: weights[k] for k in HASH_KEYS if k in weights}
    for dotted in HASH_ALSO:
        group, _, key = dotted.partition(".")
        if isinstance(relevant.get(group), dict) and key in written.get(group, {}):
            relevant[group][key] = written[group][key]
    if isinstance(relevant.get("train"), dict) and "max_position" in written.get("train", {}):
        # ... train.max_position as written (null: derived from the eval lengths) ...
        relevant["train"]["max_position"] = written["train"]["max_position"]
    if isinstance(relevant.get("encoder"), dict) and relevant["encoder"].get("lr_mult") == 1.0:
        # ... and no encoder.lr_mult at the plain rate, which every run had before the option existed
        relevant["encoder"].pop("lr_mult")
    if weights.get("finetune") is not None:  # a fine-tuned run: its lineage shapes its weights
        relevant["finetune"] = weights["finetune"]
    blob = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
