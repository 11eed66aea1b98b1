"""Training: the loop (trainer), its state and checkpoints, the optimizer, the sweep cache, data parallelism.

The loop and the optimizer take typed settings (:class:`posexp.config.schema.Config`, its ``TrainConfig``) and plain
arguments, not the Hydra config. Must not import ``posexp.commands``, ``posexp.evaluation``,
``posexp.reporting``, ``posexp.analysis`` or ``posexp.cli.app``: those sit above it.
This ``__init__`` imports nothing, so a submodule brings only its own imports.
"""
