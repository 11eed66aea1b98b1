"""LongRoPE's search for per-frequency rescale factors and ``n^`` (Ding et al. 2024, "LongRoPE", §3.2, Algorithm 1).

LongRoPE rescales each rotary frequency by its own factor, ``theta_i / lambda_i``, instead of one rule for all
(PI: every ``lambda_i = s``; NTK, YaRN: a formula in ``i``), and leaves the first ``n^`` positions unscaled
(``I(lambda_i, n^) = 1`` for ``n < n^``). Both are found by an evolutionary search at the target length:

- the first population holds the factors PI, NTK and YaRN imply (the paper's initial solutions) with ``n^ = 0``,
  then copies of them mutated;
- each generation keeps the ``parents`` best, and makes children by mutation (each factor multiplied by
  ``exp(N(0, sigma))``; ``n^`` redrawn from :data:`START_CHOICES` with probability 0.3) and
  crossover (each factor, and ``n^``, taken from one of two parents);
- every candidate obeys the paper's monotone constraint ``1 <= lambda_0 <= lambda_1 <= ...`` (lower frequencies,
  larger index, interpolated at least as much), enforced by sorting and clipping to ``[1, 2 s]``, on the paper's
  grid of step 0.01.

The score is one of two objectives, lower is better:

- ``ppl`` (LongRoPE): perplexity at the target length on a slice of the validation tokens held apart from what
  ``posexp eval`` scores (the last tokens of the split; the evaluation reads from its start);
- ``needle`` (LongRoPE2, Shang et al. 2025, §3.2 "needle-driven perplexity"): perplexity on the answer tokens only,
  of documents of the target length with a passkey planted at a random depth and asked for at the end (the
  passkey wording of Mohtashami & Jaggi 2023, as LongRoPE2 uses it), so that the factors are chosen for reading
  far context, not for the local tokens that dominate plain perplexity.

The search is deterministic given its seed: candidates depend only on the random numbers and on the scores, so a
search that replays with the scores it already has (``cache``) makes the same candidates and only scores new ones.
``posexp search`` keeps that cache in a state file, which is how a stopped search continues (posexp/commands/search.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from posexp.encoders.scaling import LONGROPE, ntk_base, rope_frequencies, yarn_frequencies
from posexp.errors import require

Log = Optional[Callable[[str], None]]
Score = Callable[[np.ndarray, int], float]  # (factors, n^) -> the objective, lower is better

# n^'s search space (Ding et al. 2024, §3.2): the first positions left unscaled
START_CHOICES = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)
STEP = 0.01  # the factors' grid (the paper's search step)
OBJECTIVES = ("ppl", "needle")


@dataclass
class SearchResult:
    """The best factors and ``n^`` found, their score, the starting points' (``pi``, ``ntk``, ``yarn``) and each
    generation's best score."""

    factors: list[float]
    ppl: float
    initial: dict[str, float] = field(default_factory=dict)
    history: list[float] = field(default_factory=list)
    start: int = 0


