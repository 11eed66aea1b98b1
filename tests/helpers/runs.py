"""Run folders as posexp writes them (``results.json``, Hydra's ``.hydra/overrides.yaml``), built in a test's
folder without training, for the tests of what reads them: the report, the pivot, ``load_run``.

:func:`make_run` and :func:`make_task_run` write a perplexity or a task run from a few numbers; :func:`write_run`
writes the rows given (:func:`ppl_rows` makes perplexity rows); the two sweeps at the end are among those the
report goldens render.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from posexp.evaluation.accuracy import wilson_interval

EVAL = {"tokens": 65536, "protocol": "nonoverlap"}


def make_run(
    folder: Path,
    ppls: dict[int, float | None],
    overrides: list[str] | None = ("encoder=rope",),
    encoder: str = "rope",
    base: float | None = 10000.0,
    train_len: int = 128,
    fingerprint: str = "fp-stdlib",
    eval_settings: dict | None = None,
    status: str = "completed",
    extra_rows: list[dict] | None = None,
    overrides_in_results: bool = True,
    seed: int = 0,
    config: dict | None = None,
    curves: bool = False,
) -> Path:
    """Write a run folder like the trainer does; a None perplexity means not applicable."""
    overrides = list(overrides or [])
    rows = []
    for length, ppl in ppls.items():
        rows.append({
            "length": length, "multiple": length / train_len, "protocol": "nonoverlap", "scaling": None,
            "applicable": ppl is not None, "ppl": ppl, "loss": None if ppl is None else 1.0,
            "loss_se": 0.01, "ppl_low": None if ppl is None else ppl * 0.98,
            "ppl_high": None if ppl is None else ppl * 1.02, "tokens": 65536, "windows": 65536 // length,
            "tokens_per_s": 40000.0, "peak_mem_mb": 210.0,
        })
    rows += extra_rows or []
    run = {
        "label": " ".join(overrides) or "default", "encoder": encoder, "base": base,
        "train_len": train_len, "seed": seed,
        "config": {"encoder": {"name": encoder}, "base": base, "train_len": train_len, "seed": seed, **(config or {})},
        "config_hash": "ab12",
        "corpus": "stdlib", "corpus_fingerprint": fingerprint, "eval_settings": eval_settings or dict(EVAL),
        "versions": {"posexp": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}, "git_commit": None,
        "status": status, "params": 821504,
        "train": {"steps": 1000, "tokens": 4096000, "final_loss": 1.23, "wall_s": 120.0},
    }
    if overrides_in_results:
        run["overrides"] = overrides
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    (folder / ".hydra").mkdir(exist_ok=True)
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides) or "[]\n")
    if curves:  # what a finished run also writes: per-position losses and the training log
        lines = ["protocol,stride,last_k,scaling,scaling_factor,length,position,loss,count"]
        for length, ppl in ppls.items():
            if ppl is not None:
                lines += [f"nonoverlap,,,,,{length},{p},{1.0 + p / length:.6f},{65536 // length}"
                          for p in range(length)]
        (folder / "loss_by_position.csv").write_text("\n".join(lines) + "\n")
        (folder / "metrics.csv").write_text("step,tokens,loss,lr,tokens_per_s,elapsed_s\n"
                                            "10,1000,3.0,0.001,100.0,1.0\n20,2000,2.5,0.001,100.0,2.0\n")
    return folder


def make_sweep(root: Path, n: int) -> Path:
    for i in range(n):
        make_run(root / str(i), {128: 3.0 + i, 256: 4.0 + i}, overrides=["train.steps=50", f"seed={i}"])
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root


def make_task_run(folder: Path, accuracy: dict[int, float | None], task: str = "copy", encoder: str = "rope",
                  seed: int = 0, train_len: int = 64, examples: int = 200) -> Path:
    """A task run's folder as the trainer writes it; None = not applicable."""
    rows = []
    for length, acc in accuracy.items():
        exact = None if acc is None else round(acc * examples)
        low, high = (None, None) if acc is None else wilson_interval(exact, examples)
        rows.append({"metric": "accuracy", "task": task, "length": length, "multiple": length / train_len,
                     "depth": None, "protocol": "teacher_forced", "scaling": None, "scaling_factor": None,
                     "applicable": acc is not None, "exact_match": None if acc is None else exact / examples,
                     "exact_match_low": low, "exact_match_high": high, "examples": examples})
    overrides = [f"task={task}", f"encoder={encoder}", f"seed={seed}"]
    run = {"label": " ".join(overrides), "overrides": overrides, "encoder": encoder, "train_len": train_len,
           "seed": seed, "status": "completed", "task": {"name": task, "options": {}},
           "config": {"encoder": {"name": encoder}, "seed": seed, "train_len": train_len, "task": {"name": task}}}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return folder


def result_rows(run_dir: Path) -> list[dict]:
    """The rows of the run folder's ``results.json``."""
    return json.loads((run_dir / "results.json").read_text())["rows"]


