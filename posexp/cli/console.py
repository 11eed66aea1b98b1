"""Where the ``posexp`` command's messages go: errors to stderr, one line each, with the exit status they name."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from posexp.errors import PosexpError


def console(stderr: bool = False) -> Console:
    """A Rich console for the command's output. COLUMNS=0 made Rich's consoles zero characters wide, errors
    included: the terminal's own width (or 80 columns) is taken instead, as :func:`shutil.get_terminal_size` reads
    it; any other COLUMNS is Rich's to read."""
    width = shutil.get_terminal_size().columns if os.environ.get("COLUMNS") == "0" else None
    return Console(stderr=stderr, width=width)


def say(text: str, error: bool = False) -> None:
    """``text`` to stderr as one line however long (soft_wrap: for the terminal to wrap and for scripts to grep);
    ``error``: prefixed ``error:``."""
    if "RANK" not in os.environ or _is_main():  # under torchrun every rank fails alike; one message is enough
        console(stderr=True).print(("[bold red]error:[/] " if error else "") + escape(text), highlight=False,
                                   soft_wrap=True)


def fail(error: PosexpError) -> NoReturn:
    """Print ``error`` as one line and exit with its status."""
    say(str(error), error=True)
    raise SystemExit(error.exit_code)


def _is_main() -> bool:
    from posexp.training.distributed import is_main  # torch: see posexp/cli/app.py

    return is_main()
