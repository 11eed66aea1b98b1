"""``posexp analyze``: the geometry of a positional encoding, without training.

Every encoder is analysed through its hooks (:mod:`posexp.encoders.base`), never
by name, so each gets what applies to the way it touches attention:

``embed``   the encodings ``p_m`` themselves: the inner products ``<p_m, p_n>``
            (Su 2021, "Transformer升级之路 1", Eq. 31: ``sum_i cos((m - n) theta_i)``
            for sinusoids), their decay with distance and a power-law fit (his
            §2.3, Eq. 40: ``O(1/|m-n|)`` for ``theta_i = base^(-2i/d)``), and the
            power spectrum of ``p`` along positions (his §5.5 recipe).
``rotate``  the score ``<R_m q, R_n k>`` with a constant content ``q = k = (1, ..., 1)``,
            so everything shown comes from position; the frequencies ``theta_i``
            read off the hook itself (the eigenvalues of the one-step rotation);
            and RoFormer's relative upper bound (Su et al. 2021, §3.4.3).
``bias``    the additive logit bias per head as a function of the distance, with a
            straight-line fit (ALiBi's bias is ``-m_h (i - j)``, Press et al. 2022, §3).
``scores``  the extra logits with the same constant content.

A hook an encoder does not use is reported "not applicable" with the reason.
Every score map ``S[m, n]`` is summarised by its mean along each diagonal
``m - n = r`` (the decay curve) and by ``position_dependence``: how far
``S[m, n]`` strays from a function of ``m - n`` alone (0 for a relative score).

For a trained run (``posexp analyze RUN_DIR``) the same geometry is computed on the
trained encoder, and the attention of the trained model is measured on validation
text at multiples of the training length: per layer and head, the mean distance
from a query to the keys it attends to and the entropy of its attention.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any, List, Optional, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch import Tensor

from posexp.config import Config, build_encoder, eval_lengths, validate
from posexp.errors import ConfigError, PosexpError, require
from posexp.io import atomic_write_bytes, atomic_write_json
from posexp.rundir import is_run_dir

log = logging.getLogger(__name__)

ANALYSIS_JSON = "analysis.json"
COMPARISON_PNG = "comparison.png"
# Sized for a paper column, like posexp/plots.py.
FIG_W, FIG_H, DPI = 4.5, 3.0, 150
HOOKS = ("embed", "rotate", "bias", "scores")
# position_dependence below this (float32 hooks) counts as a score of m - n alone
RELATIVE_TOLERANCE = 1e-4


# -- config ------------------------------------------------------------------------------------

@dataclass
class AnalyzeConfig:
    """``analyze.*`` keys (``configs/analyze.yaml`` documents each)."""

    length: Optional[int] = None
    heatmap_len: Optional[int] = None
    fit_from: int = 1
    multiples: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    tokens: int = 8192
    figures: bool = True


def _analyze_root_schema() -> type:
    """The training schema plus ``analyze``; ``configs/analyze.yaml`` merges it after ``config``.

    A subclass of :class:`posexp.config.Config` whose inherited fields are all MISSING,
    so merging it keeps every value ``configs/config.yaml`` set (a MISSING value never
    overrides one that is set) and only adds the ``analyze`` node.
    """
    import dataclasses
    import typing

    from omegaconf import MISSING

    hints = typing.get_type_hints(Config)  # real types: this module's annotations are strings
    inherited = [(f.name, hints[f.name], field(default=MISSING)) for f in dataclasses.fields(Config)]
    schema = dataclasses.make_dataclass("AnalyzeRootConfig", inherited + [
        ("analyze", AnalyzeConfig, field(default_factory=AnalyzeConfig))], bases=(Config,))
    schema.__module__ = __name__
    return schema


AnalyzeRootConfig = _analyze_root_schema()


def register_schema() -> None:
    """Store the ``posexp analyze`` schema: the training config plus ``analyze.*``; idempotent."""
    from hydra.core.config_store import ConfigStore

    from posexp.config import register_configs

    register_configs()
    ConfigStore.instance().store(name="posexp_analyze_schema", node=AnalyzeRootConfig)


def check_analyze(a: Any) -> None:
    """Range checks of the ``analyze`` keys. Raises :class:`ConfigError` naming the key."""
    require(a.length is None or a.length >= 2, "analyze.length",
            f"must be at least 2 positions, or null for the longest eval length (got {a.length})")
    require(a.heatmap_len is None or a.heatmap_len >= 2, "analyze.heatmap_len",
            f"must be at least 2 positions, or null for twice train_len (got {a.heatmap_len})")
    require(a.fit_from >= 1, "analyze.fit_from", f"must be a distance >= 1 (got {a.fit_from})")
    require(len(a.multiples) > 0 and all(m > 0 for m in a.multiples), "analyze.multiples",
            f"must list positive multiples of train_len, e.g. analyze.multiples=[1,2,4,8] (got {list(a.multiples)})")
    require(a.tokens > 0, "analyze.tokens", f"must be a positive number of tokens (got {a.tokens})")


# -- score maps through the hooks ----------------------------------------------------------------

def units(encoder, n_layers: int) -> list[tuple[str, Any]]:
    """What to analyse: the encoder, or for a per-layer mix the first layer of each encoding in it."""
    layers = encoder.for_layers(n_layers)
    if all(e is encoder for e in layers):
        return [(encoder.label, encoder)]
    seen, out = set(), []
    for i, e in enumerate(layers):
        if e.name not in seen:
            seen.add(e.name)
            out.append((f"layer {i} ({e.name})", e))
    return out


@torch.no_grad()
def embed_vectors(encoder, length: int) -> Tensor:
    """``p (L, D)``: what ``embed`` adds to a zero token embedding at positions ``0 .. L-1``."""
    pos = torch.arange(length)
    x = torch.zeros(1, length, encoder.d_model)
    return encoder.embed(x, pos)[0].double()  # (L, D)


@torch.no_grad()
def score_map(encoder, hook: str, length: int) -> Tensor:
    """The position part of the attention logits ``S (H, L, L)`` at positions ``0 .. L-1`` from one hook.

    ``embed``: ``<p_m, p_n>`` (one map, ``H = 1``). ``rotate``: ``<R_m q, R_n k>`` and
    ``scores``: the extra logits, both with the constant content ``q = k = (1, ..., 1)``
    (the all-equal ``h_i`` of RoFormer §3.4.3, for which the rotary score is
    ``sum_i 2 cos((m - n) theta_i)``). ``bias``: the bias itself. Entries with
    ``n > m`` (masked in a causal model) are left as computed.
    """
    pos = torch.arange(length)
    if hook == "embed":
        p = embed_vectors(encoder, length)
        return (p @ p.T)[None]  # (1, L, L)
    H, Dh = encoder.n_heads, encoder.head_dim
    ones = torch.ones(1, H, length, Dh)
    if hook == "rotate":
        q, k = encoder.rotate(ones, ones.clone(), pos, pos)
        return (q.double() @ k.double().transpose(-1, -2))[0]  # (H, L, L)
    if hook == "bias":
        return encoder.bias(pos, pos).double()  # (H, L, L)
    if hook == "scores":
        return encoder.scores(ones, ones.clone(), pos, pos)[0].double()  # (H, L, L)
    raise ValueError(f"unknown hook {hook!r}")


def diagonal_means(S: Tensor) -> Tensor:
    """``c (H, L)``: ``c[h, r]`` = mean of ``S[h, m, m - r]`` over ``m`` (the causal diagonals)."""
    H, L, _ = S.shape
    return torch.stack([torch.diagonal(S, offset=-r, dim1=-2, dim2=-1).mean(-1) for r in range(L)], dim=-1)


def position_dependence(S: Tensor) -> float:
    """How far ``S[m, n]`` (causal part) is from a function of ``m - n`` alone, relative to ``max |S|``.

    The largest spread (max minus min) along any diagonal ``m - n = r`` over the largest
    absolute entry: 0 (up to rounding) when the score is relative, as RoPE's is by
    construction (Su et al. 2021, Eq. 16) and sinusoidal inner products are (Su 2021, Eq. 31).
    """
    L = S.shape[-1]
    scale = float(torch.tril(S).abs().max())
    if scale == 0:
        return 0.0
    spread = max(float((d.amax(-1) - d.amin(-1)).max())
                 for d in (torch.diagonal(S, offset=-r, dim1=-2, dim2=-1) for r in range(L)))
    return spread / scale


def envelope(curve: np.ndarray) -> np.ndarray:
    """``e(r) = max_{r' >= r} |c(r')|``: the tightest non-increasing upper bound of ``|c|`` on the range."""
    return np.maximum.accumulate(np.abs(np.asarray(curve, dtype=float))[::-1])[::-1]


def octave_mean(curve: np.ndarray) -> np.ndarray:
    """``m(r)`` = mean of ``curve`` over ``[r, 2r]`` for ``r = 1 .. (L-1)/2``; ``m[0] = curve[0]``.

    The trend of an oscillating curve such as RoFormer's bound, on the log-distance axis it is drawn on.
    """
    c = np.asarray(curve, float)
    stop = _half(len(c))
    csum = np.concatenate(([0.0], np.cumsum(c)))
    r = np.arange(1, stop)
    return np.concatenate(([c[0]], (csum[2 * r + 1] - csum[r]) / (r + 1)))


def power_law_fit(distances: np.ndarray, values: np.ndarray) -> Optional[dict]:
    """Least-squares fit of ``values ~ a * r^(-k)`` in log-log space (Su 2021 §5.5 fits ``a / d^b``).

    Returns ``{"a", "exponent" (k), "r2" (of the log-log line)}`` or None without two positive points.
    """
    r, v = np.asarray(distances, float), np.asarray(values, float)
    keep = (r > 0) & (v > 0) & np.isfinite(v)
    if keep.sum() < 2:
        return None
    x, y = np.log(r[keep]), np.log(v[keep])
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1.0 - float((resid**2).sum() / total) if total > 0 else 1.0
    return {"a": float(np.exp(intercept)), "exponent": float(-slope), "r2": r2}


def decay_summary(curve: np.ndarray, fit_from: int = 1) -> dict:
    """Decay measures of a similarity curve ``c(r)``, ``r = 0 .. L-1``, normalised by ``c(0)``.

    * ``envelope`` ``e(r)`` (:func:`envelope`) of ``c(r) / c(0)``;
    * ``half_distance``: the first ``r`` with ``e(r) <= 1/2``: the distance beyond which
      no position is more than half as similar as a position to itself (None if none within the range);
    * ``mean_abs``: the mean of ``|c(r) / c(0)|`` over ``r = 1 .. L-1``;
    * ``power_law``: :func:`power_law_fit` of ``e(r)`` over ``r = fit_from .. (L-1)/2``
      (Su 2021, Eq. 40 predicts exponent ~1 for the exponential schedule, asymptotically).
      Only up to half the range, so that each ``e(r)`` is a maximum over at least ``[r, 2r]``:
      near the end of the range the envelope is the curve itself.
    """
    c = np.asarray(curve, float)
    c0 = c[0] if c[0] != 0 else (np.abs(c).max() or 1.0)
    norm = c / c0
    env = envelope(norm)
    below = np.nonzero(env <= 0.5)[0]
    r = np.arange(len(c))
    stop = _half(len(c))
    fit = power_law_fit(r[fit_from:stop], env[fit_from:stop])
    return {
        "normalized": norm,
        "envelope": env,
        "half_distance": int(below[0]) if len(below) else None,
        "mean_abs": float(np.abs(norm[1:]).mean()) if len(c) > 1 else 0.0,
        "power_law": fit,
    }


def linear_fit(distances: np.ndarray, values: np.ndarray) -> dict:
    """``values ~ slope * r + intercept`` by least squares, with ``r2`` (1 = exactly linear)."""
    r, v = np.asarray(distances, float), np.asarray(values, float)
    slope, intercept = np.polyfit(r, v, 1)
    total = ((v - v.mean()) ** 2).sum()
    resid = v - (slope * r + intercept)
    r2 = 1.0 - float((resid**2).sum() / total) if total > 0 else 1.0
    return {"slope": float(slope), "intercept": float(intercept), "r2": r2}


@torch.no_grad()
def rotary_frequencies(encoder) -> Tensor:
    """``theta (Dh/2,)`` of a ``rotate`` encoder, read off the hook, highest first.

    ``rotate`` turns a query at position ``m`` by ``R^m``; the one-step map
    ``R = M_1 M_0^{-1}`` (``M_p`` the hook applied to the basis vectors at position ``p``)
    has eigenvalues ``exp(+-i theta_i)``, whatever the feature pairing. Unrotated
    features (partial rotary) give ``theta = 0``.
    """
    Dh = encoder.head_dim
    basis = torch.eye(Dh, dtype=torch.float32)[:, None, None, :].expand(Dh, encoder.n_heads, 1, Dh).contiguous()
    dummy = torch.zeros(1, encoder.n_heads, 1, Dh)
    maps = []
    for p in (0, 1):
        pos = torch.tensor([p])
        q, _ = encoder.rotate(basis, dummy, pos, pos)
        maps.append(q[:, 0, 0, :].double().T)  # (Dh, Dh), column b = the hook applied to e_b
    step = maps[1] @ torch.linalg.inv(maps[0])
    angles = torch.linalg.eigvals(step).angle().abs().sort(descending=True).values
    return angles[0::2].contiguous()  # each theta appears as +theta and -theta


@torch.no_grad()
def rotates_only(encoder, length: int = 64) -> bool:
    """Whether ``rotate`` keeps the norm of q and k (a pure rotation; xPos also scales them)."""
    pos = torch.arange(length)
    ones = torch.ones(1, encoder.n_heads, length, encoder.head_dim)
    q, k = encoder.rotate(ones, ones.clone(), pos, pos)
    norm = ones.norm(dim=-1)
    return bool(torch.allclose(q.norm(dim=-1), norm, rtol=1e-4) and torch.allclose(k.norm(dim=-1), norm, rtol=1e-4))


def rope_relative_bound(theta: Tensor, max_distance: int) -> np.ndarray:
    """RoFormer's relative upper bound ``(1/(d/2)) sum_j |S_j|`` at distances ``0 .. max_distance - 1``.

    Su et al. 2021 (RoFormer), §3.4.3: with ``S_j = sum_{i<j} e^{i (m-n) theta_i}`` and
    ``h_i = q_[2i:2i+1] k*_[2i:2i+1]``, Abel summation gives
    ``|sum_i h_i e^{i (m-n) theta_i}| <= (max_i |h_{i+1} - h_i|) sum_{j=1}^{d/2} |S_j|``,
    and the mean ``(1/(d/2)) sum_j |S_j|`` decays with ``m - n`` (their Figure 2).

    Args:
        theta: the frequencies, ordered as the ``h_i`` (highest first, ``theta_i = base^(-2i/d)``).
        max_distance: how many distances, from 0.

    Returns:
        ``(max_distance,)``; the value at distance 0 is ``(d/2 + 1) / 2``.
    """
    r = torch.arange(max_distance, dtype=torch.float64)[:, None]
    phases = torch.polar(torch.ones(r.shape[0], theta.numel(), dtype=torch.float64), r * theta.double()[None, :])
    partial = phases.cumsum(dim=-1)  # S_1 .. S_{d/2}
    return partial.abs().mean(dim=-1).numpy()


def frequency_table(theta: Tensor, train_len: int, lengths: Sequence[int]) -> dict:
    """Wavelengths ``2 pi / theta_i`` (tokens) against the training and evaluation lengths.

    A pair whose wavelength exceeds ``train_len`` never turned a full circle in
    training, so the angles it meets at longer contexts are new to the model (the
    dimensions position interpolation and YaRN rescale; Su 2021 §2.3 relates the base
    to the longest wavelength ``2 pi base``).
    """
    th = theta.double().numpy()
    with np.errstate(divide="ignore"):
        wl = np.where(th > 0, 2 * np.pi / th, np.inf)
    longest = max(lengths) if lengths else train_len
    return {
        "theta": [float(t) for t in th],
        "wavelength": [float(w) if np.isfinite(w) else None for w in wl],
        # full turns pair i makes over the training context, and over the longest evaluation context
        "turns_in_train_len": [float(train_len / w) for w in wl],
        "turns_in_longest_eval": [float(longest / w) for w in wl],
        "pairs": int(len(th)),
        "longer_than_train_len": int((wl > train_len).sum()),
        "longer_than_longest_eval": int((wl > longest).sum()),
        "min_wavelength": float(wl.min()),
        "max_wavelength": float(wl[np.isfinite(wl)].max()) if np.isfinite(wl).any() else None,
    }


def embed_spectrum(p: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Power spectrum of the encodings along positions, summed over features (Su 2021 §5.5).

    Returns ``(cycles per token (F,), power (F,))``, the mean over positions removed first.
    """
    x = p.numpy() - p.numpy().mean(axis=0, keepdims=True)
    power = (np.abs(np.fft.rfft(x, axis=0)) ** 2).sum(axis=1)
    return np.fft.rfftfreq(x.shape[0]), power


