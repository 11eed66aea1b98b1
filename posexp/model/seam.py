"""posexp's own model behind the model seam (:class:`posexp.model.interface.EvaluableLM`).

:class:`OwnModelSeam` is mixed into :class:`~posexp.model.gpt.GPT`: a reading swaps the trained encoder for its
scaled copy (:func:`posexp.encoders.extension.scaled_encoder`, sharing the trained parameters) and sets the
attention window, and puts both back afterwards; out of memory, it halves the query block of the blocked
attention path.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from torch import Tensor

from posexp.encoders.extension import check_scaling, scaled_encoder
from posexp.model.interface import Reading

MIN_ATTN_BLOCK = 16  # the query block is not halved below this on out-of-memory


class OwnModelSeam:
    """The :class:`~posexp.model.interface.EvaluableLM` methods of :class:`~posexp.model.gpt.GPT`, read from its
    ``encoder``, ``attention_window``, ``shape`` and ``blocks``."""

    encoder: Any
    attention_window: Any
    shape: Any
    blocks: Any

    @property
    def label(self) -> str:
        return self.encoder.label

    @property
    def max_length(self) -> Optional[int]:
        return self.encoder.max_length

    def check_scaling(self, kind: str) -> Optional[str]:
        """A scaling this run's encoding does not offer is the user's error (:func:`check_scaling` raises)."""
        check_scaling(kind, self.encoder.name, self.encoder)
        return None

    def _scaled(self, how: Reading):
        return scaled_encoder(self.encoder, how.scaling, how.factor, how.train_len,
                              None if how.longrope_factors is None else list(how.longrope_factors),
                              how.longrope_start, how.remap)

    @contextlib.contextmanager
    def reading(self, how: Reading) -> Iterator[None]:
        saved = self.encoder, self.attention_window, self.shape.attn_block_size
        scaled = self._scaled(how)
        try:
            if scaled is not saved[0]:
                self.encoder = scaled
            self.attention_window = how.window
            yield
        finally:
            self.encoder, self.attention_window, self.shape.attn_block_size = saved

    def length_refusal(self, how: Reading, length: int) -> Optional[str]:
        scaled = self._scaled(how)
        depth = getattr(scaled, "depth_refusal", None)  # a position remapping that would remap no layer
        if depth is not None and depth(len(self.blocks)) is not None:
            return depth(len(self.blocks))
        if scaled.supports(length):
            return None
        by = f" with {how.scaling} scaling by {how.factor:g}" if how.scaling != "none" else ""
        return f"encoder {self.encoder.name!r}{by} represents at most {scaled.max_length} positions"

    def logits(self, idx: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        return self(idx, pos)  # type: ignore[operator]  # an nn.Module

    def _blocked(self) -> bool:
        """Whether some layer attends on the blocked path, whose query blocks can shrink: a bias or scores, or a
        window (``eval.window``, or a layer's own, as irope's RoPE layers)."""
        enc = self.encoder
        own = any(e.layer_window is not None for e in enc.for_layers(len(self.blocks)))
        return (enc.uses_bias or enc.uses_scores or enc.explicit_attention or enc.uses_attend
                or self.attention_window is not None or own)

    def shrink(self) -> Optional[str]:
        if not self._blocked() or self.shape.attn_block_size <= MIN_ATTN_BLOCK:
            return None
        self.shape.attn_block_size //= 2
        return f"query blocks of {self.shape.attn_block_size}"

    def memory_settings(self) -> dict:
        return {"attn_block_size": self.shape.attn_block_size}


__all__ = ["MIN_ATTN_BLOCK", "OwnModelSeam"]
