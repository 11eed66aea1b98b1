"""Re-run one of the measured studies and rewrite its tables in ``scripts/study_NAME.md``.

    python scripts/study.py --list                 # the studies and what each costs
    python scripts/study.py tasks --dry-run        # the commands it would run, nothing runs
    python scripts/study.py converged              # train the sweeps, then posexp report into study_converged.md

Each study is the sweeps its tables came from (``posexp train -m ...`` into
``outputs/studies/NAME/``) followed by ``posexp report ... --format markdown``
(or, for speed and memory, the benchmark script that measures them). The
markdown beside this script is what the study last produced: its header names
the commit and the machine it ran on. A re-run replaces the header and the
tables and keeps the section ``## Reading``, which a person writes after
looking at the numbers (and which names the commit it was written for). The
sweeps run two one-thread jobs at a time through Hydra's joblib launcher
(``pip install -e '.[sweeps]'``).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
POSEXP = [sys.executable, "-m", "posexp"]
ONE_THREAD = "train.threads=1"
READING = "## Reading"
LM_SIX = "encoder=none,sinusoidal,learned,rope,alibi,t5"
TASK_FIVE = "encoder=none,sinusoidal,rope,alibi,t5"
PARALLEL = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]  # two one-thread runs at a time
CURVE_STEPS = "25,50,100,150,200,300,400,500"  # the curve study's columns


@dataclass
class Table:
    """One table of a study: the command whose standard output is the table, under a title."""

    title: str
    command: list[str]


@dataclass
class Study:
    """The sweeps a study trains (each into its own folder) and the tables it reads from them."""

    about: str
    cost: str
    sweeps: dict[str, list[str]] = field(default_factory=dict)  # folder name -> posexp arguments
    tables: list[Table] = field(default_factory=list)
    evals: list[list[str]] = field(default_factory=list)  # posexp eval arguments, run on the sweeps before the tables


def _report(folders: list[str], *options: str) -> list[str]:
    return [*POSEXP, "report", *folders, *options, "--format", "markdown"]


def _sweep(*args: str) -> list[str]:
    return ["train", "-m", *args, ONE_THREAD, *PARALLEL]


def _bench(script: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / script), *args]


STUDIES = {
    "default": Study(
        "the six core encodings at the default budget on the built-in data (the README's headline table)",
        "about 3 minutes of training per encoding on 2 cores",
        {"six": _sweep(LM_SIX)},
        [Table("perplexity per byte at 1x-16x the training length", _report(["{six}"], "--by", "encoder"))]),
    "curve": Study(
        "the six core encodings at the default budget, measured at 1x-8x every 25 steps while they train "
        "(eval.during_training), and what that costs",
        "about 3 minutes of training per encoding on 2 cores, then 2 default runs for the overhead",
        {"six": _sweep(LM_SIX, "eval.during_training.every=25")},
        [Table("4x against 1x as training goes", _bench("curve_table.py", "{six}", "--steps", CURVE_STEPS)),
         Table("8x against 1x as training goes", _bench("curve_table.py", "{six}", "--multiple", "8", "--steps",
                                                       CURVE_STEPS)),
         Table("the curve's overhead (scripts/bench_curve.py)", _bench("bench_curve.py"))]),
    "converged": Study(
        "the same six at 4x the tokens and 8x the optimizer steps (experiment=converged)",
        "11-60 minutes of training per encoding on one thread",
        {"converged": _sweep("experiment=converged", LM_SIX)},
        [Table("perplexity per byte, experiment=converged", _report(["{converged}"], "--by", "encoder"))]),
    "encodings": Study(
        "every encoding in configs/encoder/ at the default budget",
        "about 3 minutes of training per encoding (path's O(L^2 d) reference form several times that), one per yaml",
        {"all": _sweep("encoder=glob(*)")},
        [Table("perplexity per byte at 1x, 4x and 16x",
               _report(["{all}"], "--by", "encoder", "--metric", "ppl@1x,ppl@4x,ppl@16x"))]),
    "tasks": Study(
        "the core encodings on copy, reverse, mqar and passkey, contiguous and randomized positions",
        "45-120 s of training per run, about 200 runs",
        {"copy_reverse": _sweep("seed=0,1,2", "task=copy,reverse", TASK_FIVE,
                                "train.positions=contiguous,randomized"),
         # learned positions: contiguous up to their table, randomized with a table as long as the longest test
         "copy_reverse_learned": _sweep("seed=0,1,2", "task=copy,reverse", "encoder=learned"),
         "copy_reverse_learned_rand": _sweep("seed=0,1,2", "task=copy,reverse", "encoder=learned",
                                             "encoder.max_length=256", "train.positions=randomized"),
         "mqar": _sweep("task=mqar", TASK_FIVE, "train.positions=contiguous,randomized"),
         "mqar_learned": _sweep("task=mqar", "encoder=learned"),
         "mqar_learned_rand": _sweep("task=mqar", "encoder=learned", "encoder.max_length=256",
                                     "train.positions=randomized"),
         "passkey": _sweep("task=passkey", TASK_FIVE, "train.positions=contiguous,randomized"),
         "passkey_learned": _sweep("task=passkey", "encoder=learned"),
         "passkey_learned_rand": _sweep("task=passkey", "encoder=learned", "encoder.max_length=1024",
                                        "train.positions=randomized"),
         "other_tasks": _sweep("task=sort,addition,parity,flipflop", "encoder=rope",
                               "model.init=gpt2,pytorch", "model.tie_embeddings=true,false")},
        [Table("copy and reverse", _report(["{copy_reverse}", "{copy_reverse_learned}", "{copy_reverse_learned_rand}"],
                                           "--by", "task,encoder,train.positions", "--metric",
                                           "acc@1x,acc@2x,tok@1x,tok@2x,tok@4x")),
         Table("mqar", _report(["{mqar}", "{mqar_learned}", "{mqar_learned_rand}"], "--by",
                               "encoder,train.positions", "--metric", "acc@1x,acc@2x,acc@4x,tok@1x,tok@2x,tok@4x")),
         Table("passkey", _report(["{passkey}", "{passkey_learned}", "{passkey_learned_rand}"], "--by",
                                  "encoder,train.positions")),
         Table("sort, addition, parity, flipflop (rope)", _report(["{other_tasks}"], "--by",
                                                                  "task,model.init,model.tie_embeddings"))]),
    "finetune": Study(
        "the default rope run, trained at 128, extended to 512 by posexp finetune",
        "35 s to 30 minutes of training per fine-tune on one thread",
        {"parent": ["train", ONE_THREAD],
         "finetunes": ["finetune", "{parent}", "train_len=512", "-m", "train.steps=50,200,800",
                       "scaling=none,linear,ntk,yarn", ONE_THREAD]},
        [Table("perplexity per byte at 512, 1024 and 2048", _report(
            ["{finetunes}"], "--by", "scaling,train.steps", "--metric", "ppl@512,ppl@1024,ppl@2048"))]),
    "extension": Study(
        "one context extension as one table: the default rope run (trained at 128), the same run under each "
        "evaluation-time scaling, and its fine-tunes to 512, at the same lengths, from one posexp report",
        "about 3 minutes for the parent, 4 evaluations, and 3-6 minutes per fine-tune on one thread",
        {"parent": ["train", ONE_THREAD, "eval.multiples=[1,4,8,16]"],
         "finetunes": ["finetune", "{parent}", "train_len=512", "-m", "scaling=none,yarn", "train.steps=200",
                       ONE_THREAD]},
        [Table("parent, evaluation-time scalings and fine-tunes (posexp report PARENT FINETUNES)",
               _report(["{parent}", "{finetunes}"]))],
        evals=[["eval", "{parent}", f"eval.scaling={s}", "eval.multiples=[1,4,8,16]"] for s in ("linear", "yarn")]),
    "speed": Study(
        "training and evaluation speed next to transformers and x-transformers (pip install -e '.[bench]')",
        "about 20 minutes",
        {},
        [Table("scripts/bench.py", _bench("bench.py", "--threads", "1", "--clock", "cpu", "--steps", "5")),
         Table("scripts/bench_precision.py", _bench("bench_precision.py", "--threads", "1", "--clock", "cpu"))]),
    "memory": Study(
        "evaluation memory and tokens/s at 4,096 and 16,384 tokens",
        "about 2 minutes",
        {},
        [Table("scripts/bench_eval.py", _bench("bench_eval.py"))]),
    "scale": Study(
        "memory and time of GPT-2 small and a 1B model at 32K tokens on 8 GPUs (FSDP2, activation checkpointing, "
        "context parallelism), projected by formulas from single-device numbers: activation bytes per token "
        "(scripts/bench_scale.py) and 16K-token evaluation of the bias encodings (scripts/bench_eval.py)",
        "about 3 minutes",
        {},
        [Table("scripts/bench_eval.py, the bias encodings at 16K",
               _bench("bench_eval.py", "--lengths", "16384", "--encoders", "alibi", "t5", "kerple", "fire", "sandwich",
                      "--no-hf")),
         Table("scripts/bench_scale.py", _bench("bench_scale.py"))]),
    "windows": Study(
        "the six core encodings next to their own window baseline (eval.window=128, the training length): a model "
        "that by construction reads no further back than it was trained on; perplexity, context gain and passkey",
        "about 3 minutes of training per LM run and 1-2 per passkey run, then 4 evaluations of each",
        {"six": _sweep(LM_SIX), "passkey": _sweep("task=passkey", LM_SIX)},
        [Table("perplexity per byte and context gain, plain", _report(
            ["{six}"], "--by", "encoder", "--metric", "ppl@1x,ppl@2x,ppl@4x,ppl@16x,gain")),
         Table("the same, windowed (eval.window=128)", _report(
            ["{six}"], "--by", "encoder", "--metric", "ppl@1x,ppl@2x,ppl@4x,ppl@16x,gain", "--view", "window=128")),
         Table("passkey retrieval, plain", _report(["{passkey}"], "--by", "encoder")),
         Table("passkey retrieval, windowed (eval.window=128)", _report(["{passkey}"], "--by", "encoder", "--view",
                                                                       "window=128"))],
        evals=[["eval", "{six}", "eval.window=128"], ["eval", "{six}", "eval.protocol=last_k", "eval.last_k=64"],
               ["eval", "{six}", "eval.protocol=last_k", "eval.last_k=64", "eval.window=128"],
               ["eval", "{passkey}", "eval.window=128"]]),
    "gpu": Study(
        "the CUDA path on one GPU: the fused-kernel tests, then training tokens/s and MFU at GPT-2-small shape next "
        "to transformers and x-transformers, and long-context evaluation (scripts/bench_gpu.py)",
        "about 8 minutes for the tests; the whole benchmark about 40 (--families, --lengths and --no-peers shorten it)",
        {},
        [Table("pytest -m cuda", [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]),
         Table("scripts/bench.py --gpu", _bench("bench.py", "--gpu"))]),
    "base": Study(
        "which base? rope and sinusoidal over base 10 to 10^6, three seeds each, at the default budget, with "
        "verdicts against base 10000; then the frequency schedules (exponential, power, linear) at base 10000",
        "54 runs of about 1.5 minutes, two at a time: about 45 minutes on 2 cores",
        {"bases": _sweep("encoder=rope,sinusoidal", "base=10,100,1000,10000,100000,1000000", "seed=0,1,2"),
         "schedules": _sweep("encoder=rope,sinusoidal", "encoder.freq_schedule=exponential,power,linear",
                             "seed=0,1,2")},
        [Table(f"{enc}: perplexity per byte by base, each base against base 10000", _report(
            ["{bases}"], "--where", f"encoder={enc}", "--by", "base", "--baseline", "base=10000",
            "--metric", "ppl@1x,ppl@4x,ppl@16x,ratio@16x", "--margin", "2%")) for enc in ("rope", "sinusoidal")]
        + [Table(f"{enc}: the frequency schedules at base 10000, against the exponential one", _report(
            ["{schedules}"], "--where", f"encoder={enc}", "--by", "encoder.freq_schedule", "--baseline",
            "encoder.freq_schedule=exponential", "--metric", "ppl@1x,ppl@4x,ppl@16x,ratio@16x"))
           for enc in ("rope", "sinusoidal")]),
    "launchers": Study(
        "a 4-run sweep with Hydra's basic launcher, one thread per run, and joblib",
        "about 15 minutes",
        {},
        [Table("scripts/bench_launchers.py", _bench("bench_launchers.py"))]),
}


def folders(name: str) -> dict[str, str]:
    """Where each sweep of a study writes its runs, relative to the repository."""
    return {sweep: f"outputs/studies/{name}/{sweep}" for sweep in STUDIES[name].sweeps}


def commands(name: str) -> list[tuple[str, list[str]]]:
    """``(what, argv)`` for every command a study runs, its sweeps first, folders filled in."""
    where = folders(name)
    out = []
    for sweep, args in STUDIES[name].sweeps.items():
        dir_key = "hydra.sweep.dir" if "-m" in args else "hydra.run.dir"
        out.append((f"sweep {sweep}", [*POSEXP, *(a.format(**where) for a in args), f"{dir_key}={where[sweep]}"]))
    for args in STUDIES[name].evals:
        out.append((f"eval {' '.join(args[2:])}", [*POSEXP, *(a.format(**where) for a in args)]))
    for table in STUDIES[name].tables:
        out.append((table.title, [a.format(**where) for a in table.command]))
    return out


def machine() -> str:
    """The machine a study ran on, in words: CPU, cores, Python and torch."""
    import torch  # only when a study runs: --help and --dry-run stay quick

    from posexp.runtime.precision import cpu_name

    cpu = cpu_name()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {torch.get_num_threads()} threads{gpu}, Python {platform.python_version()}, torch {torch.__version__}"


def markdown(name: str, tables: list[tuple[str, list[str], str]], commit: str, reading: str) -> str:
    """The study's file: header (commit, machine, date), each table under the command that made it, the reading."""
    lines = [f"# Study: {name}", "", STUDIES[name].about + ".", "",
             f"Last produced by `python scripts/study.py {name}` at commit `{commit}` on {machine()}, "
             f"{time.strftime('%Y-%m-%d')}.", ""]
    for title, argv, text in tables:
        shown = " ".join(Path(a).name if a == sys.executable else a for a in argv)
        lines += [f"## {title}", "", "```bash", shown.replace(str(REPO) + "/", ""), "```", "", text.strip(), ""]
    return "\n".join(lines) + ("\n" + reading if reading else "")


