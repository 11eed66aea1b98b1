"""Built-in and user corpora: what goes in, how it is split, cached and sampled."""

from __future__ import annotations

import numpy as np
import pytest

from posexp.data import (DOC_SEPARATOR, BatchSampler, check_fits, load_corpus, stdlib_files, stdlib_root)
from posexp.errors import ConfigError, PosexpError


def test_stdlib_corpus_excludes_tests_and_site_packages():
    root = stdlib_root()
    files = stdlib_files()
    assert len(files) > 100
    for f in files:
        parts = set(f.relative_to(root).parts[:-1])
        assert not parts & {"test", "tests", "site-packages"}, f
        assert f.suffix == ".py"


def test_stdlib_corpus_is_split_by_file_deterministically(tmp_path):
    a = load_corpus("stdlib", cache_dir=str(tmp_path / "a"))
    b = load_corpus("stdlib", cache_dir=str(tmp_path / "b"))  # built again from scratch
    assert a.fingerprint == b.fingerprint
    assert np.array_equal(a.val, b.val)
    assert a.split == "by_file" and 0 < a.val_files < a.files
    assert 0.01 < a.val.size / (a.train.size + a.val.size) < 0.2
    # cached: a second load reads the token arrays back with the same fingerprint
    c = load_corpus("stdlib", cache_dir=str(tmp_path / "a"))
    assert c.fingerprint == a.fingerprint and np.array_equal(c.train, a.train)
    info = a.info()
    assert info["corpus_fingerprint"] == a.fingerprint and info["vocab_size"] == 256


def test_text_file_is_byte_tokens_with_the_tail_held_out(tmp_path):
    text = "héllo wörld\n" * 500
    f = tmp_path / "corpus.txt"
    f.write_text(text, encoding="utf-8")
    c = load_corpus("text", str(f), val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    joined = np.concatenate([c.train, c.val]).tobytes()
    assert joined == text.encode("utf-8")
    assert c.split == "by_tail"
    assert c.val.size == pytest.approx(0.1 * len(text.encode()), abs=1)


def test_text_folder_joins_documents_with_a_separator(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(40):
        (d / f"doc{i:02d}.txt").write_text(f"document {i} " * 20)
    (d / ".hidden").write_text("not read")
    c = load_corpus("text", str(d), val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
    assert c.split == "by_file" and c.files == 40
    assert int((c.train == DOC_SEPARATOR).sum()) + int((c.val == DOC_SEPARATOR).sum()) == 40 - 2
    assert b"not read" not in c.train.tobytes() + c.val.tobytes()


@pytest.mark.parametrize("content,needle", [(b"\xff\xfe\x00bad", "not UTF-8"), (b"abc\x00def", "binary")])
def test_non_text_files_are_refused_by_name(tmp_path, content, needle):
    f = tmp_path / "weird.bin"
    f.write_bytes(content)
    with pytest.raises(PosexpError, match=needle) as e:
        load_corpus("text", str(f), cache_dir=str(tmp_path / "cache"))
    assert "weird.bin" in str(e.value)


def test_missing_and_empty_paths(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus("text", str(tmp_path / "nope.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty folder"):
        load_corpus("text", str(tmp_path / "empty"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(PosexpError, match="no text"):
        load_corpus("text", str(tmp_path / "empty.txt"), cache_dir=str(tmp_path / "cache"))


def test_too_small_for_one_window(tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_text("x" * 300)
    c = load_corpus("text", str(f), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="eval.lengths"):
        check_fits(c, train_len=8, longest_eval=64)
    with pytest.raises(ConfigError, match="train_len"):
        check_fits(c, train_len=1000, longest_eval=8)


def test_batches_are_a_function_of_seed_and_step():
    tokens = np.arange(10_000, dtype=np.int64)
    s = BatchSampler(tokens, seq_len=16, batch_size=4, seed=7)
    b5 = s.batch(5)
    assert b5.shape == (4, 17)
    for w in b5:  # each row is a contiguous window of the corpus
        assert np.array_equal(w, np.arange(w[0], w[0] + 17))
    assert np.array_equal(b5, BatchSampler(tokens, 16, 4, seed=7).batch(5))  # resumable: no hidden state
    assert not np.array_equal(b5, s.batch(6))
    assert not np.array_equal(b5, BatchSampler(tokens, 16, 4, seed=8).batch(5))
