"""``posexp export RUN DIR``: a finished run read as any command reads it, then written as a transformers model folder
by :mod:`posexp.hf.export` (which maps the model and checks the reloaded logits)."""

from __future__ import annotations

import os
from pathlib import Path

from posexp.commands.loading import load_run
from posexp.errors import PosexpError


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False):
    """Write the run in ``run_dir`` as a transformers model folder ``out_dir``
    (:func:`posexp.hf.export.export_loaded`); the destination is claimed and checked before the run is read.

    Raises:
        PosexpError: the run cannot be read, its encoding has no exact transformers counterpart, or ``out_dir``
            may not be written.
    """
    from posexp.hf import require_transformers

    require_transformers("posexp export")
    from posexp.commands.pretrained import pretrained_refusal
    from posexp.hf.export import check_destination, claim_destination, write_claimed

    refusal = pretrained_refusal(run_dir, "export")
    if refusal is not None:  # its weights are a transformers model folder already
        raise PosexpError(refusal)
    out = Path(out_dir).expanduser()
    with claim_destination(out):  # before anything is read or written: a second export into it is refused
        check_destination(Path(run_dir), out, overwrite)
        return write_claimed(load_run(run_dir), out)


__all__ = ["export_run"]
