"""Peak memory and speed of long-context evaluation, and a side-by-side with transformers.

    python scripts/bench_eval.py                       # alibi, t5, rope at 4,096 and 16,384 tokens
    python scripts/bench_eval.py --lengths 4096 8192 --encoders alibi
    python scripts/bench_eval.py --no-hf               # skip the transformers comparison

Each (encoder, length) runs in a fresh Python process on the default model
(configs/model/small.yaml; untrained weights: speed and memory do not
depend on them) and evaluates one window of L tokens exactly as ``posexp
eval`` does, so its memory is measured alone. Two memory numbers per row:

* eval peak: the evaluator's own measure, the rise of the resident set's
  high-water mark (VmHWM, reset before the window) over the memory in use
  before it: what evaluating this length needs on top of the loaded model;
* process peak: the child's whole lifetime peak RSS (ru_maxrss), including
  Python, torch's libraries and the model: what ``top`` would show.

If transformers is installed, it also times a forward pass of Llama (RoPE) and
Bloom (ALiBi) of the same width, depth and heads at 1,024 tokens (8x the
default training length) next to posexp's rope and alibi models.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _default_shape() -> dict:
    """The default model's width, depth and heads, from the config schema (what ``posexp train`` builds)."""
    from posexp.config.schema import ModelConfig

    m = ModelConfig()
    return {"d_model": m.d_model, "n_layers": m.n_layers, "n_heads": m.n_heads}


DEFAULT_SHAPE = _default_shape()
TRAIN_LEN = 128
VOCAB = 256


def _model(encoder: str):
    import torch

    from posexp.encoders import create
    from posexp.model.gpt import GPT, ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, **DEFAULT_SHAPE)
    return GPT(shape, create(encoder, d_model=shape.d_model, n_heads=shape.n_heads)).eval()


def one(encoder: str, length: int) -> dict:
    """Evaluate one window of ``length`` tokens in this process; the row plus the process peak."""
    import numpy as np
    import torch

    from posexp.config.schema import EvalConfig
    from posexp.evaluation.perplexity import evaluate

    model = _model(encoder)
    val = np.random.default_rng(0).integers(0, VOCAB, length + 1, dtype=np.uint8)
    settings = EvalConfig(lengths=[length], tokens=length, batch_tokens=length)
    row = evaluate(model, val, settings, TRAIN_LEN, torch.device("cpu"))[0]
    return {"encoder": encoder, "length": length, "tokens_per_s": row["tokens_per_s"],
            "eval_peak_mib": row["peak_mem_mb"], "process_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "eval_s": row["eval_s"], "threads": torch.get_num_threads()}


def _child(encoder: str, length: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--one", encoder, str(length)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        return {"encoder": encoder, "length": length, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _time(fn, reps: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def hf_side_by_side(length: int, batch: int, reps: int) -> list[tuple[str, str, float, float]]:
    """(posexp model, transformers model, posexp tokens/s, transformers tokens/s) for a forward pass."""
    import torch
    import transformers

    d, layers, heads = DEFAULT_SHAPE["d_model"], DEFAULT_SHAPE["n_layers"], DEFAULT_SHAPE["n_heads"]
    idx = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=d, intermediate_size=4 * d, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=length,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True)).eval()
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=d, n_layer=layers, n_head=heads)).eval()
    out = []
    with torch.inference_mode():
        for ours, theirs, model in (("rope", "Llama (RoPE)", llama), ("alibi", "Bloom (ALiBi)", bloom)):
            mine = _model(ours)
            t_ours = _time(lambda: mine(idx), reps)
            t_theirs = _time(lambda: model(input_ids=idx, use_cache=False), reps)
            out.append((ours, theirs, batch * length / t_ours, batch * length / t_theirs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoders", nargs="+", default=["alibi", "t5", "rope"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[4096, 16384])
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--hf-length", type=int, default=8 * TRAIN_LEN)
    ap.add_argument("--hf-batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--one", nargs=2, metavar=("ENCODER", "LENGTH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]))))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console()
    shape = ", ".join(f"{k} {v}" for k, v in DEFAULT_SHAPE.items())
    table = Table(title=f"posexp eval: one window, default model ({shape}), CPU")
    for col in ("encoder", "length", "tokens/s", "eval peak MiB", "process peak MiB", "peak / shortest"):
        table.add_column(col, justify="left" if col == "encoder" else "right")
    threads = set()
    for enc in args.encoders:
        first = None
        for length in args.lengths:
            r = _child(enc, length)
            if "error" in r:
                table.add_row(enc, f"{length:,}", "failed", " ".join(r["error"]), "", "")
                continue
            threads.add(r["threads"])
            first = first or r["eval_peak_mib"]
            table.add_row(enc, f"{length:,}", f"{r['tokens_per_s']:,.0f}", f"{r['eval_peak_mib']:,.0f}",
                          f"{r['process_peak_mib']:,.0f}", f"{r['eval_peak_mib'] / first:.2f}x")
    console.print(table)
    console.print(f"torch threads: {', '.join(map(str, sorted(threads)))}; eval peak = rise of the RSS high-water "
                  "mark during the window; process peak = lifetime max RSS of the child process")

    if args.no_hf:
        return
    try:
        import transformers  # noqa: F401
    except ImportError:
        console.print("transformers is not installed: no side-by-side (pip install transformers)")
        return
    t = Table(title=f"forward pass, batch {args.hf_batch} x {args.hf_length:,} tokens (best of {args.reps}), "
                    "same width/depth/heads")
    for col in ("posexp", "tokens/s", "transformers", "tokens/s", "posexp / transformers"):
        t.add_column(col, justify="right")
    for ours, theirs, a, b in hf_side_by_side(args.hf_length, args.hf_batch, args.reps):
        t.add_row(ours, f"{a:,.0f}", theirs, f"{b:,.0f}", f"{a / b:.2f}x")
    console.print(t)
    console.print("Llama's MLP is SwiGLU (3 matrices of 128x512) where posexp's is GELU (2), so Llama does "
                  "~1.5x the MLP work per token; Bloom's MLP matches posexp's.")


if __name__ == "__main__":
    main()
