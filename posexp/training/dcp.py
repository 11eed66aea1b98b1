"""Sharded resumable checkpoints (``train.parallel=fsdp``) through ``torch.distributed.checkpoint`` (DCP).

A sharded run's ``checkpoint/step-NNNNNNNN.dcp/`` holds the weights and AdamW's moments as safetensors files,
one per rank, each with the rank's shards and where they sit in the whole tensor (DCP's Hugging Face storage
layout, ``HuggingFaceStorageWriter(save_distributed=True)``). DCP reads them back into any number of ranks,
resharding as it goes: a run saved by two processes resumes in one and the reverse. Nothing in them is a
pickle: DCP's default layout keeps its index as one (``.metadata``, read with ``pickle.load``), the safetensors
layout keeps it in the files' JSON headers, so loading still executes no code. The trainer state beside them
(``step-NNNNNNNN.state.pt``, ``weights_only``) keeps the optimizer's parameter groups, whose parameters DCP
names by their place in the model (``blocks.0.attn.qkv.weight``).

:mod:`posexp.training.checkpoint` owns the pointer (``resume.json``) and the order of writes; this module
writes and reads the folder.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DCP_SUFFIX", "digest", "load_sharded", "save_sharded"]

DCP_SUFFIX = ".dcp"
MODEL, OPTIM = "model.", "optim."
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter state besides its step count (Loshchilov & Hutter 2019)


def digest(folder: Path) -> str:
    """SHA-256 over the names and contents of the files of ``folder`` (a checkpoint folder's fingerprint)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0")
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _model_tensors(model_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A model's state (DTensor shards when sharded) under checkpoint names, each tensor once: a tied head is its
    embedding's."""
    from torch.distributed.tensor import DTensor

    seen: set[tuple] = set()
    out = {}
    for name, t in model_state.items():
        local = t.to_local() if isinstance(t, DTensor) else t
        where = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape))
        if where not in seen:  # a tied head's weight is its embedding's: the same memory under a second name
            seen.add(where)
            out[MODEL + name] = t
    return out


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def save_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Write ``model``'s and ``optimizer``'s tensors into ``folder`` (every rank its shards; a collective).

    The folder is written under a temporary name and renamed into place by rank 0 once every rank's files
    are complete, so a kill leaves either no folder or a whole one.

    Returns:
        The optimizer's parameter groups (hyperparameters, parameter names), for the trainer state file.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    flat = _model_tensors(get_model_state_dict(model))
    osd: Any = get_optimizer_state_dict(model, optimizer)
    for fqn, state in osd["state"].items():
        for key, value in state.items():
            flat[f"{OPTIM}{fqn}.{key}"] = value
    tmp = folder.with_name(f".{folder.name}.tmp")
    main = not _distributed() or dist.get_rank() == 0
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
    if _distributed():
        dist.barrier()
    dcp.save(flat, storage_writer=dcp.HuggingFaceStorageWriter(str(tmp), save_distributed=True))
    if main:
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    return list(osd["param_groups"])


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                 param_groups: list[dict[str, Any]]) -> None:
    """Read ``folder`` (written by :func:`save_sharded` on any number of ranks) into ``model`` and ``optimizer``.

    ``model`` may be sharded over any number of ranks, or whole: DCP gives each rank the parts of each tensor
    it holds. Every rank calls it.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)

    whole: dict[str, Any] = get_model_state_dict(model)  # every name, a tied head's too: the same tensor as its embedding
    flat = _model_tensors(whole)
    state: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            state[name] = {"step": torch.zeros((), dtype=torch.float32),
                           **{m: torch.zeros_like(p.detach()) for m in MOMENTS}}
            flat.update({f"{OPTIM}{name}.{k}": v for k, v in state[name].items()})
    dcp.load(flat, storage_reader=dcp.HuggingFaceStorageReader(str(folder)))
    set_model_state_dict(model, whole)
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": param_groups})  # type: ignore[dict-item]
