"""Checkpoints: the trained weights for evaluation, and trainer state to resume a killed run.

A run folder's ``checkpoint/`` holds

- ``model.safetensors`` and ``meta.json``: the weights when training ended, what
  ``posexp eval`` loads;
- ``step-NNNNNNNN.safetensors`` and ``step-NNNNNNNN.state.pt``: the weights and the
  trainer state at step N (AdamW moments, every RNG state, the running loss of the
  current logging interval). The data position is the step itself: the batch of
  step s is a function of (seed, s), see :class:`posexp.data.corpus.BatchSampler`;
- ``step-NNNNNNNN.dcp/`` in place of the step's ``.safetensors`` in a run trained with
  ``train.parallel=fsdp``: the weights and AdamW's moments in shards, one safetensors file per
  rank, which any number of ranks can read (:mod:`posexp.training.dcp`);
- ``resume.json``: which step pair is the latest complete one, with the SHA-256 of
  both files and the config hash of the run with its format.

Each file is written to a temporary name and renamed into place, and
``resume.json`` is renamed last, so a kill at any moment leaves the previous
complete pair or the new one. Loading executes no code: weights go through
safetensors, trainer state through ``torch.load(weights_only=True)``, which
accepts tensors and plain Python values only.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from posexp.config.identity import RunHash
from posexp.errors import PosexpError
from posexp.runs.atomic import atomic_path, atomic_write_bytes, atomic_write_json
from posexp.runs.layout import CHECKPOINT_DIR, WEIGHTS_FILE, sha256_file
from posexp.training import dcp

META_FILE = "meta.json"
RESUME_FILE = "resume.json"
STATE_FORMAT = 1
_LOAD_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError, KeyError, TypeError)


# -- RNG states ------------------------------------------------------------------------------------

def rng_states() -> dict:
    """Every RNG a training step may draw from, as tensors and plain values (``weights_only``-loadable)."""
    state: Any = np.random.get_state()
    name, keys, pos, has_gauss, cached = state
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    """Restore what :func:`rng_states` returned."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = states["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


# -- final weights ---------------------------------------------------------------------------------

def save_weights(model: torch.nn.Module, path: Path, config_hash: str, step: int) -> str:
    """Write ``model``'s weights to ``path`` atomically; returns their SHA-256."""
    from safetensors.torch import save_model

    with atomic_path(path) as tmp:
        save_model(model, str(tmp), metadata={"config_hash": config_hash, "step": str(step)})
        digest = sha256_file(tmp)
    return digest


def save_final(model: torch.nn.Module, run_dir: Path, meta: dict) -> Path:
    """``checkpoint/model.safetensors`` and ``meta.json`` (config hash and its format, steps, SHA-256 of the weights)."""
    ckpt = run_dir / CHECKPOINT_DIR
    digest = save_weights(model, ckpt / WEIGHTS_FILE, str(meta.get("config_hash", "")), int(meta.get("steps", 0)))
    atomic_write_json(ckpt / META_FILE, {**meta, "sha256": digest})
    return ckpt


