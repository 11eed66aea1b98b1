"""Built-in and user corpora: what goes in, how it is split, cached and sampled."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from posexp.data.corpus import (DOC_SEPARATOR, BatchSampler, check_fits, load_corpus, stdlib_files, stdlib_root)
from posexp.config.schema import DataConfig
from posexp.errors import ConfigError, PosexpError
from posexp.commands.edge import typed


def test_stdlib_corpus_excludes_tests_and_site_packages():
    root = stdlib_root()
    files = stdlib_files()
    assert len(files) > 100
    for f in files:
        parts = set(f.relative_to(root).parts[:-1])
        assert not parts & {"test", "tests", "site-packages"}, f
        assert f.suffix == ".py"


def test_stdlib_corpus_is_split_by_file_deterministically(tmp_path):
    a = load_corpus(DataConfig(cache_dir=str(tmp_path / "a")))
    b = load_corpus(DataConfig(cache_dir=str(tmp_path / "b")))  # built again from scratch
    assert a.fingerprint == b.fingerprint
    assert np.array_equal(a.val, b.val)
    assert a.split == "by_file" and 0 < a.val_files < a.files
    assert 0.01 < a.val.size / (a.train.size + a.val.size) < 0.2
    # cached: a second load reads the token arrays back with the same fingerprint
    c = load_corpus(DataConfig(cache_dir=str(tmp_path / "a")))
    assert c.fingerprint == a.fingerprint and np.array_equal(c.train, a.train)
    info = a.info()
    assert info["corpus_fingerprint"] == a.fingerprint and info["vocab_size"] == 256


def test_text_file_is_byte_tokens_with_the_tail_held_out(tmp_path):
    text = "héllo wörld\n" * 500
    f = tmp_path / "corpus.txt"
    f.write_text(text, encoding="utf-8")
    c = load_corpus(DataConfig(name="text", path=str(f), val_fraction=0.1, cache_dir=str(tmp_path / "cache")))
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
    c = load_corpus(DataConfig(name="text", path=str(d), val_fraction=0.25, cache_dir=str(tmp_path / "cache")))
    assert c.split == "by_file" and c.files == 40
    assert int((c.train == DOC_SEPARATOR).sum()) + int((c.val == DOC_SEPARATOR).sum()) == 40 - 2
    assert b"not read" not in c.train.tobytes() + c.val.tobytes()


@pytest.mark.parametrize("content,needle", [(b"\xff\xfe\x00bad", "not UTF-8"), (b"abc\x00def", "binary")])
def test_non_text_files_are_refused_by_name(tmp_path, content, needle):
    f = tmp_path / "weird.bin"
    f.write_bytes(content)
    with pytest.raises(PosexpError, match=needle) as e:
        load_corpus(DataConfig(name="text", path=str(f), cache_dir=str(tmp_path / "cache")))
    assert "weird.bin" in str(e.value)


def test_on_bad_file_skip_leaves_them_out_and_says_how_many(tmp_path):
    root = tmp_path / "notes"
    root.mkdir()
    for i in range(4):
        (root / f"note{i}.txt").write_text(f"note {i}: " + "plain words " * 200, encoding="utf-8")
    (root / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 50)
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    cache = str(tmp_path / "cache")
    with pytest.raises(PosexpError, match="data.on_bad_file=skip"):  # the default still stops, naming the way out
        load_corpus(DataConfig(name="text", path=str(root), cache_dir=cache))
    for attempt in ("built", "cached"):  # said again when the corpus comes from the cache
        warnings = []
        corpus = load_corpus(DataConfig(name="text", path=str(root), cache_dir=cache, on_bad_file="skip"),
                             warn=warnings.append)
        assert corpus.files == 4, attempt
        assert warnings == [f"data.on_bad_file=skip: left out 2 of 6 files under {root} that are not UTF-8 text"]
        assert b"caf" not in corpus.train.tobytes() + corpus.val.tobytes()
    with pytest.raises(PosexpError, match="latin1.txt|image.png"):  # a skipping build does not answer the default
        load_corpus(DataConfig(name="text", path=str(root), cache_dir=cache))


def test_a_folder_of_binary_files_under_skip_is_called_not_text_not_empty(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    for i in range(3):
        (root / f"img{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" * 20)
    with pytest.raises(PosexpError, match="3 of its 3 files are not UTF-8 text") as e:
        load_corpus(DataConfig(name="text", path=str(root), cache_dir=str(tmp_path / "cache"), on_bad_file="skip"),
                    warn=lambda _: None)
    assert "empty" not in str(e.value)


def test_on_bad_file_takes_error_or_skip(compose):
    from posexp.commands.validation import validate

    validate(compose("data=text", "data.path=x.txt", "data.on_bad_file=skip"), memory=None)
    with pytest.raises(ConfigError, match="data.on_bad_file.*error, skip"):
        validate(compose("data=text", "data.path=x.txt", "data.on_bad_file=ignore"), memory=None)


def test_missing_and_empty_paths(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "nope.txt")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty folder"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "empty")))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(PosexpError, match="no text"):
        load_corpus(DataConfig(name="text", path=str(tmp_path / "empty.txt"), cache_dir=str(tmp_path / "cache")))


def test_too_small_for_one_window(tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_text("x" * 300)
    c = load_corpus(DataConfig(name="text", path=str(f), cache_dir=str(tmp_path / "cache")))
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


# ---------------------------------------------------------------------------- tokenizers on local corpora

def _text_folder(root, n_docs: int = 30, words: int = 300):
    from helpers.text import sample_text

    root.mkdir()
    for i in range(n_docs):
        (root / f"doc{i:02d}.txt").write_text(sample_text(words, seed=i), encoding="utf-8")
    return root


def test_bpe_corpus_follows_the_tokenizer_and_is_cached_beside_it(tmp_path, monkeypatch):
    from posexp.data.tokenizer import BPETokenizer, TokenizerSpec

    d = _text_folder(tmp_path / "docs")
    cache = str(tmp_path / "cache")
    byte = load_corpus(DataConfig(name="text", path=str(d), val_fraction=0.2, cache_dir=cache))
    bpe = load_corpus(DataConfig(name="text", path=str(d), val_fraction=0.2, cache_dir=cache), TokenizerSpec("bpe",
                                                                                                             300))
    assert bpe.tokenizer == "bpe" and bpe.vocab_size == 300 and bpe.train.dtype == np.uint16
    assert int(bpe.train.max()) < 300 and bpe.train.size < 0.6 * byte.train.size
    # the same documents on each side of the split, whatever the tokenizer
    assert bpe.val_files == byte.val_files and bpe.info()["val_bytes"] == byte.val.size
    assert bpe.info()["tokens_per_byte"] == pytest.approx(bpe.val.size / byte.val.size, rel=1e-5)
    tok = BPETokenizer.load(Path(bpe.tokenizer_file))
    assert Path(bpe.tokenizer_file).name == "tokenizer.json" and tok.vocab_size == bpe.vocab_size
    # decoding the validation tokens gives back exactly the validation bytes
    sep = tok.separator
    assert tok.decode(bpe.val).replace("<|doc|>", "\x00").encode() == byte.val.tobytes()
    assert DOC_SEPARATOR == 0 and int((bpe.val == sep).sum()) == int((byte.val == 0).sum())
    # no run ever mixes tokenizers: each has its own fingerprint and cache folder
    bpe400 = load_corpus(DataConfig(name="text", path=str(d), val_fraction=0.2, cache_dir=cache), TokenizerSpec("bpe",
                                                                                                                400))
    assert len({byte.fingerprint, bpe.fingerprint, bpe400.fingerprint}) == 3
    assert len(list(Path(cache).iterdir())) == 3
    # cached: read back without training again
    monkeypatch.setattr(BPETokenizer, "train", lambda *a, **k: pytest.fail("retrained a cached tokenizer"))
    again = load_corpus(DataConfig(name="text", path=str(d), val_fraction=0.2, cache_dir=cache), TokenizerSpec("bpe",
                                                                                                               300))
    assert again.fingerprint == bpe.fingerprint and np.array_equal(again.val, bpe.val)


def test_bpe_is_trained_on_the_training_split_only(tmp_path):
    from posexp.data.local import _is_val
    from posexp.data.tokenizer import TokenizerSpec

    d = _text_folder(tmp_path / "docs", n_docs=20, words=200)
    names = sorted(p.name for p in d.iterdir())
    held_out = [n for n in names if _is_val(n, 0.2)]
    assert held_out and len(held_out) < len(names)
    for n in held_out:  # a word that only the validation files contain, hundreds of times
        (d / n).write_text("zqxjvk " * 300, encoding="utf-8")
    c = load_corpus(DataConfig(name="text", path=str(d), val_fraction=0.2, cache_dir=str(tmp_path / "cache")),
                    TokenizerSpec("bpe", 400))
    vocab = json.loads(Path(c.tokenizer_file).read_text())["model"]["vocab"]
    assert not [t for t in vocab if "zq" in t or "xj" in t or "vk" in t]
    assert any("the" in t for t in vocab)  # while training-split words were merged


def test_bpe_on_one_file_splits_the_text_not_a_character(tmp_path):
    from posexp.data.tokenizer import BPETokenizer, TokenizerSpec

    text = "naïve café — über " * 400
    f = tmp_path / "one.txt"
    f.write_text(text, encoding="utf-8")
    c = load_corpus(DataConfig(name="text", path=str(f), val_fraction=0.1, cache_dir=str(tmp_path / "cache")),
                    TokenizerSpec("bpe", 280))
    assert c.split == "by_tail"
    tok = BPETokenizer.load(Path(c.tokenizer_file))
    assert tok.decode(c.train) + tok.decode(c.val) == text


# ---------------------------------------------------------------------------- data=hf, offline with a local data set

def _hub_like(tmp_path, splits=("train", "validation"), rows=40):
    """A small data set as ``datasets`` saves it, with a text column and another one."""
    from datasets import Dataset, DatasetDict

    from helpers.text import sample_text

    dd = DatasetDict({s: Dataset.from_dict({"id": list(range(rows)),
                                            "body": [sample_text(60, seed=100 * k + i) for i in range(rows)]})
                      for k, s in enumerate(splits)})
    path = tmp_path / "hub_like"
    dd.save_to_disk(str(path))
    return path, dd


def test_hf_local_data_set_uses_its_splits_and_text_column(tmp_path):
    path, dd = _hub_like(tmp_path)
    c = load_corpus(DataConfig(kind="hf", name=str(path), text_column="body", cache_dir=str(tmp_path / "cache")))
    assert c.split == "hub" and c.files == 80 and c.val_files == 40
    assert c.train.tobytes() == "\x00".join(dd["train"]["body"]).encode()
    assert c.val.tobytes() == "\x00".join(dd["validation"]["body"]).encode()
    # rows that are lines of one text are concatenated as they are
    lines = load_corpus(DataConfig(kind="hf", name=str(path), text_column="body", separate_rows=False,
                                   cache_dir=str(tmp_path / "cache")))
    assert lines.val.tobytes() == "".join(dd["validation"]["body"]).encode()
    assert lines.fingerprint != c.fingerprint
    first = load_corpus(DataConfig(kind="hf", name=str(path), text_column="body", max_train_docs=5,
                                   cache_dir=str(tmp_path / "cache")))
    assert first.train.tobytes() == "\x00".join(dd["train"]["body"][:5]).encode()
    assert np.array_equal(first.val, c.val)


def test_hf_without_a_validation_split_holds_out_the_last_rows_and_says_so(tmp_path):
    path, dd = _hub_like(tmp_path, splits=("train",), rows=40)
    said = []
    c = load_corpus(DataConfig(kind="hf", name=str(path), text_column="body", val_fraction=0.1,
                               cache_dir=str(tmp_path / "cache")), log=said.append)
    assert c.split == "carved_from_train" and c.val_files == 4
    assert c.val.tobytes() == "\x00".join(dd["train"]["body"][36:]).encode()
    assert c.train.tobytes() == "\x00".join(dd["train"]["body"][:36]).encode()
    assert any("no 'validation' split" in s and "last 4 of 40" in s for s in said)


def test_hf_bpe_is_cached_and_read_back_without_the_data_set(tmp_path, monkeypatch):
    import posexp.data.hub as data
    from posexp.data.tokenizer import TokenizerSpec

    path, _ = _hub_like(tmp_path)
    hub = DataConfig(kind="hf", name=str(path), text_column="body", cache_dir=str(tmp_path / "cache"))
    c = load_corpus(hub, TokenizerSpec("bpe", 300))
    assert c.vocab_size == 300 and (Path(c.tokenizer_file).parent / "train.npy").is_file()
    monkeypatch.setattr(data, "_open_dataset", lambda hub: pytest.fail("opened the data set despite the cache"))
    again = load_corpus(hub, TokenizerSpec("bpe", 300))
    assert again.fingerprint == c.fingerprint


def test_hf_bad_split_or_column_names_the_choices(tmp_path):
    path, _ = _hub_like(tmp_path)
    with pytest.raises(ConfigError, match="no column 'text'; its columns: id, body.*text columns: body") as e:
        load_corpus(DataConfig(kind="hf", name=str(path), cache_dir=str(tmp_path / "cache")))
    assert e.value.key == "data.text_column"
    with pytest.raises(ConfigError, match="holds int64 values"):
        load_corpus(DataConfig(kind="hf", name=str(path), text_column="id", cache_dir=str(tmp_path / "cache")))
    with pytest.raises(ConfigError, match="no split 'training'; its splits: train, validation") as e:
        load_corpus(DataConfig(kind="hf", name=str(path), train_split="training", text_column="body",
                               cache_dir=str(tmp_path / "cache")))
    assert e.value.key == "data.train_split"


def test_hf_unreachable_hub_is_detected_fast_and_explained(tmp_path, monkeypatch):
    """No HF_HUB_OFFLINE, but the Hub does not answer: one probe, then the local cache only, then a message."""
    from posexp.data.hub import hub_reachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    assert not hub_reachable()
    with pytest.raises(PosexpError, match="not cached.*cannot be reached.*data=text") as e:
        load_corpus(DataConfig(kind="hf", name="posexp-tests/no-such-data-set", cache_dir=str(tmp_path / "cache")))
    assert "posexp-tests/no-such-data-set" in str(e.value)


@pytest.mark.parametrize("name", ["./no-such-folder", "{tmp}/no-such-folder", "data/sets/no-such-folder"])
def test_a_local_data_set_path_that_does_not_exist_is_said_so_not_sent_to_the_hub(tmp_path, monkeypatch, name):
    """A mistyped folder was looked up on the Hub and called "not cached", with an `hf download ./no-such-folder`
    to run: no Hub id has that form, so the message names the path and what data.name takes."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("posexp.data.hub._open_hub", lambda hub: pytest.fail("looked the path up on the Hub"))
    name = name.format(tmp=tmp_path)
    with pytest.raises(ConfigError, match="does not exist") as e:
        load_corpus(DataConfig(kind="hf", name=name, cache_dir=str(tmp_path / "cache")))
    assert e.value.key == "data.name" and name in str(e.value)


