"""``posexp search``'s command line: LongRoPE's factor search (posexp/commands/search.py does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from posexp.cli.console import fail
from posexp.cli.options import option
from posexp.commands.search import SearchOptions, search_main
from posexp.errors import TrainingInterrupted


def search_cmd(
    target: str = typer.Argument(..., help="A rope run folder, or hf:PATH_OR_NAME (a transformers model with RoPE).",
                                 show_default=False),
    overrides: Optional[List[str]] = typer.Argument(None, help="For hf: models, settings as posexp eval hf: takes "
                                                    "them, e.g. data=text data.path=DIR hf.bos=false.",
                                                    show_default=False),
    target_len: int = option("search", "--target-len"),
    out: Optional[Path] = option("search", "--out"),
    objective: str = option("search", "--objective"),
    tokens: int = option("search", "--tokens"),
    needles: int = option("search", "--needles"),
    population: int = option("search", "--population"),
    generations: int = option("search", "--generations"),
    parents: int = option("search", "--parents"),
    seed: int = option("search", "--seed"),
    start: Optional[int] = option("search", "--start"),
    restart: bool = option("search", "--restart"),
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
