"""Config schema: one dataclass per group, which :func:`posexp.commands.validation.register_configs` stores in Hydra's
ConfigStore. The one rule of what shapes the trained weights is :mod:`posexp.config.identity`
(:func:`~posexp.config.identity.weights_config`, :func:`~posexp.config.identity.config_hash`).

Hydra merges ``configs/*.yaml`` onto these schemas at compose time, so an
unknown key or a value of the wrong type fails with the key's name before
anything runs. Range checks that a type cannot express (``base > 1``, lengths
positive, ``d_model`` divisible by the heads) live in :mod:`posexp.commands.validation`.

A leaf: imports nothing of posexp, so every module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import MISSING


LM = "lm"  # task=lm: language modelling on data, measured by perplexity


def config_dir() -> Path:
    """The shipped ``configs/`` folder: beside the package in a checkout, inside it in a wheel."""
    import posexp.configs as shipped  # the top-level configs/ folder, mapped as a package

    return Path(shipped.__file__).resolve().parent


@dataclass
class DataConfig:
    """``configs/data/*.yaml`` document the keys; ``posexp/data/`` loads, splits and caches."""

    name: Optional[str] = "stdlib"  # stdlib/text: the corpus; hf: a Hub id or a local data set folder
    # the loader: stdlib, text or hf (unset: the name, as in configs written before data=hf existed)
    kind: Optional[str] = None  # stdlib | text | hf
    description: str = ""
    path: Optional[str] = None
    # data=text: a file that is not UTF-8 text stops the run (error) or is left out, with a count (skip)
    on_bad_file: str = "error"  # error | skip
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
    """``configs/model/*.yaml``; :class:`posexp.model.gpt.ModelShape` adds the vocabulary size to it."""

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
    # Scalable-Softmax (Nakanishi 2025): each layer's attention logits times s * log n, n the keys a query
    # attends to and s learned per head, for any encoding (posexp/model/gpt.py). Off: the model as before.
    ssmax: bool = False
    # LayerNorms with a learned bias (beta), as GPT-2 has; false: scale only, as MPT's (posexp export maps an alibi
    # run onto MPT, whose norms have no bias, only when it trained without).
    norm_bias: bool = True

    def param_count(self, vocab_size: int = 0) -> int:
        """Trainable parameters of a model of this shape (:class:`posexp.model.gpt.GPT`): its blocks and final
        LayerNorm, plus ``vocab_size x d_model`` for the token embeddings (twice when the output layer is not
        tied to them). An encoding's own parameters (learned, t5, ...) come on top."""
        d, hidden = self.d_model, int(self.mlp_ratio * self.d_model)
        # attention's qkv and output projections, the MLP's two, two LayerNorms (weight and bias); no linear biases
        norm = 2 * d if self.norm_bias else d  # a LayerNorm's weight, and its bias unless model.norm_bias=false
        block = 4 * d * d + 2 * d * hidden + 2 * norm
        block += self.n_heads if self.ssmax else 0  # SSMax's s per head
        return self.n_layers * block + norm + vocab_size * d * (1 if self.tie_embeddings else 2)


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
    precision: str = "auto"  # auto | fp32 | bf16
    device: str = "auto"  # auto | cpu | cuda | mps
    # CPU threads: auto = the cores free to this process (posexp/runtime/threads.py), or a number; null = torch's
    # default (one per core), as runs before auto recorded it
    threads: Any = "auto"  # a number or "auto" (a Union, which OmegaConf 2.3 fails to merge)
    log_every: int = 25
    progress: bool = True
    # Resumable checkpoints (posexp resume RUN_DIR): every N steps and/or every M minutes; 0 turns either off.
    # One is always written when training ends or is interrupted.
    checkpoint_every: int = 100  # steps between resumable checkpoints; 0 = off
    checkpoint_minutes: float = 10.0
    # Training-time position tricks for any encoding (posexp/model/positions.py):
    # randomized positions (Ruoss et al. 2023) and sequence-length warmup (Li et al. 2022).
    positions: str = "contiguous"  # contiguous | randomized (Ruoss et al. 2023) | pose (Zhu et al. 2024)
    max_position: Optional[int] = None
    pose_target_len: Optional[int] = None  # positions=pose: the length trained for; null = the longest eval length
    curriculum: str = "none"  # none | linear: sequence-length warmup (Li et al. 2022)
    curriculum_start_len: Optional[int] = None
    curriculum_steps: Optional[int] = None
    # How several processes (torchrun) hold the model (posexp/training/sharding.py): ddp replicates it on every
    # rank; fsdp shards parameters, gradients and AdamW's moments over the ranks (FSDP2's fully_shard). The same
    # steps on the same batches either way, up to float rounding.
    parallel: str = "ddp"  # ddp | fsdp
    # recompute each block's activations in the backward pass instead of keeping them: less memory, ~1/3 more compute
    activation_checkpointing: bool = False
    # split each training sequence over N processes (torch's context_parallel, CUDA; posexp/training/context.py):
    # N = the number of processes, each training on the whole global batch's shard of positions; 1 = off
    context_parallel: int = 1


@dataclass
class TaskConfig:
    """``configs/task/*.yaml``: the keys of every task; ``lm`` is language modelling on ``data``. A generated task's
    own options come from its class's ``__init__`` (:func:`posexp.tasks.options_schema`, stored as
    ``schema/task/NAME``), as an encoder's do; ``posexp/tasks/`` generates the instances."""

    name: str = "lm"  # lm, or a task of posexp/tasks/ (posexp list shows them)
    description: str = ""


@dataclass
class PretrainedTaskConfig(TaskConfig):
    """``posexp eval hf:MODEL``'s ``task``: ``lm`` (perplexity) or ``passkey`` in the model's own tokens."""

    digits: int = 5  # passkey: digits of the key


@dataclass
class CurveConfig:
    """``eval.during_training``: extrapolation measured while the model trains, on a small fixed budget.

    Every ``every`` steps (and at the last step) the model is evaluated at ``multiples`` x ``train_len`` on the
    same held-out tokens (a task: the same instances) each time; rows go to ``curve.csv`` and the trackers.
    ``configs/eval/default.yaml`` documents each key; it never changes the weights, the config hash or the cache key.
    """

    every: Optional[int] = None  # steps between curve points; null or 0 = off (the default)
    multiples: List[int] = field(default_factory=lambda: [1, 2, 4, 8])  # lengths as multiples of train_len
    tokens: int = 4096  # task=lm: target tokens scored at every length (the first of the validation split)
    examples: int = 64  # task runs: instances scored at every length


@dataclass
class KeyTokensConfig:
    """``eval.key_tokens``: key-token perplexity (LongPPL, Fang et al. 2024; :mod:`posexp.evaluation.key_tokens`).

    An evaluator model marks the targets it predicts much better with a row's whole context than with only the
    last ``short_len`` tokens; each perplexity row then also gets ``ppl_key`` over those targets. Off (the
    evaluator null) leaves every row and every hash as they were.
    """

    evaluator: Optional[str] = None  # a run folder or hf:NAME; null = off
    alpha: float = 2.0  # LSD threshold: log p(long) - log p(short) > alpha (nats; the paper's 2)
    beta: float = -2.0  # LCL threshold: log p(long) > beta (nats; the paper's -2)
    short_len: Optional[int] = None  # the short context K in tokens; null = the evaluated model's train_len
    short_stride: Optional[int] = None  # targets per short window S (context K .. K+S-1); null = K / 4; 1 = exact K
    cache_dir: Optional[str] = None  # where selections are kept; null = key_tokens/ under the token cache


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
    # eval-time context extension: rescaled frequencies (posexp/encoders/scaling.py), then the position remappings
    # (posexp/encoders/remapping.py)
    scaling: str = "none"  # none | linear | ntk | dynamic_ntk | yarn | llama3 | longrope | rerope | self_extend | string | dca | ms_poe
    scaling_factor: Optional[float] = None
    rerope_window: Optional[int] = None
    # the position remappings' options; null = the method's default for train_len (and the length, self_extend_group)
    self_extend_group: Optional[int] = None
    self_extend_window: Optional[int] = None
    string_offset: Optional[int] = None
    string_local: Optional[int] = None
    dca_chunk: Optional[int] = None
    dca_local: Optional[int] = None
    ms_poe_min: Optional[float] = None
    ms_poe_max: Optional[float] = None
    ms_poe_skip_layers: Optional[int] = None
    longrope_factors: Optional[List[float]] = None  # eval.scaling=longrope: one rescale factor per rotary frequency
    longrope_start: int = 0  # eval.scaling=longrope: LongRoPE's n^, the first positions left unscaled (0 = none)
    longrope_file: Optional[str] = None  # eval.scaling=longrope: a factors file posexp search wrote (factors and n^)
    window: Optional[int] = None  # attend only to the last K keys (a window baseline); null = the whole past
    sinks: Optional[int] = None  # with a window: the first S tokens stay visible too (attention sinks)
    batch_tokens: int = 16384
    loss_by_position: bool = True
    # task runs (task != lm): instances per length (and depth), and the depths in [0, 1] of passkey, niah, kv_retrieval
    examples: int = 256
    depths: List[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    # extrapolation while training goes (curve.csv, curve.png): off unless eval.during_training.every is set
    during_training: CurveConfig = field(default_factory=CurveConfig)
    # key-token perplexity (LongPPL): off unless eval.key_tokens.evaluator names a run or hf:MODEL
    key_tokens: KeyTokensConfig = field(default_factory=KeyTokensConfig)


@dataclass
class FinetuneConfig:
    """A fine-tuned run's lineage (``posexp finetune``): the parent it started from and how its encoding was
    extended. None on a run trained from scratch; ``posexp/commands/finetune.py`` fills it in."""

    parent: str = MISSING  # the parent run folder
    parent_config_hash: str = MISSING
    parent_weights_sha256: str = MISSING  # SHA-256 of the parent's checkpoint/model.safetensors
    parent_train_len: int = MISSING  # the length the parent trained at; train_len is the new one
    parent_corpus_fingerprint: Optional[str] = None  # the tokens the parent trained on
    scaling: str = "none"  # none (direct fine-tuning) | linear | ntk | dynamic_ntk | yarn | llama3 | longrope
    scaling_factor: float = 1.0  # s (for dynamic_ntk the factor a of its formula)
    longrope_factors: Optional[List[float]] = None  # scaling=longrope: one rescale factor per rotary frequency
    longrope_start: Optional[int] = None  # scaling=longrope: LongRoPE's n^ (null: 0, every position scaled)
    # DroPE (Gelberg et al. 2025): the parent's encoding this fine-tune dropped (rope), its encoder now none
    dropped_encoder: Optional[str] = None


@dataclass
class Config:
    # the encoder's options: its own schema at compose time, a plain mapping (name, options) once typed
    encoder: Any = MISSING
    data: DataConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    model: ModelConfig = MISSING
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    # the task's keys: its own schema at compose time (schema/task/NAME), a plain mapping (name, options) once typed
    task: Any = field(default_factory=lambda: {"name": LM, "description": ""})
    # the experiment trackers a run reports to, tracker name -> its options (each tracker's own schema at compose time,
    # schema/logger/NAME, from its start()): none by default; logger=tensorboard, logger=[tensorboard,mlflow]
    logger: Any = field(default_factory=dict)
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
    scaling: str = "none"  # none | linear | ntk | dynamic_ntk | yarn | llama3 | longrope (what the encoding offers)
    scaling_factor: Optional[float] = None  # null: new train_len / parent's (dynamic_ntk: 1)
    longrope_factors: Optional[List[float]] = None  # scaling=longrope: one rescale factor per rotary frequency
    longrope_start: int = 0  # scaling=longrope: LongRoPE's n^, the first positions left unscaled (0 = none)
    longrope_file: Optional[str] = None  # scaling=longrope: a factors file posexp search wrote (factors and n^)
    train_len: Optional[int] = None  # the new training length; null: 4x the parent's
    # DroPE (Gelberg et al. 2025): drop a RoPE parent's positional encoding and recalibrate (encoder=none sets it)
    drope: bool = False
    allow_changed_encoder: bool = False  # go on although the parent's plugin encoder's source changed (a warning)
    data: Any = None  # null: the parent's corpus; naming one checks that it is the parent's
    logger: Any = None  # null: the parent's experiment trackers; logger=NAME chooses others (logger=none: none)
    train: TrainConfig = MISSING
    eval: EvalConfig = MISSING
    seed: int = 0  # seeds the fine-tuning data order (and any new table rows)
    device: str = "auto"  # auto | cpu | cuda | mps
    precision: str = "auto"  # auto | fp32 | bf16
    compile: bool = False
    cache: bool = False
    cache_dir: str = "outputs/cache"
    objective: Any = "longest"


@dataclass
class HFConfig:
    """``posexp eval hf:MODEL``: which pretrained transformers causal LM, and how it is loaded (:mod:`posexp.hf`)."""

    model: str = MISSING  # a local model folder or a Hub name (the command's hf:MODEL)
    revision: Optional[str] = None  # a Hub revision (branch, tag or commit); null = the cached default
    trust_remote_code: bool = False  # run the model's own code from its folder or the Hub (off: transformers' classes)
    device_map: Optional[str] = None  # auto: accelerate spreads the layers over the GPUs (and CPU); null: one device
    query_chunk: Optional[int] = None  # queries per forward over the key cache; null = the adapter's default
    bos: str = "auto"  # each window's first input is the BOS token: auto (as the tokenizer adds one) | true | false


@dataclass
class PretrainedConfig:
    """What ``posexp eval hf:MODEL`` reads (``configs/pretrained.yaml``): the model, the data it is measured on
    with its own tokenizer, and the ``eval`` group as a run's."""

    hf: HFConfig = field(default_factory=HFConfig)
    data: DataConfig = MISSING
    eval: EvalConfig = MISSING
    task: PretrainedTaskConfig = field(default_factory=PretrainedTaskConfig)  # lm: perplexity; passkey (task.name)
    train_len: Optional[int] = None  # the model's original context length; null = what its config says
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | mps
    precision: str = "auto"  # auto | fp32 | bf16 (auto: the weights' own dtype where the device computes it)


PRECISIONS = ("auto", "fp32", "bf16")
PARALLEL = ("ddp", "fsdp")  # train.parallel


DEVICES = ("auto", "cpu", "cuda", "mps")


PROTOCOLS = ("nonoverlap", "sliding", "last_k")


DATASETS = ("stdlib", "text", "hf")  # data.kind: the loaders


OBJECTIVES = ("longest", "mean")  # objective: besides an eval length in tokens


def eval_lengths(cfg: Config) -> list[int]:
    """``eval.lengths`` if given, else ``eval.multiples`` times ``train_len``; sorted, unique."""
    return lengths_of(cfg.eval, int(cfg.train_len))


def lengths_of(e: EvalConfig, train_len: int) -> list[int]:
    """The lengths an ``eval`` group measures for a run trained at ``train_len`` (see :func:`eval_lengths`)."""
    if e.lengths is not None:
        return sorted(set(int(n) for n in e.lengths))
    return sorted(set(int(m) * int(train_len) for m in e.multiples))


def curve_lengths(cfg: Config) -> list[int]:
    """The lengths ``eval.during_training`` measures: its multiples times ``train_len``, sorted, unique."""
    return sorted(set(int(m) * int(cfg.train_len) for m in cfg.eval.during_training.multiples))


def is_task(cfg: Config) -> bool:
    """Whether a run trains on a generated task (measured by accuracy) rather than language modelling."""
    return str(cfg.task["name"]) != LM


def default_max_position(train_len: int, longest_eval: int) -> int:
    """``train.max_position`` when unset: every position training or evaluation reads (Ruoss et al. 2023 draw
    training positions from a range that covers the longest evaluated length)."""
    return max(int(train_len), int(longest_eval))
