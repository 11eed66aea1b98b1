"""Open a pretrained transformers causal LM with its tokenizer, and say exactly which one it was.

``posexp eval hf:NAME_OR_PATH`` reads a local model folder, or a Hub name from the Hugging Face cache (downloaded
when the machine is online). Nothing runs code shipped with a model unless ``hf.trust_remote_code=true``; a model
that needs it, a missing folder or an uncached name on an offline machine is one line, not a traceback.

:func:`provenance` records what a run's numbers came from: the name, the revision (the commit of the cached
snapshot when there is one), the architecture class, the SHA-256 of the config (canonical JSON) and of the weight
files, the dtype and the parameter count.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
import socket
import struct
from pathlib import Path
from urllib.parse import urlparse
from typing import Any, Optional

import torch

from posexp.errors import PosexpError

# a Hub repository id: a name, or an owner and a name (letters, digits, '-', '_', '.')
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
WEIGHT_NAMES = "model.safetensors, model-*-of-*.safetensors, pytorch_model.bin"  # what a message says was looked for
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# weights of other frameworks, which a folder may hold instead (transformers reads them only converted)
OTHER_WEIGHTS = ("tf_model.h5", "flax_model.msgpack", "model.ckpt.index", "*.gguf")
# the files a tokenizer is read from: tokenizers' own, sentencepiece, BPE, WordPiece, tiktoken
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "merges.txt", "vocab.txt", "*.tiktoken")
PROBE_TIMEOUT = 3.0  # seconds: one TCP connection to the Hub (or the proxy), once per process
# config keys that say how a config was saved or loaded, not what the model is
VOLATILE_CONFIG_KEYS = ("_commit_hash", "_name_or_path", "transformers_version", "dtype", "torch_dtype")
TRUST_KEY = "hf.trust_remote_code"


def offline() -> bool:
    """Whether this machine may not download (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def hub_endpoint() -> str:
    """The host the Hub is reached at (``HF_ENDPOINT``, else huggingface.co)."""
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except Exception:  # noqa: BLE001 - an old or broken huggingface_hub: the default endpoint
        return "https://huggingface.co"


@functools.lru_cache(maxsize=None)
def hub_reachable(endpoint: Optional[str] = None) -> bool:
    """Whether one TCP connection to the Hub (or to the HTTPS proxy, where one is set) opens within
    :data:`PROBE_TIMEOUT`: asked once per process, so that a machine without network is told so at once rather than
    after the Hub client's retries."""
    url = urlparse(endpoint or hub_endpoint())
    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
                  if os.environ.get(k)), None)
    if proxy:
        url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def closest_folder(name: str) -> Optional[str]:
    """The local model folder (one with a ``config.json``) or cached Hub name nearest ``name``, written as it would
    be given after ``hf:``; None when nothing is near."""
    path = Path(name).expanduser()
    parent = path.parent if str(path.parent) not in ("", ".") else Path(".")
    candidates: dict[str, str] = {}
    try:
        for d in parent.iterdir():
            if d.is_dir() and (d / "config.json").is_file():
                candidates[d.name] = str(d) if parent != Path(".") else d.name
    except OSError:
        pass
    try:
        from huggingface_hub import constants

        for d in Path(constants.HF_HUB_CACHE).glob("models--*"):
            repo = d.name[len("models--"):].replace("--", "/")
            candidates.setdefault(repo, repo)
    except Exception:  # noqa: BLE001 - no cache, or no huggingface_hub: local folders only
        pass
    target = path.name if parent != Path(".") or "/" not in name else name
    near = difflib.get_close_matches(target, list(candidates), n=1, cutoff=0.6)
    if not near:
        near = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return candidates[near[0]] if near else None


def _did_you_mean(name: str) -> str:
    near = closest_folder(name)
    return f"; did you mean hf:{near}?" if near is not None and near != name else ""


