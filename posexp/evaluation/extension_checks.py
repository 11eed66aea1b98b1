"""The evaluation-time context extension a config asks for (``eval.scaling`` and its options), checked before
anything loads: known, offered by the encoding, and each option only with its method and in range. Shared by a run's
evaluation (:func:`posexp.commands.validation.validate_eval`) and a pretrained model's (posexp/commands/pretrained.py).
"""

from __future__ import annotations

from typing import Any, Optional

from posexp.encoders.extension import NONE, REMAPPINGS, REROPE, SCALINGS, check_scaling, scaled_encoder
from posexp.encoders.remapping import ALL_OPTION_KEYS, OPTION_KEYS, Remapping, check_options
from posexp.encoders.scaling import LONGROPE, check_known, check_longrope_start
from posexp.errors import require
from posexp.runs.longrope import longrope_settings


def check_scaling_options(scaling: str, factor: Optional[float], encoder_name: str, encoder=None,
                          rerope_window: Optional[int] = None, train_len: Optional[int] = None) -> None:
    """``eval.scaling`` known and offered by the encoder (as configured, when ``encoder`` is given), and its
    settings as :func:`check_scaling_settings` checks them."""
    check_known(scaling)
    check_scaling(scaling, encoder_name, encoder)
    check_scaling_settings(scaling, factor, rerope_window, train_len)


def check_scaling_settings(scaling: str, factor: Optional[float], rerope_window: Optional[int] = None,
                           train_len: Optional[int] = None) -> None:
    """Whatever the model: ``eval.scaling`` known; ``eval.scaling_factor`` >= 1 and only with a scaling that has a
    factor; ``eval.rerope_window`` only with ``rerope``, between 1 and ``train_len`` (when known)."""
    check_known(scaling)
    if rerope_window is not None:
        require(scaling == REROPE, "eval.rerope_window",
                f"only applies with eval.scaling=rerope (scaling is {scaling}); drop it or set eval.scaling=rerope")
        limit = f" and train_len={train_len}" if train_len is not None else ""
        require(rerope_window >= 1 and (train_len is None or rerope_window <= train_len), "eval.rerope_window",
                f"must be between 1{limit}, the window of relative positions kept exact; "
                f"distances beyond it are read as the window (got {rerope_window})")
    if scaling == REROPE:
        require(factor is None, "eval.scaling_factor",
                "rerope has no factor: its one setting is the window, eval.rerope_window=W "
                "(tokens; unset = train_len / 2); drop eval.scaling_factor")
    if factor is not None:
        require(scaling != NONE, "eval.scaling_factor",
                f"only applies with an eval.scaling ({', '.join(SCALINGS[1:])}); drop it or set one")
        require(factor >= 1, "eval.scaling_factor",
                f"must be >= 1, the factor the context is extended by (got {factor:g}); leave it unset "
                "for eval length / train length at each length")


def check_remap_options(e: Any, train_len: Optional[int]) -> None:
    """A remapping's ``eval.`` options: each with its method, in range (defaults filled in); no factor, no window."""
    check_options(e.scaling, given := {key: getattr(e, key, None) for key in ALL_OPTION_KEYS}, train_len)
    if e.scaling in REMAPPINGS[1:] and train_len is not None:  # a local window against its default chunk, say
        Remapping.of(e.scaling, given, train_len, train_len)
    if e.scaling in REMAPPINGS[1:]:
        require(e.scaling_factor is None, "eval.scaling_factor", f"{e.scaling} has no factor: its settings are "
                f"{', '.join(f'eval.{k}' for k in OPTION_KEYS[e.scaling])} (null = defaults); drop eval.scaling_factor")
        require(getattr(e, "window", None) is None, "eval.window",
                f"{e.scaling} remaps positions over the whole causal past; evaluate it without eval.window")


def check_longrope_options(e: Any, train_len: int, encoder=None) -> None:
    """LongRoPE's keys only with ``eval.scaling=longrope``: its factors, its ``n^`` (Ding et al. 2024, §3.2) and
    posexp search's file; with ``encoder``, their count and values read as past the training length."""
    factors = getattr(e, "longrope_factors", None)
    require(factors is None or e.scaling == LONGROPE, "eval.longrope_factors",
            f"only applies with eval.scaling=longrope (scaling is {e.scaling}); drop it or set eval.scaling=longrope")
    for key in ("longrope_start", "longrope_file"):
        require(not getattr(e, key, None) or e.scaling == LONGROPE, f"eval.{key}",
                f"only applies with eval.scaling=longrope (scaling is {e.scaling}); drop it or set "
                f"eval.scaling=longrope")
    check_longrope_start(getattr(e, "longrope_start", 0))
    factors, start = longrope_settings(e)
    if e.scaling == LONGROPE and encoder is not None:
        scaled_encoder(encoder, LONGROPE, 2.0, int(train_len), factors, start)


__all__ = ["check_longrope_options", "check_remap_options", "check_scaling_options", "check_scaling_settings"]
