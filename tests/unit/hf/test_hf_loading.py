"""Opening a pretrained model (posexp.hf.loading): a saved folder loads with its tokenizer, what cannot load is one
line, and provenance says exactly which weights a result came from."""

from __future__ import annotations

import json

import pytest

from helpers.hf_tiny import model, tokenizer, tokens

import torch  # noqa: E402

from posexp.errors import PosexpError  # noqa: E402
from posexp.hf.loading import load_pretrained, provenance  # noqa: E402


@pytest.fixture
def saved(tmp_path):
    """A tiny Llama and its tokenizer saved as a model folder."""
    folder = tmp_path / "tiny-llama"
    m = model("llama")
    m.save_pretrained(folder)
    tokenizer(folder)
    return folder, m


def test_a_saved_folder_loads_with_its_tokenizer_and_gives_the_same_logits(saved):
    folder, original = saved
    m, tok = load_pretrained(str(folder))
    assert not m.training
    x = tokens(10)
    torch.testing.assert_close(m(x).logits, original(x).logits)
    assert tok("the cat sat").input_ids == [1, 2, 3]


def test_dtype_is_honoured(saved):
    m, _ = load_pretrained(str(saved[0]), dtype=torch.bfloat16)
    assert next(m.parameters()).dtype == torch.bfloat16
    assert provenance(m, str(saved[0]))["dtype"] == "bfloat16"


def test_provenance_is_stable_and_changes_with_a_weight(saved, tmp_path):
    folder, original = saved
    m, _ = load_pretrained(str(folder))
    first, again = provenance(m, str(folder)), provenance(load_pretrained(str(folder))[0], str(folder))
    assert first == again
    assert first["architecture"] == "LlamaForCausalLM" and first["revision"] is None
    assert first["weight_files"] == ["model.safetensors"]
    assert first["parameters"] == sum(p.numel() for p in original.parameters())
    assert len(first["config_sha256"]) == len(first["weights_sha256"]) == 64
    with torch.no_grad():
        original.lm_head.weight[0, 0] += 1e-3
    changed_folder = tmp_path / "changed"
    original.save_pretrained(changed_folder)
    tokenizer(changed_folder)
    changed = provenance(load_pretrained(str(changed_folder))[0], str(changed_folder))
    assert changed["weights_sha256"] != first["weights_sha256"]
    assert changed["config_sha256"] == first["config_sha256"]


def test_provenance_of_a_model_held_in_memory_hashes_its_tensors():
    m = model("gpt2")
    first = provenance(m, "made-in-memory")
    assert first == provenance(m, "made-in-memory") and first["weight_files"] == []
    with torch.no_grad():
        m.lm_head.weight[1, 1] += 1e-3
    assert provenance(m, "made-in-memory")["weights_sha256"] != first["weights_sha256"]


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(PosexpError, match="no such model folder") as err:
        load_pretrained(str(tmp_path / "nowhere" / "model"))
    assert "\n" not in str(err.value)


def test_an_uncached_hub_name_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosexpError) as err:
        load_pretrained("posexp-tests/no-such-model-0c1c9e63")
    text = str(err.value)
    assert "not a local folder and not in the Hugging Face cache" in text and "cannot download" in text
    assert "\n" not in text


def test_a_model_that_needs_its_own_code_asks_for_trust_remote_code(saved):
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="posexp-custom", architectures=["CustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_custom.py").write_text("raise RuntimeError('remote code ran')\n")
    with pytest.raises(PosexpError, match="hf.trust_remote_code=true") as err:
        load_pretrained(str(folder))
    assert "\n" not in str(err.value)


def test_a_cached_hub_name_loads_offline_and_records_its_commit(saved, tmp_path, monkeypatch):
    """The Hugging Face cache's layout (models--OWNER--NAME/snapshots/COMMIT, refs/main naming the commit)."""
    import shutil

    import huggingface_hub.constants

    folder, original = saved
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--posexp-tests--tiny-llama"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m, _ = load_pretrained("posexp-tests/tiny-llama")
    x = tokens(6)
    torch.testing.assert_close(m(x).logits, original(x).logits)
    record = provenance(m, "posexp-tests/tiny-llama")
    assert record["name"] == "posexp-tests/tiny-llama" and record["revision"] == commit
    assert record["weights_sha256"] == provenance(m, str(folder))["weights_sha256"]


# -- a folder that cannot load, said before transformers reads it (what lacks, which file) -----------------------

def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_folder_without_weights_says_it_lacks_them_and_what_was_looked_for(saved):
    folder, _ = saved
    (folder / "model.safetensors").unlink()
    with pytest.raises(PosexpError) as err:
        load_pretrained(str(folder))
    text = _one_line(err)
    assert "no weight file" in text and "model.safetensors" in text and "pytorch_model.bin" in text
    assert "Hugging Face cache" not in text and "downloading" not in text


def test_a_missing_shard_of_an_index_is_named(saved):
    folder, _ = saved
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PosexpError, match="lacks 1 of the 2 weight files") as err:
        load_pretrained(str(folder))
    assert "model-00002-of-00002.safetensors" in _one_line(err)


@pytest.mark.parametrize("keep", [5000, 100, 3])
def test_a_truncated_safetensors_file_is_named_in_one_line(saved, keep):
    folder, _ = saved
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(keep)
    with pytest.raises(PosexpError, match="is incomplete or damaged") as err:
        load_pretrained(str(folder))
    text = _one_line(err)
    assert str(weights) in text
    if keep == 5000:
        assert f"{size:,}" in text  # the length its header promises


def test_a_folder_without_tokenizer_files_says_which_were_looked_for(saved):
    folder, _ = saved
    for f in folder.glob("tokenizer*"):
        f.unlink()
    for f in folder.glob("special_tokens_map.json"):
        f.unlink()
    with pytest.raises(PosexpError, match="holds no tokenizer files") as err:
        load_pretrained(str(folder))
    text = _one_line(err)
    assert "tokenizer.json" in text and "tokenizer.model" in text and "vocab.json" in text
    assert "sentencepiece or tiktoken installed" not in text


@pytest.fixture
def no_network(monkeypatch):
    """A machine whose every connection fails at once (no DNS), and a Hub client that must not be asked."""
    import socket

    from posexp.hf import loading

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError(-2, "Name or service not known")

    loading.hub_reachable.cache_clear()
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)

    def no_download(*args, **kwargs):
        raise AssertionError("the Hub was asked although the machine is offline")

    monkeypatch.setattr(transformers_auto(), "from_pretrained", no_download)
    yield calls
    loading.hub_reachable.cache_clear()


def transformers_auto():
    import transformers

    return transformers.AutoModelForCausalLM


def test_a_typo_of_a_local_folder_offline_fails_at_once_naming_the_folder(saved, no_network, monkeypatch):
    import os
    import time

    folder, _ = saved
    monkeypatch.chdir(folder.parent)
    assert "HF_HUB_OFFLINE" not in os.environ
    start = time.monotonic()
    for _ in range(2):
        with pytest.raises(PosexpError) as err:
            load_pretrained("tiny-lama")
        text = _one_line(err)
        assert "did you mean hf:tiny-llama?" in text and "cannot reach huggingface.co" in text
    assert time.monotonic() - start < 5
    assert len(no_network) == 1  # offline is found out once per process
    assert "HF_HUB_OFFLINE" not in os.environ  # and the user's environment is left as it was
