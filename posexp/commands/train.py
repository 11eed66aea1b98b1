"""One run: compose-checked config in, run folder with checkpoint and results out."""

from __future__ import annotations

import csv
import io
import json
import logging
import platform
import subprocess
from pathlib import Path
from typing import Callable, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import posexp
from posexp.build import build_model
from posexp.config import config_hash, eval_lengths, to_container
from posexp.validate import config_warnings, out_of_memory, validate
from posexp.training import cache, distributed
from posexp.data.corpus import check_fits, corpus_from_config
from posexp.training.distributed import shard
from posexp.errors import ConfigError, TrainingDiverged
from posexp.evaluation.perplexity import evaluate, loss_by_position_rows, row_key
from posexp.io import atomic_write_text
from posexp.data.tokenizer import bits_per_byte
from posexp.positions import PositionPlan
from posexp.runtime import resolve_device, resolve_precision
from posexp.training.trainer import save_checkpoint, train

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.train")
RESULTS_JSON = "results.json"
LOSS_BY_POSITION_CSV = "loss_by_position.csv"
LOSS_BY_POSITION_PNG = "loss_by_position.png"
CSV_COLUMNS = ["length", "multiple", "protocol", "stride", "last_k", "scaling", "scaling_factor", "applicable",
               "ppl", "ppl_low", "ppl_high", "loss", "loss_se", "se_blocks", "tokens", "first_target",
               "last_target", "windows", "forward_tokens", "tokens_per_s", "peak_mem_mb", "peak_rss_mb"]
POSITION_COLUMNS = ["protocol", "stride", "last_k", "scaling", "scaling_factor", "length", "position", "loss",
                    "count"]


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


def versions() -> dict:
    """What produced a result: posexp, torch and Python versions."""
    return {"posexp": posexp.__version__, "torch": torch.__version__, "python": platform.python_version()}


def run_label(overrides: list[str]) -> str:
    return " ".join(overrides) if overrides else "default"


def provenance(cfg: DictConfig, overrides: list[str], corpus_info: dict, model, train_result) -> dict:
    base = getattr(model.encoder, "base", None)
    return {
        "label": run_label(overrides),
        "overrides": list(overrides),
        "encoder": model.encoder.label,  # the registry name, or a per-layer mix: mixed[rope,rope,rope,none]
        "base": base,
        "train_len": int(cfg.train_len),
        "seed": int(cfg.seed),
        "config": to_container(cfg),
        "config_hash": config_hash(cfg),
        **corpus_info,
        "eval_settings": eval_settings(cfg),
        "versions": versions(),
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "status": "completed",
        "params": model.num_params(),
        "train": {"steps": train_result.steps, "tokens": train_result.tokens,
                  "final_loss": train_result.final_loss, "wall_s": round(train_result.wall_s, 3),
                  "tokens_per_s": round(train_result.tokens_per_s, 1), "precision": train_result.precision,
                  "device": train_result.device, "threads": torch.get_num_threads(),
                  "processes": train_result.processes, "compile": train_result.compiled,
                  **({"resumed_at": train_result.resumed_at} if train_result.resumed_at else {}),
                  **({"positions": tricks} if (tricks := PositionPlan(cfg).describe()) else {})},
    }


def write_run_status(run_dir: Path, cfg: DictConfig, overrides: list[str], status: str, error: BaseException,
                     corpus_info: Optional[dict] = None, step: Optional[int] = None) -> Path:
    """A ``results.json`` without rows for a run that did not finish: ``status`` "failed" or "diverged".

    It carries what is known of the run and ``error`` (message, type, step), so
    ``posexp report`` and the sweep summary list the run with its reason instead
    of silently dropping it.
    """
    run = {"label": run_label(overrides), "overrides": list(overrides), "status": status,
           "error": {"message": str(error), "type": type(error).__name__,
                     **({"step": int(step)} if step is not None else {})},
           "versions": versions(),
           "python_version": platform.python_version(), "git_commit": git_commit()}
    try:  # the config itself may be what failed
        run.update({"encoder": cfg.encoder.name, "train_len": int(cfg.train_len), "seed": int(cfg.seed),
                    "config": to_container(cfg), "config_hash": config_hash(cfg), "eval_settings": eval_settings(cfg)})
    except Exception:  # noqa: BLE001 - record what we can, the error message says the rest
        pass
    run.update(corpus_info or {})
    return atomic_write_text(run_dir / RESULTS_JSON, json.dumps({"run": run, "rows": []}, indent=2, default=str) + "\n")


