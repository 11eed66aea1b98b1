"""Perplexity at several context lengths on the validation split.

Protocol ``nonoverlap``: the validation tokens are cut into consecutive windows
of ``L + 1`` tokens that share one token at their boundary; every one of the
``L`` targets of a window is scored, so the first targets of a window see
little context. The same number of target tokens (the first ``budget`` of the
split, ``budget`` a multiple of the longest length) is scored at every length,
so lengths differ only in how much context each token gets.
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Optional

import numpy as np
import torch

from posexp.model import GPT

Z95 = 1.959964  # two-sided 95% normal quantile


def eval_budget(requested: int, val_tokens: int, longest: int) -> int:
    """Target tokens scored at every length: at most ``requested``, a multiple of ``longest``, within the split."""
    usable = (val_tokens - 1) // longest * longest
    return max(longest, min(requested // longest * longest, usable))


def _peak_memory_mb(device: torch.device) -> Optional[float]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None


@torch.inference_mode()
def evaluate_length(model: GPT, val: np.ndarray, length: int, budget: int, batch_tokens: int,
                    device: torch.device) -> dict:
    """One row: perplexity of ``budget`` target tokens scored in non-overlapping windows of ``length``."""
    n_windows = budget // length
    starts = np.arange(n_windows) * length
    offsets = np.arange(length + 1)
    per_batch = max(1, batch_tokens // length)
    window_losses = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for i in range(0, n_windows, per_batch):
        idx = starts[i:i + per_batch, None] + offsets[None, :]
        batch = torch.from_numpy(val[idx].astype("int64")).to(device)  # (b, L + 1)
        losses = model.token_losses(batch[:, :-1], batch[:, 1:])  # (b, L) nats, fp32
        window_losses.append(losses.double().mean(dim=1).cpu())
    elapsed = time.perf_counter() - t0
    wl = torch.cat(window_losses).numpy()
    loss = float(wl.mean())  # equal-size windows: mean of means = mean over tokens
    se = float(wl.std(ddof=1) / math.sqrt(wl.size)) if wl.size > 1 else None
    row = {
        "ppl": math.exp(loss),
        "loss": loss,
        "loss_se": se,
        "ppl_low": math.exp(loss - Z95 * se) if se is not None else None,
        "ppl_high": math.exp(loss + Z95 * se) if se is not None else None,
        "tokens": int(n_windows * length),
        "windows": int(n_windows),
        "tokens_per_s": n_windows * length / elapsed if elapsed > 0 else None,
        "peak_mem_mb": _peak_memory_mb(device),
        "eval_s": elapsed,
    }
    return row


def evaluate(model: GPT, val: np.ndarray, lengths: Iterable[int], train_len: int, tokens: int,
             batch_tokens: int, device: torch.device, protocol: str = "nonoverlap",
             on_row=None) -> list[dict]:
    """Rows, one per length, in the ``results.json`` row format.

    Lengths the encoder cannot represent (``encoder.supports(L)`` false, e.g. a
    learned table shorter than ``L``) get ``applicable: false`` and ``ppl: null``.
    """
    lengths = sorted(set(int(n) for n in lengths))
    budget = eval_budget(tokens, int(val.size), max(lengths))
    model.eval()
    rows = []
    for length in lengths:
        row = {"length": length, "multiple": length / train_len, "protocol": protocol, "scaling": None,
               "applicable": model.encoder.supports(length)}
        if row["applicable"]:
            row.update(evaluate_length(model, val, length, budget, batch_tokens, device))
        else:
            row.update({"ppl": None, "loss": None, "loss_se": None, "ppl_low": None, "ppl_high": None,
                        "tokens": 0, "windows": 0, "tokens_per_s": None, "peak_mem_mb": None, "eval_s": 0.0,
                        "reason": f"encoder {model.encoder.name!r} represents at most "
                                  f"{model.encoder.max_length} positions"})
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