def test_a_folder_of_plain_text_as_an_hf_data_set_is_sent_to_data_text(tmp_path):
    """datasets reads plain text a line a row, its newlines dropped: a folder of .txt files became a corpus of one
    document per line, where one .txt file is refused with the same reason."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(2):
        (folder / f"{i}.txt").write_text("def f(x):\n    return x\n" * 20)
    with pytest.raises(ConfigError, match=re.escape(f"data=text data.path={folder}")) as e:
        load_corpus(DataConfig(kind="hf", name=str(folder), cache_dir=str(tmp_path / "cache")))
    assert e.value.key == "data.name"


# ---------------------------------------------------------------------------- through the CLI

@pytest.mark.slow  # a BPE trained and a run on it; the hf loader and the BPE are tested apart by default
def test_train_on_a_local_hf_data_set_with_bpe_end_to_end(tmp_path):
    """data=hf + tokenizer=bpe as a user types it: the model's vocabulary is the tokenizer's, results say so."""
    from safetensors import safe_open

    from helpers import TINY_RUN, invoke_main

    path, _ = _hub_like(tmp_path)
    proc = invoke_main("train", *TINY_RUN, "data=hf", f"data.name={path}", "data.text_column=body", "tokenizer=bpe",
                       "tokenizer.vocab_size=300", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stderr
    run = json.loads((tmp_path / "run" / "results.json").read_text())["run"]
    assert run["tokenizer"] == "bpe" and run["vocab_size"] == 300 and run["split"] == "hub"
    assert 0 < run["tokens_per_byte"] < 1 and run["corpus"] == str(path)
    with safe_open(str(tmp_path / "run" / "checkpoint" / "model.safetensors"), "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    assert shapes["lm_head.weight"][0] == 300  # the output layer (tied to the embedding) has one row per token
    md = (tmp_path / "run" / "results.md").read_text()
    assert "bpe token (vocab 300)" in md and "not comparable across tokenizers" in md and "bits/byte" in md


def test_a_hub_data_set_offline_and_not_cached_is_one_clear_message(tmp_path, monkeypatch):
    from helpers import invoke_main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hugging Face cache
    proc = invoke_main("train", "data=wikitext103", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.exit_code == 2
    err = " ".join(proc.stderr.split())
    assert "Salesforce/wikitext (wikitext-103-raw-v1) is not cached" in err
    assert "HF_HUB_OFFLINE" in err and "data=text" in err and "Traceback" not in proc.stderr


@pytest.mark.parametrize("overrides,key,needle", [
    (["tokenizer=bpe", "tokenizer.vocab_size=256"], "tokenizer.vocab_size", ">= 257"),
    (["tokenizer.name=wordpiece"], "tokenizer", "choose one of: byte, bpe"),
    (["tokenizer.vocab_size=512"], "tokenizer.vocab_size", "tokenizer=bpe"),
    (["data=hf"], "data.name", "data.name=OWNER/NAME"),
    (["data=hf", "data.name=x/y", "data.text_column="], "data.text_column", "text column"),
    (["data=wikitext103", "data.max_train_docs=0"], "data.max_train_docs", "positive"),
    (["data.kind=books"], "data", "choose one of: hf, pg19, stdlib, text, wikitext103"),
])
def test_bad_data_and_tokenizer_settings_name_the_key(compose, overrides, key, needle):
    from posexp.commands.validation import validate

    with pytest.raises(ConfigError, match=needle) as e:
        validate(typed(compose(*overrides)))
    assert e.value.key == key


def test_presets_compose_to_the_hub_data_sets(compose):
    from posexp.data.corpus import data_kind, hub_source

    wiki = compose("data=wikitext103", "tokenizer=bpe").data
    assert data_kind(wiki) == "hf" and hub_source(wiki).label() == "Salesforce/wikitext (wikitext-103-raw-v1)"
    assert wiki.separate_rows is False  # rows are lines of articles
    pg19 = compose("data=pg19").data
    assert data_kind(pg19) == "hf" and pg19.text_column == "text" and pg19.validation_split == "validation"
    assert compose().tokenizer.name == "byte" and data_kind(compose().data) == "stdlib"
