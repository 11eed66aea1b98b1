"""Evaluation: perplexity protocols over context lengths, and the scaling policy.

Owns how a trained model is measured past its training length (windows,
protocols, per-length rows) and which evaluation-time context extension a run
uses (:mod:`posexp.encoders.extension`). Imports the model, the encoders and the
data types, never commands, reporting or analysis.
"""
