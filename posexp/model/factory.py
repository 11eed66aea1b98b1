"""The one factory: a run's encoder and model from its config.

``posexp train``, ``posexp finetune``, ``posexp eval``, ``posexp resume``, the cache and
``posexp analyze`` all build through here, so an encoder's options are read one way everywhere,
and a fine-tuned run's encoder is extended one way everywhere (:func:`extend_encoder`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from posexp.config.schema import Config
from posexp.encoders import PositionalEncoder, create, get
from posexp.encoders.plugins import MODULE_KEY, is_builtin
from posexp.registry import construct
from posexp.model.gpt import GPT, ModelShape


def build_encoder(cfg: Config) -> PositionalEncoder:
    """The encoder of ``cfg.encoder`` for the model of ``cfg.model``, bound to its layers.

    For a fine-tuned run this is the parent's encoder as the parent trained it; :func:`extend_encoder`
    turns it into the one the run trains.

    Raises:
        ConfigError: an unknown option, a value out of range, or options that do not go together; what a plugin
            encoder's own ``__init__`` raised, in one line.
    """
    name = cfg.encoder["name"]
    options = {k: v for k, v in cfg.encoder.items() if k != "name"}
    shape = {"d_model": cfg.model.d_model, "n_heads": cfg.model.n_heads}
    given = {k: v for k, v in options.items() if k not in (MODULE_KEY, "lr_mult")}
    encoder = construct(lambda: create(name, **shape, **options), lambda: None if is_builtin(get(name)) else get(name),
                        {**shape, **given}, f"encoder={name}")
    encoder.for_layers(int(cfg.model.n_layers))
    return encoder


def extend_encoder(encoder: PositionalEncoder, cfg: Config) -> PositionalEncoder:
    """A fine-tuned run's encoder: the parent's, extended from its training length to ``train_len`` by
    ``finetune.scaling`` (:meth:`~posexp.encoders.contract.PositionalEncoder.extended`); ``encoder`` itself for a
    run trained from scratch.

    Raises:
        ConfigError: the encoding cannot be extended that way.
    """
    ft = cfg.finetune
    if ft is None:
        return encoder
    start = int(getattr(ft, "longrope_start", None) or 0)  # LongRoPE's n^, passed on only when set
    extended = encoder.extended(str(ft.scaling), float(ft.scaling_factor), int(ft.parent_train_len),
                                int(cfg.train_len), ft.longrope_factors, **({"start": start} if start else {}))
    extended.for_layers(int(cfg.model.n_layers))
    return extended


def model_shape(cfg: Config, vocab_size: int) -> ModelShape:
    """``cfg.model`` with the tokenizer's vocabulary size."""
    return ModelShape(vocab_size=vocab_size, **dataclasses.asdict(cfg.model))


def build_model(cfg: Config, vocab_size: int, init: Optional[Callable[[GPT], None]] = None) -> GPT:
    """The encoder from ``cfg.encoder`` inside a GPT of shape ``cfg.model``, initialised from ``cfg.seed``.

    Args:
        init: called on the model before a fine-tuned run's encoder is extended (to load the parent's
            weights into the parent's shape: a learned table is then resized from the trained rows).
    """
    torch.manual_seed(cfg.seed)
    model = GPT(model_shape(cfg, vocab_size), build_encoder(cfg))
    if init is not None:
        init(model)
    model.encoder = extend_encoder(model.encoder, cfg)
    return model
