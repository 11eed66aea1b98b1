"""Time per token and peak memory of each position remapping against plain evaluation, on this machine.

    python scripts/bench_remap.py                 # posexp's default model shape, 16 x train_len, CPU
    python scripts/bench_remap.py --multiple 8 --hf   # also a transformers Llama of the same shape

Each method reads the same batch of windows (``eval.batch_tokens`` worth) as ``posexp eval`` would, through the
model seam (posexp's own GPT; with ``--hf`` a random ``LlamaForCausalLM`` through :mod:`posexp.hf.remap`), under
``torch.inference_mode``; the time is the best of ``--repeats`` forward passes, the memory the peak above the start
(posexp.runtime.memory.PeakMemory: the process's resident-set high-water mark on CPU). Weights are random: the
cost of attention does not depend on them. The target (issue 44): every remapping within 2x plain evaluation's
time per token at 16x, memory growing linearly with the length (query blocks, never an extra L x L matrix).
"""

from __future__ import annotations

import argparse
import time

import torch

from posexp.config.schema import ModelConfig
from posexp.encoders import create
from posexp.encoders.remapping import REMAPPINGS, Remapping
from posexp.model.gpt import GPT, ModelShape
from posexp.model.interface import Reading
from posexp.runtime.memory import PeakMemory

TRAIN_LEN, VOCAB, BATCH_TOKENS = 128, 256, 16384


def own_model() -> GPT:
    shape = ModelConfig()
    torch.manual_seed(0)
    return GPT(ModelShape(d_model=shape.d_model, n_layers=shape.n_layers, n_heads=shape.n_heads, vocab_size=VOCAB),
               create("rope", d_model=shape.d_model, n_heads=shape.n_heads)).eval()


def hf_model():
    import transformers

    shape = ModelConfig()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=shape.d_model, num_hidden_layers=shape.n_layers,
                                      num_attention_heads=shape.n_heads, intermediate_size=4 * shape.d_model,
                                      max_position_embeddings=TRAIN_LEN)
    torch.manual_seed(0)
    from posexp.hf.model import HFLanguageModel

    return HFLanguageModel(transformers.AutoModelForCausalLM.from_config(config).eval(), "llama")


def reading(kind: str, length: int) -> Reading:
    if kind == "none":
        return Reading()
    if kind == "rerope":
        return Reading(kind, float(TRAIN_LEN // 2), TRAIN_LEN, length)
    remap = Remapping.of(kind, {}, TRAIN_LEN, length)
    return Reading(kind, remap.factor or 1.0, TRAIN_LEN, length, None, None, remap=remap)


def measure(model, kind: str, length: int, repeats: int) -> tuple[float, float]:
    """(microseconds per token, peak MiB above the start) of one batch of windows read as ``kind``."""
    batch = max(1, BATCH_TOKENS // length)
    idx = torch.randint(0, VOCAB, (batch, length + 1), generator=torch.Generator().manual_seed(0))
    best = float("inf")
    mem = PeakMemory(torch.device("cpu"))
    with torch.inference_mode(), model.reading(reading(kind, length)):
        model.token_losses(idx[:, :-1], idx[:, 1:])  # warm-up
        with mem:
            for _ in range(repeats):
                t0 = time.perf_counter()
                model.token_losses(idx[:, :-1], idx[:, 1:])
                best = min(best, time.perf_counter() - t0)
    return 1e6 * best / (batch * length), mem.delta_mb or float("nan")


def table(name: str, model, multiple: int, repeats: int) -> None:
    length = multiple * TRAIN_LEN
    plain_t, plain_m = measure(model, "none", length, repeats)
    print(f"\n{name}, {length} tokens ({multiple}x train_len {TRAIN_LEN}), {torch.get_num_threads()} thread(s)")
    print(f"{'method':<12} {'us/token':>9} {'x plain':>8} {'peak MiB':>9}")
    print(f"{'none':<12} {plain_t:9.2f} {1.0:8.2f} {plain_m:9.1f}")
    for kind in REMAPPINGS:
        t, m = measure(model, kind, length, repeats)
        print(f"{kind:<12} {t:9.2f} {t / plain_t:8.2f} {m:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multiple", type=int, default=16, help="length as a multiple of train_len (16)")
    parser.add_argument("--repeats", type=int, default=3, help="forward passes timed per method, best kept (3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    parser.add_argument("--hf", action="store_true", help="also a transformers Llama of the same shape")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table("posexp run (default shape, rope)", own_model(), args.multiple, args.repeats)
    if args.hf:
        table("transformers Llama (same shape)", hf_model(), args.multiple, args.repeats)


if __name__ == "__main__":
    main()
