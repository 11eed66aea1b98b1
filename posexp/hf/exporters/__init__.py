"""Exporters: a trained run as a transformers class, one file each, found through the one registry.

An :class:`Exporter` says which posexp encoder it takes (``encoder``), the transformers family it writes
(``target``), why it refuses a run of that encoder it cannot hold exactly (:meth:`Exporter.refusal`), and how the
weights go across (:meth:`Exporter.mapping`). Adding one is a module here with ``@EXPORTERS.register("model_type")``
(or an installed package's entry point in the group ``posexp.exporters``); :func:`posexp.hf.architectures.plan`
picks the one that takes a run's encoder, and names every exporter's encoder when none does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from posexp.errors import PosexpError
from posexp.model.gpt import GPT
from posexp.registry import Registry


@dataclass
class Mapping:
    """Which transformers class holds a run's model, and how its weights go across.

    Attributes:
        architecture: the transformers class, as config.json's ``architectures`` names it.
        description: one line for posexp_export.json and the command's output.
        config: the transformers config (a ``PretrainedConfig``).
        fill: copies posexp's weights into a model built from ``config``.
        max_length: the longest sequence the target reads (its config's ``n_positions``, ``max_seq_len`` or
            ``max_position_embeddings``), the tokenizer's ``model_max_length`` too.
    """

    architecture: str
    description: str
    config: Any
    fill: Callable[[Any, Any], None]
    max_length: int


class Exporter:
    """One transformers family a run's model maps onto exactly.

    Attributes:
        name: the transformers ``model_type`` (the registry's name).
        encoder: the posexp encoder it takes (``encoder=NAME``).
        target: the transformers family, for messages (``GPT-NeoX``).
    """

    name = ""
    encoder = ""
    target = ""

    def takes(self, model: GPT, encoder: str) -> bool:
        """Whether the run's model, of encoder ``encoder``, is one this exporter is for (its own encoder class, not a
        subclass of it that computes something else)."""
        from posexp.encoders import get

        return encoder == self.encoder and type(model.encoder) is get(self.encoder)

    def refusal(self, model: GPT) -> Optional[str]:
        """Why this run of the encoder cannot be held exactly (one line), or None when it can."""
        return None

    def mapping(self, model: GPT, reach: int) -> Mapping:
        """The transformers config and the weights' way across; ``reach``: the longest sequence it must read."""
        raise NotImplementedError


# Every exporter by its transformers model_type, found as encoders, tasks and trackers are (posexp.registry).
EXPORTERS: Registry[Exporter] = Registry("exporter", "encoder", __name__)


def hidden(model: GPT) -> int:
    """The MLP's width, ``int(mlp_ratio * d_model)``."""
    return int(model.shape.mlp_ratio * model.shape.d_model)


def norm(ln: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    """A LayerNorm's weight and bias (zeros for a norm trained without one)."""
    bias = ln.bias if ln.bias is not None else torch.zeros_like(ln.weight)
    return ln.weight, bias


def put(param: Tensor, value: Tensor) -> None:
    if param.shape != value.shape:
        raise PosexpError(f"internal: a weight of shape {tuple(value.shape)} met a parameter of shape "
                          f"{tuple(param.shape)}")
    param.copy_(value)


def zero_biases(target: nn.Module) -> None:
    """posexp's linear layers have no bias: any the target class has is zero."""
    for module in target.modules():
        bias = getattr(module, "bias", None)
        if not isinstance(module, nn.LayerNorm) and isinstance(bias, nn.Parameter):
            nn.init.zeros_(bias)


def common_config(model: GPT) -> dict:
    """Keys every target takes alike: no dropout, the tying of the output layer, the document separator as EOS
    (set by the caller), no BOS or padding."""
    return {"vocab_size": model.shape.vocab_size, "tie_word_embeddings": bool(model.shape.tie_embeddings),
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


__all__ = ["EXPORTERS", "Exporter", "Mapping", "common_config", "hidden", "norm", "put", "zero_biases"]
