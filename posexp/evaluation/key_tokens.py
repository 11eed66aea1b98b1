"""Key-token perplexity: LongPPL (Fang et al. 2024, "What is wrong with perplexity for long-context language
modeling?", ICLR 2025; the authors' code ``LongPPL/longppl.py``).

Most tokens of a text can be predicted from the few tokens before them, so perplexity over every token barely
moves when a model stops using its far context. LongPPL scores only the *key tokens*: the targets an evaluator
model predicts much better with the long context than with a short one. For target ``x_i`` with long context
``l_i`` and short context ``s_i`` (its last ``K`` tokens), under the evaluator ``theta``:

    LSD(x_i) = log p(x_i | l_i) - log p(x_i | s_i)          (long-short difference, Eq. 2)
    LCL(x_i) = log p(x_i | l_i)                              (long-context likelihood, Eq. 3)
    key(x_i) = LSD(x_i) > alpha  and  LCL(x_i) > beta        (alpha = 2, beta = -2 in the paper and code)
    LongPPL  = exp(mean over key tokens of -log p_model(x_i | l_i))                      (Eq. 4)

In posexp a row's long context is what the row's protocol gives each scored target (a ``nonoverlap`` target at
window position ``q`` reads ``q + 1`` tokens), and the evaluator reads the same windows. The short context follows
the authors' code: windows of ``K + S - 1`` tokens aligned to the long window's start, each scoring its last
``S`` targets, so a short context holds ``K .. K + S - 1`` tokens (``S = 1``: exactly ``K``, Eq. 2 as written);
a target whose long context is shorter than ``K + S`` reads the same tokens both ways and is never key. The paper
takes ``K = 4096`` for models trained at 4K and read at up to 32K, and ``S = 1024``; posexp's default is ``K`` =
the evaluated model's training length and ``S = K / 4`` (``eval.key_tokens.short_len`` / ``short_stride``).

The selection depends only on the tokens, the windows, the evaluator and the rule, and is cached under those
(:class:`KeySelector`), so every compared model is scored on the same targets and a second evaluation reads it
back without running the evaluator. ``ppl_key``'s interval is ``ppl``'s: the batch-means standard error over
blocks of ``L`` consecutive scored targets, as a ratio estimator of key-token loss per key token.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from posexp.evaluation.perplexity import Z95, EvalHooks, Windows, _exp, _forward_losses, _Pass, _run_windows
from posexp.model.interface import NO_SCALING, EvaluableLM, Reading
from posexp.runs.atomic import atomic_write_bytes
from posexp.runtime.device import autocast

SHORT_STRIDE_DIVISOR = 4  # the authors' code: trunc_len 4096, internal 1024
CACHE_FORMAT = 1


# -- the rule ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """The paper's thresholds (``alpha`` on LSD, ``beta`` on LCL, nats) and the short context ``K`` with ``S``."""

    alpha: float
    beta: float
    short_len: int
    short_stride: int

    def record(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "short_len": self.short_len, "short_stride": self.short_stride}