def ppl_rows(ppls: dict[int, float | None], train_len: int, scaling: str | None = None,
             protocol: str = "nonoverlap") -> list[dict]:
    return [{"length": n, "multiple": n / train_len, "protocol": protocol, "scaling": scaling,
             "scaling_factor": None if scaling is None else max(1.0, n / train_len),
             "applicable": p is not None, "ppl": p, "loss": None if p is None else math.log(p), "loss_se": 0.01,
             "ppl_low": None if p is None else p * 0.98, "ppl_high": None if p is None else p * 1.02,
             "tokens": 65536, "windows": 65536 // n, "tokens_per_s": 40000.0, "peak_mem_mb": 210.0}
            for n, p in ppls.items()]


def write_run(folder: Path, rows: list[dict], overrides: list[str], encoder: str, seed: int = 0,
              train_len: int = 128, base: float | None = 10000.0, extra: dict | None = None,
              config: dict | None = None) -> Path:
    run = {"label": " ".join(overrides) or "default", "overrides": overrides, "encoder": encoder, "base": base,
           "train_len": train_len, "seed": seed,
           "config": {"encoder": {"name": encoder}, "base": base, "train_len": train_len, "seed": seed,
                      **(config or {})},
           "config_hash": hashlib.sha256(folder.as_posix().encode()).hexdigest()[:16], "corpus": "stdlib", "corpus_fingerprint": "fp-stdlib",
           "eval_settings": {"tokens": 65536, "protocol": "nonoverlap"},
           "versions": {"posexp": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}, "git_commit": None,
           "status": "completed", "params": 821504,
           "train": {"steps": 1000, "tokens": 4096000, "final_loss": 1.23, "wall_s": 120.0}, **(extra or {})}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"run": run, "rows": rows}))
    return folder


def longer_finetunes(root: Path) -> Path:
    """A parent trained at 128 and its fine-tunes to 512, the parent evaluated again on another token budget since:
    its rows at 256 and 512 scored other tokens than the fine-tunes'."""
    top = root / "ext512"
    lengths = (128, 256, 512, 1024)
    parent_rows = ppl_rows(dict(zip(lengths, (3.0, 4.5, 9.0, 20.0))), 128)
    for row in parent_rows:
        if row["length"] >= 256:
            row.update(tokens=131072, eval_tokens=131072)
    parent = write_run(top / "parent", parent_rows, ["encoder=rope"], "rope")
    for name, scaling, ppls in (("ft_direct", None, (3.2, 3.1, 3.0, 6.0)), ("ft_yarn", "yarn", (3.1, 3.0, 2.9, 3.4))):
        rows = [{**r, "multiple": r["length"] / 512} for r in ppl_rows(dict(zip(lengths, ppls)), 512)]
        write_run(top / name, rows, ["encoder=rope", f"finetune={name}"], "rope", train_len=512,
                  extra={"parent": str(parent.resolve()), "parent_train_len": 128, "scaling": scaling,
                         "finetune": {"steps": 150}})
    return top


def pretrained_sweep(root: Path) -> Path:
    """``posexp eval -m hf:tiny eval.scaling=none,yarn`` and the same with ``task=passkey``: a folder per scaling
    and task, one model throughout."""
    sweep = root / "hf"
    record = {"name": "tiny", "revision": "abc123", "weights_sha256": None, "parameters": 1000}
    ppls = {"none": (3.0, 4.4, 9.1), "yarn": (3.0, 3.3, 3.9)}
    accs = {"none": (1.0, 0.5, 0.0), "yarn": (1.0, 0.9, 0.6)}
    job = 0
    for scaling in ("none", "yarn"):
        overrides = ["hf.model=tiny", f"eval.scaling={scaling}"]
        rows = ppl_rows(dict(zip((128, 256, 512), ppls[scaling])), 128, None if scaling == "none" else "yarn")
        write_run(sweep / str(job), rows, overrides, "hf:tiny", extra={"pretrained": record},
                  config={"hf": {"model": "tiny"}})
        job += 1
    for scaling in ("none", "yarn"):
        overrides = ["hf.model=tiny", "task=passkey", f"eval.scaling={scaling}"]
        rows = [{"metric": "accuracy", "task": "passkey", "length": n, "multiple": n / 128, "depth": d,
                 "protocol": "teacher_forced", "scaling": None if scaling == "none" else "yarn",
                 "scaling_factor": None, "applicable": True, "exact_match": a, "exact_match_low": 0.0,
                 "exact_match_high": 1.0, "token_accuracy": a, "examples": 20, "examples_asked": 20, "eval_seed": 0}
                for n, a in zip((128, 256, 512), accs[scaling]) for d in (0.0, 1.0)]
        write_run(sweep / str(job), rows, overrides, "hf:tiny",
                  extra={"pretrained": record, "task": {"name": "passkey", "options": {}, "zero_shot": True}},
                  config={"hf": {"model": "tiny"}, "task": {"name": "passkey"}})
        job += 1
    return sweep
