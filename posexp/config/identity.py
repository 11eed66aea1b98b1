"""The run's identity: the config as recorded (:func:`config_dict`), the one rule of what shapes the trained
weights (:func:`weights_config`) and the hash of it that names a run in reports (:func:`config_hash`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass

from omegaconf import OmegaConf

from posexp.config.schema import LM, Config, default_max_position

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
    "train.parallel": "whether the ranks replicate or shard the model: the same steps, up to float rounding",
    "train.activation_checkpointing": "activations kept or recomputed in the backward pass: the same gradients",
    "train.context_parallel": "how many processes split each sequence: the same steps, up to float rounding",
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
MODEL_KEYS_BEFORE = {"init": "gpt2", "tie_embeddings": True, "ssmax": False, "norm_bias": True}
# encoder options added later, at the value every earlier run of that encoder had: left out of the hash there
ENCODER_KEYS_BEFORE: dict[str, dict[str, object]] = {"irope": {"local": "sliding"}, "mixed": {"train_len": 128}}
# the same for train keys
TRAIN_KEYS_BEFORE = {"pose_target_len": None}
# Every task run's config held these keys, one schema for every task's options, before each task's options came
# from its own __init__ (posexp/tasks/): a task config lacking one is hashed with it at this value, so earlier
# task runs keep their hash and cache key. Frozen: a task's new option needs no entry here.
TASK_KEYS_BEFORE = {"symbols": None, "min_size": None, "digits": 5, "variant": None, "needles": None, "chains": None,
                    "hops": None, "top_k": None}


# The hash format runs record (results.json's run.hash_format, checkpoint/meta.json, resume.json): weights_config
# less the top-level keys that reach the weights only through another key. Format 1 (before runs recorded one)
# also covered train.threads and descriptions; a folder in it is refused (posexp.commands.edge.folder_run_hash).
HASH_FORMAT = 2

# top-level keys format 2 leaves out: base reaches the weights as encoder.base, device and precision as
# train.device and train.precision; compile runs the same step eagerly or compiled (up to rounding, as threads)
HASH_OMITS = ("base", "device", "precision", "compile")


# eval keys added after runs were written, and the test of their unset value: an unset one is left out wherever a
# hash covers the eval group (a pretrained model's run, posexp.commands.pretrained), so earlier hashes hold
EVAL_KEYS_UNSET = {"key_tokens": lambda v: isinstance(v, dict) and v.get("evaluator") is None}


def unset_keys_dropped(config: dict) -> dict:
    """A config as plain data less the eval keys of :data:`EVAL_KEYS_UNSET` left unset (``eval.key_tokens`` with
    no evaluator): the config a hash over the eval group reads."""
    out = copy.deepcopy(config)
    e = out.get("eval")
    if isinstance(e, dict):
        for key, unset in EVAL_KEYS_UNSET.items():
            if key in e and unset(e[key]):
                del e[key]
    return out


def config_dict(cfg: Config) -> dict:
    """The typed config as plain data, interpolations resolved: what results.json records, trackers are told,
    and the hashes are computed from."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


def weights_config(cfg: Config) -> dict:
    """:func:`weights_of` the typed config: everything that shapes the trained weights."""
    return weights_of(config_dict(cfg))


def weights_of(config: dict) -> dict:
    """A config as plain data less :data:`NOT_WEIGHTS`: everything that shapes the trained weights.

    A derived value that shapes them is made explicit: with ``train.positions=randomized`` and no
    ``train.max_position``, the range comes from the eval lengths (excluded above), so it is filled in; so is
    ``train.pose_target_len`` with ``train.positions=pose``.
    """
    out = copy.deepcopy(config)
    if out.get("compile") == "auto":
        # written as false, the value of every training cached before compile=auto: compiled or eager, a step
        # computes the same thing up to float rounding (as with train.threads), and auto is eager but on CUDA
        out["compile"] = False
    if out.get("finetune", 0) is None:
        del out["finetune"]  # a run trained from scratch: its key as before fine-tuning existed
    elif isinstance(out.get("finetune"), dict):
        for key in ("longrope_factors", "longrope_start", "dropped_encoder"):  # unset: as before these keys existed
            if out["finetune"].get(key, 0) is None:
                del out["finetune"][key]
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
    enc = out.get("encoder")
    if isinstance(enc, dict):
        for key, before in ENCODER_KEYS_BEFORE.get(str(enc.get("name")), {}).items():
            if key in enc and enc[key] == before:
                del enc[key]
    if isinstance(out.get("task"), dict) and out["task"].get("name", LM) == LM:
        out.pop("task")  # language modelling, as before tasks existed: the cache keys of earlier runs hold
    elif isinstance(out.get("task"), dict):
        for key, before in TASK_KEYS_BEFORE.items():
            out["task"].setdefault(key, before)
    t = out.get("train")
    if isinstance(t, dict):
        t.update(position_range(config))
        for key, before in TRAIN_KEYS_BEFORE.items():
            if key in t and t[key] == before:
                del t[key]
    return out


def position_range(config: dict) -> dict:
    """The ``train`` keys a config left unset whose value comes from its eval lengths, filled in: ``max_position``
    with ``train.positions=randomized``, ``pose_target_len`` (PoSE's target: the longest eval length) with ``pose``.

    They shape the weights, so a run evaluated at other lengths keeps the values it was trained with
    (:func:`posexp.commands.eval_overrides.apply_eval_overrides`). Empty when neither applies.
    """
    t = config.get("train")
    if not isinstance(t, dict):
        return {}
    if t.get("positions") == "randomized" and t.get("max_position") is None:
        return {"max_position": default_max_position(int(config["train_len"]), max(_eval_lengths(config)))}
    if t.get("positions") == "pose" and t.get("pose_target_len") is None:
        return {"pose_target_len": max(_eval_lengths(config))}
    return {}


def _eval_lengths(config: dict) -> list[int]:
    """``eval.lengths``, else ``eval.multiples`` x ``train_len`` of a config as plain data."""
    e = config.get("eval") or {}
    if e.get("lengths") is not None:
        return [int(n) for n in e["lengths"]]
    return [int(m) * int(config["train_len"]) for m in e.get("multiples") or [1]]


def config_hash(cfg: Config) -> str:
    """16 hex digits of SHA-256 over what shapes the trained weights (:func:`weights_config`), format
    :data:`HASH_FORMAT`."""
    weights = {k: v for k, v in weights_config(cfg).items() if k not in HASH_OMITS}
    blob = json.dumps({"hash_format": HASH_FORMAT, "weights": weights}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunHash:
    """A run's config hash and the format it was computed in, recorded together wherever a run keeps its hash."""

    value: str
    format: int = HASH_FORMAT


def run_hash(cfg: Config) -> RunHash:
    """The hash a new run records: :func:`config_hash` in format :data:`HASH_FORMAT`."""
    return RunHash(config_hash(cfg))
