"""The figures of ``posexp analyze``: one PNG per thing measured, in the house style of :mod:`posexp.plots.style`.

Each function draws from the numbers :mod:`posexp.analysis.geometry` (or the
attention measurement) already computed and returns the file name it wrote;
matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from posexp.analysis.geometry import RELATIVE_TOLERANCE, envelope, half_range, octave_mean
from posexp.plots.style import FIG_HEIGHT_IN, FIG_WIDTH_IN, mark_train_len, new_figure, save_png, style_axes

HOOK_TITLE = {"embed": "<p_m, p_n>", "rotate": "rotary score", "bias": "logit bias", "scores": "extra logits"}
HOOK_YLABEL = {
    "embed": "<p_m, p_n>",
    "rotate": "<R_m q, R_n k>, q = k = 1",
    "bias": "logit bias",
    "scores": "extra logit, q = k = 1",
}
ROPE_BOUND_TITLE = "rotary relative upper bound (RoFormer §3.4.3)"
# the comparison's panels: x label, y label, title
COMPARISON_AXES = {
    "decay": ("distance m - n (tokens, log)", "envelope of |S(r)/S(0)|", "decay with distance"),
    "bias": ("distance m - n (tokens)", "logit bias", "bias vs distance"),
    "rope_bound": ("relative distance m - n (tokens, log)", "(1/(d/2)) sum_j |S_j|, mean over [r, 2r]",
                   ROPE_BOUND_TITLE),
}


def draw_unit(unit: dict, name: str, train_len: int, lengths: Sequence[int], out: Path, prefix: str,
              heatmap_len: int) -> list[str]:
    """The PNGs of one unit; returns their file names."""
    curves = unit["_curves"]
    written = []
    for h in unit["hooks"]:
        written.append(_draw_heatmap(h, curves[h], name, train_len, heatmap_len, out / f"{prefix}{h}_heatmap.png"))
        written.append(_draw_vs_distance(h, unit, name, train_len, out / f"{prefix}{h}_vs_distance.png"))
    if "rope_bound" in curves:
        written.append(_draw_rope_bound(curves["rope_bound"], name, train_len, out / f"{prefix}rope_bound.png"))
    if "frequencies" in unit:
        written.append(_draw_wavelengths(unit["frequencies"], name, train_len, lengths,
                                         out / f"{prefix}wavelengths.png"))
    if "spectrum" in curves:
        written.append(_draw_spectrum(curves["spectrum"], name, train_len, out / f"{prefix}spectrum.png"))
    return written


def _draw_heatmap(h: str, c: dict, name: str, train_len: int, heatmap_len: int, path: Path) -> str:
    """The score as a function of the query position m and the key position n, causal part."""
    n = min(heatmap_len, c["map"].shape[0])
    fig = new_figure(FIG_HEIGHT_IN + 0.4, FIG_WIDTH_IN - 0.6)
    ax = fig.add_subplot()
    M = np.array(c["map"][:n, :n])
    M[np.triu_indices(n, 1)] = np.nan  # masked in a causal model
    lim = np.nanmax(np.abs(M)) or 1.0
    im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim, origin="upper", interpolation="nearest")
    cb = fig.colorbar(im, ax=ax, shrink=0.85)
    cb.set_label(HOOK_YLABEL[h] + (" (mean over heads)" if h in ("bias", "scores", "rotate") else ""), fontsize=7)
    cb.ax.tick_params(labelsize=6)
    if train_len < n:
        ax.axvline(train_len, color="0.2", linestyle="--", linewidth=0.8)
        ax.axhline(train_len, color="0.2", linestyle="--", linewidth=0.8, label=f"train length ({train_len})")
        ax.legend(fontsize=6, loc="upper right")
    style_axes(ax, "key position n (tokens)", "query position m (tokens)", f"{name}: {HOOK_TITLE[h]}, causal part")
    ax.grid(False)
    return save_png(fig, path).name


def _draw_vs_distance(h: str, unit: dict, name: str, train_len: int, path: Path) -> str:
    """The score against the distance m - n: per head for a bias, else normalised with its envelope and fit."""
    c = unit["_curves"][h]
    fig = new_figure()
    ax = fig.add_subplot()
    r = np.arange(c["per_head"].shape[1])
    if h == "bias":
        H = c["per_head"].shape[0]
        for i, fit in enumerate(unit["maps"]["bias"]["linear_fit_per_head"]):
            ax.plot(r, c["per_head"][i], linewidth=1.0,
                    label=f"head {i} (fitted slope {fit['slope']:.3g})" if H <= 8 else None)
        style_axes(ax, "distance m - n (tokens)", "logit bias", f"{name}: bias vs distance per head")
    else:
        dec = c["decay"]
        ax.plot(r[1:], dec["normalized"][1:], linewidth=0.6, color="tab:blue", alpha=0.6,
                label="mean over m of S(m, m-r) / S(0)")
        stop = half_range(len(r))
        ax.plot(r[1:stop], dec["envelope"][1:stop], linewidth=1.2, color="tab:red", label="envelope")
        fit = dec["power_law"]
        if fit is not None:
            ax.plot(r[1:stop], fit["a"] * r[1:stop] ** (-fit["exponent"]), linestyle=":", color="k",
                    linewidth=1.0, label=f"power-law fit {fit['a']:.2f} r^({-fit['exponent']:.2f})")
        ax.set_xscale("log", base=2)
        style_axes(ax, "distance m - n (tokens, log)", "score / score at distance 0",
                   f"{name}: {HOOK_TITLE[h]} vs distance")
    if unit["maps"][h]["position_dependence"] > RELATIVE_TOLERANCE:
        # not a function of m - n alone: the curve is the mean over each diagonal
        ax.set_title(ax.get_title() + " (not relative: diagonal means)", fontsize=8)
    mark_train_len(ax, train_len)
    ax.legend(fontsize=6, loc="best", framealpha=0.85)
    return save_png(fig, path).name


def _draw_rope_bound(b: np.ndarray, name: str, train_len: int, path: Path) -> str:
    """RoFormer's relative upper bound against distance, with its mean over [r, 2r]."""
    fig = new_figure()
    ax = fig.add_subplot()
    r = np.arange(1, len(b))
    ax.plot(r, b[1:], linewidth=0.6, color="tab:purple", alpha=0.6, label=f"{name}")
    trend = octave_mean(b)
    ax.plot(r[:len(trend) - 1], trend[1:], linewidth=1.2, color="tab:red", label="mean over [r, 2r]")
    ax.set_xscale("log", base=2)
    mark_train_len(ax, train_len)
    style_axes(ax, "relative distance m - n (tokens, log)", "(1/(d/2)) sum_j |S_j|", ROPE_BOUND_TITLE)
    ax.legend(fontsize=6)
    return save_png(fig, path).name