def eval_settings(cfg: DictConfig) -> dict:
    """The evaluation settings the report compares runs by; keys beyond tokens/protocol only when in use."""
    e = cfg.eval
    settings = {"tokens": int(e.tokens), "protocol": e.protocol}
    if e.get("stride") is not None:
        settings["stride"] = int(e.stride)
    if e.get("last_k") is not None:
        settings["last_k"] = int(e.last_k)
    if e.get("scaling", "none") != "none":
        settings["scaling"] = e.scaling
        if e.get("scaling_factor") is not None:
            settings["scaling_factor"] = float(e.scaling_factor)
        if e.get("rerope_window") is not None:
            settings["rerope_window"] = int(e.rerope_window)
    return settings


def token_unit(run: dict) -> str:
    """What one token is, for labels: ``byte-level token``, or ``bpe token (vocab 4096)``."""
    tokenizer = run.get("tokenizer", "byte")
    return "byte-level token" if tokenizer == "byte" else f"{tokenizer} token (vocab {run.get('vocab_size')})"


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def protocol_text(row: dict) -> str:
    """``nonoverlap``, ``sliding S=64``, ``last_k K=64``."""
    if row.get("stride") is not None:
        return f"{row['protocol']} S={row['stride']}"
    if row.get("last_k") is not None:
        return f"{row['protocol']} K={row['last_k']}"
    return str(row["protocol"])


def scaling_text(row: dict) -> str:
    """``none`` or ``yarn ×4``."""
    if row.get("scaling") is None:
        return "none"
    factor = row.get("scaling_factor")
    return str(row["scaling"]) + (factor_text(row["scaling"], factor) if factor is not None else "")


def factor_text(scaling: Optional[str], factor: float) -> str:
    """`` ×4`` after a scaling's name, or `` w=64`` after ``rerope``, whose number is a window in tokens."""
    return f" w={factor:g}" if scaling == "rerope" else f" ×{factor:g}"


def view_of(row: dict) -> tuple:
    """The (protocol, stride, K, scaling) a row belongs to; lengths within a view form one curve."""
    return (row.get("protocol"), row.get("stride"), row.get("last_k"), row.get("scaling"))


def curve_of(row: dict, train_len: int) -> tuple:
    """(view, fixed factor): rows scaled by the default per-length factor form one curve per view,
    each fixed ``eval.scaling_factor`` its own."""
    from posexp.evaluation.scaling import default_factor

    factor = row.get("scaling_factor")
    if factor is None:
        return view_of(row), None
    default = 1.0 if row.get("scaling") == "dynamic_ntk" else default_factor(row["length"], train_len)
    return view_of(row), None if abs(factor - default) < 1e-9 else float(factor)


def view_label(view: tuple) -> str:
    protocol, stride, last_k, scaling = view
    text = protocol_text({"protocol": protocol, "stride": stride, "last_k": last_k})
    return text if scaling is None else f"{text}, {scaling}"


def display_rows(results: dict) -> list[dict]:
    """Rows grouped by view (the main ``nonoverlap`` without scaling first), each view by length."""
    views = list(dict.fromkeys(view_of(r) for r in results["rows"]))
    views.sort(key=lambda v: v != ("nonoverlap", None, None, None))  # stable: otherwise first-seen order
    order = {v: i for i, v in enumerate(views)}
    return sorted(results["rows"], key=lambda r: (order[view_of(r)], r["length"], r.get("scaling_factor") or 0))


SCORED_TOKENS_NOTE = {
    "nonoverlap": "consecutive windows, every target scored",
    "sliding": "windows advance by S and score their last S targets (the first window all of them)",
    "last_k": "every window scores its last K targets; the windows end at the same tokens at every length",
}