def model_folder(name_or_path: str, revision: Optional[str] = None) -> Optional[Path]:
    """The folder the model's files are in: the local folder, or the cached Hub snapshot; None when neither.

    Raises:
        PosexpError: ``name_or_path`` is neither a folder nor a Hub name.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if not HUB_ID.match(name_or_path) or path.exists() or name_or_path.startswith((".", "~")):
        raise PosexpError(f"hf model {name_or_path!r}: no such model folder (and not a Hugging Face Hub name)"
                          f"{_did_you_mean(name_or_path)}")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name_or_path, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or a partial cache): the caller says so in words
        return None


def _not_available(name: str, why: str) -> PosexpError:
    near = _did_you_mean(name)
    if near:  # most likely a typo of a folder here: that folder, not how to copy one
        return PosexpError(f"hf model {name!r}: not a local folder and not in the Hugging Face cache; {why}{near}")
    return PosexpError(f"hf model {name!r}: not a local folder and not in the Hugging Face cache; {why} (copy "
                       f"the model folder here and give its path, e.g. posexp eval hf:/models/NAME)")


def check_model_folder(folder: Path, name: str) -> None:
    """Refuse a model folder that cannot load before transformers reads it: no ``config.json``, no weight file
    (or a shard its index names missing), or a safetensors file shorter than its header says (a copy or download
    cut short).

    Raises:
        PosexpError: one line naming the folder or file and what it lacks.
    """
    where = f"hf model {name!r}: {folder}"
    if not (folder / "config.json").is_file():
        raise PosexpError(f"{where} has no config.json, so it is not a transformers model folder; give the folder "
                          "that holds config.json and the weights")
    files = _indexed_shards(folder, name)
    if files is None:
        files = weight_files(folder)
    if not files:
        other = sorted({f.name for pattern in OTHER_WEIGHTS for f in folder.glob(pattern)})
        extra = (f"; it holds {', '.join(other)}, which posexp does not load: save the model with "
                 "save_pretrained(..., safe_serialization=True)") if other else ""
        raise PosexpError(f"{where} has config.json but no weight file (looked for {WEIGHT_NAMES}){extra}; copy the "
                          "weights into it")
    for f in files:
        if f.suffix == ".safetensors":
            _check_safetensors(f, name)


def _indexed_shards(folder: Path, name: str) -> Optional[list[Path]]:
    """The weight shards a ``*.index.json`` names, checked present; None without an index."""
    for index_name in SHARD_INDEXES:
        index = folder / index_name
        if not index.is_file():
            continue
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise PosexpError(f"hf model {name!r}: {index} cannot be read as a shard index (weight_map); copy it "
                              "again") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise PosexpError(f"hf model {name!r}: {folder} lacks {len(missing)} of the {len(shards)} weight files "
                              f"{index_name} names ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                              "copy them into it")
        return [folder / s for s in shards]
    return None


def _check_safetensors(path: Path, name: str) -> None:
    """A safetensors file whole: its 8-byte header length, the JSON header, and every tensor's bytes inside the
    file (the format's layout: https://huggingface.co/docs/safetensors)."""
    def damaged(why: str) -> PosexpError:
        return PosexpError(f"hf model {name!r}: {path} is incomplete or damaged ({why}); copy or download it again")

    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise damaged(f"{size} bytes, shorter than a header")
            (length,) = struct.unpack("<Q", head)
            if 8 + length > size:
                raise damaged(f"{size:,} bytes, its header alone promises {8 + length:,}")
            header = json.loads(fh.read(length))
    except OSError as e:
        raise PosexpError(f"hf model {name!r}: {path} cannot be read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError):
        raise damaged("its header is not JSON") from None
    if not isinstance(header, dict):
        raise damaged("its header is not a table of tensors")
    ends = [v.get("data_offsets", [0, 0])[1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    need = 8 + length + max(ends, default=0)
    if need > size:
        raise damaged(f"{size:,} bytes of the {need:,} its header promises")


def _no_tokenizer(folder: Optional[Path], name: str) -> Optional[PosexpError]:
    """The message for a model folder holding none of the files a tokenizer is read from; None where it holds
    some (the loading error is then another)."""
    if folder is None or any(True for pattern in TOKENIZER_FILES for _ in folder.glob(pattern)):
        return None
    return PosexpError(f"hf model {name!r}: {folder} holds no tokenizer files (looked for "
                       f"{', '.join(TOKENIZER_FILES)}); copy the tokenizer's files from where the model came from "
                       "beside its config.json")


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
    if folder is None and not hub_reachable():  # asked once: no retries against a network that is not there
        raise _not_available(name_or_path, f"this machine cannot reach {urlparse(hub_endpoint()).hostname} to "
                                           "download it")
    if folder is not None:
        check_model_folder(folder, name_or_path)
    source = str(folder) if folder is not None else name_or_path
    options: dict = {"revision": None if folder is not None else revision, "local_files_only": local_only,
                     "trust_remote_code": bool(trust_remote_code)}  # never None: None asks on stdin
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        placement = {"device_map": device_map} if device_map else {}
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **placement, **options)
    except (OSError, ValueError, KeyError) as exc:
        raise _loading_error(name_or_path, exc) from None
    except Exception as exc:  # noqa: BLE001 - safetensors' own error type: a weight file that does not read
        if type(exc).__name__ != "SafetensorError":
            raise
        raise PosexpError(f"hf model {name_or_path!r}: a weight file in {folder or name_or_path} cannot be read "
                          f"({' '.join(str(exc).split())[:200]}); copy or download it again") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **options)
    except (OSError, ValueError, KeyError) as exc:
        raise (_no_tokenizer(folder, name_or_path) or _loading_error(name_or_path, exc)) from None
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


__all__ = ["EXPORT_JSON", "read_export", "HUB_ID", "canonical_sha256", "check_model_folder", "closest_folder",
           "config_sha256", "hub_reachable", "load_pretrained", "model_folder", "offline",
           "provenance", "snapshot_revision", "weight_files", "weights_sha256"]
