"""``eval.key_tokens.evaluator=RUN_OR_hf:NAME``: the evaluator model of key-token perplexity, checked and opened.

The evaluator is a run folder (its weights, as ``posexp eval`` loads them) or a transformers model (``hf:NAME``,
opened by :func:`posexp.commands.pretrained.hf_evaluator`, passed in as ``open_hf``). It must read the same
tokens as the evaluated model, for the key tokens are positions in the evaluated model's token array: posexp's
byte tokens (a transformers tokenizer that ``posexp export`` wrote for a byte run counts as them), one BPE
vocabulary (the same corpus fingerprint), or one transformers tokenizer (its fingerprint). A mismatch is one line
naming both before anything is evaluated. :mod:`posexp.evaluation.key_tokens` does the rest; the selection is
cached under the token cache (``data.cache_dir``), in ``key_tokens/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from posexp.commands.edge import HF_PREFIX, folder_run_hash, load_saved
from posexp.config.schema import Config, DataConfig, EvalConfig
from posexp.data.tokens import cache_root
from posexp.errors import ConfigError, PosexpError, require
from posexp.evaluation.key_tokens import SHORT_STRIDE_DIVISOR, Evaluator, KeySelector, OpenedEvaluator, Rule
from posexp.runs.layout import CHECKPOINT, RESULTS_JSON, is_run_dir, read_results

KEY = "eval.key_tokens.evaluator"
OpenHF = Callable[[str, torch.device], Evaluator]


def run_tokens(info: dict) -> str:
    """Which tokens a posexp run reads, from its corpus record (``results.json``'s ``run``, ``Corpus.info()``)."""
    tokenizer = str(info.get("tokenizer") or "byte")
    if tokenizer == "byte":
        return "posexp byte tokens"
    return f"posexp {tokenizer} tokens of corpus {info.get('corpus_fingerprint')}"


def check_key_tokens(e: EvalConfig, task: str = "lm") -> None:
    """The ``eval.key_tokens`` numbers, and that a run folder named as the evaluator is one, before any model loads
    (``posexp train`` checks it before training)."""
    k = e.key_tokens
    require(math.isfinite(k.alpha), "eval.key_tokens.alpha", f"must be a finite number of nats (got {k.alpha})")
    require(math.isfinite(k.beta), "eval.key_tokens.beta", f"must be a finite number of nats (got {k.beta})")
    require(k.short_len is None or k.short_len >= 1, "eval.key_tokens.short_len",
            f"must be a positive number of tokens, or null for the training length (got {k.short_len})")
    require(k.short_stride is None or k.short_stride >= 1, "eval.key_tokens.short_stride",
            f"must be a positive number of tokens, or null for short_len / {SHORT_STRIDE_DIVISOR} (got "
            f"{k.short_stride})")
    if k.evaluator is None:
        return
    name = str(k.evaluator).strip()
    require(name not in ("", HF_PREFIX), KEY, "names a run folder or hf:NAME, or null for no key tokens")
    require(task == "lm", KEY, f"applies to perplexity (task=lm); task={task} is scored by accuracy: drop it")
    if not name.startswith(HF_PREFIX):
        require(is_run_dir(Path(name).expanduser(), needs_weights=True), KEY,
                f"{name}: not a run folder with weights ({RESULTS_JSON} and {CHECKPOINT}); name a run folder, or a "
                "transformers model as hf:NAME")


@dataclass
class Evaluated:
    """The evaluated model as key-token selection sees it: its name in messages, its validation tokens, which
    tokens those are (:func:`run_tokens`, or a transformers tokenizer's) and its training length (the default
    short context ``K``)."""

    label: str
    val: np.ndarray
    tokens: str
    train_len: int


def key_selector(e: EvalConfig, evaluated: Evaluated, data: DataConfig, device: torch.device, open_hf: OpenHF,
                 log: Optional[Callable[[str], None]] = None) -> Optional[KeySelector]:
    """The key-token selector of an evaluation, or None when ``eval.key_tokens.evaluator`` is unset.

    Args:
        e: the ``eval`` group.
        evaluated: the evaluated model.
        data: the ``data`` group (``data.cache_dir``: where the token cache, and the selections, are kept).
        device: where the evaluator runs.
        open_hf: opens ``hf:NAME`` (:func:`posexp.commands.pretrained.hf_evaluator`).
        log: where notes go.

    Raises:
        ConfigError: a threshold out of range, an evaluator that is neither a run nor ``hf:``, or one that reads
            other tokens.
    """
    k = e.key_tokens
    if k.evaluator is None:
        return None
    check_key_tokens(e)
    name = str(k.evaluator).strip()
    evaluator = open_hf(name[len(HF_PREFIX):], device) if name.startswith(HF_PREFIX) else run_evaluator(name, device)
    if evaluator.tokens != evaluated.tokens:
        raise ConfigError(KEY, f"the evaluator {evaluator.label} reads {evaluator.tokens}, the evaluated model "
                               f"{evaluated.label} reads {evaluated.tokens}; key tokens are positions in the evaluated model's "
                               "tokens, so both need the same tokenizer")
    short_len = int(k.short_len or evaluated.train_len)
    rule = Rule(float(k.alpha), float(k.beta), short_len,
                int(k.short_stride or max(1, short_len // SHORT_STRIDE_DIVISOR)))
    cache = Path(k.cache_dir).expanduser() if k.cache_dir else cache_root(data.cache_dir) / "key_tokens"
    return KeySelector(evaluator, rule, evaluated.val, cache, device, int(e.batch_tokens), log)


def for_run(cfg: Config, corpus, device: torch.device, open_hf: OpenHF, label: str,
            log: Optional[Callable[[str], None]] = None) -> Optional[KeySelector]:
    """:func:`key_selector` for a posexp run reading ``corpus``."""
    if cfg.eval.key_tokens.evaluator is None or corpus is None:
        return None
    evaluated = Evaluated(label, corpus.val, run_tokens(corpus.info()), int(cfg.train_len))
    return key_selector(cfg.eval, evaluated, cfg.data, device, open_hf, log)


def run_evaluator(folder: str, device: torch.device) -> Evaluator:
    """A posexp run folder as the evaluator: named by its config hash and weights' SHA-256, opened on first use.

    Raises:
        ConfigError: not a run folder with weights, or a task run.
    """
    path = Path(folder).expanduser()
    if not is_run_dir(path, needs_weights=True):
        raise ConfigError(KEY, f"{folder}: not a run folder with weights ({RESULTS_JSON} and {CHECKPOINT}); name a "
                               "run folder, or a transformers model as hf:NAME")
    results = read_results(path)
    run = results.get("run") or {}
    task = (run.get("config") or {}).get("task") or {}
    if isinstance(task, dict) and task.get("name", "lm") != "lm":
        raise ConfigError(KEY, f"{folder}: a task run (task={task.get('name')}); the evaluator is a language model")
    sha = _weights_sha256(path)
    identity = f"run {run.get('config_hash')} weights {sha}"

    def opener() -> OpenedEvaluator:
        from posexp.evaluation.runner import eval_dtype
        from posexp.model.factory import build_model
        from posexp.model.positions import PositionPlan
        from posexp.training.checkpoint import load_weights

        saved = load_saved(path)
        cfg = saved.spec
        vocab_size = run.get("vocab_size")
        if not isinstance(vocab_size, int):
            raise PosexpError(f"{path}: {RESULTS_JSON} records no vocab_size; the evaluator cannot be rebuilt")
        model = build_model(cfg, vocab_size)
        load_weights(model, path / CHECKPOINT, folder_run_hash(path, saved).value, sha256=sha,
                     hint="the key-token evaluator's weights cannot be used; retrain it with posexp train")
        model.to(device).eval()
        trained_in = (run.get("train") or {}).get("precision")
        return OpenedEvaluator(model, int(cfg.train_len), PositionPlan(cfg), eval_dtype(cfg, device, trained_in))

    return Evaluator(str(folder), identity, run_tokens(run), opener)


def _weights_sha256(run_dir: Path) -> str:
    """The SHA-256 recorded beside the weights (``checkpoint/meta.json``), else the file's own."""
    import json

    from posexp.training.checkpoint import sha256_file

    try:
        digest = json.loads((run_dir / CHECKPOINT.parent / "meta.json").read_text(encoding="utf-8")).get("sha256")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        digest = None
    return digest if isinstance(digest, str) else sha256_file(run_dir / CHECKPOINT)


__all__ = ["Evaluated", "check_key_tokens", "for_run", "key_selector", "run_evaluator", "run_tokens"]