# -- one unit: everything that applies --------------------------------------------------------

NOT_APPLICABLE = {
    "embed": "adds no position vectors to the embeddings",
    "rotate": "does not rotate q and k",
    "bias": "adds no logit bias",
    "scores": "adds no extra logit terms",
}


def analyse_unit(encoder, length: int, train_len: int, lengths: Sequence[int], fit_from: int = 1) -> dict:
    """All the numbers for one encoder (module), as plain Python values plus numpy curves under ``_curves``."""
    hooks = [h for h in HOOKS if getattr(encoder, f"uses_{h}")]
    out: dict[str, Any] = {"hooks": hooks, "length": length, "not_applicable": {}, "maps": {}}
    curves: dict[str, Any] = {}
    for h in HOOKS:
        if h not in hooks:
            out["not_applicable"][h] = NOT_APPLICABLE[h]
    if not hooks:
        out["note"] = "no positional hooks: order comes only from the causal mask; there is no geometry to show"
    for h in hooks:
        S = score_map(encoder, h, length)
        per_head = diagonal_means(S).numpy()  # (H, L)
        entry: dict[str, Any] = {"position_dependence": position_dependence(S), "heads": int(S.shape[0])}
        curves[h] = {"map": S.mean(0).numpy(), "per_head": per_head}
        if h == "bias":
            r = np.arange(length)
            fits = [linear_fit(r, per_head[i]) for i in range(per_head.shape[0])]
            entry["linear_fit_per_head"] = fits
            entry["bias_at"] = {str(d): [float(v) for v in per_head[:, d]] for d in _marks(length)}
        else:
            curve = per_head.mean(0)
            dec = decay_summary(curve, fit_from)
            curves[h]["decay"] = dec
            entry["decay"] = {k: dec[k] for k in ("half_distance", "mean_abs", "power_law")}
            entry["envelope_at"] = {str(d): float(dec["envelope"][d]) for d in _marks(length)}
        out["maps"][h] = entry
    if "embed" in hooks:
        p = embed_vectors(encoder, length)
        curves["spectrum"] = embed_spectrum(p)
        freqs = getattr(encoder, "frequencies", None)
        theta = freqs() if callable(freqs) and not encoder.uses_rotate else None
        if isinstance(theta, Tensor):
            out["frequencies"] = frequency_table(theta.detach().sort(descending=True).values, train_len, lengths)
    else:
        out["not_applicable"]["spectrum"] = "no position vectors to transform"
    if "rotate" in hooks:
        theta = rotary_frequencies(encoder)
        out["frequencies"] = frequency_table(theta, train_len, lengths)
        bound = rope_relative_bound(theta, length)
        curves["rope_bound"] = bound
        stop = _half(length)
        trend = octave_mean(bound)
        out["rope_bound"] = {"at": {str(d): float(bound[d]) for d in _marks(length)},
                             "mean_over_r_2r_at": {str(d): float(trend[d]) for d in _marks(len(trend))},
                             "power_law": power_law_fit(np.arange(fit_from, stop), octave_mean(bound)[fit_from:stop])}
        if not rotates_only(encoder):
            out["rope_bound"]["note"] = ("rotate also rescales q and k (e.g. xPos's decay); the bound covers the "
                                         "rotation only, the score curve shows both")
    else:
        out["not_applicable"]["rope_bound"] = "not a rotary encoding (RoFormer §3.4.3 bounds rotary scores)"
    if "frequencies" not in out:
        out["not_applicable"]["frequencies"] = "no frequency schedule read from its hooks"
    out["_curves"] = curves
    return out


