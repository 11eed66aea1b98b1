"""The terminal a process writes to: the Rich consoles of the command line (``posexp/cli/``) and of the training
loop (``posexp/training/``), which sits below the command line and so cannot take the command line's own.
"""

from __future__ import annotations

import os
import shutil

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A Rich console for the command's output. COLUMNS=0 made Rich's consoles zero characters wide, so that they
    printed nothing at all (errors, warnings and progress lines included): the terminal's own width (or 80 columns)
    is taken instead, as :func:`shutil.get_terminal_size` reads it; any other COLUMNS is Rich's to read."""
    width = shutil.get_terminal_size().columns if os.environ.get("COLUMNS") == "0" else None
    return Console(stderr=stderr, width=width)
