"""Text a tokenizer learns from (pseudo-sentences over a small vocabulary, some of it non-ASCII) and posexp's
byte-level BPE trained on it: for the tests of the tokenizers and of the corpora built with them."""

from __future__ import annotations

import numpy as np

from posexp.data.tokenizer import BPETokenizer, TokenizerSpec, batches

WORDS = ["the", "cat", "sat", "on", "mat", "and", "a", "dog", "ran", "far", "away", "from", "home", "while",
         "rain", "fell", "über", "naïve", "café", "x=1;", "return", "self"]


def sample_text(n_words: int, seed: int = 0) -> str:
    """Pseudo-sentences over a small vocabulary (some non-ASCII), reproducible from the seed."""
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=n_words)
    return " ".join(w + ("\n" if i % 11 == 10 else "") for i, w in enumerate(words))


def train_bpe(docs: list[str], vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
    return BPETokenizer.train(batches(iter(docs), 7), TokenizerSpec("bpe", vocab_size, min_frequency))
