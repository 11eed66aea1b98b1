"""Tiny random transformers models and tokenizers, built from their configs: no download. A model folder as the Hub
holds one (a Llama and a byte-level BPE trained on a folder of code) is what ``posexp eval hf:FOLDER`` is tested on.

Weights are drawn wider than transformers' default (``initializer_range``), so that positions move the logits
far above float32 noise and a wrong rotation cannot hide inside a tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

VOCAB = 97
INIT = 0.2


def _common(**extra) -> dict:
    return {"vocab_size": VOCAB, "initializer_range": INIT, "bos_token_id": None, "eos_token_id": None,
            "pad_token_id": None, **extra}


def configs() -> dict:
    """One small config per kind of position a test names: RoPE (Llama, Qwen2, GPT-NeoX with half of each head
    rotated), learned (GPT-2), ALiBi (Bloom, MPT)."""
    T = transformers
    rope = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
            "max_position_embeddings": 32}
    return {
        "llama": lambda **kw: T.LlamaConfig(**_common(**{"num_key_value_heads": 2, **rope, **kw})),
        "qwen2": lambda **kw: T.Qwen2Config(**_common(**{"num_key_value_heads": 2, **rope, **kw})),
        "neox": lambda **kw: T.GPTNeoXConfig(**_common(**{"rotary_pct": 0.5, **rope, **kw})),
        "gpt2": lambda **kw: T.GPT2Config(**_common(**{"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
                                                       **kw})),
        "bloom": lambda **kw: T.BloomConfig(**_common(**{"hidden_size": 32, "n_layer": 2, "n_head": 4, **kw})),
        "mpt": lambda **kw: T.MptConfig(**_common(**{"d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64,
                                                     **kw})),
    }


ROPE = ("llama", "qwen2", "neox")
NO_ROPE = ("gpt2", "bloom", "mpt")


def build(config, seed: int = 0):
    """A causal LM of ``config`` with seeded random weights, in eval mode."""
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def model(kind: str, seed: int = 0, **overrides):
    return build(configs()[kind](**overrides), seed)


def tokenizer(folder=None):
    """A word-level tokenizer over a few words (``tokenizers``), as a transformers fast tokenizer; saved into
    ``folder`` when given."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "and", "then", "slept"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    if folder is not None:
        fast.save_pretrained(folder)
    return fast


def tokens(length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)


# the text of the model folder's tokenizer and of its evaluation (data=text)
CODE = ("def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
        "        self.y = y\n\n    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n\n")


def write_code_corpus(folder: Path) -> Path:
    """Eight files of :data:`CODE` in ``folder``: several, as posexp holds some out for validation by their path's
    hash."""
    for i in range(8):
        (folder / f"part{i}.py").write_text(CODE.replace("Point", f"Point{i}") * 30)
    return folder


def text_data(corpus: Path) -> tuple[str, ...]:
    """The overrides that evaluate on the text in ``corpus``."""
    return ("data=text", "eval.tokens=1024", f"data.path={corpus}")


def bpe_tokenizer(texts: list[str]):
    """A byte-level BPE of 320 tokens trained on ``texts`` (``tokenizers``), as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def save_llama(folder: Path, corpus: Path) -> Path:
    """A random 2-layer Llama with a 64-token context, saved into ``folder`` with a BPE tokenizer trained on the
    files of ``corpus``, as a Hub model folder is."""
    tok = bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])
    tok.save_pretrained(folder)
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                      eos_token_id=tok.eos_token_id, bos_token_id=None, initializer_range=0.2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder
