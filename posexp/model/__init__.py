"""The model: a small causal Transformer whose positional encoding is a plug-in (:mod:`posexp.model.gpt`),
fused attention with a positional bias (:mod:`posexp.model.fused`), the positions a step reads
(:mod:`posexp.model.positions`) and the one factory that builds a run's encoder and model
(:mod:`posexp.model.factory`).
"""
