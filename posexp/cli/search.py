"""``posexp search``'s command line: LongRoPE's factor search (posexp/commands/search.py does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from posexp.cli.console import fail
from posexp.commands.search import SearchOptions, search_main
from posexp.errors import TrainingInterrupted


def search_cmd(
    target: str = typer.Argument(..., help="A rope run folder, or hf:PATH_OR_NAME (a transformers model with RoPE).",
                                 show_default=False),
    overrides: Optional[List[str]] = typer.Argument(None, help="For hf: models, settings as posexp eval hf: takes "
                                                    "them, e.g. data=text data.path=DIR hf.bos=false.",
                                                    show_default=False),
    target_len: int = typer.Option(..., "--target-len", help="The context length the factors are for (tokens).",
                                   show_default=False),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The search's folder (state.json, factors.json); "
                                       "default RUN/longrope/N, or outputs/longrope/NAME/N.", show_default=False),
    objective: str = typer.Option("ppl", "--objective", help="ppl (LongRoPE: held-out perplexity) or needle "
                                  "(LongRoPE2: perplexity of passkey answers planted in long documents)."),
    tokens: int = typer.Option(8192, "--tokens", help="ppl: held-out targets scored per candidate."),
    needles: int = typer.Option(8, "--needles", help="needle: documents with a planted passkey per candidate."),
    population: int = typer.Option(12, "--population", help="Candidates per generation."),
    generations: int = typer.Option(5, "--generations", help="Generations after the first."),
    parents: int = typer.Option(4, "--parents", help="The best that breed the next generation."),
    seed: int = typer.Option(0, "--seed", help="The search's random numbers."),
    start: Optional[int] = typer.Option(None, "--start", help="Fix LongRoPE's n^ (first positions left unscaled); "
                                        "default: searched over 0, 1, 2, 4, ..., 256.", show_default=False),
    restart: bool = typer.Option(False, "--restart", help="Start over, dropping the state a stopped search left."),
) -> None:
    """Search LongRoPE's per-frequency rescale factors and n^ for a run or a transformers model (Ding et al. 2024;
    --objective needle: LongRoPE2, Shang et al. 2025). Resumable: stopped, the same command continues. Writes
    factors.json, which eval.longrope_file= and finetune's longrope_file= read."""
    from posexp.evaluation.longrope_search import SearchSettings

    settings = SearchSettings(population=population, generations=generations, parents=parents, seed=seed, start=start)
    try:
        search_main(target, target_len, SearchOptions(out, objective, tokens, needles, settings, restart,
                                                      tuple(overrides or ())))
    except KeyboardInterrupt:
        fail(TrainingInterrupted("stopped; the scores so far are kept: run the same command to continue", 130))
