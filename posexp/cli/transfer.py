"""``posexp export``: a trained run out of posexp, as a transformers model folder (:mod:`posexp.hf.export`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from posexp.cli.console import fail
from posexp.errors import PosexpError


def export_cmd(
    run_dir: Path = typer.Argument(..., help="A finished run folder (posexp train's).", show_default=False),
    out_dir: Path = typer.Argument(..., help="The model folder to write; new or empty.", show_default=False),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT_DIR if it already holds a model folder "
                                                              "(an earlier export)."),
) -> None:
    """Write a trained run as a transformers model folder (learned, rope and alibi runs).

    OUT_DIR gets config.json, model.safetensors, the tokenizer files (byte or bpe: the run's token ids) and
    posexp_export.json. AutoModelForCausalLM.from_pretrained(OUT_DIR) loads it with no remote code and gives the
    run's logits (fp32; checked while exporting). learned -> GPT-2; rope -> GPT-NeoX (exponential schedule);
    alibi -> MPT (a run trained with model.norm_bias=false). Other encodings are refused. Needs transformers:
    the hf extra of posexp's install.
    """
    from posexp.commands.export import export_run

    try:
        done = export_run(run_dir, out_dir, overwrite=overwrite)
    except PosexpError as e:
        fail(e)
    Console().print(f"exported {escape(str(run_dir))} to {escape(str(done.folder))}: {escape(done.description)}; "
                    f"max |logit difference| {done.max_abs_diff:.2g} (fp32, lengths "
                    f"{', '.join(map(str, done.checked_lengths))})", highlight=False, soft_wrap=True)