def results_markdown(results: dict) -> str:
    run = results["run"]
    base = f"{run['base']:g}" if run.get("base") is not None else "none"
    rows = display_rows(results)
    lines = [
        f"# {run['label']}",
        "",
        f"encoder `{run['encoder']}`, base {base}, trained at {run['train_len']} tokens for "
        f"{run['train']['steps']} steps ({run['train']['tokens']:,} tokens), {run['params']:,} parameters, "
        f"corpus `{run['corpus']}` ({run['corpus_fingerprint']}). Perplexity per {token_unit(run)} on the "
        f"validation split; 95% interval from the standard error over blocks of L consecutive scored tokens "
        f"(the windows, for nonoverlap).",
        "",
    ]
    bpb = run.get("tokenizer", "byte") != "byte" and bool(run.get("tokens_per_byte"))
    if bpb:
        lines[-1:-1] = ["", f"Per-token perplexities are not comparable across tokenizers; bits per byte are "
                            f"(loss / ln 2 × {run['tokens_per_byte']:g} tokens per UTF-8 byte of the validation "
                            "split), in the last column."]
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        spans = sorted({tuple(r["targets"]) for r in rows if r["protocol"] == protocol and r.get("targets")})
        where = "; ".join(f"{a:,}–{b:,}" for a, b in spans) or "none"
        lines.append(f"- `{protocol}`: {SCORED_TOKENS_NOTE.get(protocol, '')}; scored targets (token indices "
                     f"in the validation split): {where}.")
    lines += [
        "",
        "| length | × train | protocol | scaling | ppl | 95% interval | loss (nats/token) | tokens scored "
        "| windows | tokens/s (forward) | peak MiB |" + (" bits/byte |" if bpb else ""),
        "|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if bpb else ""),
    ]
    for r in rows:
        interval = f"{r['ppl_low']:.3f}–{r['ppl_high']:.3f}" if r.get("ppl_low") is not None else "n/a"
        bits = (f" {_fmt(None if r['loss'] is None else bits_per_byte(r['loss'], run['tokens_per_byte']), '.4f')} |"
                if bpb else "")
        lines.append(f"| {r['length']} | {r['multiple']:g} | {protocol_text(r)} | {scaling_text(r)} "
                     f"| {_fmt(r['ppl'], '.3f')} | {interval} | {_fmt(r['loss'], '.4f')} | {r['tokens']:,} "
                     f"| {r.get('windows', 0):,} | {_fmt(r.get('tokens_per_s'), ',.0f')} "
                     f"| {_fmt(r.get('peak_mem_mb'), ',.0f')} |" + bits)
    return "\n".join(lines) + "\n"


