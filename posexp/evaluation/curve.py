"""Extrapolation while training goes (``eval.during_training``): the model measured at a few multiples of
``train_len`` every N steps, on a small budget that is the same at every point.

A language model's perplexity comes from :func:`posexp.evaluation.perplexity.evaluate` with the
``nonoverlap`` protocol on the first ``tokens`` targets of the validation split, so every point scores the
same tokens and the curve compares step with step; a task run's accuracy from
:func:`posexp.evaluation.accuracy.evaluate_task` on ``examples`` instances per length (passkey: per depth,
pooled), the same instances at every point. No evaluation-time scaling and no window: the curve shows the
encoding as it trains. A model trained with randomized positions is read with them, as in its final evaluation.

A point leaves the model as it found it: its mode put back, no gradient recorded, and torch's random
streams forked and restored around it, so a run's weights and final numbers are those of the same run
without the curve. Validation and task instances never come from the training stream either.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional

import numpy as np
import torch

from posexp.config.schema import Config, curve_lengths
from posexp.evaluation.accuracy import evaluate_task_config
from posexp.evaluation.perplexity import EvalHooks, evaluate
from posexp.model.gpt import GPT
from posexp.model.positions import PositionPlan
from posexp.runs.layout import ACCURACY, PERPLEXITY
from posexp.tasks.task import Task

# the logger name train.log and users' logging filters have always seen for training
log = logging.getLogger("posexp.train")

# What a point hands on: the step and its rows (the columns of curve.csv, posexp.runs.curve.CURVE_COLUMNS).
PointHook = Callable[[int, list[dict]], None]


class CurveProbe:
    """Measures ``model`` at the curve's lengths after every ``eval.during_training.every`` steps and after the
    last step, and hands each point's rows to ``on_point``. The trainer calls it
    (:class:`posexp.training.trainer.Probe`).

    Args:
        model: the model being trained.
        cfg: the run's config (``eval.during_training``, ``train_len``, ``train.steps``, positions).
        device: where the model is.
        on_point: called with (step, rows) after each point: curve.csv and the trackers.
        val: the validation tokens (a language model).
        task: the task (a task run); exactly one of ``val`` and ``task``.
        warn: told once which lengths the encoding cannot represent (they are left out of the curve).
    """

    def __init__(self, model: GPT, cfg: Config, device: torch.device, on_point: PointHook, *,
                 val: Optional[np.ndarray] = None, task: Optional[Task] = None,
                 warn: Optional[Callable[[str], None]] = None):
        assert (val is None) != (task is None), "a curve measures a corpus or a task"
        c = cfg.eval.during_training
        self.model, self.cfg, self.device, self.on_point, self.val, self.task = model, cfg, device, on_point, val, task
        self.every, self.last = int(c.every or 0), int(cfg.train.steps)
        self.lengths = curve_lengths(cfg)
        self.plan = PositionPlan(cfg)
        self.warn = warn
        self.metric = PERPLEXITY if task is None else ACCURACY

    def due(self, step: int) -> bool:
        return self.every > 0 and (step % self.every == 0 or step == self.last)

    def __call__(self, step: int, dtype: torch.dtype) -> None:
        rows = [{"step": step, **row} for row in self.measure(dtype)]
        log.info("curve at step %d: %s", step, ", ".join(
            f"{row['multiple']:g}x {row['ppl' if self.task is None else 'exact_match']:.4g}" for row in rows))
        self.on_point(step, rows)

    def measure(self, dtype: torch.dtype) -> list[dict]:
        """One point's rows, one per length the encoding represents (curve.csv's columns but the step)."""
        was_training = self.model.training
        forked = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=forked), torch.no_grad():
                rows = self._perplexity(dtype) if self.task is None else self._accuracy()
        finally:
            self.model.train(was_training)
        measured = [r for r in rows if r.get("applicable", True)]
        if self.warn is not None and len(measured) < len(rows):
            skipped = [r for r in rows if not r.get("applicable", True)]
            self.warn(f"eval.during_training: length{'s' if len(skipped) > 1 else ''} "
                      f"{', '.join(str(r['length']) for r in skipped)} left out of the curve: {skipped[0]['reason']}")
        self.warn = None  # said once: the same lengths are left out at every point
        return [_curve_row(r, self.metric) for r in measured]

    def _perplexity(self, dtype: torch.dtype) -> list[dict]:
        assert self.val is not None
        e = self.cfg.eval
        plain = dataclasses.replace(e, lengths=self.lengths, tokens=int(e.during_training.tokens),
                                    protocol="nonoverlap", stride=None, last_k=None, scaling="none",
                                    scaling_factor=None, rerope_window=None, longrope_factors=None, window=None,
                                    sinks=None, longrope_start=0, longrope_file=None)
        return evaluate(self.model, self.val, plain, int(self.cfg.train_len), self.device, position_plan=self.plan,
                        dtype=dtype, hooks=EvalHooks(memory=False))

    def _accuracy(self) -> list[dict]:
        assert self.task is not None
        e = self.cfg.eval
        plain = dataclasses.replace(e, lengths=self.lengths, examples=int(e.during_training.examples),
                                    scaling="none", scaling_factor=None, rerope_window=None, window=None, sinks=None)
        return _pool_depths(evaluate_task_config(self.model, self.task, dataclasses.replace(self.cfg, eval=plain),
                                          self.device, memory=False))


def _pool_depths(rows: list[dict]) -> list[dict]:
    """One accuracy row per length: passkey's rows of several depths pooled over their instances and answer
    tokens (the other tasks have one row per length already)."""
    by_length: dict[int, list[dict]] = {}
    for row in rows:
        by_length.setdefault(int(row["length"]), []).append(row)
    pooled = []
    for length, group in by_length.items():
        first = group[0]
        if not first.get("applicable", True) or len(group) == 1:
            pooled.append(first)
            continue
        examples, answers = sum(r["examples"] for r in group), sum(r["answer_tokens"] for r in group)
        pooled.append({**first, "examples": examples, "answer_tokens": answers,
                       "exact_match": sum(r["exact_match"] * r["examples"] for r in group) / examples,
                       "token_accuracy": sum(r["token_accuracy"] * r["answer_tokens"] for r in group) / answers,
                       "answer_loss": sum(r["answer_loss"] * r["answer_tokens"] for r in group) / answers,
                       "eval_s": sum(r["eval_s"] for r in group)})
    return pooled


def _curve_row(row: dict, metric: str) -> dict:
    """A results row of the curve's evaluation as a curve.csv row (without the step)."""
    common = {"length": int(row["length"]), "multiple": float(row["multiple"]), "eval_s": float(row["eval_s"])}
    if metric == PERPLEXITY:
        return {**common, "ppl": row["ppl"], "loss": row["loss"], "tokens": int(row["tokens"])}
    return {**common, "exact_match": row["exact_match"], "token_accuracy": row["token_accuracy"],
            "answer_loss": row["answer_loss"], "examples": int(row["examples"])}
