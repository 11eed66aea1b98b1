"""Tokenizers: byte-level BPE learns merges from the training text, deterministically, and round-trips text."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from posexp.errors import ConfigError
from posexp.data.tokenizer import (DOC_TOKEN, ByteTokenizer, TokenizerSpec, bits_per_byte, check_spec,
                                   token_dtype)
from helpers.text import sample_text, train_bpe


def test_bpe_round_trips_text_with_the_separator_as_its_own_token():
    docs = [sample_text(400, seed) for seed in range(5)]
    tok = train_bpe(docs, 320)
    assert tok.vocab_size == 320
    assert tok.separator == 0 and tok.dtype == np.uint16
    unseen = "naïve café über — ünïcödé 🙂 never seen\ttabs"
    for text in docs[:2] + [unseen]:
        ids = tok.encode_batch([text])[0]
        assert ids.max() < tok.vocab_size
        assert tok.decode(ids) == text  # every byte is in the alphabet: nothing is lost
    # the separator token never comes out of text, only from joining documents
    assert tok.separator not in tok.encode_batch([DOC_TOKEN.replace("|", "") + "\x00"])[0]


def test_bpe_compresses_the_text_it_was_trained_on():
    docs = [sample_text(2000, seed) for seed in range(3)]
    tok = train_bpe(docs, 400)
    text = sample_text(2000, seed=9)  # same distribution, unseen sample
    assert tok.encode_batch([text])[0].size < 0.5 * len(text.encode("utf-8"))


def _pretokens(text: str) -> list[str]:
    from tokenizers import pre_tokenizers

    return [w for w, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)]


def test_first_merge_is_the_most_frequent_adjacent_pair():
    # Sennrich et al. 2016, §3.2: each merge joins the most frequent pair of adjacent symbols.
    text = "ababab abba " * 30 + "cab"
    counts = Counter()
    for word in _pretokens(text):
        counts.update(zip(word, word[1:]))
    (best, n_best), (_, n_next) = counts.most_common(2)
    assert n_best > n_next  # no tie, so the first merge is determined
    tok = train_bpe([text], 258, min_frequency=1)  # 256 bytes + separator + exactly one merge
    merges = json.loads(tok.to_str())["model"]["merges"]
    first = merges[0] if isinstance(merges[0], list) else merges[0].split(" ")
    assert tuple(first) == best


def test_byte_tokenizer_is_utf8():
    tok = ByteTokenizer()
    ids = tok.encode_batch(["hé"])[0]
    assert ids.dtype == np.uint8 and ids.tolist() == [104, 0xC3, 0xA9]
    assert tok.vocab_size == 256 and tok.separator == 0


@pytest.mark.parametrize("spec,key,needle", [
    (TokenizerSpec("wordpiece"), "tokenizer", "byte, bpe"),
    (TokenizerSpec("bpe", 256), "tokenizer.vocab_size", ">= 257"),
    (TokenizerSpec("byte", 512), "tokenizer.vocab_size", "tokenizer=bpe"),
    (TokenizerSpec("bpe", 1000, 0), "tokenizer.min_frequency", ">= 1"),
])
def test_bad_settings_name_the_key(spec, key, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        check_spec(spec)
    assert e.value.key == key


def test_settings_key_separates_tokenizers():
    assert TokenizerSpec().key() == "" and TokenizerSpec("byte", 256).key() == ""
    keys = {TokenizerSpec("bpe").key(), TokenizerSpec("bpe", 4096).key(), TokenizerSpec("bpe", 512).key(),
            TokenizerSpec("bpe", 512, 3).key()}
    assert len(keys) == 3  # None means the 4096 default


def test_token_dtype_holds_every_id():
    for v in (256, 257, 65536, 65537):
        assert np.iinfo(token_dtype(v)).max >= v - 1
    assert token_dtype(256) == np.uint8 and token_dtype(4096) == np.uint16


def test_bits_per_byte_is_total_bits_over_total_bytes():
    # a text of 1000 bytes as 400 tokens at 2.0 nats each: 800 nats = 800 / ln 2 bits over 1000 bytes
    assert bits_per_byte(2.0, 400 / 1000) == pytest.approx(800 / math.log(2) / 1000)
    assert bits_per_byte(math.log(2), 1.0) == pytest.approx(1.0)  # byte tokens: bits per token
