"""Perplexity at several context lengths on the validation split.

Every protocol reads windows of ``L`` input tokens ``val[s : s+L]`` and predicts
``val[s+1 : s+L+1]``; "target ``t``" below is the token ``val[t]``, predicted from
the tokens before it in its window. A window scores only its last ``n`` targets,
and every scored target is scored exactly once, so the scored targets are one
contiguous range of the split, recorded in each row as ``targets: [first, last]``.

``nonoverlap`` (default)
    Windows ``s = 0, L, 2L, ...`` (consecutive windows share one boundary token);
    every target is scored, so target ``t`` sees ``(t - 1) mod L + 1`` tokens of
    context. Scored: targets ``1 .. W*L`` with ``W = budget // L`` windows, where
    ``budget`` is ``eval.tokens`` rounded down to a multiple of the longest length
    (capped by the split): the same targets at every length that divides the
    longest one (the default multiples do).

``sliding`` (``eval.stride = S``; the sliding-window evaluation of Press et al. 2022)
    The first window (``s = 0``) scores all ``L`` targets; each next window moves
    ``S`` tokens on and scores only its last ``S`` targets, so every target after
    the first ``L`` sees at least ``L - S`` tokens of context (``L - 1`` for
    ``S = 1``). The last window is placed to end at the last target and scores
    the ``<= S`` targets not yet scored. Scored: targets ``1 .. budget``, the same
    as ``nonoverlap``, so the two protocols differ only in context.

``last_k`` (``eval.last_k = K``; the setting of Kazemnejad et al. 2023)
    Window ``j`` ends at target ``e_j`` and scores its last ``K`` targets; the ends
    ``e_j = T - (n-1-j) K`` are counted back from the last target ``T`` of the
    split, independently of ``L``. Scored: the last ``n*K`` targets of the split,
    ``n = eval.tokens // K`` (fewer if the longest length would not fit), the
    same targets at every length and in every call, with ``L - K`` to ``L - 1``
    tokens of context each. Costs ``L / K`` forward tokens per scored token.

Uncertainty: ``loss_se`` is the batch-means standard error of the mean loss over
blocks of ``L`` consecutive scored targets (a ratio estimator, so a shorter last
block counts less). For ``nonoverlap`` the blocks are exactly the windows; for
``sliding`` and ``last_k`` they are the same ``L``-target stretches of text, because
the ``S``- or ``K``-token pieces of neighbouring windows are adjacent text and far
from independent (``S = 1`` would otherwise claim one independent sample per
token). ``ppl_low``/``ppl_high`` are ``exp(loss -/+ 1.96 se)``.

Memory: posexp's model attends in blocks of queries for bias and score encodings
(:mod:`posexp.model.gpt`), a transformers model in chunks of queries over a key cache
(:mod:`posexp.hf.model`), so memory is linear in ``L``; on out-of-memory a length is
retried with half the windows per batch, then as the model shrinks itself
(``EvaluableLM.shrink``: half the query block), and the row records what it ran with
(``batch_windows``, the model's ``memory_settings``, e.g. ``attn_block_size``).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from posexp.config.schema import PROTOCOLS, EvalConfig, lengths_of
from posexp.errors import ConfigError, PosexpError, require
from posexp.runtime.memory import PeakMemory, bound_heap_growth, free_memory, is_out_of_memory
from posexp.encoders.extension import NONE, REMAPPINGS, REROPE, default_factor, default_rerope_window
from posexp.encoders.remapping import OPTION_KEYS, Remapping
from posexp.runs.longrope import longrope_settings, options_text
from posexp.runs.row import PERPLEXITY, ResultRow, position_key
from posexp.model.interface import EvaluableLM, Reading
from posexp.model.window import AttentionWindow, window_fields, window_of
from posexp.runtime.device import autocast

Z95 = 1.959964  # two-sided 95% normal quantile


# -- which targets each protocol scores ----------------------------------------------------

def check_protocol(protocol: str, stride: Optional[int], last_k: Optional[int], shortest: int) -> None:
    """``eval.protocol`` known, and ``eval.stride`` / ``eval.last_k`` set exactly when it uses them, within range."""
    require(protocol in PROTOCOLS, "eval.protocol",
            f"unknown protocol {protocol!r}; choose one of: {', '.join(PROTOCOLS)}")
    if protocol == "sliding":
        require(stride is not None, "eval.stride",
                f"protocol sliding needs a stride: eval.stride=S with 1 <= S <= {shortest} (the shortest eval "
                "length); S=1 is Press et al. 2022's setting, larger S is proportionally faster")
        require(1 <= stride <= shortest, "eval.stride",
                f"must be between 1 and the shortest eval length {shortest} (got {stride})")
    else:
        require(stride is None, "eval.stride",
                f"only applies to eval.protocol=sliding (protocol is {protocol}); drop it or set eval.protocol=sliding")
    if protocol == "last_k":
        require(last_k is not None, "eval.last_k",
                f"protocol last_k needs K: eval.last_k=K with 1 <= K <= {shortest} (the shortest eval length)")
        require(1 <= last_k <= shortest, "eval.last_k",
                f"must be between 1 and the shortest eval length {shortest} (got {last_k})")
    else:
        require(last_k is None, "eval.last_k",
                f"only applies to eval.protocol=last_k (protocol is {protocol}); drop it or set eval.protocol=last_k")


def eval_budget(requested: int, val_tokens: int, longest: int) -> int:
    """Target tokens scored at every length: at most ``requested``, a multiple of ``longest``, within the split."""
    usable = (val_tokens - 1) // longest * longest
    return max(longest, min(requested // longest * longest, usable))


@dataclass
class Windows:
    """The windows of one (protocol, length): window ``w`` reads ``val[starts[w] : starts[w] + L]``
    and scores its last ``scored[w]`` targets. Scored targets are ``first .. last`` (inclusive)."""

    starts: np.ndarray
    scored: np.ndarray
    first: int
    last: int

    @property
    def tokens(self) -> int:
        return int(self.scored.sum())


def plan_windows(protocol: str, length: int, val_tokens: int, budget: int, stride: Optional[int] = None,
                 last_k: Optional[int] = None, n_last: Optional[int] = None) -> Windows:
    """Window starts and scored counts for one length (see the module docstring for each protocol).

    Args:
        protocol: ``nonoverlap``, ``sliding`` or ``last_k``.
        length: window length ``L``.
        val_tokens: size of the validation split.
        budget: scored targets for ``nonoverlap`` / ``sliding`` (targets ``1 .. budget``).
        stride: ``S`` for ``sliding``.
        last_k: ``K`` for ``last_k``.
        n_last: number of ``last_k`` windows (shared by all lengths of a call).
    """
    L = length
    if protocol == "nonoverlap":
        n = budget // L
        return Windows(np.arange(n, dtype=np.int64) * L, np.full(n, L, dtype=np.int64), 1, n * L)
    if protocol == "sliding":
        # window w ends at target min(L + w*S, budget): its last target index
        n = 1 + -(-(budget - L) // stride)  # ceil
        ends = np.minimum(L + np.arange(n, dtype=np.int64) * stride, budget)
        scored = np.diff(ends, prepend=0)  # first window: L; then S; the last one the remainder
        return Windows(ends - L, scored, 1, budget)
    if protocol == "last_k":
        last_target = val_tokens - 1
        ends = last_target - (n_last - 1 - np.arange(n_last, dtype=np.int64)) * last_k
        return Windows(ends - L, np.full(n_last, last_k, dtype=np.int64), int(ends[0]) - last_k + 1, last_target)
    raise ConfigError("eval.protocol", f"unknown protocol {protocol!r}")


def last_k_windows(tokens: int, last_k: int, val_tokens: int, longest: int) -> int:
    """Windows of a ``last_k`` evaluation: ``tokens // K``, fewer if the first would start before the split."""
    fits = (val_tokens - 1 - longest) // last_k + 1  # first window start e_0 - L >= 0
    return max(1, min(tokens // last_k, fits))


# -- uncertainty ---------------------------------------------------------------------------

def batch_means_se(target_losses: np.ndarray, block: int) -> tuple[Optional[float], int]:
    """Standard error of the mean of ``target_losses`` over consecutive blocks of ``block`` values.

    A ratio estimator, ``se^2 = m/(m-1) * sum_b n_b^2 (mean_b - mean)^2 / N^2``, so a
    shorter last block counts in proportion to its size; with equal blocks it is
    the usual ``std(block means, ddof=1) / sqrt(m)``.

    Returns:
        ``(se, m)``; ``se`` is None with fewer than two blocks.
    """
    n_total = target_losses.size
    m = -(-n_total // block)
    if m < 2:
        return None, m
    edges = np.arange(0, n_total, block)
    sums = np.add.reduceat(target_losses, edges)
    counts = np.diff(np.append(edges, n_total)).astype(np.float64)
    mean = sums.sum() / n_total
    var = m / (m - 1) * np.sum((sums - mean * counts) ** 2) / n_total**2
    return float(math.sqrt(var)), m


# -- the evaluation loop -------------------------------------------------------------------

@dataclass
class LengthResult:
    """Per-target and per-position losses of one length, before they become a row."""

    target_losses: np.ndarray
    position_sum: np.ndarray
    position_count: np.ndarray
    batch_windows: int
    memory: dict  # how the model's forward passes ran (EvaluableLM.memory_settings: attn_block_size, ...)
    retries: int = 0


def _forward_losses(model: EvaluableLM, val: np.ndarray, starts: np.ndarray, length: int,
                    device: torch.device, pos: Optional[np.ndarray] = None) -> np.ndarray:
    idx = starts[:, None] + np.arange(length + 1)[None, :]
    batch = torch.from_numpy(val[idx].astype("int64")).to(device)  # (b, L + 1)
    pos_t = None if pos is None else torch.from_numpy(pos).to(device)  # None = 0 .. L-1
    losses = model.token_losses(batch[:, :-1], batch[:, 1:], pos_t)  # (b, L) nats, fp32
    return losses.double().cpu().numpy()


def _run_windows(p: "_Pass", win: Windows, length: int, pos: Optional[np.ndarray] = None) -> LengthResult:
    """The forward passes of one length's windows, in batches of the pass's ``batch_tokens``, halved (then the model
    shrunk) on out-of-memory; each scored target's loss and the losses by position."""
    model, val, device, log, progress = p.model, p.val, p.device, p.log, p.hooks.progress
    L = length
    target_losses = np.full(win.last - win.first + 1, np.nan)
    position_sum = np.zeros(L)
    position_count = np.zeros(L, dtype=np.int64)
    per_batch = max(1, p.batch_tokens // L)
    retries = 0
    i = 0
    n = win.starts.size
    if progress is not None:
        progress(L, 0, n)
    while i < n:
        chunk = win.starts[i:i + per_batch]
        try:
            losses = _forward_losses(model, val, chunk, L, device, pos)  # (b, L)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            if not is_out_of_memory(e):
                raise
            del e
            free_memory(device)
            retries += 1
            if per_batch > 1:
                per_batch //= 2
                log(f"out of memory at length {L}: retrying with {per_batch} window(s) per batch")
                continue
            smaller = model.shrink()
            if smaller is None:
                settings = ", ".join(f"{k} {v}" for k, v in model.memory_settings().items())
                raise PosexpError(
                    f"out of memory evaluating length {L} even with one window per batch"
                    f"{f' ({settings})' if settings else ''}; "
                    f"evaluate shorter eval.lengths or use a device with more memory") from None
            log(f"out of memory at length {L}: retrying with {smaller}")
            continue
        for j, start in enumerate(chunk):
            k = int(win.scored[i + j])
            first = int(start) + 1 + L - k  # target index of the first scored target of this window
            target_losses[first - win.first:first - win.first + k] = losses[j, L - k:]
            position_sum[L - k:] += losses[j, L - k:]
            position_count[L - k:] += 1
        i += chunk.size
        if progress is not None:
            progress(L, i, n)
    return LengthResult(target_losses, position_sum, position_count, per_batch, model.memory_settings(), retries)


def _not_applicable_row(reason: str) -> dict:
    return {"applicable": False, "ppl": None, "loss": None, "loss_se": None, "ppl_low": None, "ppl_high": None,
            "se_blocks": 0, "tokens": 0, "targets": None, "windows": 0, "forward_tokens": 0, "tokens_per_s": None,
            "peak_mem_mb": None, "peak_rss_mb": None, "eval_s": 0.0, "reason": reason}


def _length_factor(scaling: str, length: int, train_len: int, scaling_factor: Optional[float],
                   rerope_window: Optional[int]) -> Optional[float]:
    """The ``scaling_factor`` of a length's row: None unscaled, else the one number the method is run with."""
    if scaling == NONE:
        return None
    if scaling == REROPE:
        # one window at every length (Su 2023); the row keeps it as the method's number
        return float(rerope_window if rerope_window is not None else default_rerope_window(train_len))
    if scaling_factor is not None:
        return float(scaling_factor)
    return 1.0 if scaling == "dynamic_ntk" else default_factor(length, train_len)


def _row_identity(e: EvalConfig, how: Reading, factor: Optional[float]) -> dict:
    """How a row is measured (:class:`posexp.runs.row.ResultRow`'s key and settings: its length, protocol,
    scaling, window and the token budget asked for); a row without a window has no ``window`` / ``sinks``."""
    return ResultRow(metric=PERPLEXITY, length=how.length, multiple=how.length / how.train_len, protocol=e.protocol,
                     stride=e.stride if e.protocol == "sliding" else None,
                     last_k=e.last_k if e.protocol == "last_k" else None,
                     scaling=None if how.scaling == NONE else how.scaling, scaling_factor=factor,
                     scaling_options=how.options,
                     eval_tokens=int(e.tokens), **window_fields(how.window)).to_dict()


def _not_applicable_reason(model: EvaluableLM, how: Reading, length: int, position_plan) -> Optional[str]:
    """Why a length cannot be evaluated (positions never trained, or more than the model reads), or None."""
    refused = position_plan.eval_refusal(length) if position_plan is not None else None
    return refused or model.length_refusal(how, length)


def reading_of(settings: EvalConfig, scaling: str, length: int, train_len: int,
               window: Optional[AttentionWindow]) -> tuple[Reading, Optional[float]]:
    """How the model reads ``length`` under the ``eval`` group, and the ``scaling_factor`` its row records (None
    unscaled)."""
    if scaling in REMAPPINGS[1:]:  # self_extend, string, dca, ms_poe: every option filled in for this length
        given = {key: getattr(settings, key, None) for key in OPTION_KEYS[scaling]}
        remap = Remapping.of(scaling, given, int(train_len), int(length))
        return (Reading(scaling, remap.factor or 1.0, int(train_len), int(length), None, window, remap=remap,
                        options=remap.text), remap.factor)
    factor = _length_factor(scaling, length, train_len, settings.scaling_factor, settings.rerope_window)
    # LongRoPE's factors and n^, as given or from posexp search's file (eval.longrope_file); its rows record them
    factors, start = longrope_settings(settings) if scaling == "longrope" else (settings.longrope_factors, 0)
    options = options_text(factors, start) if scaling == "longrope" else None
    return Reading(scaling, factor or 1.0, int(train_len), int(length),
                   None if factors is None else tuple(float(f) for f in factors), window, start, options=options), factor


@dataclass
class EvalHooks:
    """Where an evaluation reports as it goes (every field optional).

    Attributes:
        on_row: called with each row as soon as it is measured.
        log: where progress notes (out-of-memory retries) go.
        progress: ``progress(length, windows_done, windows)``, before a length's first batch and after each.
        positions: a list that gets each length's row key, ``position_sum`` and ``position_count``.
        memory: measure peak memory (:class:`PeakMemory`: a garbage collection per length; the curve skips it).
        key_tokens: key-token perplexity (:class:`posexp.evaluation.key_tokens.KeySelector`): called as
            ``key_tokens(length, windows, target_losses)`` after each length, its fields (``ppl_key``...) join the row.
    """

    on_row: Optional[Callable[[dict], None]] = None
    log: Optional[Callable[[str], None]] = None
    progress: Optional[Callable[[int, int, int], None]] = None
    positions: Optional[list] = None
    memory: bool = True
    key_tokens: Optional[Callable[[int, "Windows", np.ndarray], dict]] = None


@dataclass
class _Pass:
    """What every length of one evaluation shares: the model and data, how the forward passes run, the hooks."""

    model: EvaluableLM
    val: np.ndarray
    batch_tokens: int
    device: torch.device
    position_plan: Any
    dtype: torch.dtype
    hooks: EvalHooks

    def log(self, message: str) -> None:
        if self.hooks.log is not None:
            self.hooks.log(message)


def _measure_length(p: _Pass, how: Reading, win: Windows, length: int) -> tuple[LengthResult, float, PeakMemory]:
    """One length's forward passes with the model reading as ``how`` says: the losses, seconds taken and peak memory
    (not measured, None, unless ``hooks.memory``)."""
    mem = PeakMemory(p.device)
    with p.model.reading(how), (mem if p.hooks.memory else contextlib.nullcontext()):
        t0 = time.perf_counter()
        pos = p.position_plan.eval_positions(length) if p.position_plan is not None else None
        with autocast(p.device, p.dtype):
            res = _run_windows(p, win, length, pos)
        elapsed = time.perf_counter() - t0
    return res, elapsed, mem


@torch.inference_mode()
def evaluate(model: EvaluableLM, val: np.ndarray, settings: EvalConfig, train_len: int, device: torch.device, *,
             position_plan=None, dtype: torch.dtype = torch.float32, hooks: Optional[EvalHooks] = None) -> list[dict]:
    """Rows, one per length, in the ``results.json`` row format (:class:`posexp.runs.row.ResultRow`); a length the
    model cannot read (``model.length_refusal``, e.g. a learned table shorter than ``L``), or every length of a
    scaling the model does not offer (``model.check_scaling``, e.g. a rotary scaling of a pretrained model without
    RoPE), gets ``applicable: false``, ``ppl: null`` and the reason.

    Args:
        model: any :class:`~posexp.model.interface.EvaluableLM` (posexp's :class:`~posexp.model.gpt.GPT`, a
            transformers model through :mod:`posexp.hf.model`), read at each length as a
            :class:`~posexp.model.interface.Reading` says.
        val: validation tokens.
        settings: the ``eval`` group: lengths (or multiples of ``train_len``), ``tokens`` (the scored-target
            budget), ``batch_tokens`` (forward tokens per batch), the protocol with its stride or K (module
            docstring), the scaling (:mod:`posexp.encoders.extension`: ``scaling_factor`` fixed at every length,
            None = ``max(1, L / train_len)``, dynamic_ntk 1; ``rerope_window`` None = half of ``train_len``;
            ``longrope_factors``, longrope's per-dimension ``lambda_i``), and the
            window and sinks (:mod:`posexp.model.window`; rows then record them). Only these fields are read.
        train_len: the training length (``multiple``, the default scaling factor).
        device: where the forward passes run.
        position_plan: a :class:`posexp.model.positions.PositionPlan`: randomized positions (Ruoss et al. 2023)
            are evaluated as trained, lengths past ``max_position`` not applicable. None = positions ``0 .. L-1``.
        dtype: the forward pass's autocast precision. Log-softmax and cross-entropy run in fp32
            (``model.token_losses``) and losses are summed in float64, so perplexities carry no bf16 rounding.
        hooks: rows, notes, progress and per-position losses as they come, and key-token perplexity
            (:class:`EvalHooks`).

    Raises:
        ConfigError: an unknown protocol or scaling, a stride or K out of range, a scaling posexp's encoder lacks.
    """
    e, hooks = settings, hooks or EvalHooks()
    lengths = lengths_of(e, train_len)
    scaling = e.scaling or NONE
    check_protocol(e.protocol, e.stride, e.last_k, lengths[0])
    refused = model.check_scaling(scaling)  # an unknown one raises; one the model lacks: rows "not applicable"
    val_tokens = int(val.size)
    budget = eval_budget(int(e.tokens), val_tokens, lengths[-1])
    n_last = last_k_windows(int(e.tokens), e.last_k, val_tokens, lengths[-1]) if e.protocol == "last_k" else None
    window = window_of(e.window, e.sinks)
    p = _Pass(model, val, int(e.batch_tokens), device, position_plan, dtype, hooks)
    model.eval()
    if device.type == "cpu":
        bound_heap_growth()  # long lengths' growing query-block tensors would otherwise grow the heap
    rows = []
    for length in lengths:
        how, factor = reading_of(e, scaling, length, train_len, window)
        row = _row_identity(e, how, factor)
        reason = refused or _not_applicable_reason(model, how, length, position_plan)
        if reason is not None:
            row.update(_not_applicable_row(reason))
        else:
            _measure_row(row, p, how, plan_windows(e.protocol, length, val_tokens, budget, e.stride, e.last_k, n_last))
        rows.append(row)
        if hooks.on_row is not None:
            hooks.on_row(row)
    return rows


def _measure_row(row: dict, p: _Pass, how: Reading, win: Windows) -> None:
    """Measure ``row``'s length and add its numbers to ``row``; its per-position losses go to the hooks."""
    length = row["length"]
    res, elapsed, mem = _measure_length(p, how, win, length)
    row.update(_summarise(res, win, length, elapsed, mem))
    if p.hooks.key_tokens is not None:
        row.update(p.hooks.key_tokens(length, win, res.target_losses))
    if p.hooks.positions is not None:
        p.hooks.positions.append({**position_key(row), "position_sum": res.position_sum,
                                  "position_count": res.position_count})


def _exp(x: float) -> float:
    """``e**x``, infinite past float range: a diverged model's perplexity is inf (written as null with a note)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _summarise(res: LengthResult, win: Windows, length: int, elapsed: float, mem: PeakMemory) -> dict:
    tl = res.target_losses
    # every target in the scored range is scored exactly once (a NaN loss is the model's, not a gap)
    assert int(res.position_count.sum()) == tl.size, "every target in the scored range is scored exactly once"
    loss = float(tl.mean())
    se, blocks = batch_means_se(tl, length)
    forward_tokens = int(win.starts.size * length)
    return {
        "applicable": True,
        "ppl": _exp(loss),
        "loss": loss,
        "loss_se": se,
        "ppl_low": _exp(loss - Z95 * se) if se is not None else None,
        "ppl_high": _exp(loss + Z95 * se) if se is not None else None,
        "se_blocks": blocks,
        "tokens": int(tl.size),
        "targets": [win.first, win.last],
        "windows": int(win.starts.size),
        "forward_tokens": forward_tokens,
        "tokens_per_s": forward_tokens / elapsed if elapsed > 0 else None,
        "peak_mem_mb": mem.delta_mb,
        "peak_rss_mb": mem.peak_mb,
        "mem_measure": mem.method,
        "batch_windows": res.batch_windows,
        **res.memory,
        "oom_retries": res.retries,
        "eval_s": elapsed,
    }


def loss_by_position_rows(records: list[dict]) -> list[dict]:
    """``loss_by_position.csv`` rows (key..., position, loss, count) of the scored positions of each record."""
    out = []
    for rec in records:
        key = position_key(rec)
        for p in np.flatnonzero(rec["position_count"]):
            c = int(rec["position_count"][p])
            out.append({**key, "position": int(p), "loss": float(rec["position_sum"][p] / c), "count": c})
    return out
