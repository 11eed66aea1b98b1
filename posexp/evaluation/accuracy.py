"""Accuracy of a trained model on a generated task, at each eval length (and, for a task with a depth, each depth).

At every length ``L`` (``eval.lengths``, or ``eval.multiples`` x ``train_len``) the model reads
``eval.examples`` fresh instances of exactly ``L`` tokens (:meth:`posexp.tasks.task.Task.instances`). The
instances depend only on the task, the length and the depth, never on the run's seed, so every run of a
sweep is scored on the same instances (as every perplexity row scores the same validation tokens). Scoring
is teacher-forced: the model reads the true instance and its argmax at every answer position is compared
with the answer token there.

A row reports:

- ``exact_match``: the share of instances whose every answer token is right, with the 95% Wilson score
  interval over the instances (Wilson 1927; the interval of choice for a proportion near 0 or 1, where the
  normal one leaves [0, 1]).
- ``token_accuracy``: the share of answer tokens that are right, with a 95% interval over the instances
  (:func:`token_accuracy_interval`): the tokens of one instance are no independent trials, their errors cluster,
  so the instances are the units the interval counts, as ``exact_match``'s does.
- ``answer_loss``: mean cross-entropy in nats of the answer tokens.
- ``examples``, ``answer_tokens``, ``size`` (the instance size at that length).

Lengths a model cannot read (an encoder's table, a pretrained model's limit), or past the range of randomized
training positions, are "not applicable", as for perplexity. The model is read through the model seam
(:class:`posexp.model.interface.EvaluableLM`).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from posexp.config.schema import Config, EvalConfig, lengths_of
from posexp.runtime.memory import PeakMemory
from posexp.evaluation.perplexity import EvalHooks, _not_applicable_reason, reading_of
from posexp.evaluation.runner import run_model_scaling, with_model_scaling
from posexp.encoders.extension import NONE
from posexp.model.interface import EvaluableLM, Reading
from posexp.model.positions import PositionPlan
from posexp.model.window import window_fields, window_of
from posexp.runs.row import ACCURACY, ResultRow
from posexp.runtime.device import autocast
from posexp.runtime.precision import resolve_precision
from posexp.tasks.task import Task

Z95 = 1.959964  # two-sided 95% normal quantile
EVAL_PROTOCOL = "teacher_forced"  # a task row's protocol: the argmax at each answer position, true prefix read
_EVAL_STREAM = 4  # eval instances: a generator of (stream, length[, depth]), apart from training's


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[Optional[float], Optional[float]]:
    """The Wilson score interval of a proportion (Wilson 1927, "Probable inference, the law of succession, and
    statistical inference", JASA 22, eq. for the limits of p at ``z`` standard errors).

    ``(p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)``: inside [0, 1] and not empty at ``p = 0`` or 1.

    Returns:
        ``(low, high)``; ``(None, None)`` without trials.
    """
    if trials <= 0:
        return None, None
    return _wilson(successes / trials, trials, z)


def _wilson(p: float, trials: float, z: float) -> tuple[float, float]:
    """:func:`wilson_interval` of a share ``p`` of ``trials`` (not necessarily whole: an effective sample size)."""
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    # at p = 0 (p = 1) the lower (upper) limit is exactly 0 (1); rounding would leave 1e-17 of it
    low = 0.0 if p == 0 else max(0.0, centre - half)
    high = 1.0 if p == 1 else min(1.0, centre + half)
    return low, high


def token_accuracy_interval(right: np.ndarray, total: np.ndarray,
                            z: float = Z95) -> tuple[Optional[float], Optional[float]]:
    """The 95% interval of token accuracy ``sum(right) / sum(total)`` (per instance: answer tokens right, answer
    tokens), the instances its independent units: a cluster sample's ratio estimator.

    Its variance is the linearised (delta-method) one of a ratio over clusters, ``sum((right_i - p total_i)²) /
    sum(total)²`` (Cochran 1977, "Sampling Techniques", ch. 6, with ``n`` in place of ``n - 1``); the tokens it is
    worth, the effective sample size ``p(1 - p) / variance`` (Kish 1965, "Survey Sampling": the tokens over the
    design effect), at most the tokens; and the interval Wilson's at that size (Wilson 1927; with an effective
    size as Franco et al. 2019, "Comparative study of confidence intervals for proportions in complex sample
    surveys", JSSAM, recommend it). With one answer token per instance
    it is ``exact_match``'s Wilson interval; when an instance's tokens are all right or all wrong together, too,
    not ``sqrt(tokens per instance)`` times narrower, as a Wilson interval over the tokens would be. At ``p`` 0 or
    1 the spread cannot be told, and the instances count as one trial each.

    Returns:
        ``(low, high)`` in [0, 1]; ``(None, None)`` without answer tokens.
    """
    tokens, instances = float(total.sum()), int(total.size)
    if tokens <= 0:
        return None, None
    p = float(right.sum()) / tokens
    variance = float(np.sum((right - p * total) ** 2)) / tokens ** 2
    if p in (0.0, 1.0):
        size = float(instances)
    else:
        size = min(tokens, p * (1 - p) / variance) if variance > 0 else tokens
    return _wilson(p, size, z)


def eval_instances(task: Task, length: int, count: int, depth: Optional[float] = None):
    """The instances every run is scored on at ``length`` (and ``depth``): seeded by the length and depth only,
    so a depth gets the same instances whatever other depths are measured with it."""
    key = [_EVAL_STREAM, length] + ([] if depth is None else [1, int(round(float(depth) * 10**6))])
    rng = np.random.default_rng(key)
    options: dict[str, Any] = {"split": "val"}
    if depth is not None:
        options["depth"] = depth
    return task.instances(length, count, rng, **options)


def _score(model: EvaluableLM, tokens: np.ndarray, answer: np.ndarray, pos: Optional[np.ndarray], batch_tokens: int,
           device: torch.device) -> tuple[np.ndarray, np.ndarray, float]:
    """Per instance: answer tokens right and answer tokens; and the summed answer loss (nats)."""
    count, width = tokens.shape
    per_batch = max(1, batch_tokens // (width - 1))
    right, total, loss_sum = np.zeros(count, np.int64), np.zeros(count, np.int64), 0.0
    pos_t = None if pos is None else torch.from_numpy(pos).to(device)
    for start in range(0, count, per_batch):
        batch = torch.from_numpy(tokens[start:start + per_batch]).to(device)
        mask = torch.from_numpy(answer[start:start + per_batch, 1:]).to(device)  # which targets are answers
        logits = model.logits(batch[:, :-1], pos_t).float()  # (b, L, vocab)
        targets = batch[:, 1:]
        hit = (logits.argmax(-1) == targets) & mask
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
        right[start:start + per_batch] = hit.sum(1).cpu().numpy()
        total[start:start + per_batch] = mask.sum(1).cpu().numpy()
        loss_sum += float((losses * mask).sum().double())
    return right, total, loss_sum


def _summarise(right: np.ndarray, total: np.ndarray, loss_sum: float) -> dict:
    examples, answer_tokens = int(right.size), int(total.sum())
    exact = int((right == total).sum())
    correct = int(right.sum())
    em_low, em_high = wilson_interval(exact, examples)
    tok_low, tok_high = token_accuracy_interval(right, total)
    return {"applicable": True, "exact_match": exact / examples if examples else None,
            "exact_match_low": em_low, "exact_match_high": em_high,
            "token_accuracy": correct / answer_tokens if answer_tokens else None,
            "token_accuracy_low": tok_low, "token_accuracy_high": tok_high,
            "answer_loss": loss_sum / answer_tokens if answer_tokens else None,
            "examples": examples, "answer_tokens": answer_tokens}


def _not_applicable(reason: str) -> dict:
    return {"applicable": False, "exact_match": None, "exact_match_low": None, "exact_match_high": None,
            "token_accuracy": None, "token_accuracy_low": None, "token_accuracy_high": None, "answer_loss": None,
            "examples": 0, "answer_tokens": 0, "reason": reason}


def eval_depths(depths: Sequence[float]) -> list[float]:
    """``eval.depths`` in the order given, each once: a depth listed twice is measured (and written) once."""
    return list(dict.fromkeys(float(d) for d in depths))


def evaluate_task_config(model: EvaluableLM, task: Task, cfg: Config, device: torch.device,
                         on_row: Optional[Callable[[dict], None]] = None, memory: bool = True) -> list[dict]:
    """:func:`evaluate_task` for the ``eval`` group of a run's ``cfg``: its lengths and training positions, in the
    precision ``train.precision`` resolves to on ``device``."""
    rows = evaluate_task(model, task, cfg.eval, int(cfg.train_len), device, position_plan=PositionPlan(cfg),
                         dtype=resolve_precision(cfg.train.precision, device),
                         hooks=EvalHooks(on_row=on_row, memory=memory))
    return with_model_scaling(rows, *run_model_scaling(cfg))


@torch.inference_mode()
def evaluate_task(model: EvaluableLM, task: Task, settings: EvalConfig, train_len: int, device: torch.device, *,
                  position_plan: Optional[PositionPlan] = None, dtype: torch.dtype = torch.float32,
                  hooks: Optional[EvalHooks] = None) -> list[dict]:
    """Accuracy rows (module docstring) for the ``eval`` group ``settings``: one per length, x depth for a task
    with one (passkey, niah, kv_retrieval: :attr:`Task.has_depth`). Lengths, scalings, the window and the
    positions as for perplexity (:func:`posexp.evaluation.perplexity.evaluate`); ``dtype`` the autocast precision;
    ``hooks``: each row as it is measured (``on_row``), and ``memory`` off skips the peak-memory measurement
    (``eval.during_training``'s quick points).

    Raises:
        ConfigError: a scaling posexp's encoder does not offer, or a bad window.
    """
    e, hooks = settings, hooks or EvalHooks()
    window = window_of(getattr(e, "window", None), getattr(e, "sinks", None))
    scaling = getattr(e, "scaling", NONE) or NONE
    refused = model.check_scaling(scaling)
    depths = eval_depths(e.depths) if task.has_depth else [None]
    model.eval()
    rows = []
    for length in lengths_of(e, train_len):
        how, factor = reading_of(e, scaling, length, train_len, window)
        reason = refused or _not_applicable_reason(model, how, length, position_plan)
        for depth in depths:
            row = _row_identity(task, how, factor, depth, int(e.examples))
            if reason is not None:
                row.update(_not_applicable(reason))
            else:
                made = eval_instances(task, length, int(e.examples), depth)
                pos = position_plan.eval_positions(length) if position_plan is not None else None
                mem = PeakMemory(device)
                with model.reading(how), mem if hooks.memory else nullcontext(), autocast(device, dtype):
                    t0 = time.perf_counter()
                    right, total, loss_sum = _score(model, made.tokens, made.answer, pos, int(e.batch_tokens), device)
                    elapsed = time.perf_counter() - t0
                row.update(_summarise(right, total, loss_sum))
                read = made.tokens.shape[0] * length
                row.update(eval_s=elapsed, tokens_per_s=read / elapsed if elapsed else None, peak_mem_mb=mem.delta_mb)
            rows.append(row)
            if hooks.on_row is not None:
                hooks.on_row(row)
    return rows


def _row_identity(task: Task, how: Reading, factor: Optional[float], depth: Optional[float], examples: int) -> dict:
    """How an accuracy row is measured (:class:`posexp.runs.row.ResultRow`'s key and settings); ``window`` /
    ``sinks`` only for a windowed evaluation. The instances' seed is the evaluation stream's (:func:`eval_instances`),
    the same for every run."""
    return ResultRow(metric=ACCURACY, task=task.name, length=how.length, multiple=how.length / how.train_len,
                     depth=None if depth is None else float(depth), protocol=EVAL_PROTOCOL,
                     scaling=None if how.scaling == NONE else how.scaling, scaling_factor=factor,
                     scaling_options=how.options, size=task.size_for(how.length), examples_asked=examples, eval_seed=_EVAL_STREAM,
                     **window_fields(how.window)).to_dict()
