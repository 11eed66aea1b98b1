"""Open a pretrained transformers causal LM with its tokenizer, and say exactly which one it was.

``posexp eval hf:NAME_OR_PATH`` reads a local model folder, or a Hub name from the Hugging Face cache (downloaded
when the machine is online). Nothing runs code shipped with a model unless ``hf.trust_remote_code=true``; a model
that needs it, a missing folder or an uncached name on an offline machine is one line, not a traceback.

:func:`provenance` records what a run's numbers came from: the name, the revision (the commit of the cached
snapshot when there is one), the architecture class, the SHA-256 of the config (canonical JSON) and of the weight
files, the dtype and the parameter count.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from posexp.errors import PosexpError

# a Hub repository id: a name, or an owner and a name (letters, digits, '-', '_', '.')
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
# config keys that say how a config was saved or loaded, not what the model is
VOLATILE_CONFIG_KEYS = ("_commit_hash", "_name_or_path", "transformers_version", "dtype", "torch_dtype")
TRUST_KEY = "hf.trust_remote_code"


def offline() -> bool:
    """Whether this machine may not download (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def model_folder(name_or_path: str, revision: Optional[str] = None) -> Optional[Path]:
    """The folder the model's files are in: the local folder, or the cached Hub snapshot; None when neither.

    Raises:
        PosexpError: ``name_or_path`` is neither a folder nor a Hub name.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if not HUB_ID.match(name_or_path) or path.exists():
        raise PosexpError(f"hf model {name_or_path!r}: no such model folder (and not a Hugging Face Hub name)")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name_or_path, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or a partial cache): the caller says so in words
        return None


def _not_available(name: str, why: str) -> PosexpError:
    return PosexpError(f"hf model {name!r}: not a local folder and not in the Hugging Face cache; {why} (copy "
                       f"the model folder here and give its path, e.g. posexp eval hf:/models/NAME)")


def _loading_error(name: str, exc: Exception) -> PosexpError:
    """One line for what transformers raised while opening ``name``."""
    text = " ".join(str(exc).split())
    if "trust_remote_code" in text:
        return PosexpError(f"hf model {name!r} needs the Python code it ships (a custom architecture); set "
                           f"{TRUST_KEY}=true to run it, if you trust its authors")
    if isinstance(exc, OSError):
        return _not_available(name, "this machine cannot download it" if offline()
                              else f"downloading it failed ({type(exc).__name__})")
    return PosexpError(f"hf model {name!r} cannot be opened as a causal LM: {text[:300]}")


def load_pretrained(name_or_path: str, *, revision: Optional[str] = None, trust_remote_code: bool = False,
                    device: str = "cpu", dtype: torch.dtype = torch.float32,
                    device_map: Optional[str] = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``name_or_path`` via ``AutoModelForCausalLM`` / ``AutoTokenizer``, in eval mode.

    Args:
        name_or_path: a local folder, or a Hub name (``meta-llama/Llama-3.2-1B``).
        revision: the Hub branch, tag or commit; None for the default branch.
        trust_remote_code: run code shipped with the model (``hf.trust_remote_code``).
        device: where the model goes (``cpu``, ``cuda``, ``cuda:1``), unless ``device_map`` places it.
        dtype: the weights' dtype (``precision``).
        device_map: ``auto`` to spread a model larger than one device over the devices (accelerate).

    Raises:
        PosexpError: no such folder, not cached and no download possible, remote code needed but not allowed, or
            not a causal LM.
    """
    folder = model_folder(name_or_path, revision)
    local_only = folder is not None or offline()
    if folder is None and offline():
        raise _not_available(name_or_path, "this machine cannot download it (HF_HUB_OFFLINE is set)")
    source = str(folder) if folder is not None else name_or_path
    options: dict = {"revision": None if folder is not None else revision, "local_files_only": local_only,
                     "trust_remote_code": bool(trust_remote_code)}  # never None: None asks on stdin
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        placement = {"device_map": device_map} if device_map else {}
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **placement, **options)
        tokenizer = AutoTokenizer.from_pretrained(source, **options)
    except (OSError, ValueError, KeyError) as exc:
        raise _loading_error(name_or_path, exc) from None
    if not device_map:
        model.to(device)
    model.eval()
    return model, tokenizer


# -- provenance ------------------------------------------------------------------------------------

def canonical_sha256(data: dict) -> str:
    """SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def config_sha256(model: Any, folder: Optional[Path]) -> str:
    """SHA-256 of the model's config: its ``config.json`` as published, else the config the model holds, without
    the keys that only say how it was saved or loaded."""
    if folder is not None and (folder / "config.json").is_file():
        data = json.loads((folder / "config.json").read_text())
    else:
        data = model.config.to_dict()
    return canonical_sha256({k: v for k, v in data.items() if k not in VOLATILE_CONFIG_KEYS})


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a model folder, by name."""
    return sorted({f for pattern in WEIGHT_FILES for f in folder.glob(pattern)}, key=lambda f: f.name)


def weights_sha256(model: Any, folder: Optional[Path]) -> tuple[str, list[str]]:
    """SHA-256 over the weight files (each file's name, then its bytes, in name order) and their names; where
    there are none, over the model's tensors (each name, dtype, shape, then its bytes, in name order)."""
    digest = hashlib.sha256()
    files = weight_files(folder) if folder is not None else []
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    if not files:
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            digest.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest(), [f.name for f in files]


def snapshot_revision(folder: Optional[Path]) -> Optional[str]:
    """The commit of a Hugging Face cache snapshot (``.../snapshots/<commit>``), None for any other folder."""
    if folder is not None and folder.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", folder.name):
        return folder.name
    return None


def provenance(model: Any, name_or_path: str, revision: Optional[str] = None) -> dict:
    """What a result of ``model`` (loaded from ``name_or_path``) came from, for results.json."""
    try:
        folder = model_folder(name_or_path, revision)
    except PosexpError:
        folder = None
    sha, files = weights_sha256(model, folder)
    commit = snapshot_revision(folder) or getattr(model.config, "_commit_hash", None)
    first = next(model.parameters())
    return {"name": str(name_or_path), "revision": commit or revision,
            "architecture": type(model).__name__,
            "config_sha256": config_sha256(model, folder), "weights_sha256": sha, "weight_files": files,
            "dtype": str(first.dtype).removeprefix("torch."),
            "parameters": int(sum(p.numel() for p in model.parameters()))}


EXPORT_JSON = "posexp_export.json"  # what posexp export writes beside the model (posexp.hf.export)


def read_export(folder: str | os.PathLike) -> Optional[dict]:
    """``posexp_export.json`` of an exported folder (the run, config hash, mapping), or None for another folder."""
    path = Path(folder) / EXPORT_JSON
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["EXPORT_JSON", "read_export", "HUB_ID", "canonical_sha256", "config_sha256", "load_pretrained", "model_folder", "offline",
           "provenance", "snapshot_revision", "weight_files", "weights_sha256"]
