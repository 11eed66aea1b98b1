"""How long ``posexp check`` takes on every built-in encoding, on this machine.

    python scripts/bench_check.py                 # every configs/encoder/*.yaml, one process
    python scripts/bench_check.py --cli           # each as its own `posexp check NAME` command
    python scripts/bench_check.py rope alibi --json bench_check.json

In one process (the default) the time is the checks' own: the interpreter, torch and transformers are imported
once, before the clock starts. With ``--cli`` each encoding is a fresh ``python -m posexp check NAME --format
json``, as a user or a CI job runs it, start-up included. Either way the table lists each encoding's seconds,
its pass / fail / n/a counts, and the total, with the CPU model and core count it was measured on.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def in_process(name: str) -> dict:
    from rich.console import Console

    from posexp.commands.check import check_main

    out = io.StringIO()
    start = time.perf_counter()
    code = check_main(name, [], "json", Console(file=out, width=200))
    return {"seconds": time.perf_counter() - start, "code": code, "report": json.loads(out.getvalue())}


def as_command(name: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "posexp", "check", name, "--format", "json"], capture_output=True,
                          text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "code": proc.returncode, "report": json.loads(proc.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("encoders", nargs="*", help="default: every configs/encoder/*.yaml")
    parser.add_argument("--cli", action="store_true", help="one `posexp check` command per encoding")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    names = args.encoders or sorted(p.stem for p in (REPO / "configs" / "encoder").glob("*.yaml"))
    if not args.cli:
        import posexp.evaluation.conformance.scalings  # noqa: F401  (imports paid before the clock starts)
        try:
            import transformers.modeling_rope_utils  # noqa: F401
        except ImportError:
            pass
    measure = as_command if args.cli else in_process
    rows, start = [], time.perf_counter()
    print(f"| encoder | seconds | pass | fail | n/a |\n|---|---:|---:|---:|---:|", flush=True)
    for name in names:
        m = measure(name)
        counts = {s: sum(c["status"] == s for c in m["report"]["checks"]) for s in ("pass", "fail", "n/a")}
        rows.append({"encoder": name, "seconds": round(m["seconds"], 2), **counts})
        print(f"| {name} | {m['seconds']:.1f} | {counts['pass']} | {counts['fail']} | {counts['n/a']} |", flush=True)
    total = time.perf_counter() - start
    from posexp.runtime.precision import cpu_name

    where = f"{cpu_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    mode = "one `posexp check` command each" if args.cli else "one process"
    print(f"\n{len(names)} encodings in {total:.1f} s ({mode}); {where}")
    if args.json:
        args.json.write_text(json.dumps({"total_seconds": round(total, 2), "mode": mode, "machine": where,
                                         "encoders": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
