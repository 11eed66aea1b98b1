"""``posexp analyze`` as a Hydra job: the geometry of one configured encoding, without training.

Builds the encoder the config names, analyses each unit of it
(:mod:`posexp.analysis.geometry`), draws its figures (:mod:`posexp.analysis.drawing`),
writes ``analysis.json`` and prints a summary; at the end of a ``-m`` sweep,
:func:`compare_sweep` draws one comparison across the jobs. It takes the typed config: Hydra's is typed and
checked in ``posexp/cli/`` (:func:`posexp.analysis.schema.check_analyze_job`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posexp.analysis.drawing import draw_comparison, draw_unit
from posexp.analysis.geometry import RELATIVE_TOLERANCE, analyse_unit, units
from posexp.analysis.schema import AnalyzeConfig
from posexp.model.factory import build_encoder
from posexp.config.schema import Config, eval_lengths
from posexp.runs.atomic import atomic_write_json
from posexp.runtime import terminal
from posexp.runtime.memory import out_of_memory

ANALYSIS_JSON = "analysis.json"
COMPARISON_PNG = "comparison.png"


def analysis_length(cfg: Config, a: AnalyzeConfig, encoder) -> tuple[int, Optional[str]]:
    """Positions analysed: ``analyze.length`` or the longest eval length, within the encoder's ``max_length``."""
    want = int(a.length) if a.length is not None else max(eval_lengths(cfg))
    if not encoder.supports(want):
        return int(encoder.max_length), (f"{encoder.name} encodes at most {encoder.max_length} positions; "
                                         f"analysed 0..{encoder.max_length - 1} instead of {want}")
    return want, None


def _jsonable(unit: dict) -> dict:
    return {k: v for k, v in unit.items() if not k.startswith("_")}


def _label(encoder) -> str:
    base = encoder.base
    return f"{encoder.label}" + (f" base={base:g}" if base is not None else "")


def analyse_encoder(encoder, cfg: Config, a: AnalyzeConfig, out: Path, note: Optional[str] = None) -> dict:
    """Analyse ``encoder`` as configured by ``cfg`` and ``a`` (``analyze.*``), write PNGs and ``analysis.json``
    to ``out``."""
    train_len = int(cfg.train_len)
    lengths = eval_lengths(cfg)
    length, clipped = analysis_length(cfg, a, encoder)
    heatmap_len = int(a.heatmap_len) if a.heatmap_len is not None else 2 * train_len
    label = _label(encoder)
    result: dict[str, Any] = {
        "encoder": cfg.encoder["name"], "label": label, "base": encoder.base, "train_len": train_len,
        "eval_lengths": lengths, "d_model": encoder.d_model, "n_heads": encoder.n_heads, "length": length,
        "content": "q = k = (1, ..., 1) for rotate and scores hooks",
        "notes": [x for x in (note, clipped) if x],
        "units": [], "figures": [],
    }
    curves_out = []
    all_units = units(encoder, int(cfg.model.n_layers))
    for name, enc in all_units:
        # score maps are length x length per head, in float64
        with out_of_memory(f"analysing positions 0..{length - 1}", torch.device("cpu"), "analyze.length"):
            unit = analyse_unit(enc, length, train_len, lengths, int(a.fit_from))
        unit["name"] = name
        prefix = "" if len(all_units) == 1 else f"{name.replace(' ', '').replace('(', '_').replace(')', '')}_"
        unit_label = label if len(all_units) == 1 else f"{label} {name}"
        if a.figures:
            result["figures"] += draw_unit(unit, unit_label, train_len, lengths, out, prefix, heatmap_len)
        curves_out.append(_curves_for_json(unit))
        result["units"].append(_jsonable(unit))
    result["curves"] = curves_out
    atomic_write_json(out / ANALYSIS_JSON, result)
    return result


def _curves_for_json(unit: dict) -> dict:
    """The curves the sweep comparison redraws: full length, rounded."""
    c = unit["_curves"]
    out: dict[str, Any] = {"name": unit["name"]}
    for h in unit["hooks"]:
        if h == "bias":
            out["bias"] = np.round(c[h]["per_head"], 6).tolist()
        else:
            out[h] = np.round(c[h]["decay"]["normalized"], 6).tolist()
    if "rope_bound" in c:
        out["rope_bound"] = np.round(c["rope_bound"], 6).tolist()
    return out


