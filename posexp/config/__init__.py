"""The run's config: one dataclass per Hydra group (:mod:`posexp.config.schema`) and the run's identity,
the one rule of what shapes the trained weights and the hash of it (:mod:`posexp.config.identity`).

A leaf: imports nothing of posexp, so every module may import it.
"""
