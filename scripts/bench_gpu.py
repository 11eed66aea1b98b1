"""posexp next to its peers on a GPU: training tokens/s and MFU at GPT-2-small shape, long-context evaluation.

    python scripts/bench.py --gpu                         # everything below, on the first CUDA device
    python scripts/bench.py --gpu --lengths 4096 --families alibi t5 --json gpu.json
    python scripts/bench.py --gpu --dry-run               # the same code paths on a CPU, tiny shape: a smoke check
    pip install -e '.[bench]'                             # the peers: transformers, x-transformers

One run measures, in one process:

1. **bf16 matmul peak** of this GPU: TFLOP/s of square bf16 products (the best of a
   few sizes, each the median of repeats timed with CUDA synchronisation). MFU is
   measured against it, not against a datasheet.
2. **training** at GPT-2-small shape (d_model 768, 12 layers, 12 heads, MLP 4 x d_model,
   vocabulary 50,304 = GPT-2's padded to a multiple of 64), sequence 1,024 and 4,096,
   ``--tokens`` tokens per step (batch = tokens / sequence), bf16 autocast, fused AdamW
   (posexp's ``make_optimizer`` for every model), gradient clipping at 1.0. Every
   model's forward and cross-entropy go through ``torch.compile`` as one module
   (posexp's own step does that on CUDA by default; peers get the same, and run eager
   with a note if compiling fails). posexp: rope, alibi, t5, learned, none;
   transformers: Llama (RoPE), Bloom (ALiBi), GPT-2 (learned); x-transformers: rotary,
   ALiBi, T5 bias, absolute, NoPE. tokens/s = tokens per step / the mean of
   ``--steps`` steps after ``--warmup`` (compilation included in the warm-up). MFU =
   FLOPs per token (scripts/bench.py's ``6 N + 12 layers d L``, PaLM App. B) x tokens/s
   / the bf16 peak.
3. **evaluation** of one window of 16,384 and 65,536 tokens, batch 1, bf16 autocast,
   inference mode: tokens/s and peak GPU memory above the weights
   (``torch.cuda.max_memory_allocated``); a model that runs out of memory says so.
4. **ratios**: posexp over the best peer of each family, training and evaluation.

Targets (the issue's): at sequence 4,096, alibi and t5 >= 1.5x their best peer, rope
>= 1.0x; MFU >= 40% of the measured peak for rope and alibi; 65,536 tokens evaluated
by alibi and t5 with peak memory linear in length.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.config.schema import TrainConfig
from posexp.model.gpt import GPT
from posexp.runs.atomic import atomic_write_json
from posexp.runtime.device import autocast
from posexp.training.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (FAMILIES, PEERS, Contender, Shape, best_peer_ratios, logits_of, peer_available,  # noqa: E402
                      posexp_model, train_flops_per_token)

GPT2_SMALL = Shape(vocab=50304, d_model=768, n_layers=12, n_heads=12, seq=1024, batch=32)
TINY = Shape(vocab=256, d_model=64, n_layers=2, n_heads=4, seq=64, batch=4)
TARGETS = {"alibi": 1.5, "t5": 1.5, "rope": 1.0}  # posexp / best peer, training tokens/s at sequence 4,096


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, dtype: torch.dtype, sizes: list[int], reps: int) -> dict:
    """TFLOP/s of ``n x n`` products: the best size's median over ``reps`` timed products."""
    by_size = {}
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            a @ b
            sync(device)
            times.append(time.perf_counter() - t0)
        by_size[n] = 2 * n ** 3 / statistics.median(times) / 1e12
        del a, b
    return {"dtype": str(dtype).replace("torch.", ""), "tflops": max(by_size.values()),
            "by_size": {str(n): round(t, 2) for n, t in by_size.items()}}


