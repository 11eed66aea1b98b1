"""A run's tokenizer as Hugging Face tokenizer files, giving the ids posexp gives.

``tokenizer=byte``: text is read as its UTF-8 bytes, byte ``b`` is token ``b``. transformers has no byte
tokenizer that loads without remote code, so the bytes are written as a ``tokenizers`` byte-level BPE with no
merges: GPT-2's byte-level pre-tokenizer (Radford et al. 2019, §2.2) without its word-splitting regex turns the
text into one printable character per byte, and the vocabulary maps the character of byte ``b`` to ``b``. The NUL
byte (id 0) separates documents, as in training; it is no special token, so a literal character in the text never
turns into it.

``tokenizer=bpe``: the run's own trained ``tokenizers`` file (the token cache keeps it beside the token arrays),
written as it is, its ``<|doc|>`` the end-of-text token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from posexp.data.tokenizer import BYTE_VOCAB_SIZE, DOC_TOKEN
from posexp.errors import PosexpError

BYTE_SEPARATOR = 0  # the NUL byte between documents, the exported model's end-of-text id


def byte_to_char() -> dict[int, str]:
    """The printable character GPT-2's byte-level alphabet gives each byte (Radford et al. 2019, §2.2).

    Bytes that are printable Latin-1 characters (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves; the
    others (controls, space, soft hyphen, ...) take ``U+0100``, ``U+0101``, ... in byte order, so that no byte is
    whitespace or a control character to the tokenizer. This is the alphabet of ``tokenizers``' ``ByteLevel``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(BYTE_VOCAB_SIZE) if b not in chars)
    chars.update({b: chr(BYTE_VOCAB_SIZE + n) for n, b in enumerate(shifted)})
    return dict(sorted(chars.items()))


def byte_tokenizer() -> Any:
    """posexp's byte tokenizer as a ``tokenizers.Tokenizer``: UTF-8 byte ``b`` of the text is id ``b``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # one character per byte, never split at spaces or punctuation (no regex) and no space added in front
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def bpe_tokenizer(cfg: Any, fingerprint: Optional[str]) -> Any:
    """The run's trained BPE, read from the token cache that :func:`posexp.data.corpus.corpus_from_config` keeps
    (building it again if the cache is gone, as ``posexp eval`` does).

    Raises:
        PosexpError: the corpus here is not the one the run was trained on (its fingerprint differs).
    """
    from tokenizers import Tokenizer

    from posexp.data.corpus import corpus_from_config

    corpus = corpus_from_config(cfg)
    if fingerprint is not None and corpus.fingerprint != fingerprint:
        raise PosexpError(f"the {cfg.data.name} corpus here (fingerprint {corpus.fingerprint}) is not the one the "
                          f"run was trained on ({fingerprint}), so its BPE tokenizer is not the run's")
    if corpus.tokenizer_file is None or not Path(corpus.tokenizer_file).is_file():
        raise PosexpError(f"the run's BPE tokenizer file is not in the token cache ({corpus.tokenizer_file}); "
                          "posexp eval RUN_DIR rebuilds the cache")
    return Tokenizer.from_file(str(corpus.tokenizer_file))


def fast_tokenizer(tokenizer: Any, eos_token: Optional[str], max_length: Optional[int] = None) -> Any:
    """``tokenizer`` as the transformers tokenizer an export writes (``PreTrainedTokenizerFast``).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        eos_token: the end-of-text token, one of the tokenizer's special tokens; None: none.
        max_length: the model's longest sequence, the tokenizer's ``model_max_length`` (None: unbounded).
    """
    from transformers import PreTrainedTokenizerFast

    # no BOS/EOS added on encoding: the ids are exactly the text's, as posexp tokenizes it
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos_token, add_bos_token=False,
                                   add_eos_token=False, clean_up_tokenization_spaces=False,
                                   **({"model_max_length": max_length} if max_length else {}))


def save_tokenizer(tokenizer: Any, folder: Path, eos_token: Optional[str], max_length: Optional[int] = None) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` in ``folder``, for ``AutoTokenizer.from_pretrained``
    (the arguments as :func:`fast_tokenizer` takes them)."""
    fast_tokenizer(tokenizer, eos_token, max_length).save_pretrained(str(folder))


def export_tokenizer(cfg: Any, info: dict, folder: Path, max_length: Optional[int] = None) -> dict:
    """Write the run's tokenizer into ``folder``; returns what ``posexp_export.json`` records of it.

    Args:
        cfg: the run's typed config.
        info: the run's ``results.json`` record (its tokenizer, vocabulary size and corpus fingerprint).
        max_length: the exported model's longest sequence.
    """
    name = str(info.get("tokenizer") or "byte")
    if name not in ("byte", "bpe"):
        raise PosexpError(f"this run reads the task's own symbols (tokenizer {name!r}), not text: no tokenizer maps "
                          "onto them, so it does not export; runs of tokenizer=byte or tokenizer=bpe do")
    if name == "byte":
        if info.get("vocab_size", BYTE_VOCAB_SIZE) != BYTE_VOCAB_SIZE:
            raise PosexpError(f"the run has {info.get('vocab_size')} tokens, not the {BYTE_VOCAB_SIZE} bytes of "
                              "tokenizer=byte, so the byte tokenizer would not give its ids")
        save_tokenizer(byte_tokenizer(), folder, eos_token=None, max_length=max_length)
        return {"tokenizer": "byte", "document_separator_id": BYTE_SEPARATOR}
    tok = bpe_tokenizer(cfg, info.get("corpus_fingerprint"))
    if tok.get_vocab_size() != info.get("vocab_size"):
        raise PosexpError(f"the BPE tokenizer in the token cache has {tok.get_vocab_size()} tokens, the run "
                          f"{info.get('vocab_size')}: it is not the run's")
    save_tokenizer(tok, folder, eos_token=DOC_TOKEN, max_length=max_length)
    return {"tokenizer": "bpe", "document_separator_id": int(tok.token_to_id(DOC_TOKEN))}


__all__ = ["BYTE_SEPARATOR", "byte_to_char", "byte_tokenizer", "export_tokenizer", "fast_tokenizer"]
