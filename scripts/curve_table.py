"""The extrapolation curves of finished runs (eval.during_training) as markdown tables, one row per run.

    python scripts/curve_table.py outputs/multirun/DATE/TIME                 # 4x against 1x, at 8 steps
    python scripts/curve_table.py RUNS... --multiple 8 --steps 50,100,500

Reads each run's curve.csv (runs without one are left out). The first table: perplexity at the multiple over
perplexity at 1x, at each step shown, then the step from which it stayed more than 10% above (as the
curve section of ``posexp report`` says it); the second: the two perplexities themselves.
"""

from __future__ import annotations

import argparse

from posexp.reporting import find_runs, read_run
from posexp.reporting.curve_report import DIVERGED, diverged_from
from posexp.runs.curve import read_curve
from posexp.runs.layout import PERPLEXITY

COLUMNS = 8  # at most this many steps shown when --steps is not given, evenly spaced up to the last one


def _steps(all_steps: list[int], chosen: str | None) -> list[int]:
    if chosen:
        return [int(s) for s in chosen.split(",")]
    stride = -(-(len(all_steps) - 1) // (COLUMNS - 1)) or 1  # evenly spaced, ending at the last step
    return all_steps[::-1][::stride][::-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="run folders, sweep folders, or folders above them")
    ap.add_argument("--multiple", type=float, default=4, help="the longer length, as a multiple (default 4)")
    ap.add_argument("--steps", help="steps to show, comma-separated (default: 8 spread over the run)")
    args = ap.parse_args()
    curves = []
    for folder in find_runs(args.paths):
        metric, rows = read_curve(folder)
        if metric == PERPLEXITY and rows:
            curves.append((str(read_run(folder).info.get("encoder") or folder.name), rows))
    if not curves:
        raise SystemExit("no run with a perplexity curve.csv (train with eval.during_training.every=N)")
    steps = _steps(sorted({r["step"] for _, rows in curves for r in rows}), args.steps)
    m = f"{args.multiple:g}x"
    head = ["encoder", *(str(s) for s in steps)]
    print(f"ppl@{m} / ppl@1x at training step ...; last column: the step from which it stayed above "
          f"{1 + DIVERGED:g}\n")
    print("| " + " | ".join([*head, "above from"]) + " |\n|" + " --- |" + " ---: |" * (len(steps) + 1))
    for name, rows in curves:
        ppl = {(r["step"], r["multiple"]): r["ppl"] for r in rows}
        cells = [f"{ppl[s, args.multiple] / ppl[s, 1.0]:.2f}" if (s, args.multiple) in ppl and (s, 1.0) in ppl
                 else "n/a" for s in steps]
        since = diverged_from(rows, args.multiple)[1]
        print("| " + " | ".join([name, *cells, "—" if since is None else str(since)]) + " |")
    print(f"\nperplexity per byte at 1x / {m} at training step ...\n")
    print("| " + " | ".join(head) + " |\n|" + " --- |" + " ---: |" * len(steps))
    for name, rows in curves:
        ppl = {(r["step"], r["multiple"]): r["ppl"] for r in rows}
        cells = [f"{ppl.get((s, 1.0), float('nan')):.2f} / " +
                 (f"{ppl[s, args.multiple]:.2f}" if (s, args.multiple) in ppl else "n/a") for s in steps]
        print("| " + " | ".join([name, *cells]) + " |")


if __name__ == "__main__":
    main()
