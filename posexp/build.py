"""The one factory: a run's encoder and model from its config.

``posexp train``, ``posexp eval``, ``posexp resume``, the cache and ``posexp analyze``
all build through here, so an encoder's options are read one way everywhere.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from posexp.config import to_container
from posexp.encoders import PositionalEncoder, create
from posexp.model import GPT, ModelShape


def build_encoder(cfg: DictConfig) -> PositionalEncoder:
    """The encoder of ``cfg.encoder`` for the model of ``cfg.model``, bound to its layers.

    Raises:
        ConfigError: an unknown option, a value out of range, or options that do not go together.
    """
    options = {k: v for k, v in to_container(cfg.encoder).items() if k != "name"}
    encoder = create(cfg.encoder.name, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, **options)
    encoder.for_layers(int(cfg.model.n_layers))
    return encoder


def model_shape(cfg: DictConfig, vocab_size: int) -> ModelShape:
    """``cfg.model`` with the tokenizer's vocabulary size."""
    return ModelShape(vocab_size=vocab_size, **to_container(cfg.model))


def build_model(cfg: DictConfig, vocab_size: int) -> GPT:
    """The encoder from ``cfg.encoder`` inside a GPT of shape ``cfg.model``, initialised from ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    return GPT(model_shape(cfg, vocab_size), build_encoder(cfg))
