"""Hash format 1: how run folders written before :data:`posexp.config.identity.HASH_FORMAT` 2 were named.

Used only to check such a folder against its own records (``posexp eval``, ``posexp resume``,
``posexp finetune`` of an old parent); new runs record format 2. Kept byte for byte: every run folder
written in format 1 keeps its hash.
"""

from __future__ import annotations

import hashlib
import json

from posexp.config.identity import weights_of

# Format 1 covers these top-level keys of the weights rule (base, device, precision and compile reach the
# weights through encoder.* and train.*; task only when it is not lm, so language-modelling runs keep the hash
# they had before tasks existed), ...
HASH_KEYS = ("encoder", "data", "tokenizer", "model", "train", "train_len", "seed", "task")


# ... with these keys put back, which format 1 hashed although they do not shape the weights ...
HASH_ALSO = ("train.threads", "data.cache_dir", "data.description", "tokenizer.description")


def format1_hash(written: dict) -> str:
    """16 hex digits of SHA-256, format 1, over a run's ``.hydra/config.yaml`` as written (plain data)."""
    weights = weights_of(written)
    relevant = {k: weights[k] for k in HASH_KEYS if k in weights}
    for dotted in HASH_ALSO:
        group, _, key = dotted.partition(".")
        if isinstance(relevant.get(group), dict) and key in written.get(group, {}):
            relevant[group][key] = written[group][key]
    if isinstance(relevant.get("train"), dict) and "max_position" in written.get("train", {}):
        # ... train.max_position as written (null: derived from the eval lengths) ...
        relevant["train"]["max_position"] = written["train"]["max_position"]
    if isinstance(relevant.get("encoder"), dict) and relevant["encoder"].get("lr_mult") == 1.0:
        # ... and no encoder.lr_mult at the plain rate, which every run had before the option existed
        relevant["encoder"].pop("lr_mult")
    if weights.get("finetune") is not None:  # a fine-tuned run: its lineage shapes its weights
        relevant["finetune"] = weights["finetune"]
    blob = json.dumps(relevant, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
