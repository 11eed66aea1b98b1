"""``posexp analyze RUN_DIR``: a trained run's encoding and the attention of its model.

The same geometry as :mod:`posexp.analysis.app`, computed on the trained encoder,
and the attention of the trained model measured on validation text at multiples
of the training length: per layer and head, the mean distance from a query to the
keys it attends to and the entropy of its attention. Writes into ``RUN_DIR/analysis/``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from posexp.analysis.app import ANALYSIS_JSON, analyse_encoder, print_summary
from posexp.analysis.drawing import draw_attention
from posexp.analysis.schema import AnalyzeConfig, analyze_settings
from posexp.errors import PosexpError, require
from posexp.model.positions import PositionPlan
from posexp.runs.atomic import atomic_write_json
from posexp.runs.layout import is_run_dir
from posexp.runs.lock import refuse_running
from posexp.runtime import terminal

ANALYSIS_DIR = "analysis"  # in the run folder


@torch.no_grad()
def attention_statistics(model, tokens: np.ndarray, length: int, n_windows: int,
                         pos: Optional[np.ndarray] = None) -> dict:
    """Per layer and head, mean attention distance and entropy on ``n_windows`` windows of ``length`` tokens, read
    at positions ``pos`` (``(length,)``, as the run's evaluation reads them; None = ``0 .. length - 1``).

    The attention probabilities are recomputed from each block's input exactly as
    the model forms its logits: ``q k^T / sqrt(Dh)`` after ``rotate``, plus ``bias``
    and ``scores``, causal mask, softmax. For query ``i``: mean distance
    ``sum_j a_ij (i - j)`` (tokens) and entropy ``-sum_j a_ij log a_ij`` (nats);
    both averaged over every query of every window.

    Returns:
        ``{"mean_distance": (layers, heads), "entropy": (layers, heads)}`` numpy arrays, and
        the uniform-attention references ``uniform_distance`` / ``uniform_entropy``.
    """

    blocks = list(model.blocks)
    n_layers, H = len(blocks), model.shape.n_heads
    dist_sum = np.zeros((n_layers, H))
    ent_sum = np.zeros((n_layers, H))
    count = 0
    captured: dict[int, tuple] = {}

    def hook_for(i):
        def hook(module, args):
            captured[i] = (module, args[0], args[1])
        return hook

    handles = [b.attn.register_forward_pre_hook(hook_for(i)) for i, b in enumerate(blocks)]
    device = next(model.parameters()).device
    positions = None if pos is None else torch.as_tensor(pos, dtype=torch.long, device=device)
    try:
        for w in range(n_windows):
            idx = torch.as_tensor(np.asarray(tokens[w * length:(w + 1) * length], dtype=np.int64),
                                  device=device)[None]
            captured.clear()
            model(idx, positions)
            for i in range(n_layers):
                attn, x, plan = captured[i]
                probs = _attention_probs(attn, x, plan)  # (1, H, L, L)
                L = probs.shape[-1]
                d = (torch.arange(L, device=device)[:, None] - torch.arange(L, device=device)[None, :]).clamp(min=0)
                dist_sum[i] += (probs * d).sum(-1).mean(-1)[0].double().cpu().numpy()
                plogp = torch.where(probs > 0, probs * probs.clamp_min(1e-30).log(), torch.zeros_like(probs))
                ent_sum[i] += (-plogp.sum(-1)).mean(-1)[0].double().cpu().numpy()
            count += 1
    finally:
        for h in handles:
            h.remove()
    at = np.arange(length)
    return {"mean_distance": dist_sum / count, "entropy": ent_sum / count,
            "uniform_distance": float((at / 2).mean()), "uniform_entropy": float(np.log(at + 1).mean())}


def _attention_probs(attn, x: Tensor, plan) -> Tensor:
    B, L, D = x.shape
    enc = plan.encoder
    q, k, _ = attn.qkv(x).view(B, L, 3, attn.n_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh)
    if enc.uses_rotate:
        q, k = enc.rotate(q, k, plan.pos, plan.pos)
    logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(attn.head_dim)  # SDPA's default scale
    if plan.needs_mask:
        logits = logits + plan.bias(0, L, torch.float32)  # bias (if any) with the causal mask
        if enc.uses_scores:
            logits = logits + enc.scores(q, k, plan.pos, plan.pos).float()
        if enc.uses_transform:
            logits = logits + enc.transform(x, q, k, plan.pos)(0, L).float()
    else:
        future = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    return enc.normalise(logits, plan.pos, plan.pos) if enc.uses_normalise else logits.softmax(-1)


def parse_run_args(args: Sequence[str]) -> tuple[list[Path], AnalyzeConfig]:
    """Run folders and the ``analyze.*`` settings (``analyze.KEY=VALUE`` applied, typed and checked) of
    ``posexp analyze RUN_DIR...``."""
    import yaml

    runs, over = [], {}
    keys = list(AnalyzeConfig.__dataclass_fields__)
    for arg in args:
        if is_run_dir(arg, needs_weights=True):
            runs.append(Path(arg))
            continue
        key, eq, value = arg.partition("=")
        if not eq:
            from posexp.commands.pretrained import pretrained_refusal

            refusal = pretrained_refusal(arg, "analyze")  # a pretrained model's run: its weights are elsewhere
            if refusal is not None:
                raise PosexpError(refusal)
            refuse_running(arg)
            raise PosexpError(f"{arg}: not a run folder (one with results.json and checkpoint/model.safetensors); pass the folder "
                              "of one trained run, e.g. outputs/2026-11-22/10-00-00")
        require(key.startswith("analyze.") and key[len("analyze."):] in keys, key,
                "with a trained run only analyze.* settings apply; choose one of: "
                + ", ".join("analyze." + k for k in keys))
        over[key[len("analyze."):]] = yaml.safe_load(value)
    return runs, analyze_settings(over)


def analyze_run(run_dir: Path, settings: AnalyzeConfig, console: Optional[Console] = None,
                allow_changed_encoder: bool = False) -> dict:
    """``posexp analyze RUN_DIR``: the trained encoder's geometry and the model's attention vs length.

    Loads the run as ``posexp eval`` does (:func:`posexp.commands.eval.prepare`: its saved config,
    its corpus, safetensors weights) and writes into ``RUN_DIR/analysis/``. ``settings``: the checked
    ``analyze.*`` values (:func:`parse_run_args`).
    """
    from posexp.commands.eval import prepare, run_plugin_failures

    console = console or terminal.console()
    p = prepare(run_dir, [], allow_changed_encoder=allow_changed_encoder,
                warn=lambda m: console.print(f"warning: {m}", style="yellow", highlight=False, soft_wrap=True))
    with run_plugin_failures(p, "the analysis stopped"):
        return _analyze_prepared(p, settings, console)


def _analyze_prepared(p: Any, settings: AnalyzeConfig, console: Console) -> dict:
    """:func:`analyze_run` of the run ``p`` loaded (:class:`posexp.commands.eval.Prepared`)."""
    run_dir = p.run_dir
    cfg = p.cfg
    out = Path(run_dir) / ANALYSIS_DIR
    model = p.model.eval()
    result = analyse_encoder(model.encoder, cfg, settings, out, note="trained encoder of this run")
    train_len, plan = int(cfg.train_len), PositionPlan(cfg)  # a run trained at randomized positions reads them
    rows = []
    for m in sorted(set(settings.multiples)):
        length = m * train_len
        row: dict[str, Any] = {"multiple": m, "length": length}
        if not model.encoder.supports(length):
            row["not_applicable"] = f"{model.encoder.name} encodes at most {model.encoder.max_length} positions"
        elif (refused := plan.eval_refusal(length)) is not None:
            row["not_applicable"] = refused
        elif p.task is None and len(p.corpus.val) < length:
            row["not_applicable"] = f"the validation text has only {len(p.corpus.val)} tokens"
        else:
            n, text = _windows(p, length, settings.tokens)
            stats = attention_statistics(model, text, length, n, plan.eval_positions(length))
            row.update({"windows": n, "mean_distance": stats["mean_distance"].round(4).tolist(),
                        "entropy": stats["entropy"].round(4).tolist(),
                        "uniform_distance": stats["uniform_distance"], "uniform_entropy": stats["uniform_entropy"]})
        rows.append(row)
        console.print(f"attention at {length} tokens ({m}× train_len): "
                      + (row.get("not_applicable") or f"{row['windows']} window(s)"), highlight=False)
    result["attention"] = rows
    if settings.figures:
        result["figures"] += draw_attention(rows, train_len, result["label"], out)
    atomic_write_json(out / ANALYSIS_JSON, result)
    print_summary(result, console)
    _print_attention(rows, console)
    console.print(f"wrote {out / ANALYSIS_JSON} and {len(result['figures'])} figure(s) in {out}", highlight=False)
    return result


def _windows(p, length: int, tokens: int) -> tuple[int, np.ndarray]:
    """How many windows of ``length`` to read, and the tokens they are cut from: the validation text, or for
    a task run its evaluation instances of that length, one per window."""
    if p.task is None:
        return max(1, min(tokens // length, len(p.corpus.val) // length)), p.corpus.val
    from posexp.evaluation.accuracy import eval_instances

    n = max(1, tokens // length)
    return n, eval_instances(p.task, length, n).tokens[:, :-1].reshape(-1)


def _print_attention(rows: list[dict], console: Console) -> None:
    t = Table(title="attention per layer (mean over heads; per head in analysis.json)")
    t.add_column("length", justify="right")
    t.add_column("mean distance (tokens)")
    t.add_column("entropy (nats)")
    t.add_column("uniform: distance / entropy")
    for r in rows:
        if "mean_distance" not in r:
            t.add_row(str(r["length"]), "n/a", r["not_applicable"], "")
            continue
        d = np.array(r["mean_distance"]).mean(1)
        e = np.array(r["entropy"]).mean(1)
        t.add_row(str(r["length"]), ", ".join(f"{v:.1f}" for v in d), ", ".join(f"{v:.2f}" for v in e),
                  f"{r['uniform_distance']:.1f} / {r['uniform_entropy']:.2f}")
    console.print(t)


def analyze_runs_main(args: Sequence[str], console: Optional[Console] = None) -> list[dict]:
    """``posexp analyze RUN_DIR... [analyze.KEY=VALUE...] [--allow-changed-encoder]``: analyse each run folder;
    returns their results."""
    from posexp.commands.plugin_source import ALLOW_FLAG
    from posexp.commands.eval import check_writable

    allow = ALLOW_FLAG in args
    runs, settings = parse_run_args([a for a in args if a != ALLOW_FLAG])
    for run in runs:  # every folder checked before the first is analysed
        check_writable(run, "posexp analyze", f"its figures and {ANALYSIS_JSON}", into=run / ANALYSIS_DIR)
    return [analyze_run(r, settings, console, allow_changed_encoder=allow) for r in runs]
