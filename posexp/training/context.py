"""Context parallelism (``train.context_parallel=N``): every process holds one shard of each training sequence.

torch's ``context_parallel`` (``torch.distributed.tensor.experimental``) splits the batch's tensors along the
sequence over the processes, each keeping its shard of the queries, and runs causal
``scaled_dot_product_attention`` as a ring: the key and value shards travel from process to process and each
process merges its partial attention by log-sum-exp (Liu et al. 2023, "Ring Attention", §3), with the shards
load-balanced so that the causal mask gives every process the same work. Positions travel with the tokens, so
rotary encodings rotate each shard's queries and keys at their absolute positions (``q_pos``, ``k_pos``) before
the ring: the encoder's declaration ``context_parallel`` (:mod:`posexp.encoders.contract`) says which encodings a
shard can compute alone, and ``posexp check`` verifies it.

Here all N processes form one ring (``N`` = the number of processes) and each trains on the whole global batch:
the mean of their losses is the global batch's mean loss, and DDP or FSDP averages their gradients into its
gradient. Two limits are torch's, refused in one line each: its ring attention runs on CUDA only (its SDPA ops
have no CPU sharding strategy), and it carries no attention mask, so encodings that add a bias or scores to the
logits (shardable as they are) cannot use it yet.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Optional

import torch

from posexp.encoders.contract import PositionalEncoder

__all__ = ["refusal", "sequence_shards"]


def _attention_side(encoder: PositionalEncoder) -> bool:
    """Whether ``encoder`` changes attention beyond rotating q and k (a bias, scores, a transform, a normaliser or
    a window), which torch's ring of plain causal SDPA cannot carry."""
    layers = list(getattr(encoder, "per_layer", [encoder]))  # a mix's layers, each with its own window
    return any(e.uses_bias or e.uses_scores or e.explicit_attention or e.layer_window is not None for e in layers)


def refusal(n: int, encoder: PositionalEncoder, device: torch.device, processes: int) -> Optional[str]:
    """Why ``train.context_parallel=n`` cannot run with ``encoder`` on ``device`` over ``processes``; None if it can."""
    if n < 1:
        return f"must be a positive integer, 1 = off (got {n})"
    if n == 1:
        return None
    if not encoder.context_parallel:
        return (f"encoder={encoder.name} needs the whole sequence in each attention (it declares context_parallel = "
                "False: a query's logits read the keys between it and the key); the cp column of posexp "
                "list names the encodings a shard computes alone")
    if device.type != "cuda":
        return (f"runs on CUDA only: torch's context_parallel shards scaled_dot_product_attention, whose {device.type} "
                "kernels have no sharding strategy; use device=cuda, or train.context_parallel=1")
    if _attention_side(encoder):
        return (f"encoder={encoder.name} is shardable by its positions but adds terms to the attention logits, and "
                "torch's context_parallel runs plain causal attention in its ring, with no mask to carry them; "
                "rotary, embedded and no positions can use it")
    if processes != n:
        return (f"must equal the number of processes, each holding one shard of every sequence (got {n} with "
                f"{processes}); start torchrun --nproc_per_node={n}")
    return None


@functools.lru_cache(maxsize=None)
def _mesh(device_type: str, n: int):  # noqa: ANN202 (a DeviceMesh, built once per process)
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (n,))


@contextlib.contextmanager
def sequence_shards(n: int, device: torch.device, buffers: list[torch.Tensor], seq_dims: list[int]) -> Iterator[None]:
    """Within it, ``buffers`` are this process's shards along ``seq_dims`` and causal SDPA runs as a ring over the
    ``n`` processes (nothing changes for ``n = 1``). CUDA only (:func:`refusal`)."""
    if n == 1:
        yield
        return
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mesh = _mesh(device.type, n)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]), \
            context_parallel(mesh, buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=set(buffers)):
        yield