def _draw_wavelengths(ft: dict, name: str, train_len: int, lengths: Sequence[int], path: Path) -> str:
    """Wavelength per feature pair against the training and the longest evaluation length."""
    wl = [w if w is not None else np.nan for w in ft["wavelength"]]
    fig = new_figure()
    ax = fig.add_subplot()
    ax.plot(np.arange(len(wl)), wl, marker="o", markersize=2, linewidth=1.0, label=name)
    ax.axhline(train_len, color="0.35", linestyle="--", linewidth=0.9, label=f"train length ({train_len})")
    if lengths and max(lengths) != train_len:
        ax.axhline(max(lengths), color="tab:red", linestyle=":", linewidth=0.9,
                   label=f"longest eval length ({max(lengths)})")
    ax.set_yscale("log")
    style_axes(ax, "feature pair i", "wavelength 2π/θ_i (tokens, log)",
               f"{ft['longer_than_train_len']} of {ft['pairs']} pairs turn less than once in train_len")
    ax.legend(fontsize=6)
    return save_png(fig, path).name


def _draw_spectrum(spectrum: tuple[np.ndarray, np.ndarray], name: str, train_len: int, path: Path) -> str:
    """The power spectrum of the position vectors against the period (Su 2021 §5.5)."""
    f, power = spectrum
    fig = new_figure()
    ax = fig.add_subplot()
    keep = f > 0
    ax.loglog(1 / f[keep], power[keep] / (power[keep].max() or 1), linewidth=1.0, label=name)
    mark_train_len(ax, train_len)
    style_axes(ax, "period (tokens per cycle, log)", "power (normalised, log)",
               f"{name}: spectrum of p along positions")
    ax.legend(fontsize=6)
    return save_png(fig, path).name


