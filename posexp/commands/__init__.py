"""Commands: the recipes of ``posexp train`` (:mod:`.train`), ``resume`` (:mod:`.resume`), ``eval``
(:mod:`.eval`), ``finetune`` (:mod:`.finetune`) and the sweep helpers (:mod:`.sweeps`), with the checks
that need the domain beside them (:mod:`.validation`: ranges, combinations, whether the run fits in memory).

Each is a short orchestrator: it reads the config at the edge (Hydra's, or a run's saved
one), converts it to the typed dataclasses of :mod:`posexp.config.schema` once
(:mod:`posexp.commands.edge`), and sequences data, the factory, training, evaluation and the run folder.
The work itself lives below, in ``data/``, ``training/``, ``evaluation/`` and :mod:`posexp.runs.layout`.
May import anything below it; never ``posexp.analysis`` or ``posexp.cli.app``, which sit above.
"""
