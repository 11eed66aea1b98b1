"""The one place posexp reaches into Hydra's private API (``hydra._internal``): reading a command line as
``@hydra.main`` will, so that posexp checks it (and claims the run folder) before Hydra runs the job.

Hydra 1.3 offers no public parser of its own flags; if a Hydra release moves it, this module is what changes.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from hydra._internal.utils import get_args_parser


def parse_command_line(args: Sequence[str]) -> Optional[argparse.Namespace]:
    """Hydra's flags and overrides in ``args`` (``ns.overrides``, ``ns.multirun``, ``ns.cfg``, ``ns.help``, ...);
    None when Hydra's own parser refuses them (it has then printed its usage and the reason)."""
    try:
        return get_args_parser().parse_args(list(args))
    except SystemExit:
        return None