def run(name: str, dry_run: bool) -> None:
    out = SCRIPTS / f"study_{name}.md"
    taken = [f for f in folders(name).values() if (REPO / f).exists()]
    if taken and not dry_run:  # posexp refuses to write runs into a folder that has some
        raise SystemExit(f"study {name}: {', '.join(taken)} already hold runs; move them away to run it again")
    tables = []
    for what, argv in commands(name):
        print(f"# {what}\n{' '.join(argv)}", flush=True)
        if dry_run:
            continue
        proc = subprocess.run(argv, cwd=REPO, text=True, stdout=subprocess.PIPE if what in
                              [t.title for t in STUDIES[name].tables] else None)
        if proc.returncode != 0:
            raise SystemExit(f"study {name}: `{' '.join(argv)}` failed (exit {proc.returncode})")
        if proc.stdout is not None:
            tables.append((what, argv, proc.stdout))
    if dry_run:
        return
    old = out.read_text() if out.is_file() else ""
    reading = old[old.index(READING):] if READING in old else ""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    out.write_text(markdown(name, tables, commit, reading))
    print(f"wrote {out.relative_to(REPO)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="studies: " + ", ".join(STUDIES))
    ap.add_argument("study", nargs="?", choices=sorted(STUDIES), help="the study to run")
    ap.add_argument("--list", action="store_true", help="the studies, what each measures and what it costs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args()
    if args.list or args.study is None:
        for name, study in STUDIES.items():
            print(f"{name:10s} {study.about} ({study.cost}): scripts/study_{name}.md")
        return
    run(args.study, args.dry_run)


if __name__ == "__main__":
    main()
