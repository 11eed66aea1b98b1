"""Data: corpora, tokenizers, token caches and training batches.

Owns turning text (the standard library, a user's files, a Hub data set) into
cached train/validation token arrays (:mod:`posexp.data.corpus` is the entry
point) and the tokenizers that make them. Imports nothing of posexp but
:mod:`posexp.errors` and :mod:`posexp.runs.atomic`.
"""
