"""The precision a training run computes in: ``precision=auto`` measured on the run's own model where it matters.

:func:`posexp.runtime.choose_precision` decides; this module hands it a probe of the
run's training step (forward, fp32 cross-entropy, backward of the model being trained,
at its widths and at the run's ``batch x train_len`` up to :data:`PROBE_TOKENS` tokens),
the workload the probe stands for (the cache key) and the machine's cache folder.
Only ``auto`` on a CPU with native bf16 matmuls runs the probe; it leaves the weights,
their gradients and every RNG state as it found them, so a run's numbers do not depend
on whether its choice was measured now or read from the cache.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch

from posexp.config import TrainConfig
from posexp.data.tokens import cache_root
from posexp.model import GPT
from posexp.runtime import PrecisionChoice, autocast, choose_precision
from posexp.training import distributed

# train.log's logger, as the trainer's
log = logging.getLogger("posexp.train")

__all__ = ["PROBE_TOKENS", "probe_workload", "training_precision"]

# tokens per probe step: the run's batch up to this many (enough rows that every matmul has the run's widths
# and a realistic row count; a large batch would only make the probe longer)
PROBE_TOKENS = 8192


def probe_workload(model: GPT, rows: int, length: int) -> dict:
    """What the probe computes: the model's shape and encoder, and the probe batch ``rows x length``."""
    s = model.shape
    return {"encoder": model.encoder.label, "d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads,
            "mlp_ratio": s.mlp_ratio, "vocab": s.vocab_size, "attn_block_size": s.attn_block_size,
            "rows": rows, "length": length}


def training_precision(model: GPT, t: TrainConfig, train_len: int, device: torch.device,
                       saved: Optional[str] = None, cache_dir: Optional[Path] = None) -> PrecisionChoice:
    """The precision of ``model``'s training under the settings ``t``.

    Args:
        model: the model about to train, on ``device``, in training mode.
        t: ``train.precision`` and ``train.batch_size`` are read.
        train_len: the training context length.
        saved: the dtype name a resumed run's earlier sessions trained in: ``auto`` keeps it, so a resumed
            run computes what an uninterrupted one would.
        cache_dir: where measured choices are kept (default: the machine's posexp cache, ``$POSEXP_CACHE``).
    """
    if saved and t.precision == "auto":
        log.info("precision %s (auto): kept from the run's first session", saved)
        return PrecisionChoice(getattr(torch, saved), "auto", f"{saved}, the choice this run made when it started "
                                                              "(resumed from its checkpoint)")
    rows = max(1, min(t.batch_size, PROBE_TOKENS // max(1, train_len)))
    length = min(train_len, PROBE_TOKENS)
    idx = torch.randint(0, model.shape.vocab_size, (rows, length + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)

    def probe(dtype: torch.dtype) -> None:
        with autocast(device, dtype):
            loss = model.token_losses(idx[:, :-1], idx[:, 1:]).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    choice = choose_precision(t.precision, device, probe, probe_workload(model, rows, length),
                              cache_root(None) if cache_dir is None else cache_dir)
    # under torchrun every rank computes in rank 0's choice (one process: the choice as it is)
    dtype_name, reason, probed = distributed.broadcast((choice.name, choice.reason, choice.probe))
    log.info("precision %s (%s): %s", dtype_name, choice.asked, reason)
    return PrecisionChoice(getattr(torch, dtype_name), choice.asked, reason, probed)