def _half(length: int) -> int:
    """End (exclusive) of the distances ``0 .. (L-1)/2`` where the envelope is a max over at least ``[r, 2r]``."""
    return (length - 1) // 2 + 1


def _marks(length: int) -> list[int]:
    """Distances 0, 1, 2, 4, ... below ``length``, where the JSON samples curves."""
    out, d = [0], 1
    while d < length:
        out.append(d)
        d *= 2
    return out


# -- figures ----------------------------------------------------------------------------------

def _figure(height: float = FIG_H, width: float = FIG_W):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return atomic_write_bytes(path, buf.getvalue())


def _style(ax, xlabel: str, ylabel: str, title: Optional[str] = None) -> None:
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    if title:
        ax.set_title(title, fontsize=8)


def _mark_train(ax, train_len: int) -> None:
    ax.axvline(train_len, color="0.35", linestyle="--", linewidth=0.9, label=f"train length ({train_len})")


HOOK_TITLE = {"embed": "<p_m, p_n>", "rotate": "rotary score", "bias": "logit bias", "scores": "extra logits"}
HOOK_YLABEL = {
    "embed": "<p_m, p_n>",
    "rotate": "<R_m q, R_n k>, q = k = 1",
    "bias": "logit bias",
    "scores": "extra logit, q = k = 1",
}