def load_weights(model: torch.nn.Module, path: Path, config_hash: Optional[str], hint: str,
                 sha256: Optional[str] = None, device: str = "cpu") -> None:
    """Load safetensors weights into ``model``, refusing a corrupt file or one from another config.

    Args:
        model: the model built from the run's config.
        path: the ``.safetensors`` file.
        config_hash: the hash of the config the weights must come from; None skips the check.
        hint: what the user can do about a bad file, appended to the message.
        sha256: the digest recorded when the file was written; None skips the check.
        device: where the tensors are loaded.

    Raises:
        PosexpError: the file is missing, truncated, corrupt, from another config, or does not fit ``model``.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model

    if not path.is_file():
        raise PosexpError(f"{path}: missing; {hint}")
    if sha256 is not None and sha256_file(path) != sha256:
        raise PosexpError(f"{path}: truncated or corrupt (its SHA-256 is not the one recorded when it was "
                          f"written); {hint}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise PosexpError(f"{path}: truncated or corrupt, not a safetensors file ({str(e).splitlines()[0]}); "
                          f"{hint}") from None
    recorded = metadata.get("config_hash")
    if config_hash is not None and recorded and recorded != config_hash:
        raise PosexpError(f"{path}: written by a run with a different config (config hash {recorded}, this run's "
                          f"config hashes to {config_hash}); {hint}")
    try:
        load_model(model, str(path), strict=True, device=device)
    except (SafetensorError, RuntimeError, OSError, ValueError) as e:
        raise PosexpError(f"{path}: does not fit the model of this run's config "
                          f"({str(e).splitlines()[0]}); {hint}") from None


def parent_weights(finetune: Any) -> Callable[[torch.nn.Module], None]:
    """What loads a fine-tune's starting point: the parent's final weights, refused unless they are the ones its
    lineage recorded (SHA-256 and config hash of ``finetune``, a :class:`posexp.config.schema.FinetuneConfig`)."""
    path = Path(finetune.parent) / CHECKPOINT_DIR / WEIGHTS_FILE
    hint = (f"the fine-tune starts from the weights the parent {finetune.parent} had when it was launched; "
            "fine-tune the parent as it is now in a new run")

    def load(model: torch.nn.Module) -> None:
        load_weights(model, path, finetune.parent_config_hash, hint, sha256=finetune.parent_weights_sha256)

    return load


# -- resumable trainer state -----------------------------------------------------------------------

def save_resume(run_dir: Path, model: torch.nn.Module, state: dict[str, Any], run_hash: RunHash,
                optimizer: Optional[torch.optim.Optimizer] = None) -> Optional[Path]:
    """Write the weights and trainer state of step ``state["step"]``, then point ``resume.json`` at them.

    Older step files are removed once the new pointer is in place. A sharded model (``train.parallel=fsdp``)
    writes its weights and ``optimizer``'s moments as a DCP folder (:mod:`posexp.training.dcp`): every rank
    calls this then, and rank 0 alone writes the rest (the others get None).
    """
    from posexp.training import sharding

    ckpt = run_dir / CHECKPOINT_DIR
    step = int(state["step"])
    stem = f"step-{step:08d}"
    sharded = sharding.is_sharded(model)
    weights = ckpt / (f"{stem}{dcp.DCP_SUFFIX}" if sharded else f"{stem}.safetensors")
    state_file = ckpt / f"{stem}.state.pt"
    if sharded:
        assert optimizer is not None, "a sharded model's checkpoint holds its optimizer's moments"
        state = {**state, "optimizer_groups": dcp.save_sharded(weights, model, optimizer)}
        if not sharding.is_main_rank():
            return None
    try:
        weights_sha = dcp.digest(weights) if sharded else save_weights(model, weights, run_hash.value, step)
        buf = io.BytesIO()
        torch.save({**state, "format": STATE_FORMAT, "config_hash": run_hash.value}, buf)
        data = buf.getvalue()
        atomic_write_bytes(state_file, data)
        pointer = {"format": STATE_FORMAT, "step": step, "config_hash": run_hash.value,
                   "hash_format": run_hash.format, "weights": weights.name, "weights_sha256": weights_sha,
                   "state": state_file.name, "state_sha256": hashlib.sha256(data).hexdigest()}
        if state.get("data_fingerprint"):  # read before anything trains, by check_same_data
            pointer["data_fingerprint"] = state["data_fingerprint"]
        path = atomic_write_json(ckpt / RESUME_FILE, pointer)
    except BaseException:
        # a full disk: the previous pair stays the checkpoint, and this one's weights give their space back
        _remove_unused(ckpt, (weights, state_file))
        raise
    remove_stale(ckpt, keep={weights.name, state_file.name})
    return path


def _remove_unused(ckpt: Path, files: tuple[Path, ...]) -> None:
    """Delete ``files`` unless ``resume.json`` names them (a pointer written just before the failure does)."""
    try:
        pointer = json.loads((ckpt / RESUME_FILE).read_text(encoding="utf-8"))
        named = {pointer.get("weights"), pointer.get("state")} if isinstance(pointer, dict) else set()
    except (OSError, ValueError):
        named = set()
    for f in files:
        if f.name not in named:
            _remove(f)


def _remove(path: Path) -> None:
    """Delete a step file, or a sharded checkpoint's folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale(ckpt: Path, keep: set[str]) -> None:
    """Delete step files other than ``keep`` and temporary files a killed writer left behind."""
    if not ckpt.is_dir():
        return
    for p in ckpt.iterdir():
        stale_step = p.name.startswith("step-") and p.name not in keep
        leftover = p.name.startswith(".") and p.name.endswith(".tmp")
        if (p.is_file() or p.name.endswith((dcp.DCP_SUFFIX, dcp.DCP_SUFFIX + ".tmp"))) and (stale_step or leftover):
            _remove(p)


def read_resume_pointer(run_dir: Path) -> Optional[dict]:
    """``checkpoint/resume.json``, checked for shape; None when the run has no resumable checkpoint yet.

    Raises:
        PosexpError: the file exists but cannot be read or is not a checkpoint pointer.
    """
    path = run_dir / CHECKPOINT_DIR / RESUME_FILE
    if not path.exists():
        return None
    try:
        pointer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PosexpError(f"{path}: cannot be read ({e}); {restart_hint(run_dir)}") from None
    fields = {"step": int, "config_hash": str, "weights": str, "weights_sha256": str, "state": str,
              "state_sha256": str}
    if not isinstance(pointer, dict) or any(not isinstance(pointer.get(k), t) for k, t in fields.items()):
        raise PosexpError(f"{path}: not a checkpoint pointer (expected {', '.join(fields)}); "
                          f"{restart_hint(run_dir)}")
    for key in ("weights", "state"):
        if Path(pointer[key]).name != pointer[key]:  # a file beside resume.json, never elsewhere
            raise PosexpError(f"{path}: \"{key}\" must name a file in {path.parent}; {restart_hint(run_dir)}")
    return pointer


