"""Learned absolute position embeddings.

One trained vector per position, added to the token embedding: Gehring et al.
2017, "Convolutional Sequence to Sequence Learning", §3.1, and GPT-2 (Radford
et al. 2019, "Language Models are Unsupervised Multitask Learners"). Positions
past the table were never seen, so the encoding cannot represent them at all.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from posexp.encoders import register
from posexp.encoders.contract import PositionalEncoder, check_position_range
from posexp.encoders.scaling import module_copy
from posexp.errors import ConfigError, require


@register("learned")
class Learned(PositionalEncoder):
    """A trained table of ``max_length`` position vectors added to the token embeddings.

    Args:
        d_model: model width.
        n_heads: attention heads (unused).
        max_length: rows in the table, the longest sequence it can encode; > 0.
            The configs set it to the training length, since rows beyond it
            would never receive a gradient.
    """

    context_parallel = True  # a shard's logits follow from its queries' and keys' absolute positions
    description = "Learned: a trained vector per position up to max_length (GPT-2; Gehring et al. 2017)"
    # evaluation-time context extension: position interpolation (posexp/encoders/scaling.py)
    supported_scalings = ("linear",)
    position_scale = 1.0  # positions are multiplied by this; 1 / s on a scaled copy

    def __init__(self, d_model: int, n_heads: int, max_length: int = 1024):
        super().__init__(d_model, n_heads)
        require(max_length > 0, "encoder.max_length", f"must be a positive integer (got {max_length})")
        self.max_length = int(max_length)
        self.wpe = nn.Embedding(self.max_length, d_model)
        # GPT-2's initialisation; the model leaves encoder parameters to the encoder
        nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)

    def with_scaling(self, kind: str, factor: float, train_len: int) -> "Learned":
        """A copy that reads position ``m`` as ``m / factor`` between table rows (position interpolation).

        Chen et al. 2023, §2.3, ``f'(x, m) = f(x, m L / L')``, applied to a table: the
        vector at fractional position ``p = m / s`` is the linear interpolation of rows
        ``floor(p)`` and ``floor(p) + 1``. The copy covers ``s * max_length`` positions;
        the last ``s - 1`` of them fall past the last row by less than one and take it.

        Args:
            kind: ``linear``, the only method for a learned table.
            factor: ``s >= 1``.
            train_len: the training context length (unused: the table's size is what counts).
        """
        clone = module_copy(self)
        clone.position_scale = 1.0 / float(factor)
        clone.max_length = int(self.max_length * float(factor) + 1e-9)  # positions m with m / s < max_length
        return clone

    def extended(self, kind: str, factor: float, train_len: int, new_len: int,
                 factors: Optional[Sequence[float]] = None, start: int = 0) -> "Learned":
        """A table of ``new_len`` rows for fine-tuning at ``new_len`` tokens, starting from this one.

        ``linear``: row ``m`` is this table read at ``m / s`` (:meth:`with_scaling`'s interpolation, so the
        fine-tune starts from exactly what evaluation-time interpolation reads): the 1-D form of the resize
        ViT and DeiT apply to a trained position table at a new resolution (Dosovitskiy et al. 2021, §3.2;
        Touvron et al. 2021, §3, who interpolate bicubically in 2-D), with position interpolation's
        ``m L / L'`` (Chen et al. 2023, §2.3). ``none``: the trained rows are kept and new rows are added,
        initialised as the table was (GPT-2's N(0, 0.02)); they learn from zero during fine-tuning.

        Raises:
            ConfigError: a factor too small for the table to cover ``new_len`` positions.
        """
        rows = max(new_len, self.max_length)
        table = Learned(self.d_model, self.n_heads, max_length=rows)  # new rows drawn as at initialisation
        table.name, table.lr_mult = self.name, self.lr_mult
        with torch.no_grad():
            if kind == "none":
                table.wpe.weight[:self.max_length] = self.wpe.weight
                return table
            scaled = self.with_scaling(kind, factor, train_len)
            if scaled.max_length < new_len:
                raise ConfigError("scaling_factor", f"{factor:g} stretches the {self.max_length} trained rows over "
                                                    f"{scaled.max_length} positions, fewer than train_len={new_len}; "
                                                    f"use at least {new_len / self.max_length:g} (or leave it unset)")
            table.wpe.weight.copy_(scaled._interpolated(torch.arange(rows)))
        return table

    def _interpolated(self, pos: Tensor) -> Tensor:
        table = self.wpe.weight  # (max_rows, D)
        rows = table.shape[0]
        p = (pos.to(torch.float64) * self.position_scale).clamp(0, rows - 1)  # (L,)
        lo = p.floor().long()
        hi = (lo + 1).clamp(max=rows - 1)
        w = (p - lo.to(torch.float64)).to(table.dtype)[:, None]  # (L, 1)
        return table[lo] * (1 - w) + table[hi] * w  # (L, D)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        if self.position_scale != 1.0:
            check_position_range(pos, self.max_length, "interpolated learned positions cover")
            return x + self._interpolated(pos).to(x.dtype)
        # nn.Embedding would fail with a bare index error; say which limit was hit instead
        check_position_range(pos, self.max_length, "learned position embeddings cover")
        return x + self.wpe(pos).to(x.dtype)
