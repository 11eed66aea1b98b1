"""LongRoPE's evolutionary search for a rope run's per-frequency factors (Ding et al. 2024), with its progress.

    python scripts/longrope_search.py outputs/DATE/TIME --target-len 512          # 4x a run trained at 128
    python scripts/longrope_search.py RUN --target-len 512 --population 16 --generations 8 --json factors.json

Scores each candidate by perplexity at the target length on held-out tokens apart from the ones ``posexp eval``
scores (``posexp/evaluation/longrope_search.py`` says how), then prints the factors found as the overrides that use
them: ``posexp eval RUN eval.scaling=longrope eval.longrope_factors=[...]`` and ``posexp finetune RUN
scaling=longrope longrope_factors=[...]``. Minutes on a CPU at the default model's size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished rope run folder")
    ap.add_argument("--target-len", type=int, required=True, help="the context length the factors are for")
    ap.add_argument("--tokens", type=int, default=8192, help="held-out targets scored per candidate (default 8192)")
    ap.add_argument("--population", type=int, default=12)
    ap.add_argument("--generations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the factors and the search's numbers here")
    args = ap.parse_args(argv)

    import torch

    import posexp
    from posexp.data.corpus import corpus_from_config
    from posexp.errors import PosexpError
    from posexp.evaluation.longrope_search import SearchSettings, perplexity_score, search_factors
    from posexp.evaluation.runner import eval_dtype

    try:
        run = posexp.load_run(args.run)
        cfg, model = run.config, run.model
        encoder = model.encoder
        if getattr(encoder, "name", None) != "rope" or getattr(encoder, "rot_dim", None) is None:
            raise PosexpError(f"{args.run}: LongRoPE rescales rope's frequencies; this run's encoder is "
                              f"{getattr(encoder, 'name', '?')!r}")
        if args.target_len <= cfg.train_len:
            raise PosexpError(f"--target-len: must be longer than the run's train_len {cfg.train_len}")
        val = corpus_from_config(cfg).val
        device = torch.device("cpu")
        dtype = eval_dtype(cfg, device, (run.info.get("train") or {}).get("precision"))
        score = perplexity_score(model, val, cfg, args.target_len, args.tokens, device, dtype)
        factor = args.target_len / cfg.train_len
        start = time.perf_counter()
        settings = SearchSettings(population=args.population, generations=args.generations, seed=args.seed)
        result = search_factors(score, int(encoder.rot_dim), float(encoder.base), factor, int(cfg.train_len),
                                settings, log=lambda m: print(f"{m} ({time.perf_counter() - start:.0f} s)", flush=True))
    except PosexpError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    listed = "[" + ",".join(f"{f:g}" for f in result.factors) + "]"
    print(f"best ppl at {args.target_len}: {result.ppl:.3f} (pi {result.initial['pi']:.3f}, ntk "
          f"{result.initial['ntk']:.3f}, yarn {result.initial['yarn']:.3f}) on {args.tokens} held-out targets")
    print(f"posexp eval {args.run} eval.scaling=longrope 'eval.longrope_factors={listed}'")
    print(f"posexp finetune {args.run} train_len={args.target_len} scaling=longrope 'longrope_factors={listed}'")
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), "target_len": args.target_len, "tokens": args.tokens,
                                         "factors": result.factors, "ppl": result.ppl, "initial": result.initial,
                                         "history": result.history, "seed": args.seed}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
