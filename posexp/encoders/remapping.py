"""Training-free position remapping: RoPE read at other positions than the true ones, at evaluation only.

Every method here keeps a RoPE model's weights and rotary frequencies and changes only *which positions* a query
and a key are rotated at, piece by piece over the (query, key) pairs. A pair ``(m, n)`` (query position ``m``, key
position ``n``, distance ``d = m - n``) falls in one piece; within piece ``p`` the logit is RoPE's at the remapped
positions, ``<R(P_q^p(m)) q, R(P_k^p(n)) k>``, so the relative position the model sees is
``P_q^p(m) - P_k^p(n)``:

==============  ==========================================================================================
``rerope``      Su 2023 ("Transformer升级之路 12: 无限外推的ReRoPE?"): ``min(d, w)``. Pieces: ``d <= w`` as
                trained; ``d > w``: the query at ``w``, the key at 0. Option ``window`` (``w``).
``self_extend`` Jin et al. 2024 ("LLM Maybe LongLM", §3, Eq. of the grouped attention): neighbour attention
                ``d < W`` as trained; grouped attention ``d >= W``: the query at ``floor(m/G) + W - W/G``, the key
                at ``floor(n/G)``, so the groups join the neighbour window without a gap. Options ``group``
                (``G``) and ``window`` (``W``); as in the authors' code (datamllab/LongLM) the shift ``W - W/G``
                is a true division.
``string``      An et al. 2025 ("Why does the effective context length of LLMs fall short?", STRING's shifted
                position matrix): ``d < S`` as trained; ``d >= S``: ``d - S + W`` (the query moved back by
                ``S - W``), so the rarely trained distances ``> L - S + W`` are never read. Options ``offset``
                (``S``) and ``local`` (``W``). The authors' flash implementation (HKUNLP/STRING,
                ``string_for_llama.py``) also counts the key at exactly ``d = S`` in both halves and multiplies
                cos and sin by ``0.1 ln 2 + 1``; posexp follows the paper's matrix, each key once, no temperature.
``dca``         An et al. 2024 ("Training-Free Long-Context Scaling of LLMs", Dual Chunk Attention, §3), with
                chunks of ``c = s - w`` positions (``s`` the chunk size, ``w`` the local window; the authors'
                ``chunkllama_attn_replace.py``): keys at ``n mod c`` always; queries at ``m mod c`` within the
                chunk (intra-chunk), at ``min(m mod c + c, s)`` over the previous chunk (successive-chunk), and
                at ``min(2c - 1, s)`` over older chunks (inter-chunk). Options ``chunk`` (``s``), ``local`` (``w``).
``ms_poe``      Zhang et al. 2024 ("Found in the Middle", Ms-PoE, §3.2): head ``h`` reads every position at
                ``m / r_h``, ``r_h = min + (max - min) * rank_h / H``, the heads ranked by their share of attention
                outliers (weights above 4x the row mean, in the last query row of the unrotated attention of the
                input) from most to fewest, so the most position-aware heads are compressed least; the first
                ``skip_layers`` layers are left as they are (the authors apply layers 2..31 of 32). The authors'
                code indexes the ratios by the sort order itself and gives a key head its group's first ratio;
                posexp gives each head the ratio of its rank, to its queries and keys alike, as the paper states.
==============  ==========================================================================================

How it runs: q and k arrive rotated at their true positions (``R(m) q``); since ``R(a) R(b) = R(a + b)``, rotating
them by ``P(m) - m`` moves them to the remapped positions, on posexp's own RoPE (``posexp.encoders.rope.RemappedRoPE``, through
the ``attend`` hook) and inside a transformers model's attention interface (:mod:`posexp.hf.remap`) alike.
:func:`posexp.encoders.remap_attention.remapped_attention` forms each query block's logits piece by piece over only the key columns the piece
touches, so memory is one block of logits (linear in the length), never a full ``L x L`` matrix per piece.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from posexp.errors import ConfigError

REROPE, SELF_EXTEND, STRING, DCA, MS_POE = "rerope", "self_extend", "string", "dca", "ms_poe"
# every remapping, rerope included; the last four are this module's (rerope's posexp path is ReRoPEScores)
REMAPPINGS = (REROPE, SELF_EXTEND, STRING, DCA, MS_POE)
# eval.<key> of each method's options, in the order rows record them
OPTION_KEYS: dict[str, tuple[str, ...]] = {
    REROPE: ("rerope_window",),
    SELF_EXTEND: ("self_extend_group", "self_extend_window"),
    STRING: ("string_offset", "string_local"),
    DCA: ("dca_chunk", "dca_local"),
    MS_POE: ("ms_poe_min", "ms_poe_max", "ms_poe_skip_layers"),
}
ALL_OPTION_KEYS = tuple(k for keys in OPTION_KEYS.values() for k in keys)
# the option a row keeps as its scaling_factor (it may change with the length); the others go to scaling_options
FACTOR_OPTION = {REROPE: "rerope_window", SELF_EXTEND: "self_extend_group"}
MS_POE_MIN, MS_POE_MAX, MS_POE_SKIP = 1.2, 1.8, 2  # the authors' run script (src/ms_poe.sh)
MS_POE_OUTLIER = 4.0  # an outlier weight is above 4x its row's mean (the authors' _calculate_outlier)


def _short(key: str) -> str:
    return key.split("_", 2)[-1] if key.startswith(("self_extend_", "ms_poe_")) else key.split("_", 1)[1]


def default_options(kind: str, train_len: int, length: int) -> dict[str, float]:
    """Each option's value when its ``eval.`` key is unset, for a model trained at ``train_len`` read at ``length``.

    - rerope: ``w = train_len / 2``.
    - self_extend: ``W = train_len / 4`` and the smallest ``G`` whose grouped positions stay inside the trained
      range at this length, ``G = ceil((L - W) / (train_len - W))`` (Jin et al. 2024, §3: Self-Extend reaches
      ``(L_train - W) * G + W`` tokens), at least 1.
    - string: ``S = floor(0.33 * train_len)`` and ``W = min(128, train_len / 16)`` (the authors' defaults: a third
      of the training length shifted, a local window of 128 on 2K-128K models), ``W < S``.
    - dca: ``s = 3/4 train_len`` and ``w = train_len / 16`` (the authors' ``replace_with_chunkllama``).
    - ms_poe: ``min = 1.2``, ``max = 1.8``, ``skip_layers = 2``.
    """
    T = int(train_len)
    if kind == REROPE:
        return {"rerope_window": max(1, T // 2)}
    if kind == SELF_EXTEND:
        return {"self_extend_group": default_group(length, T), "self_extend_window": max(1, T // 4)}
    if kind == STRING:
        S = max(2, int(0.33 * T))
        return {"string_offset": S, "string_local": max(1, min(128, T // 16, S - 1))}
    if kind == DCA:
        s = max(2, T * 3 // 4)
        return {"dca_chunk": s, "dca_local": max(0, min(T // 16, s - 1))}
    if kind == MS_POE:
        return {"ms_poe_min": MS_POE_MIN, "ms_poe_max": MS_POE_MAX, "ms_poe_skip_layers": MS_POE_SKIP}
    raise ConfigError("eval.scaling", f"{kind!r} is not a position remapping; choose one of: {', '.join(REMAPPINGS)}")


def default_group(length: int, train_len: int, window: Optional[int] = None) -> int:
    """Self-Extend's group when ``eval.self_extend_group`` is unset: the smallest ``G`` with
    ``(train_len - W) * G + W >= length`` (Jin et al. 2024, §3), ``W`` the neighbour window (default train_len / 4)."""
    W = max(1, int(train_len) // 4) if window is None else int(window)
    return max(1, math.ceil((int(length) - W) / max(1, int(train_len) - W)))


def check_options(kind: Optional[str], given: dict, train_len: Optional[int] = None) -> None:
    """Each set ``eval.<option>`` belongs to ``kind`` and is in range.

    Raises:
        ConfigError: naming the key and what it allows.
    """
    for key, value in given.items():
        if value is None:
            continue
        owner = next(k for k, keys in OPTION_KEYS.items() if key in keys)
        if kind != owner:
            raise ConfigError(f"eval.{key}", f"only applies with eval.scaling={owner} (scaling is {kind}); "
                                             f"drop it or set eval.scaling={owner}")
    g = {k: v for k, v in given.items() if v is not None}
    limit = f" and train_len={train_len}" if train_len is not None else ""

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"eval.{key}", f"{what} (got {g[key]})")

    for key in ("self_extend_group", "self_extend_window", "string_offset", "string_local", "dca_chunk",
                "ms_poe_skip_layers"):
        if key in g:
            low = 0 if key == "ms_poe_skip_layers" else 1
            need(float(g[key]).is_integer() and g[key] >= low, key,
                 f"must be an integer >= {low}" + ("" if key == "ms_poe_skip_layers" else " (tokens)"))
    if "dca_local" in g:
        need(float(g["dca_local"]).is_integer() and g["dca_local"] >= 0, "dca_local", "must be an integer >= 0 (tokens)")
    for key in ("string_offset", "dca_chunk", "self_extend_window"):
        if key in g and train_len is not None:
            need(g[key] <= train_len, key, f"must be between 1{limit}: a distance the model was trained on")
    if "string_local" in g and "string_offset" in g:
        need(g["string_local"] < g["string_offset"], "string_local", "must be smaller than eval.string_offset")
    if "dca_local" in g and "dca_chunk" in g:
        need(g["dca_local"] < g["dca_chunk"], "dca_local", "must be smaller than eval.dca_chunk")
    for key in ("ms_poe_min", "ms_poe_max"):
        if key in g:
            need(g[key] >= 1, key, "must be a ratio >= 1 (positions are divided by it)")
    if "ms_poe_min" in g and "ms_poe_max" in g:
        need(g["ms_poe_max"] >= g["ms_poe_min"], "ms_poe_max", "must be >= eval.ms_poe_min")


def skip_refusal(remap: "Remapping", n_layers: int) -> Optional[str]:
    """Why Ms-PoE would leave every one of ``n_layers`` layers as trained (its ``skip_layers`` too many), or None."""
    if remap.kind != MS_POE or int(remap["skip_layers"]) < n_layers:
        return None
    return (f"ms_poe leaves its first {int(remap['skip_layers'])} layers as trained, every layer of this "
            f"{n_layers}-layer model: set eval.ms_poe_skip_layers below {n_layers}")


@dataclass(frozen=True)
class Remapping:
    """One remapping and all its options (``eval.<key>`` names, every one filled in), for one length.

    Attributes:
        kind: one of :data:`REMAPPINGS`.
        options: ``((eval key, value), ...)`` in :data:`OPTION_KEYS` order.
    """

    kind: str
    options: tuple[tuple[str, float], ...] = field(default=())

    @classmethod
    def of(cls, kind: str, given: dict, train_len: int, length: int) -> "Remapping":
        """``kind`` with the options ``given`` (unset ones None) and the rest at their defaults.

        Raises:
            ConfigError: an option out of range once the defaults are filled in (a local window not below its
                offset or chunk).
        """
        values = {**default_options(kind, train_len, length),
                  **{k: v for k, v in given.items() if v is not None and k in OPTION_KEYS[kind]}}
        T = int(train_len)
        if kind == SELF_EXTEND and given.get("self_extend_group") is None:  # the paper's reach from the window used
            values["self_extend_group"] = default_group(length, T, int(values["self_extend_window"]))
        if kind == STRING and given.get("string_local") is None:
            values["string_local"] = max(1, min(int(values["string_local"]), int(values["string_offset"]) - 1))
        if kind == DCA and given.get("dca_local") is None:
            values["dca_local"] = max(0, min(int(values["dca_local"]), int(values["dca_chunk"]) - 1))
        check_options(kind, {k: values[k] for k in OPTION_KEYS[kind]})
        return cls(kind, tuple((k, _number(values[k])) for k in OPTION_KEYS[kind]))

    def __getitem__(self, short: str) -> float:
        for key, value in self.options:
            if _short(key) == short:
                return value
        raise KeyError(short)

    @property
    def factor(self) -> Optional[float]:
        """The number a row keeps as ``scaling_factor`` (rerope's window, self_extend's group), or None."""
        key = FACTOR_OPTION.get(self.kind)
        return None if key is None else float(dict(self.options)[key])

    @property
    def text(self) -> Optional[str]:
        """The other options as a row's ``scaling_options``: ``"window=32"``, ``"min=1.2 max=1.8 skip_layers=2"``;
        None when the factor is the only one."""
        rest = [(k, v) for k, v in self.options if k != FACTOR_OPTION.get(self.kind)]
        return " ".join(f"{_short(k)}={v:g}" for k, v in rest) or None

    def method(self) -> "Method":
        """The pieces and positions of this remapping (:class:`Method`)."""
        return METHODS[self.kind](self)


def _number(v: float) -> float:
    v = float(v)
    return int(v) if v.is_integer() else v


# -- the methods' pieces ------------------------------------------------------------------------------

def _floor_div(x: Tensor, by: float) -> Tensor:
    return torch.div(x, by, rounding_mode="floor")


class Method:
    """A remapping's pieces over (query, key) pairs.

    ``region(m, n)`` numbers each pair's piece (``(Lq, Lk)``, int); ``q_at(p, m)`` / ``k_at(p, n)`` are the positions
    the queries and keys of piece ``p`` are read at (None: their true ones), of shape ``(L,)``, or ``(B, H, L)`` for
    per-head positions. ``k_variant(p)`` names pieces that read keys at the same positions, so each is rotated once.
    """

    pieces = 1

    def block(self, default: int) -> int:
        """Queries per block of logits: at most 128 (measured fastest on CPU by scripts/bench_remap.py: the narrow
        pieces then span few columns); a method whose pieces follow chunks of positions may prefer its chunk."""
        return min(default, 128)

    def region(self, m: Tensor, n: Tensor) -> Tensor:
        return torch.zeros(m.shape[0], n.shape[0], dtype=torch.int8, device=m.device)

    def q_at(self, p: int, m: Tensor) -> Optional[Tensor]:
        return None

    def k_at(self, p: int, n: Tensor) -> Optional[Tensor]:
        return None

    def k_variant(self, p: int) -> int:
        return p


class ReRoPEMethod(Method):
    """``min(m - n, w)`` (Su 2023): as trained up to ``w``; beyond, the query at ``w`` and the key at 0."""

    pieces = 2

    def __init__(self, r: Remapping):
        self.w = float(r["window"])

    def region(self, m, n):
        return ((m[:, None] - n[None, :]) > self.w).to(torch.int8)

    def q_at(self, p, m):
        return None if p == 0 else torch.full_like(m, self.w, dtype=torch.float64)

    def k_at(self, p, n):
        return None if p == 0 else torch.zeros_like(n, dtype=torch.float64)


class SelfExtendMethod(Method):
    """Jin et al. 2024: neighbour ``d < W`` as trained; grouped ``d >= W`` at ``floor(m/G) + W - W/G`` and
    ``floor(n/G)``."""

    pieces = 2

    def __init__(self, r: Remapping):
        self.G, self.W = int(r["group"]), int(r["window"])

    def region(self, m, n):
        return ((m[:, None] - n[None, :]) >= self.W).to(torch.int8)

    def q_at(self, p, m):
        return None if p == 0 else _floor_div(m, self.G).double() + (self.W - self.W / self.G)

    def k_at(self, p, n):
        return None if p == 0 else _floor_div(n, self.G).double()


class StringMethod(Method):
    """An et al. 2025: ``d < S`` as trained; ``d >= S`` read at ``d - S + W`` (the query moved by ``W - S``)."""

    pieces = 2

    def __init__(self, r: Remapping):
        self.S, self.W = int(r["offset"]), int(r["local"])

    def region(self, m, n):
        return ((m[:, None] - n[None, :]) >= self.S).to(torch.int8)

    def q_at(self, p, m):
        return None if p == 0 else m.double() - self.S + self.W


class DCAMethod(Method):
    """An et al. 2024, Dual Chunk Attention over chunks of ``c = s - w`` positions: intra (0), successive (1) and
    inter-chunk (2) pieces, every key at ``n mod c``."""

    pieces = 3

    def __init__(self, r: Remapping):
        self.s, self.w = int(r["chunk"]), int(r["local"])
        self.c = self.s - self.w

    def block(self, default):
        return max(16, min(default, self.c))  # a block then spans at most two chunks: narrow intra and successive

    def region(self, m, n):
        gap = _floor_div(m, self.c)[:, None] - _floor_div(n, self.c)[None, :]
        return gap.clamp(0, 2).to(torch.int8)

    def q_at(self, p, m):
        within = torch.remainder(m, self.c).double()
        if p == 0:
            return within
        if p == 1:
            return (within + self.c).clamp(max=self.s)
        return torch.full_like(within, float(min(2 * self.c - 1, self.s)))

    def k_at(self, p, n):
        return torch.remainder(n, self.c).double()

    def k_variant(self, p):
        return 0


class MsPoEMethod(Method):
    """Zhang et al. 2024: head ``h`` at ``m / r_h``, queries and keys alike (per-head positions ``(B, H, L)``); the
    ratios are set per input by :meth:`rank_heads` before the method is used."""

    def __init__(self, r: Remapping):
        self.lo, self.hi = float(r["min"]), float(r["max"])
        self.skip = int(r["skip_layers"])
        self.ratio: Optional[Tensor] = None  # (B, H)

    def ratios(self, rank: Tensor) -> Tensor:
        """``r_h = min + (max - min) * rank_h / H`` (the authors' ``compress_ratio``), for ranks ``(B, H)``."""
        H = rank.shape[-1]
        return self.lo + (self.hi - self.lo) * rank.double() / H

    def rank_heads(self, q: Tensor, k: Tensor, scale: float) -> None:
        """Set the ratios from unrotated ``q (B, H, Lq, D)`` and ``k (B, H, Lk, D)``: the last query's attention over
        every key; a head's score is its share of weights above 4x the row mean; most outliers -> rank 0."""
        logits = (q[:, :, -1:].double() @ k.double().transpose(-1, -2)) * scale  # (B, H, 1, Lk), sees every key
        w = logits.softmax(-1)
        outliers = (w > MS_POE_OUTLIER * w.mean(-1, keepdim=True)).double().mean(-1)[..., 0]  # (B, H)
        order = torch.argsort(-outliers, dim=-1, stable=True)  # heads from most to fewest outliers
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
        self.ratio = self.ratios(rank)

    def _at(self, pos: Tensor) -> Tensor:
        assert self.ratio is not None, "rank_heads sets the ratios first"
        return pos.double()[None, None, :] / self.ratio[..., None]  # (B, H, L)

    def q_at(self, p, m):
        return self._at(m)

    def k_at(self, p, n):
        return self._at(n)


METHODS: dict[str, Callable[[Remapping], Method]] = {REROPE: ReRoPEMethod, SELF_EXTEND: SelfExtendMethod,
                                                     STRING: StringMethod, DCA: DCAMethod, MS_POE: MsPoEMethod}


__all__ = ["ALL_OPTION_KEYS", "DCA", "FACTOR_OPTION", "MS_POE", "METHODS", "Method", "MsPoEMethod", "OPTION_KEYS",
           "REMAPPINGS", "REROPE", "Remapping", "SELF_EXTEND", "STRING", "check_options", "default_group", "default_options", "skip_refusal",
           ]

