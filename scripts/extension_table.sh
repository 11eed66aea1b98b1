#!/usr/bin/env bash
# The README's extension table (section "Pretrained models"): the default rope run (trained at 128 tokens), exported as a
# transformers model and read back through `posexp eval hf:`, under each training-free extension method at 4x, 8x
# and 16x its training length: perplexity and key-token perplexity (LongPPL, Fang et al. 2024), and the zero-shot
# passkey. No public checkpoint can be fetched on the machines this was measured on, so the exported run stands in
# for one; every command below works the same on a Hub model (M=meta-llama/..., eval.lengths of its context).
#
#   bash scripts/extension_table.sh            # about 20 minutes on 1 CPU thread, most of it training; OUT=DIR
#
# Key tokens need an evaluator that reads the long context well: here the default run fine-tuned with PoSE to 2048
# positions (Zhu et al. 2024; trained at 128 tokens, so minutes on a CPU), exported too, so that it reads the same
# tokens as the exported run (one tokenizer).
set -euo pipefail
OUT=${OUT:-outputs/extension_table}
THREADS=${THREADS:-1}
LENGTHS='[512,1024,2048]'   # 4x, 8x, 16x train_len=128
TOKENS=${TOKENS:-65536}     # scored targets per length (eval.tokens' default)

[ -f "$OUT/run/results.json" ] || posexp train train.threads="$THREADS" hydra.run.dir="$OUT/run"
[ -f "$OUT/evaluator/results.json" ] || posexp finetune "$OUT/run" train.positions=pose train.pose_target_len=2048 \
    train.batch_size=32 train.threads="$THREADS" hydra.run.dir="$OUT/evaluator"
[ -d "$OUT/hf" ] || posexp export "$OUT/run" "$OUT/hf"
[ -d "$OUT/evaluator-hf" ] || posexp export "$OUT/evaluator" "$OUT/evaluator-hf"

# perplexity and ppl_key: one job per method, each a run folder of the sweep
posexp eval -m "hf:$OUT/hf" eval.scaling=none,linear,yarn,rerope,self_extend,string,dca eval.lengths="$LENGTHS" \
    eval.tokens="$TOKENS" eval.key_tokens.evaluator="hf:$OUT/evaluator-hf" device=cpu precision=fp32 hydra.sweep.dir="$OUT/ppl"
# the zero-shot passkey (Mohtashami & Jaggi 2023) at the same lengths, for the same methods
posexp eval -m "hf:$OUT/hf" task=passkey eval.scaling=none,linear,yarn,rerope,self_extend,string,dca \
    eval.lengths="$LENGTHS" eval.examples=20 eval.depths='[0.5]' device=cpu precision=fp32 \
    hydra.sweep.dir="$OUT/passkey"

posexp report "$OUT/ppl" "$OUT/passkey" --cols scaling --out "$OUT/report"
python - "$OUT" <<'EOF'
# the README's table: ppl / ppl_key per method and length, read from the sweep's rows
import sys

import posexp

df = posexp.load_runs(f"{sys.argv[1]}/ppl")
df = df[df.metric == "perplexity"].assign(scaling=lambda d: d.scaling.fillna("none"))
order = ["none", "linear", "yarn", "rerope", "self_extend", "string", "dca"]
lengths = sorted(df.length.unique())
print("| `eval.scaling=` | " + " | ".join(f"{n} ({n // 128}x)" for n in lengths) + " |")
print("|---|" + "---:|" * len(lengths))
for method in order:
    rows = df[df.scaling == method].set_index("length")
    cells = [f"{rows.ppl[n]:.2f} / {rows.ppl_key[n]:.2f}" if n in rows.index else "—" for n in lengths]
    print(f"| {method} | " + " | ".join(cells) + " |")
keys = df[df.scaling == "none"].set_index("length").key_tokens
print("key tokens per length: " + ", ".join(f"{n}: {int(keys[n])}" for n in lengths))
acc = posexp.load_runs(f"{sys.argv[1]}/passkey")
acc = acc[acc.metric == "accuracy"].assign(scaling=lambda d: d.scaling.fillna("none"))
print("passkey exact match (%): " + "; ".join(
    f"{m} " + "/".join(f"{100 * v:.0f}" for v in acc[acc.scaling == m].sort_values("length").exact_match)
    for m in order))
EOF
