"""The geometry of a positional encoding: score maps through its hooks, and what they show.

Pure tensor math, no files and no figures. Every encoder is analysed through its
hooks (:mod:`posexp.encoders.contract`), never by name, so each gets what applies to
the way it touches attention:

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
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

HOOKS = ("embed", "rotate", "bias", "scores")
# position_dependence below this (float32 hooks) counts as a score of m - n alone
RELATIVE_TOLERANCE = 1e-4
# a rotate hook whose one-step angles are all below this (radians per token) turns no pair: it is no rotation
NO_TURN = 1e-6


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
    stop = half_range(len(c))
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
    return {"a": float(np.exp(intercept)), "exponent": float(-slope), "r2": _r2(y, slope * x + intercept)}


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
    stop = half_range(len(c))
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
    return {"slope": float(slope), "intercept": float(intercept), "r2": _r2(v, slope * r + intercept)}


def _r2(values: np.ndarray, fitted: np.ndarray) -> float:
    """``1 - SS_res / SS_tot`` of a least-squares line: the share of the values' variance it explains, in
    ``[0, 1]``; 1 for values constant up to rounding, which the line fits exactly (their spread is then rounding
    noise, as the fit's residuals are, and the ratio of two rounding noises is no measure)."""
    total = float(((values - values.mean()) ** 2).sum())
    if total <= len(values) * (16 * np.finfo(float).eps * float(np.abs(values).max())) ** 2:
        return 1.0
    return 1.0 - float(((values - fitted) ** 2).sum()) / total


@torch.no_grad()
def rotary_frequencies(encoder) -> Optional[Tensor]:
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
        if q.shape[-1] != Dh:  # the hook maps q to another width (PoPE's polar features): no rotation of Dh
            return None
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
    if not hooks and getattr(encoder, "explicit_attention", False):
        out["note"] = ("order enters only through the content (the transform / normalise hooks: forget gates, "
                       "Householder products, stick-breaking); there is no content-free geometry to show")
    elif not hooks:
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
    theta = rotary_frequencies(encoder) if "rotate" in hooks else None
    if "rotate" in hooks and (why := _not_a_rotation(theta)) is not None:
        out["not_applicable"]["rope_bound"] = why
    elif theta is not None:
        out["frequencies"] = frequency_table(theta, train_len, lengths)
        bound = rope_relative_bound(theta, length)
        curves["rope_bound"] = bound
        stop = half_range(length)
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


def _not_a_rotation(theta: Optional[Tensor]) -> Optional[str]:
    """Why the frequencies read off a ``rotate`` hook (:func:`rotary_frequencies`; None: the hook changes the head
    width) are no rotation to bound or to read wavelengths from; None when a pair of features turns."""
    if theta is None:
        return "rotate changes the width of q and k: not a rotation of the head's features"
    if not bool((theta > NO_TURN).any()):  # iRoPE's NoPE layers: a query temperature
        return "rotate turns no pair of features (it rescales q or k): not a rotation"
    return None


def half_range(length: int) -> int:
    """End (exclusive) of the distances ``0 .. (L-1)/2`` where the envelope is a max over at least ``[r, 2r]``."""
    return (length - 1) // 2 + 1


def _marks(length: int) -> list[int]:
    """Distances 0, 1, 2, 4, ... below ``length``, where the JSON samples curves."""
    out, d = [0], 1
    while d < length:
        out.append(d)
        d *= 2
    return out