def is_key(loss_long: np.ndarray, loss_short: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """LSD > alpha and LCL > beta (Fang et al. 2024, Eqs. 2-3), from the evaluator's losses (nats) of the same
    targets with the long and the short context."""
    lsd = loss_short - loss_long  # log p(long) - log p(short)
    lcl = -loss_long  # log p(long)
    return (lsd > alpha) & (lcl > beta)


def target_contexts(win: Windows, length: int) -> np.ndarray:
    """The long context (tokens read) of each scored target ``win.first .. win.last``: a window scoring its last
    ``k`` targets gives them ``length - k + 1 .. length`` tokens."""
    ctx = np.zeros(win.last - win.first + 1, dtype=np.int64)
    for start, k in zip(win.starts.tolist(), win.scored.tolist()):
        first = start + 1 + length - k
        ctx[first - win.first:first - win.first + k] = np.arange(length - k + 1, length + 1)
    return ctx


def short_contexts(ctx: np.ndarray, short_len: int, stride: int) -> np.ndarray:
    """The short context of each target (the authors' windows: ``K .. K + S - 1`` tokens, aligned to the long
    window's start); 0 where the long context is under ``K + S`` and the short window would read the same."""
    out = short_len + (ctx - short_len) % stride
    return np.where(ctx >= short_len + stride, out, 0)


# -- the evaluator -----------------------------------------------------------------------------------

@dataclass
class OpenedEvaluator:
    """An evaluator model ready to read: the model, the length it was trained at, how it reads positions
    (:class:`posexp.model.positions.PositionPlan`, None = contiguous) and its autocast dtype."""

    model: EvaluableLM
    train_len: int
    position_plan: Any = None
    dtype: torch.dtype = torch.float32


@dataclass
class Evaluator:
    """The model named by ``eval.key_tokens.evaluator``, opened only when a selection is not cached.

    Attributes:
        label: as the user named it (a run folder, ``hf:NAME``).
        identity: what the cache key holds: a run's config hash and weights' SHA-256, a model's id and revision.
        tokens: which tokens it reads (the tokenizer), checked against the evaluated model's before anything runs.
        opener: loads the model.
    """

    label: str
    identity: str
    tokens: str
    opener: Callable[[], OpenedEvaluator]
    _opened: Optional[OpenedEvaluator] = field(default=None, repr=False)

    def open(self) -> OpenedEvaluator:
        if self._opened is None:
            self._opened = self.opener()
        return self._opened


# -- selecting, cached -------------------------------------------------------------------------------

def tokens_digest(val: np.ndarray) -> str:
    """16 hex digits of SHA-256 over the token ids (as int64, whatever the array's dtype)."""
    return hashlib.sha256(np.ascontiguousarray(val, dtype=np.int64).tobytes()).hexdigest()[:16]


class KeySelector:
    """Picks (or reads back) the key tokens of each row's windows and adds ``ppl_key`` to the row.

    Called by :func:`posexp.evaluation.perplexity.evaluate` as ``selector(length, windows, target_losses)`` after
    a length is measured; returns the fields for the row.

    Args:
        evaluator: the evaluator model.
        rule: the thresholds and the short context.
        val: the validation tokens (the evaluated model's, which the evaluator shares).
        cache_dir: where selections are kept (one ``.npz`` each, named by its key).
        device: where the evaluator runs.
        batch_tokens: forward tokens per batch.
        log: where a note goes when the evaluator runs.
    """

    def __init__(self, evaluator: Evaluator, rule: Rule, val: np.ndarray, cache_dir: Path, device: torch.device,
                 batch_tokens: int = 16384, log: Optional[Callable[[str], None]] = None):
        self.evaluator, self.rule, self.val, self.cache_dir = evaluator, rule, val, Path(cache_dir)
        self.device, self.batch_tokens, self.log = device, int(batch_tokens), log
        self.val_digest = tokens_digest(val)
        self.computed = 0  # selections the evaluator ran for (the rest were read from the cache)

    def cache_key(self, length: int, win: Windows) -> str:
        blob = json.dumps({"format": CACHE_FORMAT, "tokens": self.val_digest, "evaluator": self.evaluator.identity,
                           "rule": self.rule.record(), "length": int(length),
                           "windows": hashlib.sha256(np.ascontiguousarray(win.starts, dtype=np.int64).tobytes()
                                                     + b"|" + np.ascontiguousarray(win.scored, dtype=np.int64)
                                                     .tobytes()).hexdigest()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def select(self, length: int, win: Windows) -> tuple[Optional[np.ndarray], int, Optional[str]]:
        """``(key targets (absolute indices), candidates, reason)``: reason says why none could be picked."""
        path = self.cache_dir / f"{self.cache_key(length, win)}.npz"
        cached = _read(path)
        if cached is not None:
            return cached[0], cached[1], None
        opened = self.evaluator.open()
        why = opened.model.length_refusal(Reading(NO_SCALING, 1.0, opened.train_len, int(length)), int(length))
        if why is not None:
            return None, 0, f"the key-token evaluator {self.evaluator.label} cannot read {length} tokens: {why}"
        if self.log is not None:
            self.log(f"key tokens at length {length}: {self.evaluator.label} reads the long and short contexts")
        keys, candidates = self._pick(opened, length, win)
        self.computed += 1
        _write(path, keys, candidates, {"evaluator": self.evaluator.label, "identity": self.evaluator.identity,
                                        "length": int(length), **self.rule.record()})
        return keys, candidates, None

    @torch.inference_mode()
    def _pick(self, opened: OpenedEvaluator, length: int, win: Windows) -> tuple[np.ndarray, int]:
        ctx = target_contexts(win, length)
        cs = short_contexts(ctx, self.rule.short_len, self.rule.short_stride)
        candidates = np.flatnonzero(cs)
        targets = win.first + candidates
        model = opened.model
        model.eval()
        p = _Pass(model, self.val, self.batch_tokens, self.device, opened.position_plan, opened.dtype,
                  EvalHooks(memory=False))
        with model.reading(Reading(NO_SCALING, 1.0, opened.train_len, int(length))):
            pos = opened.position_plan.eval_positions(length) if opened.position_plan is not None else None
            with autocast(self.device, opened.dtype):
                long = _run_windows(p, win, length, pos).target_losses[candidates]
        short = self._short_losses(opened, targets, cs[candidates])
        return targets[is_key(long, short, self.rule.alpha, self.rule.beta)].astype(np.int64), int(candidates.size)

    def _short_losses(self, opened: OpenedEvaluator, targets: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """The evaluator's loss of each target with its short context: one window per start ``t - c_s``, as long
        as its last target needs (``K + S - 1`` tokens but at the end of a long window), batched by length."""
        out = np.full(targets.size, np.nan)
        starts = targets - cs
        groups: dict[int, np.ndarray] = {}
        for u in np.unique(starts).tolist():
            groups[u] = np.flatnonzero(starts == u)
        by_len: dict[int, list[int]] = {}
        for u, members in groups.items():
            by_len.setdefault(int(targets[members].max() - u), []).append(u)
        model = opened.model
        for n, us in sorted(by_len.items()):
            per_batch = max(1, self.batch_tokens // n)
            pos = opened.position_plan.eval_positions(n) if opened.position_plan is not None else None
            with model.reading(Reading(NO_SCALING, 1.0, opened.train_len, n)), autocast(self.device, opened.dtype):
                for i in range(0, len(us), per_batch):
                    chunk = np.asarray(us[i:i + per_batch], dtype=np.int64)
                    losses = _forward_losses(model, self.val, chunk, n, self.device, pos)  # (b, n)
                    for j, u in enumerate(chunk.tolist()):
                        members = groups[u]
                        out[members] = losses[j, targets[members] - u - 1]
        return out

    def __call__(self, length: int, win: Windows, target_losses: np.ndarray) -> dict:
        keys, candidates, reason = self.select(length, win)
        record = {"evaluator": self.evaluator.label, **self.rule.record(), "candidates": candidates}
        if keys is None:
            return {"key_reason": reason}
        return {**key_summary(target_losses, win.first, keys, length), "key_selection": record}


def _read(path: Path) -> Optional[tuple[np.ndarray, int]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return np.asarray(data["targets"], dtype=np.int64), int(data["candidates"])
    except (OSError, ValueError, KeyError):
        return None  # none yet, or damaged: picked again


def _write(path: Path, keys: np.ndarray, candidates: int, meta: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, targets=keys, candidates=np.int64(candidates), meta=np.array(json.dumps(meta, sort_keys=True)))
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError:
        pass  # a read-only cache only costs the evaluator's pass next time


# -- the row's numbers -------------------------------------------------------------------------------

def ratio_se(sums: np.ndarray, counts: np.ndarray) -> Optional[float]:
    """Standard error of ``sum(sums) / sum(counts)`` over blocks (a ratio estimator, as ``ppl``'s
    :func:`posexp.evaluation.perplexity.batch_means_se`): ``m/(m-1) * sum_b (s_b - R n_b)^2 / N^2``; None unless
    two blocks or more hold a count (with one, the estimate would be a spurious 0)."""
    m, total = sums.size, float(counts.sum())
    if m < 2 or int(np.count_nonzero(counts)) < 2:
        return None
    ratio = float(sums.sum()) / total
    return float(math.sqrt(m / (m - 1) * float(np.sum((sums - ratio * counts) ** 2)) / total ** 2))


def key_summary(target_losses: np.ndarray, first: int, keys: np.ndarray, block: int) -> dict:
    """``ppl_key`` (exp of the mean loss over the key targets), its 95% interval and ``key_tokens``, from the
    model's loss of every scored target (``first`` the index of ``target_losses[0]``); blocks of ``block``
    consecutive scored targets give the standard error, as for ``ppl``."""
    mask = np.zeros(target_losses.size, dtype=bool)
    inside = keys[(keys >= first) & (keys < first + target_losses.size)] - first
    mask[inside] = True
    n = int(mask.sum())
    if n == 0:
        return {"ppl_key": None, "ppl_key_low": None, "ppl_key_high": None, "loss_key": None, "loss_key_se": None,
                "key_tokens": 0}
    loss = float(target_losses[mask].mean())
    edges = np.arange(0, target_losses.size, block)
    sums = np.add.reduceat(np.where(mask, target_losses, 0.0), edges)
    counts = np.add.reduceat(mask.astype(np.float64), edges)
    se = ratio_se(sums, counts)
    return {"ppl_key": _exp(loss), "ppl_key_low": _exp(loss - Z95 * se) if se is not None else None,
            "ppl_key_high": _exp(loss + Z95 * se) if se is not None else None, "loss_key": loss, "loss_key_se": se,
            "key_tokens": n}


__all__ = ["Evaluator", "KeySelector", "OpenedEvaluator", "Rule", "is_key", "key_summary", "ratio_se",
           "short_contexts", "target_contexts", "tokens_digest"]