def draw_unit(unit: dict, name: str, train_len: int, lengths: Sequence[int], out: Path, prefix: str,
              heatmap_len: int) -> list[str]:
    """The PNGs of one unit; returns their file names."""
    curves = unit["_curves"]
    written = []
    for h, c in ((h, curves[h]) for h in unit["hooks"]):
        # heatmap of the score as a function of m and n
        n = min(heatmap_len, c["map"].shape[0])
        fig = _figure(FIG_H + 0.4, FIG_W - 0.6)
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
        _style(ax, "key position n (tokens)", "query position m (tokens)", f"{name}: {HOOK_TITLE[h]}, causal part")
        ax.grid(False)
        written.append(_save(fig, out / f"{prefix}{h}_heatmap.png").name)

        # against distance
        fig = _figure()
        ax = fig.add_subplot()
        r = np.arange(c["per_head"].shape[1])
        if h == "bias":
            H = c["per_head"].shape[0]
            for i, fit in enumerate(unit["maps"]["bias"]["linear_fit_per_head"]):
                ax.plot(r, c["per_head"][i], linewidth=1.0,
                        label=f"head {i} (fitted slope {fit['slope']:.3g})" if H <= 8 else None)
            _style(ax, "distance m - n (tokens)", "logit bias", f"{name}: bias vs distance per head")
        else:
            dec = c["decay"]
            ax.plot(r[1:], dec["normalized"][1:], linewidth=0.6, color="tab:blue", alpha=0.6,
                    label="mean over m of S(m, m-r) / S(0)")
            stop = _half(len(r))
            ax.plot(r[1:stop], dec["envelope"][1:stop], linewidth=1.2, color="tab:red", label="envelope")
            fit = dec["power_law"]
            if fit is not None:
                ax.plot(r[1:stop], fit["a"] * r[1:stop] ** (-fit["exponent"]), linestyle=":", color="k",
                        linewidth=1.0, label=f"power-law fit {fit['a']:.2f} r^({-fit['exponent']:.2f})")
            ax.set_xscale("log", base=2)
            _style(ax, "distance m - n (tokens, log)", "score / score at distance 0",
                   f"{name}: {HOOK_TITLE[h]} vs distance")
        if unit["maps"][h]["position_dependence"] > RELATIVE_TOLERANCE:
            # not a function of m - n alone: the curve is the mean over each diagonal
            ax.set_title(ax.get_title() + " (not relative: diagonal means)", fontsize=8)
        _mark_train(ax, train_len)
        ax.legend(fontsize=6, loc="best", framealpha=0.85)
        written.append(_save(fig, out / f"{prefix}{h}_vs_distance.png").name)

    if "rope_bound" in curves:
        b = curves["rope_bound"]
        fig = _figure()
        ax = fig.add_subplot()
        r = np.arange(1, len(b))
        ax.plot(r, b[1:], linewidth=0.6, color="tab:purple", alpha=0.6, label=f"{name}")
        trend = octave_mean(b)
        ax.plot(r[:len(trend) - 1], trend[1:], linewidth=1.2, color="tab:red", label="mean over [r, 2r]")
        ax.set_xscale("log", base=2)
        _mark_train(ax, train_len)
        _style(ax, "relative distance m - n (tokens, log)", "(1/(d/2)) sum_j |S_j|",
               "rotary relative upper bound (RoFormer §3.4.3)")
        ax.legend(fontsize=6)
        written.append(_save(fig, out / f"{prefix}rope_bound.png").name)

    if "frequencies" in unit:
        ft = unit["frequencies"]
        wl = [w if w is not None else np.nan for w in ft["wavelength"]]
        fig = _figure()
        ax = fig.add_subplot()
        ax.plot(np.arange(len(wl)), wl, marker="o", markersize=2, linewidth=1.0, label=name)
        ax.axhline(train_len, color="0.35", linestyle="--", linewidth=0.9, label=f"train length ({train_len})")
        if lengths and max(lengths) != train_len:
            ax.axhline(max(lengths), color="tab:red", linestyle=":", linewidth=0.9,
                       label=f"longest eval length ({max(lengths)})")
        ax.set_yscale("log")
        _style(ax, "feature pair i", "wavelength 2π/θ_i (tokens, log)",
               f"{ft['longer_than_train_len']} of {ft['pairs']} pairs turn less than once in train_len")
        ax.legend(fontsize=6)
        written.append(_save(fig, out / f"{prefix}wavelengths.png").name)

    if "spectrum" in curves:
        f, power = curves["spectrum"]
        fig = _figure()
        ax = fig.add_subplot()
        keep = f > 0
        ax.loglog(1 / f[keep], power[keep] / (power[keep].max() or 1), linewidth=1.0, label=name)
        _mark_train(ax, train_len)
        _style(ax, "period (tokens per cycle, log)", "power (normalised, log)",
               f"{name}: spectrum of p along positions")
        ax.legend(fontsize=6)
        written.append(_save(fig, out / f"{prefix}spectrum.png").name)
    return written


