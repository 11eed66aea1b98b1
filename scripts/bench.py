"""Training and evaluation speed of posexp next to other implementations, on this machine.

    python scripts/bench.py                          # everything at the fixed shape below
    python scripts/bench.py --quick                  # a tiny shape: a smoke check in about a minute
    python scripts/bench.py --gpu                    # on a GPU: GPT-2-small shape, bf16 (scripts/bench_gpu.py)
    python scripts/bench.py --families rope alibi --steps 5 --json bench.json
    pip install -e '.[bench]'                        # the peers: transformers, x-transformers

One run measures, side by side in one process and one time window:

1. **matmul peak**: GFLOP/s of square fp32 and bf16 matrix products, the best
   of a few sizes (median of repeats per size).
2. **training**: tokens/s of a full optimizer step (forward, cross-entropy,
   backward, gradient clipping at 1.0, AdamW) for each posexp encoding family,
   in fp32 and with ``train.precision=auto``, and for each installed peer at
   the same shape: transformers Llama (RoPE), GPT-2 (learned) and Bloom
   (ALiBi); x-transformers with rotary, ALiBi, T5 bias, learned absolute
   positions and none. Every model takes the same AdamW (posexp's own
   ``make_optimizer``: same groups, betas, weight decay, implementation) and
   the same torch thread count. Steps run round-robin over all models (one
   step of each, then the next round), so a load change on a shared machine
   hits them all alike; tokens/s is batch x length over the median timed
   step, after warm-up steps. MFU is the model's training FLOP/s over the
   fp32 matmul GFLOP/s probed in the same rounds.
3. **evaluation**: tokens/s and peak memory of one window of 4,096 and 16,384
   tokens (batch 1, untrained weights: speed and memory do not depend on
   them), each in a fresh process under an address-space limit, so that a
   model that materialises heads x L x L scores fails alone instead of
   pushing the machine into swap. Every model runs the same thing: its
   forward pass and the cross-entropy, in inference mode, after a warm-up
   window of the training length (``posexp eval`` adds its bookkeeping on
   top; ``scripts/bench_eval.py`` measures that on the default model). Peak
   memory is the rise of the resident set's high-water mark during the
   window (``posexp.runtime.memory.PeakMemory``).
4. **ratios**: posexp / best peer of each family, in tokens/s and in MFU.

FLOPs per trained token (counted from the configuration, the convention of
Chowdhery et al. 2022, "PaLM", Appendix B)::

    6 * N + 12 * n_layers * d_model * L
    N = n_layers * (4 * d_model^2 + k * d_model * d_ff) + vocab * d_model

``N`` counts the weights that take part in a matrix product: q, k, v and
output projections, the MLP (``k = 2`` matrices, or 3 for a gated MLP like
Llama's), and the output head (tied or not, it is a product). The second term
is attention's ``QK^T`` and ``AV`` over the full L x L, as PaLM counts it
(a causal kernel may skip half). Not counted: embedding lookups, norms,
biases, activations, softmax, rotations and bias tables (O(d) per token).

Shape (fixed so numbers compare across machines and commits): vocab 256,
d_model 256, 4 layers, 4 heads, MLP 4 x d_model, sequence 256, batch 16, no
dropout. Differences a peer cannot switch off are printed with its row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import Tensor

from posexp.runs.atomic import atomic_write_json
from posexp.runtime.memory import PeakMemory
from posexp.runtime.precision import bf16_is_native

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gpu  # noqa: E402
from benchlib import (CLOCKS, FAMILIES, FAMILY_LABEL, PEERS, QUICK, Clock, Contender, Shape, Trainee,  # noqa: E402
                      all_contenders, best_peer_ratios, logits_of, matmul_gflops, matmul_peak, peer_available,
                      posexp_model, train_flops_per_token)


def bench_training(contenders: list[tuple[Contender, str]], shape: Shape, steps: int, warmup: int,
                   log: Callable[[str], None], clock: Clock) -> tuple[list[dict], float]:
    """Round-robin timed steps; rows per contender and the median fp32 matmul probe of the same rounds."""
    batch = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=torch.Generator().manual_seed(0))
    trainees = []
    for c, precision in contenders:
        try:
            trainees.append(Trainee(c, shape, precision, batch, clock))
        except Exception as e:  # a peer whose installed version cannot be configured this way
            log(f"  {c.label}: not built ({type(e).__name__}: {e})")
    probe_n = 1024 if shape.d_model >= 256 else 512
    probes = []
    for r in range(warmup + steps):
        timed = r >= warmup
        for t in trainees:
            t.step(timed)
        if timed:
            probes.append(matmul_gflops(probe_n, torch.float32, 1, clock))
        log(f"  round {r + 1}/{warmup + steps}{'' if timed else ' (warm-up)'}")
    probe = statistics.median(probes)
    rows = []
    tokens = shape.batch * shape.seq
    for t in trainees:
        c = t.contender
        step_s = statistics.median(t.times)
        flops = train_flops_per_token(shape, c.mlp_matrices)
        tps = tokens / step_s
        rows.append({"impl": c.impl, "name": c.name, "family": c.family, "label": c.label,
                     "precision": t.precision, "dtype": str(t.dtype).replace("torch.", ""),
                     "precision_choice": t.choice.record(),
                     "tokens_per_s": tps, "step_s_median": step_s, "step_s_all": t.times,
                     "params": sum(p.numel() for p in t.model.parameters()),
                     "flops_per_token": flops, "gflops": tps * flops / 1e9,
                     "mfu": tps * flops / 1e9 / probe, "final_loss": t.loss, "notes": c.notes})
    return rows, probe


def eval_one(impl: str, family: str, name: str, shape: Shape, length: int, clock: Clock) -> dict:
    """One window of ``length`` tokens in this process: tokens/s and memory."""
    c = next(c for c in all_contenders() if (c.impl, c.family, c.name) == (impl, family, name))
    torch.manual_seed(0)
    model = c.build(shape, length).eval()
    row = {"impl": impl, "family": family, "name": name, "label": c.label, "length": length,
           "threads": torch.get_num_threads()}
    idx = torch.randint(0, shape.vocab, (1, length + 1), generator=torch.Generator().manual_seed(0))

    def forward(ids: Tensor) -> float:
        logits = logits_of(model, ids[:, :-1])
        return float(F.cross_entropy(logits.float().flatten(0, 1), ids[0, 1:]))

    with torch.inference_mode():
        forward(idx[:, :shape.seq + 1])  # warm-up
        with PeakMemory(torch.device("cpu")) as mem:
            t0 = clock()
            forward(idx)
            elapsed = clock() - t0
    row.update(tokens_per_s=length / elapsed, eval_peak_mib=mem.delta_mb)
    row["process_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def eval_child(c: Contender, shape: Shape, length: int, mem_limit_gib: float, threads: int, clock: str) -> dict:
    cmd = [sys.executable, __file__, "--eval-one", c.impl, c.family, c.name, str(length), "--threads", str(threads),
           "--clock", clock,
           "--mem-limit-gib", str(mem_limit_gib), "--shape", json.dumps(asdict(shape))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    base = {"impl": c.impl, "family": c.family, "name": c.name, "label": c.label, "length": length}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[-1]
        oom = "memory" in last.lower() or "alloc" in last.lower() or proc.returncode < 0
        return {**base, "error": f"out of memory (limit {mem_limit_gib:g} GiB)" if oom else last[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_training(console, train_rows: list[dict], shape: Shape, probe: float, peak32: dict, auto: str) -> None:
    table = Table(title=f"training, batch {shape.batch} x {shape.seq} tokens, d_model {shape.d_model}, "
                        f"{shape.n_layers} layers, {shape.n_heads} heads, MLP {shape.d_ff}, vocab {shape.vocab}")
    for col in ("model", "precision", "tokens/s", "MFLOP/token", "GFLOP/s", "MFU", "params", "differs from posexp by"):
        table.add_column(col, justify="left" if col in ("model", "differs from posexp by") else "right")
    for r in sorted(train_rows, key=lambda r: (FAMILIES.index(r["family"]), r["impl"] != "posexp")):
        table.add_row(r["label"], r["precision"] if r["precision"] == "fp32" else f"{r['precision']} ({r['dtype']})",
                      f"{r['tokens_per_s']:,.0f}", f"{r['flops_per_token'] / 1e6:.1f}", f"{r['gflops']:.1f}",
                      f"{r['mfu']:.0%}", f"{r['params'] / 1e6:.2f}M", r["notes"])
    console.print(table)
    console.print(f"MFU = training GFLOP/s / fp32 matmul {probe:.1f} GFLOP/s (n=1024 products probed in the same "
                  f"rounds; standalone peak {peak32['gflops']:.1f}). precision=auto on this CPU: {auto}"
                  + ("; its rows would equal the fp32 rows, so they are not timed twice." if auto == "float32" else "."))
    nope = next((r for r in train_rows if r["impl"] == "posexp" and r["family"] == "none"), None)
    if nope:
        rel = ", ".join(f"{r['family']} {r['tokens_per_s'] / nope['tokens_per_s']:.2f}x" for r in train_rows
                        if r["impl"] == "posexp" and r["family"] != "none" and r["precision"] == "fp32")
        console.print(f"posexp families / posexp NoPE (tokens/s): {rel}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true",
                    help="on a CUDA GPU instead: GPT-2-small shape, bf16, evaluation at 16K and 64K tokens "
                         "(scripts/bench_gpu.py; python scripts/bench.py --gpu --help lists its options)")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per model (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed training steps per model first")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--quick", action="store_true", help=f"tiny shape {QUICK}, 3 steps, eval at 512: a smoke check")
    ap.add_argument("--json", metavar="OUT", help="write every number to this JSON file")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads, the same for all")
    ap.add_argument("--eval-lengths", nargs="*", type=int, default=None,
                    help="evaluation window lengths (default 4096 16384; none to skip)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time; cpu: process CPU seconds / threads, which leaves out waiting for a "
                         "core on a shared machine (exact with --threads 1)")
    ap.add_argument("--no-train", action="store_true", help="skip the training section")
    ap.add_argument("--no-peers", action="store_true", help="posexp only")
    ap.add_argument("--mem-limit-gib", type=float, default=8.0, help="address-space limit of each evaluation process")
    ap.add_argument("--eval-one", nargs=4, metavar=("IMPL", "FAMILY", "NAME", "LENGTH"), help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def contenders(args: argparse.Namespace, native: bool, log: Callable[[str], None]) -> tuple[list, list, list]:
    """posexp's models, the installed peers, and the (model, precision) pairs to train."""
    ours = [Contender("posexp", f, f, posexp_model(f)) for f in args.families]
    peers = [] if args.no_peers else [c for c in PEERS if c.family in args.families]
    missing = sorted({c.impl for c in peers if not peer_available(c)})
    if missing:
        log(f"not installed, skipped: {', '.join(missing)} (pip install -e '.[bench]')")
    peers = [c for c in peers if peer_available(c)]
    runs = [(c, "fp32") for c in ours]
    if native:  # auto may be either dtype here: time it too (scripts/bench_precision.py: fp32, bf16 and auto)
        runs += [(c, "auto") for c in ours]
    return ours, peers, runs + [(c, "fp32") for c in peers]