def draw_comparison(results: list[dict], path: Path) -> Optional[Path]:
    """One figure across analyses (the jobs of a sweep), a panel per kind of curve the jobs have: decay envelopes
    (embed, rotate, scores: a ratio to distance 0), biases (logits) and rotary bounds, each on its own axis; None,
    and no file, when no job has a curve (NoPE, FoX: no content-free geometry)."""
    panels: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {"decay": [], "bias": [], "rope_bound": []}
    for r in results:
        c = r["curves"][0]
        hook = next((h for h in ("embed", "rotate", "scores") if h in c), None)
        if hook is not None:
            env = envelope(np.asarray(c[hook]))
            stop = half_range(len(env))
            panels["decay"].append((r["label"], np.arange(1, stop), env[1:stop]))
        elif "bias" in c:
            b = np.asarray(c["bias"]).mean(0)
            panels["bias"].append((r["label"] + " (mean over heads)", np.arange(len(b)), b))
        if "rope_bound" in c:
            trend = octave_mean(np.asarray(c["rope_bound"]))
            panels["rope_bound"].append((r["label"], np.arange(1, len(trend)), trend[1:]))
    drawn = [kind for kind, curves in panels.items() if curves]
    if not drawn:
        return None
    fig = new_figure(FIG_HEIGHT_IN * len(drawn))
    axes = fig.subplots(len(drawn), 1, squeeze=False)[:, 0]
    for ax, kind in zip(axes, drawn):
        for label, x, y in panels[kind]:
            ax.plot(x, y, linewidth=1.1, label=label)
        if kind != "bias":
            ax.set_xscale("log", base=2)
        style_axes(ax, *COMPARISON_AXES[kind])
        for tl in sorted({r["train_len"] for r in results}):
            mark_train_len(ax, tl)
        ax.legend(fontsize=6, loc="best", framealpha=0.85)
    return save_png(fig, path)


def draw_attention(rows: list[dict], train_len: int, label: str, out: Path) -> list[str]:
    """Mean attention distance and entropy per layer and head against context length; returns the file names."""
    ok = [r for r in rows if "mean_distance" in r]
    if not ok:
        return []
    x = [r["length"] for r in ok]
    dist = np.array([r["mean_distance"] for r in ok])  # (lengths, layers, heads)
    ent = np.array([r["entropy"] for r in ok])
    n_layers, H = dist.shape[1], dist.shape[2]
    written = []
    for key, arr, ref, ylabel in (("distance", dist, "uniform_distance", "mean attention distance (tokens)"),
                                  ("entropy", ent, "uniform_entropy", "attention entropy (nats)")):
        fig = new_figure(FIG_HEIGHT_IN * max(1, min(n_layers, 4)) * 0.8)
        axes = fig.subplots(n_layers, 1, squeeze=False)[:, 0]
        for layer, ax in enumerate(axes):
            for h in range(H):
                ax.plot(x, arr[:, layer, h], marker="o", markersize=3, linewidth=1.0, label=f"head {h}")
            ax.plot(x, [r[ref] for r in ok], linestyle=":", color="k", linewidth=1.0, label="uniform attention")
            mark_train_len(ax, train_len)
            ax.set_xscale("log", base=2)
            ax.set_xticks(x, [str(v) for v in x])
            style_axes(ax, "context length (tokens)", ylabel, f"{label}: layer {layer}")
        axes[0].legend(fontsize=6, loc="best", framealpha=0.85, ncol=2)
        written.append(save_png(fig, out / f"attention_{key}.png").name)
    return written
