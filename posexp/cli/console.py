"""Where the ``posexp`` command's messages go: errors to stderr, one line each, with the exit status they name."""

from __future__ import annotations

import os
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from posexp.errors import PosexpError

# COLUMNS=0 (or not a number) made every console zero characters wide, errors included: dropped before
# the first console is made, so rich measures the terminal (or takes 80 columns) instead
if not os.environ.get("COLUMNS", "1").isdigit() or os.environ.get("COLUMNS") == "0":
    del os.environ["COLUMNS"]
err_console = Console(stderr=True)


def fail(error: PosexpError) -> NoReturn:
    """Print ``error`` as one line and exit with its status."""
    # soft_wrap: one line however long, for the terminal to wrap and for scripts to grep
    if "RANK" not in os.environ or _is_main():  # under torchrun every rank fails alike; one message is enough
        err_console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
    raise SystemExit(error.exit_code)


def _is_main() -> bool:
    from posexp.training.distributed import is_main  # torch: see posexp/cli/app.py

    return is_main()
