"""The run's identity: the one rule of what shapes the trained weights (:func:`weights_config`) and the
hash of it that names a run in reports and keys the sweep cache (:func:`config_hash`).
"""

from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig

from posexp.config.schema import LM, default_max_position, eval_lengths, to_container

# The one rule: the resolved config shapes the trained weights, except these keys, each for its reason.
# The sweep cache (training/cache.py) keys on it; the run-folder hash (config_hash) derives from it.
NOT_WEIGHTS: dict[str, str] = {
    "eval": "evaluation reads the weights, it never changes them",
    "cache": "whether a finished training is reused, not how a training goes",
    "cache_dir": "where reused trainings are kept",
    "objective": "what a sweeper is told after training",
    "hydra": "Hydra's own settings: output folders, launchers, logging",
    "logger": "which experiment trackers hear about the run",
    "train.progress": "the progress bar",
    "train.log_every": "how often metrics.csv gets a row",
    "train.checkpoint_every": "when resumable checkpoints are written; a resumed run is bit-identical",
    "train.checkpoint_minutes": "when resumable checkpoints are written; a resumed run is bit-identical",
    "train.threads": "how many CPU threads run the same computation",
    "data.cache_dir": "where the token cache is kept; the corpus fingerprint says what it holds",
    "data.description": "text for posexp list",
    "tokenizer.description": "text for posexp list",
    "task.description": "text for posexp list",
    "finetune.parent": "where the parent run lies; its weights' SHA-256 says what it was",
    # error stops a run whose data skip would leave files out of, so the two never train on different text
    "data.on_bad_file": "what happens to a file that is not UTF-8 text: no run trains on one either way",
}


# model keys added after runs were written, with the value every one of those runs had: at that value they stay
# out of weights_config, so earlier run folders keep their hash and earlier cache entries their key
MODEL_KEYS_BEFORE = {"init": "gpt2", "tie_embeddings": True}


def weights_config(cfg: DictConfig) -> dict:
    """The resolved config less :data:`NOT_WEIGHTS`: everything that shapes the trained weights.

    A derived value that shapes them is made explicit: with ``train.positions=randomized`` and no
    ``train.max_position``, the range comes from the eval lengths (excluded above), so it is filled in.
    """
    out = to_container(cfg)
    if out.get("compile") == "auto":
        # written as false, the value of every training cached before compile=auto: compiled or eager, a step
        # computes the same thing up to float rounding (as with train.threads), and auto is eager but on CUDA
        out["compile"] = False
    if out.get("finetune", 0) is None:
        del out["finetune"]  # a run trained from scratch: its key as before fine-tuning existed
    for dotted in NOT_WEIGHTS:
        group, _, key = dotted.rpartition(".")
        node = out.get(group) if group else out
        if isinstance(node, dict):
            node.pop(key, None)
    model = out.get("model")
    if isinstance(model, dict):
        for key, before in MODEL_KEYS_BEFORE.items():
            if key in model and model[key] == before:
                del model[key]
    if isinstance(out.get("task"), dict) and out["task"].get("name", LM) == LM:
        out.pop("task")  # language modelling, as before tasks existed: the cache keys of earlier runs hold
    t = out.get("train")
    if isinstance(t, dict) and t.get("positions") == "randomized" and t.get("max_position") is None:
        t["max_position"] = default_max_position(cfg.train_len, max(eval_lengths(cfg)))
    return out


# The run-folder hash (results.json's config_hash, checkpoints, resume) is format 1, kept byte for byte so
# that every run folder written so far keeps its hash: it covers these top-level keys of weights_config
# (base, device, precision and compile reach the weights through encoder.* and train.*; task only when it is
# not lm, so language-modelling runs keep the hash they had before tasks existed), ...
HASH_KEYS = ("encoder", "data", "tokenizer", "model", "train", "train_len", "seed", "task")


# ... with these keys put back, which format 1 hashed although they do not shape the weights ...
HASH_ALSO = ("train.threads", "data.cache_dir", "data.description", "tokenizer.description")


def config_hash(cfg: DictConfig) -> str:
    """16 hex digits of SHA-256 over what shapes the trained weights (:func:`weights_config`), format 1."""
    written = to_container(cfg)
    weights = weights_config(cfg)
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
