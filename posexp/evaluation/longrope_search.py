"""LongRoPE's search for per-frequency rescale factors (Ding et al. 2024, "LongRoPE", §2.2 and Algorithm 1).

LongRoPE rescales each rotary frequency by its own factor, ``theta_i / lambda_i``, instead of one rule for all
(PI: every ``lambda_i = s``; NTK, YaRN: a formula in ``i``). The factors are found by an evolutionary search
against perplexity at the target length:

- the first population holds the factors PI, NTK and YaRN imply (the paper's initial solutions), then copies of
  them mutated;
- each generation keeps the ``parents`` best, and makes children by mutation (each factor multiplied by
  ``exp(N(0, sigma))``) and crossover (each factor taken from one of two parents);
- every candidate obeys the paper's monotone constraint ``1 <= lambda_0 <= lambda_1 <= ...`` (lower frequencies,
  larger index, interpolated at least as much), enforced by sorting and clipping to ``[1, 2 s]``.

The score is the perplexity at ``target_len`` on a slice of the validation tokens held apart from what ``posexp
eval`` scores (the last tokens of the split; the evaluation reads from its start), so that the factors are not
chosen on the numbers they are then reported with. The paper's other searched setting, the first ``n^`` positions
left unscaled, is not searched (posexp's ``longrope`` does not apply it, as transformers does not).

``posexp eval RUN eval.scaling=longrope eval.longrope_factors=[...]`` then evaluates with the factors found, and
``posexp finetune RUN scaling=longrope longrope_factors=[...]`` fine-tunes with them (``scripts/longrope_search.py``
runs the search on a run folder).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from posexp.config.schema import Config
from posexp.encoders.scaling import ntk_base, rope_frequencies, yarn_frequencies
from posexp.errors import require

Log = Optional[Callable[[str], None]]


@dataclass
class SearchResult:
    """The best factors found, their perplexity, the starting points' (``pi``, ``ntk``, ``yarn``) and each
    generation's best perplexity."""

    factors: list[float]
    ppl: float
    initial: dict[str, float] = field(default_factory=dict)
    history: list[float] = field(default_factory=list)


def initial_factors(dim: int, base: float, factor: float, train_len: int) -> dict[str, np.ndarray]:
    """``lambda_i = theta_i / theta'_i`` of PI, NTK and YaRN at scale ``factor``: the search's first solutions."""
    theta = rope_frequencies(dim, base).numpy()
    return {"pi": np.full(dim // 2, float(factor)),
            "ntk": theta / rope_frequencies(dim, ntk_base(base, factor, dim)).numpy(),
            "yarn": theta / yarn_frequencies(dim, base, factor, train_len).numpy()}


def constrained(factors: np.ndarray, factor: float) -> np.ndarray:
    """The paper's constraint: factors non-decreasing with the frequency index, at least 1 (at most ``2 s``)."""
    return np.sort(np.clip(factors, 1.0, 2.0 * factor))


@dataclass(frozen=True)
class SearchSettings:
    """How the evolutionary search runs (Ding et al. 2024, Algorithm 1); the defaults take minutes on a CPU.

    Attributes:
        population: candidates scored each generation (the first: PI, NTK, YaRN and their mutants).
        generations: generations after the first.
        parents: how many of the best breed the next generation.
        sigma: the mutation's spread, in log-factor.
        seed: the search's random numbers.
    """

    population: int = 12
    generations: int = 5
    parents: int = 4
    sigma: float = 0.15
    seed: int = 0


def search_factors(score: Callable[[np.ndarray], float], dim: int, base: float, factor: float, train_len: int,
                   settings: SearchSettings = SearchSettings(), log: Log = None) -> SearchResult:
    """The evolutionary search for ``dim / 2`` factors minimising ``score`` (perplexity at the target length).

    Args:
        score: perplexity of the model under given factors (:func:`perplexity_score`).
        dim: the rotary width; base: its trained base; factor: ``s`` = target length / ``train_len``.
        settings: the search's population, generations, parents, mutation spread and seed.
        log: called with a line per generation (its best perplexity).
    """
    population, generations, parents, sigma = (settings.population, settings.generations, settings.parents,
                                               settings.sigma)
    require(population >= 4 and 2 <= parents < population, "population",
            f"must be at least 4, with 2 <= parents < population (got {population}, {parents})")
    rng = np.random.default_rng(settings.seed)
    starts = {k: constrained(v, factor) for k, v in initial_factors(dim, base, factor, train_len).items()}
    seeds = list(starts.values())
    pool = seeds + [constrained(seeds[i % 3] * np.exp(rng.normal(0, sigma, dim // 2)), factor)
                    for i in range(population - len(seeds))]
    scored: dict[bytes, float] = {}

    def ranked(candidates: list[np.ndarray]) -> list[tuple[float, np.ndarray]]:
        for c in candidates:
            if c.tobytes() not in scored:
                value = score(c)
                scored[c.tobytes()] = value if math.isfinite(value) else math.inf
        return sorted(((scored[c.tobytes()], c) for c in candidates), key=lambda t: t[0])

    best = ranked(pool)
    result = SearchResult([], best[0][0], {k: scored[v.tobytes()] for k, v in starts.items()}, [best[0][0]])
    _say(log, 0, generations, best[0][0], result.initial)
    for g in range(1, generations + 1):
        elite = [c for _, c in best[:parents]]
        children: list[np.ndarray] = []
        while len(children) < population - parents:
            a, b = rng.choice(parents, 2, replace=False)
            child = np.where(rng.random(dim // 2) < 0.5, elite[a], elite[b])  # crossover
            children.append(constrained(child * np.exp(rng.normal(0, sigma, dim // 2)), factor))  # mutation
        best = ranked(elite + children)
        result.history.append(best[0][0])
        _say(log, g, generations, best[0][0])
    result.factors, result.ppl = [round(float(f), 4) for f in best[0][1]], best[0][0]
    return result


def _say(log: Log, g: int, generations: int, ppl: float, initial: Optional[dict] = None) -> None:
    if log is None:
        return
    start = f" (pi {initial['pi']:.3f}, ntk {initial['ntk']:.3f}, yarn {initial['yarn']:.3f})" if initial else ""
    log(f"longrope search: generation {g}/{generations}, best ppl {ppl:.3f}{start}")


def perplexity_score(model, val: np.ndarray, cfg: Config, target_len: int, tokens: int,
                     device: torch.device, dtype: torch.dtype) -> Callable[[np.ndarray], float]:
    """``score(factors)``: perplexity of ``model`` at ``target_len`` under ``eval.scaling=longrope`` with those
    factors, on the last ``tokens`` targets of ``val`` (apart from the tokens ``posexp eval`` scores first)."""
    from posexp.evaluation.perplexity import evaluate
    from posexp.model.positions import PositionPlan

    held_out = val[-(tokens + target_len + 1):]
    settings = dataclasses.replace(cfg.eval, lengths=[target_len], multiples=[1], tokens=tokens, protocol="nonoverlap",
                                   scaling="longrope", scaling_factor=None, window=None, sinks=None,
                                   loss_by_position=False)

    def score(factors: np.ndarray) -> float:
        e = dataclasses.replace(settings, longrope_factors=[float(f) for f in factors])
        rows = evaluate(model, held_out, e, int(cfg.train_len), device, position_plan=PositionPlan(cfg), dtype=dtype)
        ppl = rows[0].get("ppl")
        return float(ppl) if isinstance(ppl, (int, float)) else math.inf

    return score