def check_same_data(run_dir: Path, fingerprint: str) -> None:
    """Refuse to resume a run on other data than its checkpoint trained on (an edited ``data.path`` file, another
    interpreter's data=stdlib): its remaining steps would train on that, and its results name only that.

    Raises:
        PosexpError: the latest resumable checkpoint records another data fingerprint.
    """
    saved = (read_resume_pointer(run_dir) or {}).get("data_fingerprint")
    if saved is not None and saved != fingerprint:
        raise PosexpError(f"{run_dir}: the training data here (fingerprint {fingerprint}) is not the one its training "
                          f"started on ({saved}); its remaining steps would train on other data: restore that data, "
                          "or train the run again with posexp train")


def saved_precision(run_dir: Path) -> Optional[str]:
    """The forward dtype the latest resumable checkpoint's run trained in (``float32`` / ``bfloat16``), or None.

    A sharded run settles its precision before its model is sharded and its checkpoint loaded (the mixed-precision
    policy follows it); a checkpoint that cannot be read gives None here and its error when it is loaded.
    """
    try:
        pointer = read_resume_pointer(run_dir)
        if pointer is None:
            return None
        state = torch.load(run_dir / CHECKPOINT_DIR / pointer["state"], map_location="cpu", weights_only=True)
    except (PosexpError, *_LOAD_ERRORS):
        return None
    precision = state.get("precision") if isinstance(state, dict) else None
    return precision if isinstance(precision, str) and precision else None


def restart_hint(run_dir: Path) -> str:
    return (f"delete {run_dir / CHECKPOINT_DIR} to train this run again from step 0 with "
            f"posexp resume {run_dir}, or start a new run with posexp train")


def load_resume(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                run_hash: RunHash, device: torch.device) -> Optional[dict]:
    """Load the latest resumable checkpoint into ``model`` and ``optimizer``; returns the trainer state.

    Returns:
        The state dict saved by the trainer (``step``, ``rng``, running loss, ...), or None
        when the run has no resumable checkpoint.

    Raises:
        PosexpError: a pointer, weights or state file that is corrupt, truncated, from another
            config or that does not fit this model, naming the file.
    """
    pointer = read_resume_pointer(run_dir)
    if pointer is None:
        return None
    ckpt = run_dir / CHECKPOINT_DIR
    hint = restart_hint(run_dir)
    if pointer["config_hash"] != run_hash.value:
        raise PosexpError(f"{ckpt / RESUME_FILE}: written by a run with a different config (config hash "
                          f"{pointer['config_hash']}, this run's .hydra/config.yaml hashes to {run_hash.value}); "
                          f"was the config or the checkpoint folder changed? {hint}")
    weights = ckpt / pointer["weights"]
    if weights.is_dir():
        if dcp.digest(weights) != pointer["weights_sha256"]:
            raise PosexpError(f"{weights}: truncated or corrupt (its SHA-256 is not the one in {RESUME_FILE}); {hint}")
    else:
        load_weights(model, weights, run_hash.value, hint, sha256=pointer["weights_sha256"], device=str(device))
    state_path = ckpt / pointer["state"]
    if not state_path.is_file():
        raise PosexpError(f"{state_path}: missing; {hint}")
    if sha256_file(state_path) != pointer["state_sha256"]:
        raise PosexpError(f"{state_path}: truncated or corrupt (its SHA-256 is not the one in {RESUME_FILE}); {hint}")
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except _LOAD_ERRORS as e:
        raise PosexpError(f"{state_path}: cannot be loaded as trainer state ({str(e).splitlines()[0]}); "
                          f"{hint}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("step") != pointer["step"]:
        raise PosexpError(f"{state_path}: not the trainer state of step {pointer['step']}; {hint}")
    try:
        if weights.is_dir():  # weights and moments in DCP's shards, resharded to this run's ranks
            dcp.load_sharded(weights, model, optimizer, state["optimizer_groups"])
        else:
            optimizer.load_state_dict(state["optimizer"])
    except _LOAD_ERRORS as e:
        raise PosexpError(f"{state_path}: the optimizer state does not fit this run's model "
                          f"({str(e).splitlines()[0]}); {hint}") from None
    return state
