"""Evaluation speed and memory of a transformers model read through posexp's adapter, next to posexp's own model.

    python scripts/bench_hf_eval.py                       # 4K and 16K tokens, the bench shape below
    python scripts/bench_hf_eval.py --vocab 32000         # a Llama-sized vocabulary: where chunked losses matter
    python scripts/bench_hf_eval.py --lengths 1024 --threads 1 --json out.json
    pip install -e '.[hf]'                                # transformers

Three ways of computing the per-token losses of one window (batch 1, untrained weights: speed and memory do not
depend on them), each in a fresh process under an address-space limit, in inference mode after a warm-up window:

- **posexp GPT (rope)**: posexp's own model with a RoPE encoder, ``GPT.token_losses`` called directly;
- **hf adapter**: a random transformers Llama of the same shape through :class:`posexp.hf.model.HFLanguageModel`
  (chunks of ``--chunk`` queries over one key cache, the losses per chunk);
- **hf plain forward**: the same Llama's ordinary forward over the whole window, then the cross-entropy of all its
  logits at once: the baseline the adapter's chunking is measured against.

Shape: vocab 256, d_model 256, 4 layers, 4 heads. posexp's MLP is ``4 d`` with GELU (2 matrices); the Llama's is
gated SiLU (3 matrices) of width ``8 d / 3`` so both have the same MLP weights. Peak memory is the rise of the
resident set's high-water mark during the window (``posexp.runtime.memory.PeakMemory``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from posexp.runtime.memory import PeakMemory

IMPLS = ("posexp", "hf-adapter", "hf-plain")
LABEL = {"posexp": "posexp GPT (rope)", "hf-adapter": "hf adapter (Llama)", "hf-plain": "hf plain forward (Llama)"}


def build(impl: str, vocab: int, d: int, layers: int, heads: int, chunk: int):
    """A callable ``losses(ids (1, L + 1)) -> (1, L)`` for ``impl``."""
    torch.manual_seed(0)
    if impl == "posexp":
        from posexp.encoders import create
        from posexp.model.gpt import GPT, ModelShape

        gpt = GPT(ModelShape(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads),
                  create("rope", d_model=d, n_heads=heads)).eval()
        return lambda ids: gpt.token_losses(ids[:, :-1], ids[:, 1:])
    from transformers import LlamaConfig, LlamaForCausalLM

    from posexp.hf.model import HFLanguageModel

    config = LlamaConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=8 * d // 3, max_position_embeddings=256, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    llama = LlamaForCausalLM(config).eval()
    if impl == "hf-adapter":
        lm = HFLanguageModel(llama, "random-llama", chunk=chunk)
        return lambda ids: lm.token_losses(ids[:, :-1], ids[:, 1:])

    def plain(ids):
        logits = llama(ids[:, :-1]).logits
        return F.cross_entropy(logits.float().flatten(0, 1), ids[0, 1:], reduction="none")[None]

    return plain


def one(args: argparse.Namespace) -> dict:
    """One window of ``args.length`` tokens in this process."""
    torch.set_num_threads(args.threads)
    losses = build(args.impl, args.vocab, args.d_model, args.layers, args.heads, args.chunk)
    ids = torch.randint(0, args.vocab, (1, args.length + 1), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        losses(ids[:, :257])  # warm-up
        with PeakMemory(torch.device("cpu")) as mem:
            t0 = time.perf_counter()
            out = losses(ids)
            elapsed = time.perf_counter() - t0
    return {"impl": args.impl, "label": LABEL[args.impl], "length": args.length, "vocab": args.vocab,
            "chunk": args.chunk if args.impl == "hf-adapter" else None, "threads": args.threads,
            "tokens_per_s": args.length / elapsed, "seconds": elapsed, "peak_mib": mem.delta_mb,
            "mean_loss": float(out.mean())}


def child(args: argparse.Namespace, impl: str, length: int) -> dict:
    cmd = [sys.executable, __file__, "--one", impl, "--length", str(length), "--vocab", str(args.vocab),
           "--chunk", str(args.chunk), "--threads", str(args.threads), "--mem-limit-gib", str(args.mem_limit_gib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"impl": impl, "label": LABEL[impl], "length": length, "error": last[:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Evaluation tokens/s and peak memory: posexp's GPT vs a transformers "
                                            "Llama through posexp.hf.model, at 4K and 16K tokens on this CPU.")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--chunk", type=int, default=1024, help="the adapter's queries per forward call")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--mem-limit-gib", type=float, default=16.0, help="address-space limit of each measurement")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--one", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.set_defaults(d_model=256, layers=4, heads=4)
    args = p.parse_args(argv)
    args.impl = args.one
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.one:
        limit = int(args.mem_limit_gib * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        print(json.dumps(one(args)))
        return
    print(f"shape: vocab {args.vocab}, d_model 256, 4 layers, 4 heads; batch 1; fp32; {args.threads} threads; "
          f"adapter chunk {args.chunk}; torch {torch.__version__}")
    print(f"{'model':<28}{'length':>8}{'tokens/s':>12}{'peak MiB':>10}{'mean loss':>11}")
    rows = []
    for length in args.lengths:
        for impl in args.impls:
            row = child(args, impl, length)
            rows.append(row)
            if "error" in row:
                print(f"{row['label']:<28}{length:>8}  failed: {row['error']}")
                continue
            peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
            print(f"{row['label']:<28}{length:>8}{row['tokens_per_s']:>12.0f}{peak:>10}{row['mean_loss']:>11.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