def evaluation_section(console: Console, models: list[Contender], shape: Shape, lengths: list[int],
                       args: argparse.Namespace, log: Callable[[str], None]) -> list[dict]:
    """One window per model and length, each in a fresh process; the table of them."""
    rows = []
    et = Table(title=f"evaluation, one window, batch 1 (address-space limit {args.mem_limit_gib:g} GiB per process)")
    for col in ("model", "length", "tokens/s", "eval peak MiB", "process peak MiB"):
        et.add_column(col, justify="left" if col == "model" else "right")
    for c in models:
        for length in lengths:
            log(f"  eval {c.label} at {length:,}")
            r = eval_child(c, shape, length, args.mem_limit_gib, args.threads, args.clock)
            rows.append(r)
            if "error" in r:
                et.add_row(c.label, f"{length:,}", r["error"], "", "")
            else:
                et.add_row(c.label, f"{length:,}", f"{r['tokens_per_s']:,.0f}",
                           f"{r['eval_peak_mib']:,.0f}" if r["eval_peak_mib"] is not None else "?",
                           f"{r['process_peak_mib']:,.0f}")
    console.print(et)
    console.print("eval peak = rise of the RSS high-water mark during the window; learned tables are built "
                  "with as many rows as the window (speed only: untrained rows).")
    return rows