# -- the Hydra app's job ------------------------------------------------------------------------

def analysis_length(cfg: DictConfig, encoder) -> tuple[int, Optional[str]]:
    """Positions analysed: ``analyze.length`` or the longest eval length, within the encoder's ``max_length``."""
    want = int(cfg.analyze.length) if cfg.analyze.length is not None else max(eval_lengths(cfg))
    if not encoder.supports(want):
        return int(encoder.max_length), (f"{encoder.name} encodes at most {encoder.max_length} positions; "
                                         f"analysed 0..{encoder.max_length - 1} instead of {want}")
    return want, None


def _jsonable(unit: dict) -> dict:
    return {k: v for k, v in unit.items() if not k.startswith("_")}


def _label(cfg: DictConfig, encoder) -> str:
    base = encoder.base
    return f"{encoder.label}" + (f" base={base:g}" if base is not None else "")


def analyse_encoder(encoder, cfg: DictConfig, out: Path, note: Optional[str] = None) -> dict:
    """Analyse ``encoder`` as configured by ``cfg``, write PNGs and ``analysis.json`` to ``out``."""
    a = cfg.analyze
    train_len = int(cfg.train_len)
    lengths = eval_lengths(cfg)
    length, clipped = analysis_length(cfg, encoder)
    heatmap_len = int(a.heatmap_len) if a.heatmap_len is not None else 2 * train_len
    label = _label(cfg, encoder)
    result: dict[str, Any] = {
        "encoder": cfg.encoder.name, "label": label, "base": encoder.base, "train_len": train_len,
        "eval_lengths": lengths, "d_model": encoder.d_model, "n_heads": encoder.n_heads, "length": length,
        "content": "q = k = (1, ..., 1) for rotate and scores hooks",
        "notes": [x for x in (note, clipped) if x],
        "units": [], "figures": [],
    }
    curves_out = []
    all_units = units(encoder, int(cfg.model.n_layers))
    for name, enc in all_units:
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


