"""Where the ``posexp`` command's messages go: errors to stderr, one line each, with the exit status they name."""

from __future__ import annotations

import os
from typing import NoReturn

from rich.markup import escape

from posexp.errors import PosexpError
from posexp.runtime.terminal import console  # the command's consoles, shared with training's progress


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