def ratios_section(console: Console, train_rows: list[dict], eval_rows: list[dict], lengths: list[int]) -> dict:
    """posexp / best peer of each family, in training tokens/s and MFU and in evaluation tokens/s per length."""
    ratios = {"train_tokens_per_s": best_peer_ratios(train_rows, "tokens_per_s"),
              "train_mfu": best_peer_ratios(train_rows, "mfu")}
    for length in lengths:
        ratios[f"eval_tokens_per_s_{length}"] = best_peer_ratios(eval_rows, "tokens_per_s",
                                                                 lambda r, n=length: r["length"] == n)
    rt = Table(title="posexp / best peer of the same family")
    for col in ("family", "measure", "posexp", "best peer", "peer", "ratio"):
        rt.add_column(col, justify="left" if col in ("family", "measure", "best peer") else "right")
    for measure, items in ratios.items():
        f = "{:.0%}" if measure == "train_mfu" else "{:,.0f}"
        for x in items:
            rt.add_row(FAMILY_LABEL[x["family"]], measure, f.format(x["posexp"]), x["best_peer"],
                       "-" if x["peer"] is None else f.format(x["peer"]),
                       "-" if x["ratio"] is None else f"{x['ratio']:.2f}x")
    if rt.row_count:
        console.print(rt)
    return ratios


