"""The single-device numbers scripts/study_scale.md projects from: training-step memory per token and layer.

    python scripts/bench_scale.py                        # rope, lengths 1,024 and 2,048, activation checkpointing off/on
    python scripts/bench_scale.py --lengths 512 1024 --d-model 256 --layers 4

Each row is a fresh process: a GPT of the given width and depth (vocabulary 256, fp32 on the CPU) takes one
forward + backward pass of a batch of one sequence, and the rise of the resident set's high-water mark over the
step (posexp's :class:`~posexp.runtime.memory.PeakMemory`) is what the activations (and gradients) took. The
difference between two lengths, divided by the added tokens, the layers and the width, gives the bytes each
token keeps per layer and per unit of width: the ``a`` of study_scale.md's formulas (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", §4.1, count 34 bytes in 16-bit activations, i.e.
68 in fp32, without recomputation; with a block recomputed only its input stays: 4 bytes in fp32).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def one(length: int, d_model: int, layers: int, checkpointing: bool) -> dict:
    """One training step's memory rise in this process."""
    import torch

    from posexp.encoders import create
    from posexp.model.gpt import GPT, ModelShape
    from posexp.runtime.memory import PeakMemory
    from posexp.training.sharding import checkpoint_blocks

    torch.manual_seed(0)
    heads = max(1, d_model // 64)
    shape = ModelShape(vocab_size=256, d_model=d_model, n_layers=layers, n_heads=heads, attn_block_size=length)
    model = GPT(shape, create("rope", d_model=d_model, n_heads=heads)).train()
    if checkpointing:
        checkpoint_blocks(model)
    idx = torch.randint(0, 256, (1, length + 1))
    model.token_losses(idx[:, :16], idx[:, 1:17]).mean().backward()  # warm the kernels and allocate the grads
    with PeakMemory(torch.device("cpu")) as peak:
        model.token_losses(idx[:, :-1], idx[:, 1:]).mean().backward()
    return {"length": length, "d_model": d_model, "layers": layers, "checkpointing": checkpointing,
            "step_mib": peak.delta_mb, "params": sum(p.numel() for p in model.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        length, checkpointing = int(args.one[0]), args.one[2] == "1"
        print(json.dumps(one(length, args.d_model, args.layers, checkpointing)))
        return
    rows = []
    for checkpointing in (False, True):
        for length in args.lengths:
            proc = subprocess.run([sys.executable, __file__, "--one", str(length), "x", "1" if checkpointing else "0",
                                   "--d-model", str(args.d_model), "--layers", str(args.layers)],
                                  capture_output=True, text=True, check=True)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print("| checkpointing | length | step MiB |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {'on' if r['checkpointing'] else 'off'} | {r['length']:,} | {r['step_mib']:,.0f} |")
    for checkpointing in (False, True):
        mine = [r for r in rows if r["checkpointing"] == checkpointing]
        lo, hi = mine[0], mine[-1]
        per = (hi["step_mib"] - lo["step_mib"]) * 2 ** 20 / (hi["length"] - lo["length"]) / args.layers / args.d_model
        print(f"checkpointing {'on' if checkpointing else 'off'}: {per:.1f} bytes per token, layer and unit of width "
              f"(fp32; {lo['length']:,} -> {hi['length']:,} tokens, d_model {args.d_model}, {args.layers} layers)")


if __name__ == "__main__":
    main()
