"""Commands: the recipes of ``posexp train``, ``resume``, ``eval`` and the sweep helpers.

Each is a short orchestrator: it reads the config at the edge (Hydra's, or a run's saved
one), converts it to the typed dataclasses of :mod:`posexp.config.schema` once
(:mod:`posexp.commands.edge`), and sequences data, the factory, training, evaluation and the run folder.
The work itself lives below, in ``data/``, ``training/``, ``evaluation/`` and :mod:`posexp.runs.layout`.
May import anything below it; never ``posexp.analysis`` or ``posexp.cli.app``, which sit above.
"""