def run_analyze(cfg: DictConfig, out: Path, console: Optional[Console] = None) -> dict:
    """``posexp analyze encoder=... base=...``: check the config, analyse, write, print a summary."""
    console = console or Console()
    validate(cfg)
    check_analyze(cfg.analyze)
    torch.manual_seed(int(cfg.seed))  # learned encoders are analysed at their seeded initialisation
    encoder = build_encoder(cfg)
    encoder.eval()
    note = None
    if any(p.requires_grad for p in encoder.parameters()):
        note = "learned parameters shown at their initialisation (seed); analyse a trained run for the learned values"
    out.mkdir(parents=True, exist_ok=True)
    result = analyse_encoder(encoder, cfg, out, note)
    print_summary(result, console)
    console.print(f"wrote {out / ANALYSIS_JSON} and {len(result['figures'])} figure(s) in {out}", highlight=False)
    return result


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
                    + (f", envelope ~ r^-{fit['exponent']:.2f} (r2 {fit['r2']:.2f})" if fit else "")
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
    has_bound = any("rope_bound" in c for r in results for c in r["curves"])
    fig = _figure(FIG_H * (2 if has_bound else 1))
    axes = fig.subplots(2 if has_bound else 1, 1, squeeze=False)[:, 0]
    train_lens = set()
    for r in results:
        train_lens.add(r["train_len"])
        c = r["curves"][0]
        hook = next((h for h in ("embed", "rotate", "scores") if h in c), None)
        if hook is not None:
            env = envelope(np.asarray(c[hook]))
            stop = _half(len(env))
            axes[0].plot(np.arange(1, stop), env[1:stop], linewidth=1.1, label=r["label"])
            axes[0].set_xscale("log", base=2)
            _style(axes[0], "distance m - n (tokens, log)", "envelope of |S(r)/S(0)|", "decay with distance")
        elif "bias" in c:
            b = np.asarray(c["bias"]).mean(0)
            axes[0].plot(np.arange(len(b)), b, linewidth=1.1, label=r["label"] + " (mean over heads)")
            _style(axes[0], "distance m - n (tokens)", "logit bias", "bias vs distance")
        if has_bound and "rope_bound" in c:
            trend = octave_mean(np.asarray(c["rope_bound"]))
            axes[1].plot(np.arange(1, len(trend)), trend[1:], linewidth=1.1, label=r["label"])
            axes[1].set_xscale("log", base=2)
            _style(axes[1], "relative distance m - n (tokens, log)", "(1/(d/2)) sum_j |S_j|, mean over [r, 2r]",
                   "rotary relative upper bound (RoFormer §3.4.3)")
    for ax in axes:
        for tl in sorted(train_lens):
            _mark_train(ax, tl)
        ax.legend(fontsize=6, loc="best", framealpha=0.85)
    return _save(fig, Path(sweep_dir) / COMPARISON_PNG)


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]