class LossOf(nn.Module):
    """Any contender's mean cross-entropy as one module's forward, so it compiles as one graph."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        if isinstance(self.model, GPT):
            return self.model.token_losses(idx, targets).mean()  # what posexp's trainer computes
        logits = logits_of(self.model, idx)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def compiled(module: nn.Module, enable: bool) -> tuple[Callable, str]:
    """``torch.compile(module)`` if asked and it compiles (checked by the caller's warm-up), else the module."""
    if not enable:
        return module, "eager"
    return torch.compile(module), "compiled"


def train_one(c: Contender, shape: Shape, device: torch.device, dtype: torch.dtype, steps: int, warmup: int,
              compile_: bool, peak_tflops: float) -> dict:
    """tokens/s, MFU and peak memory of full training steps of one contender."""
    torch.manual_seed(0)
    model = c.build(shape, shape.seq).to(device).train()
    cfg = TrainConfig()
    opt = make_optimizer(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    batch = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=torch.Generator().manual_seed(0))
    x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)
    net, mode = compiled(LossOf(model), compile_)

    def step() -> Tensor:
        with autocast(device, dtype):
            loss = net(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    try:
        for _ in range(warmup):
            step()
    except Exception as e:  # noqa: BLE001 - a peer torch.compile cannot handle runs eager, with a note
        if not compile_ or isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        net, mode = LossOf(model), f"eager (compile failed: {type(e).__name__})"
        for _ in range(warmup):
            step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync(device)
    step_s = (time.perf_counter() - t0) / steps
    tokens = shape.batch * shape.seq
    flops = train_flops_per_token(shape, c.mlp_matrices)
    tps = tokens / step_s
    return {"label": c.label, "impl": c.impl, "family": c.family, "seq": shape.seq, "batch": shape.batch,
            "mode": mode, "tokens_per_s": tps, "step_s": step_s, "flops_per_token": flops,
            "tflops": tps * flops / 1e12, "mfu": tps * flops / 1e12 / peak_tflops, "final_loss": float(loss),
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None,
            "params": sum(p.numel() for p in model.parameters()), "notes": c.notes}


def eval_one(c: Contender, shape: Shape, length: int, device: torch.device, dtype: torch.dtype) -> dict:
    """tokens/s and peak memory above the weights of one window of ``length`` tokens."""
    torch.manual_seed(0)
    model = c.build(shape, length).to(device).eval()
    idx = torch.randint(0, shape.vocab, (1, length + 1), generator=torch.Generator().manual_seed(0)).to(device)

    def forward(ids: Tensor) -> float:
        with autocast(device, dtype):
            logits = logits_of(model, ids[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), ids[0, 1:])

    with torch.inference_mode():
        forward(idx[:, :shape.seq + 1])  # warm-up at the training length
        forward(idx)  # and at this length: FlexAttention compiles its kernel for it here
        sync(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        loss = forward(idx)
        sync(device)
        elapsed = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2 ** 30 if device.type == "cuda" else None
    return {"label": c.label, "impl": c.impl, "family": c.family, "length": length,
            "tokens_per_s": length / elapsed, "peak_gib": peak, "loss": float(loss)}


def guarded(run: Callable[[], dict], base: dict, device: torch.device) -> dict:
    """``run()``, or ``base`` with the error (out of memory, or what failed) instead of numbers."""
    try:
        return run()
    except torch.cuda.OutOfMemoryError:
        return {**base, "error": "out of memory"}
    except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end of the benchmark
        return {**base, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def contenders(families: list[str], peers: bool) -> list[Contender]:
    ours = [Contender("posexp", f, f, posexp_model(f)) for f in families]
    theirs = [c for c in PEERS if c.family in families and peer_available(c)] if peers else []
    return ours + theirs


def print_rows(title: str, rows: list[dict], columns: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{name:>14s}" if i else f"{name:34s}" for i, (name, _) in enumerate(columns)))
    for r in rows:
        cells = []
        for i, (_, fmt) in enumerate(columns):
            key = columns[i][0]
            value = r.get(key)
            cells.append(f"{r['label']:34s}" if key == "model" else
                         f"{value:>14{fmt}}" if isinstance(value, (int, float)) else f"{str(value or ''):>14s}")
        print("  ".join(cells) + (f"  {r['error']}" if "error" in r else "") +
              (f"  [{r['mode']}]" if r.get("mode", "compiled") != "compiled" else ""))


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.py --gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true",
                    help="on the CPU, tiny shape, fp32, one step, eval at 256 and 512: every code path, no numbers")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--lengths", nargs="*", type=int, default=[1024, 4096],
                    help="training sequence lengths (none: evaluation only)")
    ap.add_argument("--tokens", type=int, default=32768, help="training tokens per step (batch = tokens / length)")
    ap.add_argument("--eval-lengths", nargs="*", type=int, default=[16384, 65536])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="every model eager")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--json", metavar="OUT")
    return ap.parse_args(argv)


def settings(args: argparse.Namespace) -> dict:
    """Device, dtype, shape, lengths and step counts: the GPU's, or a tiny CPU run's for ``--dry-run``."""
    if args.dry_run:
        return dict(device=torch.device("cpu"), dtype=torch.float32, shape=TINY, lengths=[64, 128],
                    eval_lengths=[256, 512], tokens=256, steps=1, warmup=1, compile_=False)
    if not torch.cuda.is_available():
        raise SystemExit("bench.py --gpu: torch sees no CUDA device (--dry-run runs the code paths on a CPU)")
    torch.backends.cuda.matmul.allow_tf32 = True
    return dict(device=torch.device("cuda"), dtype=torch.bfloat16, shape=GPT2_SMALL, lengths=args.lengths,
                eval_lengths=args.eval_lengths, tokens=args.tokens, steps=args.steps, warmup=args.warmup,
                compile_=not args.no_compile)


def summarise(train_rows: list[dict], eval_rows: list[dict], lengths: list[int], eval_lengths: list[int]) -> dict:
    """posexp / best peer per family, training (tokens/s, MFU) per sequence and evaluation per length; printed."""
    summary = {f"train_tokens_per_s_{seq}": best_peer_ratios(train_rows, "tokens_per_s", lambda r, s=seq: r["seq"] == s,
                                                             TARGETS) for seq in lengths}
    summary.update({f"train_mfu_{seq}": best_peer_ratios(train_rows, "mfu", lambda r, s=seq: r["seq"] == s, TARGETS)
                    for seq in lengths})
    summary.update({f"eval_tokens_per_s_{n}": best_peer_ratios(eval_rows, "tokens_per_s",
                                                               lambda r, n=n: r["length"] == n, TARGETS)
                    for n in eval_lengths})
    print("\nposexp / best peer")
    for measure, items in summary.items():
        for x in items:
            ratio = "-" if x["ratio"] is None else f"{x['ratio']:.2f}x"
            target = f" (target >= {x['target']}x)" if x["target"] and measure.startswith("train_tokens") else ""
            print(f"  {measure:28s} {x['family']:8s} {ratio:>7s}{target}  vs {x['best_peer']}")
    return summary


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    s = settings(args)
    device, dtype, shape = s["device"], s["dtype"], s["shape"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"bench.py --gpu: {name}, torch {torch.__version__}, {dtype}; shape {shape}")
    if args.dry_run:
        print("dry run: every code path once on a CPU at a tiny shape; the numbers below measure nothing")
    sizes = [4096, 8192, 16384] if device.type == "cuda" else [128, 256]
    peak = matmul_peak(device, dtype, sizes, reps=10 if device.type == "cuda" else 2)
    print(f"matmul peak: {peak['tflops']:.1f} TFLOP/s {peak['dtype']} {peak['by_size']}")

    models = contenders(args.families, not args.no_peers)
    train_rows = []
    for seq in s["lengths"]:
        sh = dataclasses.replace(shape, seq=seq, batch=max(1, s["tokens"] // seq))
        for c in models:
            base = {"label": c.label, "impl": c.impl, "family": c.family, "seq": seq, "batch": sh.batch}
            train_rows.append(guarded(lambda: train_one(c, sh, device, dtype, s["steps"], s["warmup"], s["compile_"],
                                                        peak["tflops"]), base, device))
        print_rows(f"training, sequence {seq}, batch {sh.batch}", [r for r in train_rows if r["seq"] == seq],
                   [("model", ""), ("tokens_per_s", ",.0f"), ("mfu", ".1%"), ("peak_gib", ".1f")])
    eval_rows = []
    for length in s["eval_lengths"]:
        for c in models:
            base = {"label": c.label, "impl": c.impl, "family": c.family, "length": length}
            eval_rows.append(guarded(lambda: eval_one(c, shape, length, device, dtype), base, device))
        print_rows(f"evaluation, one window of {length} tokens", [r for r in eval_rows if r["length"] == length],
                   [("model", ""), ("tokens_per_s", ",.0f"), ("peak_gib", ".2f")])
    summary = summarise(train_rows, eval_rows, s["lengths"], s["eval_lengths"])
    if args.json:
        atomic_write_json(args.json, {
            "device": name, "torch": torch.__version__, "dtype": str(dtype), "shape": dataclasses.asdict(shape),
            "tokens_per_step": s["tokens"], "steps": s["steps"], "warmup": s["warmup"], "compile": s["compile_"],
            "matmul_peak": peak, "training": train_rows, "evaluation": eval_rows, "ratios": summary,
            "dry_run": args.dry_run})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