def results_csv(results: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in results["rows"]:
        targets = r.get("targets") or (None, None)
        w.writerow({**r, "first_target": targets[0], "last_target": targets[1]})
    return buf.getvalue()


def results_table(results: dict) -> Table:
    run = results["run"]
    rows = display_rows(results)
    # one "evaluation" column, only when something other than the default protocol was measured
    show_view = any(view_of(r) != ("nonoverlap", None, None, None) for r in rows)
    # the fixed phrase first: Rich wraps a long title to the table's width, and labels can be long
    table = Table(title=f"perplexity by context length — {run['label']} (trained at {run['train_len']} tokens)")
    columns = [("length", "right"), ("× train", "right")] + ([("evaluation", "left")] if show_view else []) + [
        ("ppl", "right"), ("95% interval", "left"), ("loss (nats)", "right"), ("tokens/s", "right"),
        ("peak MiB", "right")]
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for r in rows:
        interval = f"{r['ppl_low']:.2f}–{r['ppl_high']:.2f}" if r.get("ppl_low") is not None else ""
        view = [protocol_text(r) + (f", {scaling_text(r)}" if r.get("scaling") else "")] if show_view else []
        table.add_row(str(r["length"]), f"{r['multiple']:g}", *view, _fmt(r["ppl"], ".3f"), interval,
                      _fmt(r["loss"], ".4f"), _fmt(r.get("tokens_per_s"), ",.0f"), _fmt(r.get("peak_mem_mb"), ",.0f"))
    return table


def write_results(run_dir: Path, results: dict) -> None:
    """``results.json`` (the public contract), ``results.csv``, ``results.md`` and ``ppl_vs_length.png``."""
    from posexp.reporting.plots import plot_ppl_vs_length

    run = results["run"]
    series = []
    shown = display_rows(results)
    for curve in dict.fromkeys(curve_of(r, run["train_len"]) for r in shown):
        rows = [r for r in shown if curve_of(r, run["train_len"]) == curve]
        view, fixed = curve
        label = view_label(view) + (factor_text(view[3], fixed) if fixed is not None else "")
        series.append((label, [r["length"] for r in rows], [r["ppl"] for r in rows],
                       [r.get("ppl_low") for r in rows], [r.get("ppl_high") for r in rows]))
    plot_ppl_vs_length(series, run_dir / "ppl_vs_length.png", train_len=run["train_len"],
                       title=f"{run['label']} (trained at {run['train_len']} tokens)",
                       ylabel=f"perplexity (per {token_unit(run)})")
    atomic_write_text(run_dir / "results.csv", results_csv(results))
    atomic_write_text(run_dir / "results.md", results_markdown(results))
    # written last: a folder with results.json is a finished run
    atomic_write_text(run_dir / RESULTS_JSON, json.dumps(results, indent=2, allow_nan=False) + "\n")


def evaluate_config(model, val, cfg: DictConfig, device: torch.device,
                    console: Optional[Console] = None) -> tuple[list[dict], Optional[list[dict]]]:
    """Rows (and per-position records, unless ``eval.loss_by_position`` is off) for the ``eval`` group of ``cfg``."""
    e = cfg.eval
    positions: Optional[list[dict]] = [] if e.get("loss_by_position", True) else None
    log = (lambda msg: console.print(f"[yellow]{msg}[/]", highlight=False)) if console is not None else None
    rows = evaluate(model, val, eval_lengths(cfg), int(cfg.train_len), int(e.tokens), int(e.batch_tokens), device,
                    protocol=e.protocol, stride=e.get("stride"), last_k=e.get("last_k"),
                    scaling=e.get("scaling", "none"), scaling_factor=e.get("scaling_factor"),
                    rerope_window=e.get("rerope_window"), positions=positions,
                    log=log, position_plan=PositionPlan(cfg),
                    dtype=resolve_precision(cfg.train.precision, device))  # losses accumulate in fp32 anyway
    return rows, positions


def _parse_position_row(raw: dict) -> dict:
    def opt(value: str, cast):
        return None if value in ("", None) else cast(value)

    return {"protocol": raw["protocol"], "stride": opt(raw["stride"], int), "last_k": opt(raw["last_k"], int),
            "scaling": opt(raw["scaling"], str), "scaling_factor": opt(raw["scaling_factor"], float),
            "length": int(raw["length"]), "position": int(raw["position"]), "loss": float(raw["loss"]),
            "count": int(raw["count"])}


def read_loss_by_position(run_dir: Path) -> list[dict]:
    """The rows of a run's ``loss_by_position.csv``; empty if it has none (or an unreadable one)."""
    path = run_dir / LOSS_BY_POSITION_CSV
    if not path.is_file():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [_parse_position_row(r) for r in csv.DictReader(f)]
    except (OSError, KeyError, ValueError):
        return []  # rebuilt from what this evaluation measured


def write_loss_by_position(run_dir: Path, records: list[dict], train_len: int, label: str) -> None:
    """Merge new per-position losses into ``loss_by_position.csv`` and redraw ``loss_by_position.png``.

    Columns: the row key (protocol, stride, last_k, scaling, scaling_factor, length), then
    ``position`` (0-based index of the predicting token in the window: the prediction saw
    ``position + 1`` tokens), ``loss`` (mean nats over the windows that score that position)
    and ``count`` (how many windows did). Rows of re-measured keys are replaced.
    """
    from posexp.reporting.plots import plot_loss_by_position

    new = loss_by_position_rows(records)
    fresh = {row_key(r) for r in new}
    rows = [r for r in read_loss_by_position(run_dir) if row_key(r) not in fresh] + new
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=POSITION_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "loss": f"{r['loss']:.6f}"})
    # the main view if measured, else the one just evaluated
    curves = [curve_of(r, train_len) for r in rows]
    main = (("nonoverlap", None, None, None), None)
    chosen = main if main in curves else (curve_of(new[0], train_len) if new else None)
    series = []
    for length in sorted({r["length"] for r, c in zip(rows, curves) if c == chosen}):
        pts = [r for r, c in zip(rows, curves) if c == chosen and r["length"] == length]
        series.append((length, [r["position"] for r in pts], [r["loss"] for r in pts], [r["count"] for r in pts]))
    if chosen is None:
        view = "nothing measured"
    else:
        view = view_label(chosen[0]) + (factor_text(chosen[0][3], chosen[1]) if chosen[1] is not None else "")
    plot_loss_by_position(series, run_dir / LOSS_BY_POSITION_PNG, train_len=train_len,
                          title=f"{label}: loss by position ({view})")
    atomic_write_text(run_dir / LOSS_BY_POSITION_CSV, buf.getvalue())


def _warner(console: Console):
    """A warning for the user: yellow on the run's console, and in train.log."""
    def warn(message: str) -> None:
        log.warning(message)
        console.print(f"[yellow]warning: {escape(message)}[/]", highlight=False, soft_wrap=True)  # one line, for grep
    return warn


def warn_about_settings(cfg: DictConfig, warn: Callable[[str], None], is_main: bool) -> bool:
    """Warn about settings that train, but probably not as meant; returns whether ``cache_dir`` can be written.

    With ``cache=true`` and a ``cache_dir`` that cannot be written, this is said once, here: the run reads the
    cache but stores nothing.
    """
    for note in config_warnings(cfg):
        warn(note)
    problem = cache.unwritable_warning(cfg) if cfg.get("cache") and is_main else None
    if problem is not None:
        warn(problem)
    return problem is None