def initial_factors(dim: int, base: float, factor: float, train_len: int) -> dict[str, np.ndarray]:
    """``lambda_i = theta_i / theta'_i`` of PI, NTK and YaRN at scale ``factor``: the search's first solutions."""
    theta = rope_frequencies(dim, base).numpy()
    return {"pi": np.full(dim // 2, float(factor)),
            "ntk": theta / rope_frequencies(dim, ntk_base(base, factor, dim)).numpy(),
            "yarn": theta / yarn_frequencies(dim, base, factor, train_len).numpy()}


def constrained(factors: np.ndarray, factor: float) -> np.ndarray:
    """The paper's constraint: factors non-decreasing with the frequency index, at least 1 (at most ``2 s``), on the
    search's grid of :data:`STEP`."""
    return np.round(np.sort(np.clip(factors, 1.0, 2.0 * factor)) / STEP) * STEP


def start_choices(train_len: int, fixed: Optional[int] = None) -> tuple[int, ...]:
    """The ``n^`` values searched: the paper's below the training length, or just ``fixed``."""
    return (int(fixed),) if fixed is not None else tuple(n for n in START_CHOICES if n < train_len)


def candidate_key(factors: np.ndarray, start: int) -> str:
    """A candidate's name in the cache and the state file: its factors on the grid and its ``n^``."""
    return ",".join(f"{f:.2f}" for f in factors) + f"|{int(start)}"


@dataclass(frozen=True)
class SearchSettings:
    """How the evolutionary search runs (Ding et al. 2024, Algorithm 1); the defaults take minutes on a CPU.

    Attributes:
        population: candidates scored each generation (the first: PI, NTK, YaRN and their mutants).
        generations: generations after the first.
        parents: how many of the best breed the next generation.
        sigma: the mutation's spread, in log-factor.
        seed: the search's random numbers.
        start: a fixed ``n^``; None searches it over :data:`START_CHOICES`.
    """

    population: int = 12
    generations: int = 5
    parents: int = 4
    sigma: float = 0.15
    seed: int = 0
    start: Optional[int] = None

    def candidates(self) -> int:
        """How many candidates a search scores at most (fewer when two coincide)."""
        return self.population + self.generations * (self.population - self.parents)


def check_settings(settings: SearchSettings) -> None:
    """Raises ConfigError (naming the option) for a search that cannot run."""
    require(settings.population >= 4, "--population", f"must be at least 4 (got {settings.population})")
    require(2 <= settings.parents < settings.population, "--parents",
            f"must be at least 2 and fewer than --population {settings.population} (got {settings.parents})")
    require(settings.generations >= 0, "--generations", f"must be 0 or more (got {settings.generations})")
    require(settings.sigma > 0, "--sigma", f"must be > 0, the mutation's spread in log-factor (got {settings.sigma})")
    require(settings.start is None or settings.start >= 0, "--start",
            f"must be a whole number of positions >= 0 (got {settings.start})")


@dataclass(frozen=True)
class Stretch:
    """What a search extends: a rotary width ``rot_dim`` at its trained ``base``, from ``train_len`` to
    ``target_len`` tokens (``factor`` = s, their ratio)."""

    rot_dim: int
    base: float
    train_len: int
    target_len: int

    @property
    def factor(self) -> float:
        return self.target_len / self.train_len


def search_factors(score: Score, stretch: Stretch, settings: SearchSettings = SearchSettings(), log: Log = None,
                   cache: Optional[dict[str, float]] = None,
                   on_scored: Optional[Callable[[str, float, bool], None]] = None) -> SearchResult:
    """The evolutionary search for ``rot_dim / 2`` factors and ``n^`` minimising ``score``.

    Args:
        score: the objective of the model under given factors and ``n^`` (:func:`perplexity_score`,
            :func:`needle_score`).
        stretch: the rotary width, its trained base, and the training and target lengths (``s`` their ratio).
        settings: the search's population, generations, parents, mutation spread, seed and a fixed ``n^``.
        log: called with a line per generation (its best score).
        cache: scores already known by :func:`candidate_key` (a stopped search's); new ones are added to it.
        on_scored: called after each candidate with its key, its score and whether it was newly scored.
    """
    check_settings(settings)
    population, parents, sigma, factor = settings.population, settings.parents, settings.sigma, stretch.factor
    rng = np.random.default_rng(settings.seed)
    starts = start_choices(stretch.train_len, settings.start)
    n = stretch.rot_dim // 2
    scored: dict[str, float] = {} if cache is None else cache

    def mutate(factors: np.ndarray, start: int) -> tuple[np.ndarray, int]:
        child = constrained(factors * np.exp(rng.normal(0, sigma, n)), factor)
        if len(starts) > 1 and rng.random() < 0.3:  # n^ redrawn from its choices (as the authors' code samples them)
            start = int(rng.choice(starts))
        return child, start

    def ranked(pool: list[tuple[np.ndarray, int]]) -> list[tuple[float, np.ndarray, int]]:
        for c, s in pool:
            key = candidate_key(c, s)
            fresh = key not in scored
            if fresh:
                value = score(c, s)
                scored[key] = value if math.isfinite(value) else math.inf
            if on_scored is not None:
                on_scored(key, scored[key], fresh)
        return sorted(((scored[candidate_key(c, s)], c, s) for c, s in pool), key=lambda t: t[0])

    seeds = _seeds(stretch, starts[0] if settings.start is not None else 0)
    pool = list(seeds.values())
    pool += [mutate(*pool[i % 3]) for i in range(population - len(pool))]
    best = ranked(pool)
    result = SearchResult([], best[0][0], {k: scored[candidate_key(*v)] for k, v in seeds.items()}, [best[0][0]])
    _say(log, 0, settings.generations, best[0][0], best[0][2], result.initial)
    for g in range(1, settings.generations + 1):
        elite = [(c, s) for _, c, s in best[:parents]]
        children: list[tuple[np.ndarray, int]] = []
        while len(children) < population - parents:
            a, b = rng.choice(parents, 2, replace=False)
            take = rng.random(n) < 0.5
            mixed = np.where(take, elite[a][0], elite[b][0])  # crossover, per factor
            start = elite[a][1] if rng.random() < 0.5 else elite[b][1]  # and n^ from one parent
            children.append(mutate(mixed, start))
        best = ranked(elite + children)
        result.history.append(best[0][0])
        _say(log, g, settings.generations, best[0][0], best[0][2])
    result.factors = [round(float(f), 4) for f in best[0][1]]
    result.ppl, result.start = best[0][0], int(best[0][2])
    return result


def _seeds(stretch: Stretch, start: int) -> dict[str, tuple[np.ndarray, int]]:
    """The search's first candidates: PI's, NTK's and YaRN's factors (:func:`initial_factors`), at ``n^`` = ``start``."""
    found = initial_factors(stretch.rot_dim, stretch.base, stretch.factor, stretch.train_len)
    return {k: (constrained(v, stretch.factor), start) for k, v in found.items()}


def _say(log: Log, g: int, generations: int, ppl: float, start: int, initial: Optional[dict] = None) -> None:
    if log is None:
        return
    begun = f" (pi {initial['pi']:.3f}, ntk {initial['ntk']:.3f}, yarn {initial['yarn']:.3f})" if initial else ""
    log(f"longrope search: generation {g}/{generations}, best {ppl:.3f} at n^={start}{begun}")


def perplexity_score(model, held_out: np.ndarray, eval_settings, train_len: int, target_len: int,
                     device: torch.device, dtype: torch.dtype, position_plan=None) -> Score:
    """``score(factors, n^)``: perplexity of ``model`` (behind the model seam) at ``target_len`` under
    ``eval.scaling=longrope`` with those factors and ``n^``, on the ``len(held_out) - target_len - 1`` targets of
    ``held_out`` (the end of the validation tokens, apart from those ``posexp eval`` scores first)."""
    from posexp.evaluation.perplexity import evaluate

    tokens = len(held_out) - target_len - 1
    settings = dataclasses.replace(eval_settings, lengths=[target_len], multiples=[1], tokens=tokens,
                                   protocol="nonoverlap", stride=None, last_k=None, scaling=LONGROPE,
                                   scaling_factor=None, window=None, sinks=None, loss_by_position=False,
                                   longrope_file=None)

    def score(factors: np.ndarray, start: int = 0) -> float:
        e = dataclasses.replace(settings, longrope_factors=[float(f) for f in factors], longrope_start=int(start))
        rows = evaluate(model, held_out, e, int(train_len), device, position_plan=position_plan, dtype=dtype)
        ppl = rows[0].get("ppl")
        return float(ppl) if isinstance(ppl, (int, float)) else math.inf

    return score


def needle_documents(encode: Callable[[str], list[int]], val: np.ndarray, vocab: int, target_len: int, count: int,
                     seed: int = 0, digits: int = 5):
    """LongRoPE2's documents (Shang et al. 2025, §3.2): ``count`` texts of ``target_len + 1`` tokens of ``val`` with a
    passkey planted at a random depth and asked for at the end; ``(tokens (count, L + 1), answer mask)``."""
    from posexp.tasks.passkey_text import TextPasskey

    task = TextPasskey(encode, val, vocab, digits=digits)
    made = task.instances(target_len, count, np.random.default_rng(seed))
    return made.tokens, made.answer


def needle_score(model, tokens: np.ndarray, answer: np.ndarray, train_len: int, device: torch.device,
                 dtype: torch.dtype, batch: int = 4, position_plan=None) -> Score:
    """``score(factors, n^)``: LongRoPE2's needle-driven perplexity (Shang et al. 2025, §3.2): ``exp`` of the mean
    cross-entropy over the answer tokens only of :func:`needle_documents`, read at their length under LongRoPE, at
    the positions ``position_plan`` reads that length at (as :func:`perplexity_score`; None = ``0 .. L-1``)."""
    from posexp.model.interface import Reading
    from posexp.runtime.device import autocast

    x = torch.as_tensor(tokens[:, :-1], dtype=torch.long)
    y = torch.as_tensor(tokens[:, 1:], dtype=torch.long)
    scored = torch.as_tensor(answer[:, 1:])  # the answer tokens, as targets
    length = int(x.shape[1])
    drawn = position_plan.eval_positions(length) if position_plan is not None else None
    pos = torch.as_tensor(drawn, dtype=torch.long, device=device) if drawn is not None else None

    def score(factors: np.ndarray, start: int = 0) -> float:
        how = Reading(LONGROPE, length / train_len, int(train_len), length, tuple(float(f) for f in factors), None,
                      int(start))
        total, count = 0.0, 0
        with torch.no_grad(), model.reading(how), autocast(device, dtype):
            for i in range(0, x.shape[0], batch):
                losses = model.token_losses(x[i:i + batch].to(device), y[i:i + batch].to(device), pos)  # (b, L)
                mask = scored[i:i + batch].to(losses.device)
                total += float(losses[mask].double().sum())
                count += int(mask.sum())
        mean = total / max(count, 1)
        return math.exp(mean) if math.isfinite(mean) else math.inf

    return score


__all__ = ["OBJECTIVES", "START_CHOICES", "SearchResult", "SearchSettings", "Stretch", "candidate_key", "check_settings",
           "constrained", "initial_factors", "needle_documents", "needle_score", "perplexity_score",
           "search_factors", "start_choices"]