class AnalyzeSweepCallback(Callback):
    """Hydra callback: when a ``posexp analyze -m`` sweep ends, draw ``comparison.png`` in the sweep folder."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        try:
            path = compare_sweep(Path(str(config.hydra.sweep.dir)))
            if path is not None:
                Console().print(f"wrote {path}", highlight=False)
        except Exception:  # the jobs' own outputs are already safe
            log.warning("comparison figure not written", exc_info=True)


# -- a trained run: learned encoding and attention --------------------------------------------

@torch.no_grad()
def attention_statistics(model, tokens: np.ndarray, length: int, n_windows: int) -> dict:
    """Per layer and head, mean attention distance and entropy on ``n_windows`` windows of ``length`` tokens.

    The attention probabilities are recomputed from each block's input exactly as
    the model forms its logits: ``q k^T / sqrt(Dh)`` after ``rotate``, plus ``bias``
    and ``scores``, causal mask, softmax. For query ``i``: mean distance
    ``sum_j a_ij (i - j)`` (tokens) and entropy ``-sum_j a_ij log a_ij`` (nats);
    both averaged over every query of every window.

    Returns:
        ``{"mean_distance": (layers, heads), "entropy": (layers, heads)}`` numpy arrays, and
        the uniform-attention references ``uniform_distance`` / ``uniform_entropy``.
    """

    blocks = list(model.blocks)
    n_layers, H = len(blocks), model.shape.n_heads
    dist_sum = np.zeros((n_layers, H))
    ent_sum = np.zeros((n_layers, H))
    count = 0
    captured: dict[int, tuple] = {}

    def hook_for(i):
        def hook(module, args):
            captured[i] = (module, args[0], args[1])
        return hook

    handles = [b.attn.register_forward_pre_hook(hook_for(i)) for i, b in enumerate(blocks)]
    device = next(model.parameters()).device
    try:
        for w in range(n_windows):
            idx = torch.as_tensor(np.asarray(tokens[w * length:(w + 1) * length], dtype=np.int64),
                                  device=device)[None]
            captured.clear()
            model(idx)
            for i in range(n_layers):
                attn, x, plan = captured[i]
                probs = _attention_probs(attn, x, plan)  # (1, H, L, L)
                L = probs.shape[-1]
                d = (torch.arange(L, device=device)[:, None] - torch.arange(L, device=device)[None, :]).clamp(min=0)
                dist_sum[i] += (probs * d).sum(-1).mean(-1)[0].double().cpu().numpy()
                plogp = torch.where(probs > 0, probs * probs.clamp_min(1e-30).log(), torch.zeros_like(probs))
                ent_sum[i] += (-plogp.sum(-1)).mean(-1)[0].double().cpu().numpy()
            count += 1
    finally:
        for h in handles:
            h.remove()
    i = np.arange(length)
    return {"mean_distance": dist_sum / count, "entropy": ent_sum / count,
            "uniform_distance": float((i / 2).mean()), "uniform_entropy": float(np.log(i + 1).mean())}


def _attention_probs(attn, x: Tensor, plan) -> Tensor:
    B, L, D = x.shape
    enc = plan.encoder
    q, k, _ = attn.qkv(x).view(B, L, 3, attn.n_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, L, Dh)
    if enc.uses_rotate:
        q, k = enc.rotate(q, k, plan.pos, plan.pos)
    logits = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(attn.head_dim)  # SDPA's default scale
    if plan.needs_mask:
        logits = logits + plan.bias(0, L, torch.float32)  # bias (if any) with the causal mask
        if enc.uses_scores:
            logits = logits + enc.scores(q, k, plan.pos, plan.pos).float()
    else:
        future = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    return logits.softmax(-1)


def parse_run_args(args: Sequence[str]) -> tuple[list[Path], dict]:
    """Run folders and ``analyze.KEY=VALUE`` overrides of ``posexp analyze RUN_DIR...``."""
    import yaml

    runs, over = [], {}
    keys = list(AnalyzeConfig.__dataclass_fields__)
    for arg in args:
        if is_run_dir(arg, needs_weights=True):
            runs.append(Path(arg))
            continue
        key, eq, value = arg.partition("=")
        if not eq:
            raise PosexpError(f"{arg}: not a run folder (one with results.json and checkpoint/); pass the folder "
                              "of one trained run, e.g. outputs/2026-11-22/10-00-00")
        require(key.startswith("analyze.") and key[len("analyze."):] in keys, key,
                "with a trained run only analyze.* settings apply; choose one of: "
                + ", ".join("analyze." + k for k in keys))
        over[key[len("analyze."):]] = yaml.safe_load(value)
    return runs, over


def analyze_run(run_dir: Path, overrides: dict, console: Optional[Console] = None) -> dict:
    """``posexp analyze RUN_DIR``: the trained encoder's geometry and the model's attention vs length.

    Loads the run as ``posexp eval`` does (:func:`posexp.reeval.prepare`: its saved config,
    its corpus, safetensors weights) and writes into ``RUN_DIR/analysis/``.
    """
    from omegaconf.errors import OmegaConfBaseException

    from posexp.commands.eval import prepare

    console = console or Console()
    p = prepare(run_dir, [])
    a = OmegaConf.structured(AnalyzeConfig)
    for k, v in overrides.items():
        try:
            a[k] = v
        except OmegaConfBaseException:
            raise ConfigError(f"analyze.{k}", f"{v!r} is not a valid value") from None
    check_analyze(a)
    cfg = OmegaConf.create(OmegaConf.to_container(p.cfg, resolve=True))
    cfg.analyze = a
    out = Path(run_dir) / "analysis"
    model = p.model.eval()
    result = analyse_encoder(model.encoder, cfg, out, note="trained encoder of this run")
    train_len = int(cfg.train_len)
    rows = []
    for m in sorted(set(int(x) for x in a.multiples)):
        length = m * train_len
        row: dict[str, Any] = {"multiple": m, "length": length}
        if not model.encoder.supports(length):
            row["not_applicable"] = f"{model.encoder.name} encodes at most {model.encoder.max_length} positions"
        elif len(p.corpus.val) < length:
            row["not_applicable"] = f"the validation text has only {len(p.corpus.val)} tokens"
        else:
            n = max(1, min(int(a.tokens) // length, len(p.corpus.val) // length))
            stats = attention_statistics(model, p.corpus.val, length, n)
            row.update({"windows": n, "mean_distance": stats["mean_distance"].round(4).tolist(),
                        "entropy": stats["entropy"].round(4).tolist(),
                        "uniform_distance": stats["uniform_distance"], "uniform_entropy": stats["uniform_entropy"]})
        rows.append(row)
        console.print(f"attention at {length} tokens ({m}× train_len): "
                      + (row.get("not_applicable") or f"{row['windows']} window(s)"), highlight=False)
    result["attention"] = rows
    if a.figures:
        result["figures"] += _draw_attention(rows, train_len, result["label"], out)
    atomic_write_json(out / ANALYSIS_JSON, result)
    print_summary(result, console)
    _print_attention(rows, console)
    console.print(f"wrote {out / ANALYSIS_JSON} and {len(result['figures'])} figure(s) in {out}", highlight=False)
    return result


def _draw_attention(rows: list[dict], train_len: int, label: str, out: Path) -> list[str]:
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
        fig = _figure(FIG_H * max(1, min(n_layers, 4)) * 0.8)
        axes = fig.subplots(n_layers, 1, squeeze=False)[:, 0]
        for layer, ax in enumerate(axes):
            for h in range(H):
                ax.plot(x, arr[:, layer, h], marker="o", markersize=3, linewidth=1.0, label=f"head {h}")
            ax.plot(x, [r[ref] for r in ok], linestyle=":", color="k", linewidth=1.0, label="uniform attention")
            _mark_train(ax, train_len)
            ax.set_xscale("log", base=2)
            ax.set_xticks(x, [str(v) for v in x])
            _style(ax, "context length (tokens)", ylabel, f"{label}: layer {layer}")
        axes[0].legend(fontsize=6, loc="best", framealpha=0.85, ncol=2)
        written.append(_save(fig, out / f"attention_{key}.png").name)
    return written


def _print_attention(rows: list[dict], console: Console) -> None:
    t = Table(title="attention per layer (mean over heads; per head in analysis.json)")
    t.add_column("length", justify="right")
    t.add_column("mean distance (tokens)")
    t.add_column("entropy (nats)")
    t.add_column("uniform: distance / entropy")
    for r in rows:
        if "mean_distance" not in r:
            t.add_row(str(r["length"]), "n/a", r["not_applicable"], "")
            continue
        d = np.array(r["mean_distance"]).mean(1)
        e = np.array(r["entropy"]).mean(1)
        t.add_row(str(r["length"]), ", ".join(f"{v:.1f}" for v in d), ", ".join(f"{v:.2f}" for v in e),
                  f"{r['uniform_distance']:.1f} / {r['uniform_entropy']:.2f}")
    console.print(t)


def analyze_runs_main(args: Sequence[str], console: Optional[Console] = None) -> list[dict]:
    runs, overrides = parse_run_args(args)
    return [analyze_run(r, overrides, console) for r in runs]
