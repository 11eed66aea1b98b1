"""Sharded data parallelism (``train.parallel=fsdp``): PyTorch's FSDP2 holds the model, posexp hands it over.

Under ``train.parallel=ddp`` (the default) every rank holds the whole model and AdamW's moments and
DistributedDataParallel averages the gradients. Under ``fsdp`` each transformer block, and then the model
with its embeddings, head and the encoding's own parameters (T5's buckets, FIRE's MLP, FoX's gates ...), is
handed to ``torch.distributed.fsdp.fully_shard`` on a one-dimensional device mesh over the ranks: every rank
keeps ``1/N`` of each parameter, its gradient and its AdamW moments, gathers a block's parameters just
before the block runs and reduce-scatters its gradients after (Zhao et al. 2023, "PyTorch FSDP", §3;
the per-parameter sharding of FSDP2 is torch's ``fully_shard``). The same global batch is split over the
ranks as under DDP (:func:`posexp.training.distributed.shard`), so the steps are the same up to float
rounding (``tests/process/test_distributed.py`` holds the loss curves together).

The training copy is sharded, not the model the run hands in: that one stays whole on every rank, is given
the trained weights at the end (:meth:`ShardedTraining.consolidate`), and is what rank 0 evaluates and saves,
as after DDP. One process may train ``fsdp`` too (a one-rank mesh), so a run sharded over two processes can
be resumed by one and the reverse (:mod:`posexp.training.dcp`).

Mixed precision follows ``precision``: under bf16 a block's parameters are gathered in bf16 and gradients
reduced in fp32 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``); under fp32 nothing is cast.
``train.activation_checkpointing`` recomputes each block's activations in the backward pass
(``torch.utils.checkpoint`` around each block's forward, which keeps the parameter names the checkpoints use),
in either mode and in one process (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").
"""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from posexp.errors import PosexpError
from posexp.model.gpt import GPT

__all__ = ["ShardedTraining", "all_finite", "checkpoint_blocks", "is_main_rank", "is_sharded", "one_process_group"]


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` was handed to FSDP2 (its parameters are DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def checkpoint_blocks(model: nn.Module) -> None:
    """Recompute each transformer block's activations in the backward pass instead of keeping them.

    The block's own ``forward`` runs under ``torch.utils.checkpoint`` (non-reentrant); no module is wrapped, so
    the parameter names, and the checkpoints, stay the same. Each call attends with a fresh
    :class:`~posexp.model.gpt.AttentionPlan`: a plan caches its whole-sequence bias for the layers after the first,
    and a recomputed block must build again what it built the first time.
    """
    for block in model.blocks:  # type: ignore[union-attr]
        if not (isinstance(block.forward, functools.partial) and block.forward.func is _recomputed):  # once only
            block.forward = functools.partial(_recomputed, block.forward)


def _recomputed(forward: Callable[..., torch.Tensor], x: torch.Tensor, plan: Any) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    def run(x: torch.Tensor) -> torch.Tensor:
        return forward(x, type(plan)(plan.encoder, plan.pos, plan.block_size, plan.fused, plan.window))

    if not torch.is_grad_enabled():  # evaluation: nothing to recompute
        return forward(x, plan)
    return checkpoint(run, x, use_reentrant=False)


def precision_policy(dtype: torch.dtype) -> Any:
    """FSDP2's mixed precision for the forward dtype ``dtype``: gather in it, reduce gradients in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


@contextlib.contextmanager
def one_process_group(device: torch.device) -> Iterator[None]:
    """A process group of this process alone, when none is joined (``fsdp`` without torchrun); left afterwards."""
    if dist.is_initialized():
        yield
        return
    if not dist.is_available():
        raise PosexpError("this build of torch has no torch.distributed, which train.parallel=fsdp needs; "
                          "use train.parallel=ddp")
    if device.type == "cuda":  # object broadcasts on CPU, the shards' collectives through NCCL
        index = torch.cuda.current_device() if device.index is None else device.index
        dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", index))
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class ShardedTraining:
    """The FSDP2 copy of a model that trains, and the way back to the whole model.

    Args:
        model: the whole model, on ``device``, in training mode; it stays as it is until :meth:`consolidate`.
        device: where the shards live (``cpu``: gloo; ``cuda``: NCCL).
        dtype: the forward pass's precision, which the mixed-precision policy follows.
        activation_checkpointing: recompute each block's activations in the backward pass.
    """

    def __init__(self, model: GPT, device: torch.device, dtype: torch.dtype,
                 activation_checkpointing: bool = False):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.whole = model
        self.model = copy.deepcopy(model)
        if activation_checkpointing:
            checkpoint_blocks(self.model)
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        policy = precision_policy(dtype)
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        # the root: embeddings, the head, the final norm and the encoding's parameters, which every block reads;
        # kept gathered after the forward pass since the backward pass needs them first
        fully_shard(self.model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)

    def consolidate(self) -> GPT:
        """Gather the trained shards (a collective: every rank calls it) into the whole model; returns that."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        with torch.no_grad():
            for name, tensor in self.whole.state_dict().items():
                if name in full:
                    tensor.copy_(full[name])
        return self.whole


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def all_finite(model: nn.Module) -> bool:
    """Whether every parameter of ``model`` is finite on every rank (a collective when the model is sharded)."""
    params = [_local(p) for p in model.parameters()]
    finite = torch.stack([torch.isfinite(p).all() for p in params if p.numel()]).all().to(torch.int32)
    if is_sharded(model):
        dist.all_reduce(finite)  # a sum of 0/1 flags: every rank finite when it reaches the world size
        return int(finite.item()) == dist.get_world_size()
    return bool(finite.item())


def is_main_rank() -> bool:
    """Whether this process is rank 0 of the process group it joined (or joined none)."""
    return not dist.is_initialized() or dist.get_rank() == 0
