"""One run: compose-checked config in, run folder with checkpoint and results out."""

from __future__ import annotations

import csv
import io
import json
import platform
import subprocess
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

import posexp
from posexp.config import config_hash, eval_lengths, to_container, validate
from posexp.data import check_fits, load_corpus
from posexp.errors import ConfigError
from posexp.evaluate import evaluate
from posexp.io import atomic_write_text
from posexp.train import build_model, resolve_device, save_checkpoint, train

RESULTS_JSON = "results.json"
CSV_COLUMNS = ["length", "multiple", "protocol", "scaling", "applicable", "ppl", "ppl_low", "ppl_high", "loss",
               "loss_se", "tokens", "windows", "tokens_per_s", "peak_mem_mb"]


def git_commit() -> Optional[str]:
    """The commit of the posexp source in use, with ``-dirty`` if it has local changes; None outside git."""
    src = Path(posexp.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_label(overrides: list[str]) -> str:
    return " ".join(overrides) if overrides else "default"


def provenance(cfg: DictConfig, overrides: list[str], corpus_info: dict, model, train_result) -> dict:
    base = getattr(model.encoder, "base", None)
    return {
        "label": run_label(overrides),
        "overrides": list(overrides),
        "encoder": cfg.encoder.name,
        "base": base,
        "train_len": int(cfg.train_len),
        "seed": int(cfg.seed),
        "config": to_container(cfg),
        "config_hash": config_hash(cfg),
        **corpus_info,
        "eval_settings": {"tokens": int(cfg.eval.tokens), "protocol": cfg.eval.protocol},
        "versions": {"posexp": posexp.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "status": "completed",
        "params": model.num_params(),
        "train": {"steps": train_result.steps, "tokens": train_result.tokens,
                  "final_loss": train_result.final_loss, "wall_s": round(train_result.wall_s, 3),
                  "tokens_per_s": round(train_result.tokens_per_s, 1), "precision": train_result.precision,
                  "device": train_result.device, "threads": torch.get_num_threads()},
    }


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def results_markdown(results: dict) -> str:
    run = results["run"]
    base = f"{run['base']:g}" if run.get("base") is not None else "none"
    lines = [
        f"# {run['label']}",
        "",
        f"encoder `{run['encoder']}`, base {base}, trained at {run['train_len']} tokens for "
        f"{run['train']['steps']} steps ({run['train']['tokens']:,} tokens), {run['params']:,} parameters, "
        f"corpus `{run['corpus']}` ({run['corpus_fingerprint']}). Perplexity per byte-level token on the "
        f"validation split; 95% interval over windows.",
        "",
        "| length | × train | protocol | ppl | 95% interval | loss (nats/token) | tokens scored | tokens/s |",
        "|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for r in results["rows"]:
        interval = f"{r['ppl_low']:.3f}–{r['ppl_high']:.3f}" if r.get("ppl_low") is not None else "n/a"
        lines.append(f"| {r['length']} | {r['multiple']:g} | {r['protocol']} | {_fmt(r['ppl'], '.3f')} | {interval} "
                     f"| {_fmt(r['loss'], '.4f')} | {r['tokens']:,} | {_fmt(r.get('tokens_per_s'), ',.0f')} |")
    return "\n".join(lines) + "\n"


def results_csv(results: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in results["rows"]:
        w.writerow(r)
    return buf.getvalue()


def results_table(results: dict) -> Table:
    run = results["run"]
    table = Table(title=f"{run['label']} — perplexity by context length (trained at {run['train_len']})")
    for col, justify in (("length", "right"), ("× train", "right"), ("ppl", "right"), ("95% interval", "left"),
                         ("loss (nats)", "right"), ("tokens/s", "right")):
        table.add_column(col, justify=justify)
    for r in results["rows"]:
        interval = f"{r['ppl_low']:.2f}–{r['ppl_high']:.2f}" if r.get("ppl_low") is not None else ""
        table.add_row(str(r["length"]), f"{r['multiple']:g}", _fmt(r["ppl"], ".3f"), interval,
                      _fmt(r["loss"], ".4f"), _fmt(r.get("tokens_per_s"), ",.0f"))
    return table


def write_results(run_dir: Path, results: dict) -> None:
    """``results.json`` (the public contract), ``results.csv``, ``results.md`` and ``ppl_vs_length.png``."""
    from posexp.plots import plot_ppl_vs_length

    run = results["run"]
    rows = [r for r in results["rows"] if r["protocol"] == "nonoverlap" and r.get("scaling") is None]
    plot_ppl_vs_length(
        [(run["label"], [r["length"] for r in rows], [r["ppl"] for r in rows],
          [r.get("ppl_low") for r in rows], [r.get("ppl_high") for r in rows])],
        run_dir / "ppl_vs_length.png", train_len=run["train_len"],
        title=f"{run['label']} (trained at {run['train_len']} tokens)", ylabel="perplexity (per byte)")
    atomic_write_text(run_dir / "results.csv", results_csv(results))
    atomic_write_text(run_dir / "results.md", results_markdown(results))
    # written last: a folder with results.json is a finished run
    atomic_write_text(run_dir / RESULTS_JSON, json.dumps(results, indent=2, allow_nan=False) + "\n")


def run_train(cfg: DictConfig, run_dir: Path, overrides: list[str], console: Optional[Console] = None) -> dict:
    """Validate, load data, train, checkpoint, evaluate and write the results of one run."""
    console = console or Console()
    validate(cfg)
    lengths = eval_lengths(cfg)
    if cfg.eval.tokens < max(lengths):
        raise ConfigError("eval.tokens", f"must be at least the longest eval length {max(lengths)} "
                                         f"(got {cfg.eval.tokens})")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    corpus = load_corpus(cfg.data.name, cfg.data.path, cfg.data.val_fraction, cfg.data.cache_dir)
    check_fits(corpus, cfg.train_len, max(lengths))
    model = build_model(cfg, corpus.vocab_size)
    device = resolve_device(cfg.train.device)
    base = getattr(model.encoder, "base", None)
    console.print(f"[bold]posexp[/] encoder [cyan]{cfg.encoder.name}[/]"
                  f"{f' base {base:g}' if base is not None else ''} · {model.num_params():,} params · "
                  f"data {corpus.name} ({corpus.train.size:,} train / {corpus.val.size:,} val tokens) · "
                  f"train_len {cfg.train_len} · {device} · {torch.get_num_threads()} threads · run dir {run_dir}",
                  highlight=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    result = train(model, corpus, cfg, run_dir)
    save_checkpoint(model, run_dir, {"config_hash": config_hash(cfg), "steps": result.steps,
                                     "encoder": cfg.encoder.name})
    rows = evaluate(model, corpus.val, lengths, cfg.train_len, cfg.eval.tokens, cfg.eval.batch_tokens, device,
                    protocol=cfg.eval.protocol)
    results = {"run": provenance(cfg, overrides, corpus.info(), model, result), "rows": rows}
    write_results(run_dir, results)
    console.print(results_table(results))
    console.print(f"wrote {run_dir / RESULTS_JSON} (train {result.wall_s:.0f}s, "
                  f"{result.tokens_per_s:,.0f} tokens/s)", highlight=False)
    return results
