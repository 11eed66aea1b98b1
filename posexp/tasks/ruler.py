"""What RULER's tasks here share: a haystack of repeated filler, pieces woven into it, distinct symbols drawn per
instance, and the order words first appear in.

Hsieh et al. 2024 ("RULER: What's the Real Context Size of Your Long-Context Language Models?", §3) hide what a
question needs in "noise": the same few sentences repeated ("The grass is green. The sky is blue. ..."). Here the
tasks are symbolic, as ``mqar`` is: the noise is a cycle of :data:`FILLER_PERIOD` filler tokens repeated, read from
a random phase, so that a haystack carries no information and a model may learn to skip it, as in RULER.
"""

from __future__ import annotations

import numpy as np

FILLER_PERIOD = 8  # distinct filler tokens, repeated: the symbolic "The grass is green. The sky is blue. ..."


def filler(count: int, size: int, first: int, rng: np.random.Generator) -> np.ndarray:
    """``(count, size)`` filler: tokens ``first .. first + FILLER_PERIOD - 1`` in a cycle, from a random phase."""
    phase = rng.integers(0, FILLER_PERIOD, size=(count, 1))
    return first + (phase + np.arange(size)[None, :]) % FILLER_PERIOD


def weave(haystack: np.ndarray, pieces: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Pieces inserted into a haystack: piece ``j`` of row ``i`` goes right before haystack token ``at[i, j]``
    (``at = size``: after all of it); pieces at the same place keep their order.

    Args:
        haystack: ``(count, size)`` tokens.
        pieces: ``(count, m, w)`` tokens, ``m`` pieces of ``w`` tokens per row.
        at: ``(count, m)`` places in ``0 .. size``.

    Returns:
        ``(count, size + m * w)`` tokens.
    """
    count, size = haystack.shape
    m, w = pieces.shape[1], pieces.shape[2]
    order = np.argsort(at, axis=1, kind="stable")
    at = np.take_along_axis(at, order, axis=1)
    pieces = np.take_along_axis(pieces, order[:, :, None], axis=1)
    out = np.empty((count, size + m * w), dtype=np.int64)
    rows = np.arange(count)[:, None]
    # a haystack token moves right by the pieces placed at or before it; piece k (in order) by the k before it
    before = (at[:, None, :] <= np.arange(size)[None, :, None]).sum(axis=2)  # (count, size)
    out[rows, np.arange(size)[None, :] + w * before] = haystack
    starts = at + w * np.arange(m)[None, :]  # (count, m)
    out[rows[:, :, None], starts[:, :, None] + np.arange(w)[None, None, :]] = pieces
    return out


def distinct(count: int, k: int, symbols: int, rng: np.random.Generator) -> np.ndarray:
    """``(count, k)`` symbols ``0 .. symbols - 1``, distinct within a row, in a random order."""
    return np.argsort(rng.random((count, symbols)), axis=1)[:, :k].astype(np.int64)


def first_appearance(row: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """``chosen`` (tokens that occur in ``row``) in the order they first appear in ``row``."""
    tokens, first = np.unique(row, return_index=True)
    where = dict(zip(tokens.tolist(), first.tolist()))
    return np.array(sorted((int(c) for c in chosen), key=where.__getitem__), dtype=np.int64)