def run_train(cfg: DictConfig, run_dir: Path, overrides: list[str], console: Optional[Console] = None,
              resume: bool = False) -> dict:
    """Validate, load data, train, checkpoint, evaluate and write the results of one run.

    Args:
        resume: continue training from the run folder's latest checkpoint (``posexp resume``).

    Raises:
        TrainingDiverged: after writing a results.json with status "diverged".
    """
    console = console or Console()
    validate(cfg)
    # several processes (torchrun): rank 0's run folder for all, and only rank 0 writes or prints
    device = resolve_device(cfg.train.device)
    w = distributed.setup(device)
    if w.distributed:
        run_dir = Path(distributed.broadcast(str(run_dir)))
        shard(cfg.train.batch_size, w)  # a batch that does not split fails here, before any data is read
        if not w.is_main:
            console = Console(quiet=True)
    warn = _warner(console)
    cache_writable = warn_about_settings(cfg, warn, w.is_main)
    lengths = eval_lengths(cfg)
    if cfg.eval.tokens < max(lengths):
        raise ConfigError("eval.tokens", f"must be at least the longest eval length {max(lengths)} "
                                         f"(got {cfg.eval.tokens})")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    for turn in (True, False):  # rank 0 builds the token cache first, the others then read it
        if w.is_main == turn:
            corpus = corpus_from_config(cfg, log=lambda msg: console.print(msg, highlight=False), warn=warn)
        distributed.barrier()
    check_fits(corpus, cfg.train_len, max(lengths))
    with out_of_memory("building the model", torch.device("cpu"), "model.d_model or model.n_layers"):
        model = build_model(cfg, corpus.vocab_size)
    base = getattr(model.encoder, "base", None)
    console.print(f"[bold]posexp[/] encoder [cyan]{cfg.encoder.name}[/]"
                  f"{f' base {base:g}' if base is not None else ''} · {model.num_params():,} params · "
                  f"data {corpus.name} ({corpus.train.size:,} train / {corpus.val.size:,} val tokens) · "
                  f"train_len {cfg.train_len} · {device}"
                  f"{f' × {w.size} processes' if w.distributed else ''} · {torch.get_num_threads()} threads"
                  f"{' · compiled' if cfg.get('compile', False) else ''} · run dir {run_dir}",
                  highlight=False)
    if w.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    # cache=true: a finished training of the same training config is evaluated, not repeated (posexp/cache.py)
    reused = distributed.broadcast(cache.lookup(cfg, corpus.fingerprint)) if cfg.get("cache") and not resume else None
    if reused is not None:
        result = reused.restore(model, run_dir, device) if w.is_main else None
        cache.log.info(reused.message())
        console.print(reused.message(), highlight=False)
    else:
        try:
            with out_of_memory("training", device, "train.batch_size, train_len, model.d_model or model.n_layers"):
                result = train(model, corpus, OmegaConf.to_object(cfg.train), run_dir, train_len=int(cfg.train_len),
                               seed=int(cfg.seed), plan=PositionPlan(cfg), config_hash=config_hash(cfg),
                               compiled=bool(cfg.get("compile", False)), resume=resume)
        except TrainingDiverged as e:
            if w.is_main:
                write_run_status(run_dir, cfg, overrides, "diverged", e, corpus.info(), step=e.step)
            raise
    if not w.is_main:
        return {}  # rank 0 evaluates and writes; the weights are the same on every rank
    save_checkpoint(model, run_dir, {"config_hash": config_hash(cfg), "steps": result.steps,
                                     "encoder": cfg.encoder.name})
    if cfg.get("cache") and reused is None and cache_writable:
        cache.store(cfg, corpus.fingerprint, run_dir, result)
    rows, positions = evaluate_config(model, corpus.val, cfg, device, console)
    results = {"run": provenance(cfg, overrides, corpus.info(), model, result), "rows": rows}
    if reused is not None:
        results["run"]["cached_from"] = reused.provenance()
        results["run"]["train"]["threads"] = reused.entry.get("threads")  # of the training, not this evaluation
    if positions:
        write_loss_by_position(run_dir, positions, int(cfg.train_len), results["run"]["label"])
    write_results(run_dir, results)
    console.print(results_table(results))
    trained = f"weights from cache {reused.key}" if reused is not None else \
        f"train {result.wall_s:.0f}s, {result.tokens_per_s:,.0f} tokens/s"
    console.print(f"wrote {run_dir / RESULTS_JSON} ({trained})", highlight=False)
    return results