def run_analyze(cfg: Config, a: AnalyzeConfig, out: Path, console: Optional[Console] = None) -> dict:
    """``posexp analyze encoder=... base=...`` of a checked config: analyse, write, print a summary."""
    console = console or terminal.console()
    torch.manual_seed(int(cfg.seed))  # learned encoders are analysed at their seeded initialisation
    encoder = build_encoder(cfg)
    encoder.eval()
    note = None
    if any(p.requires_grad for p in encoder.parameters()):
        note = "learned parameters shown at their initialisation (seed); analyse a trained run for the learned values"
    out.mkdir(parents=True, exist_ok=True)
    result = analyse_encoder(encoder, cfg, a, out, note)
    print_summary(result, console)
    console.print(f"wrote {out / ANALYSIS_JSON} and {len(result['figures'])} figure(s) in {out}", highlight=False)
    return result


def _power(exponent: float) -> str:
    """The power of r an envelope ``~ r^-exponent`` is fitted with, to 2 decimals, one that rounds to zero without a
    sign (a flat fit's exponent of 0.004 or -1e-17 is no decay and no growth)."""
    text = f"{-exponent:.2f}"
    return text.lstrip("-") if float(text) == 0 else text


def print_summary(result: dict, console: Console) -> None:
    """A short table of the numbers a reader looks for first."""
    t = Table(title=f"posexp analyze · {result['label']} · d_model {result['d_model']}, {result['n_heads']} heads · "
                    f"positions 0..{result['length'] - 1} · train_len {result['train_len']}")
    t.add_column("unit / hook", style="cyan")
    t.add_column("relative?", justify="right")
    t.add_column("decay", justify="left")
    for unit in result["units"]:
        if not unit["hooks"]:
            t.add_row(unit["name"], "—", unit.get("note", ""))
        for h, m in unit["maps"].items():
            dep = m["position_dependence"]
            rel = "yes" if dep < RELATIVE_TOLERANCE else f"no ({dep:.2g})"
            if h == "bias":
                fits = m["linear_fit_per_head"]
                decay = "slopes/head " + ", ".join(f"{f['slope']:.3g}" for f in fits[:8]) + \
                        f" (linear r2 min {min(f['r2'] for f in fits):.3f})"
            else:
                d = m["decay"]
                fit = d["power_law"]
                decay = (f"half at r={d['half_distance']}" if d["half_distance"] is not None else "never below 1/2") \
                    + f", mean|S/S0| {d['mean_abs']:.3f}" \
                    + (f", envelope ~ r^{_power(fit['exponent'])} (r2 {fit['r2']:.2f})" if fit else "")
            t.add_row(f"{unit['name']} / {h}", rel, decay)
        if "rope_bound" in unit:
            at = unit["rope_bound"]["mean_over_r_2r_at"]
            keys = [k for k in at if int(k) in (0, result["train_len"]) or k == max(at, key=int)]
            t.add_row(f"{unit['name']} / rope bound", "",
                      escape("mean over [r, 2r]: ") + ", ".join(f"r={k}: {at[k]:.2f}" for k in keys)
                      + (" (the rotation only; q, k are also rescaled)" if "note" in unit["rope_bound"] else ""))
        if "frequencies" in unit:
            f = unit["frequencies"]
            t.add_row(f"{unit['name']} / wavelengths", "",
                      f"{f['min_wavelength']:.3g}..{f['max_wavelength'] or float('inf'):.3g} tokens; "
                      f"{f['longer_than_train_len']}/{f['pairs']} pairs longer than train_len, "
                      f"{f['longer_than_longest_eval']} longer than the longest eval length")
        na = ", ".join(f"{k}" for k in unit["not_applicable"])
        if na:
            t.add_row(f"{unit['name']} / not applicable", "", na)
    console.print(t)
    for n in result.get("notes", []):
        console.print(f"[yellow]note:[/] {n}", highlight=False)


# -- the sweep comparison ---------------------------------------------------------------------

def compare_sweep(sweep_dir: Path) -> Optional[Path]:
    """One figure across the jobs of a ``posexp analyze -m`` sweep: decay curves (and rotary bounds)."""
    results = []
    for path in sorted(Path(sweep_dir).glob(f"*/{ANALYSIS_JSON}"), key=lambda p: (len(p.parent.name), p.parent.name)):
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    if len(results) < 2:
        return None
    return draw_comparison(results, Path(sweep_dir) / COMPARISON_PNG)