def eval_one_main(args: argparse.Namespace) -> None:
    """The child process of one evaluation window: prints its row as JSON."""
    limit = int(args.mem_limit_gib * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    impl, family, name, length = args.eval_one
    print(json.dumps(eval_one(impl, family, name, Shape(**json.loads(args.shape)), int(length), Clock(args.clock))))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--gpu" in argv:  # the GPU benchmark has its own shape and options
        return bench_gpu.main(argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.eval_one:
        return eval_one_main(args)
    console = Console(width=max(Console().width, 150))
    log = lambda msg: console.print(f"[dim]{msg}[/]")  # noqa: E731
    shape = QUICK if args.quick else Shape()
    steps = min(args.steps, 3) if args.quick else args.steps
    eval_lengths = args.eval_lengths if args.eval_lengths is not None else ([512] if args.quick else [4096, 16384])
    clock = Clock(args.clock)
    console.print(f"[bold]posexp bench[/]: torch {torch.__version__}, {args.threads} threads, {args.clock} clock, "
                  f"{torch.backends.cpu.get_cpu_capability()} ({platform.processor() or platform.machine()}); "
                  f"shape {shape}")
    sizes_fp32, sizes_bf16 = ([256, 512], [128]) if args.quick else ([512, 1024, 2048], [256, 512])
    peak32 = matmul_peak(sizes_fp32, torch.float32, reps=5, clock=clock)
    peak16 = matmul_peak(sizes_bf16, torch.bfloat16, reps=3, clock=clock)
    native = bf16_is_native(torch.device("cpu"))
    auto = "measured per model (a probe of both)" if native else "float32"
    console.print(f"matmul peak: fp32 {peak32['gflops']:.1f} GFLOP/s {peak32['by_size']}, "
                  f"bf16 {peak16['gflops']:.1f} GFLOP/s {peak16['by_size']} "
                  f"(bf16 / fp32 = {peak16['gflops'] / peak32['gflops']:.2f}); precision=auto -> {auto}")
    ours, peers, runs = contenders(args, native, log)
    train_rows, probe = [], float("nan")
    if not args.no_train:
        console.print(f"training: {len(runs)} models, {args.warmup} warm-up + {steps} timed steps each, round-robin")
        train_rows, probe = bench_training(runs, shape, steps, args.warmup, log, clock)
        print_training(console, train_rows, shape, probe, peak32, auto)
    eval_rows = evaluation_section(console, ours + peers, shape, eval_lengths, args, log) if eval_lengths else []
    ratios = ratios_section(console, train_rows, eval_rows, eval_lengths)
    if args.json:
        atomic_write_json(args.json, {
            "shape": asdict(shape), "threads": args.threads, "clock": args.clock, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_average": os.getloadavg(),
            "steps": steps, "warmup": args.warmup, "matmul_peak": {"fp32": peak32, "bf16": peak16},
            "matmul_probe_fp32_gflops": probe, "precision_auto": auto, "training": train_rows,
            "evaluation": eval_rows, "ratios": ratios,
            "flops_formula": "6*N + 12*n_layers*d_model*seq, N = n_layers*(4 d^2 + k d d_ff) + vocab d (PaLM App. B)"})
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
