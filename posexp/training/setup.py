"""What trains, settled once before the first step: the model as ``train.parallel`` holds it, the module whose
forward the step calls, the optimizer, the state a run starts (or resumes) from, and the precision.

``ddp`` (the default) trains the run's model itself, wrapped in DistributedDataParallel under torchrun; ``fsdp``
trains an FSDP2 copy (:mod:`posexp.training.sharding`), whose precision is settled before it is sharded since the
mixed-precision policy follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from posexp.config.identity import RunHash
from posexp.config.schema import Config
from posexp.errors import ConfigError
from posexp.model.gpt import GPT
from posexp.runtime.device import world
from posexp.runtime.precision import PrecisionChoice
from posexp.training.checkpoint import saved_precision
from posexp.training.optim import make_optimizer
from posexp.training.precision import training_precision
from posexp.training.sharding import ShardedTraining, checkpoint_blocks, is_sharded
from posexp.training.state import TrainState

__all__ = ["TokenLosses", "TrainingSetup", "loss_module"]


class TokenLosses(torch.nn.Module):
    """``model.token_losses`` as a module's forward, so DistributedDataParallel and torch.compile can wrap it."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.model.token_losses(idx, targets, pos)  # (B, L) nats, fp32


def loss_module(model: GPT, device: torch.device, compiled: bool = False) -> torch.nn.Module:
    """What the training step calls: the model's token losses, data-parallel under torchrun (DDP, unless the model
    is sharded already: ``train.parallel=fsdp``), compiled on request.

    Raises:
        ConfigError: ``compile=true`` where torch.compile cannot run.
    """

    net: torch.nn.Module = TokenLosses(model)
    if world().distributed and not is_sharded(model):
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    if compiled:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            raise ConfigError("compile", "torch.compile does not support this Python / torch build; "
                                         "drop compile=true")
        net = torch.compile(net)  # type: ignore[assignment]  # a module still; compiled at the first step (about 20 s on a CPU), then reused
    return net


@dataclass
class TrainingSetup:
    """What trains: the model (the run's, or its FSDP2 copy), the loss module, the optimizer, the state it starts
    from and the precision it computes in."""

    model: GPT  # the model whose parameters train: the run's own, or its sharded copy under train.parallel=fsdp
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: TrainState
    resumed: bool
    precision: PrecisionChoice
    sharded: Optional[ShardedTraining] = None

    @classmethod
    def build(cls, model: GPT, spec: Config, run_dir: Path, run_hash: RunHash, resume: bool, device: torch.device,
              compiled: bool) -> "TrainingSetup":
        """Wrap ``model`` as ``spec.train.parallel`` says, make its optimizer, load the checkpoint to resume from.

        Under ``fsdp`` the precision is settled before sharding, since the mixed-precision policy follows it.
        """
        t = spec.train
        if t.parallel != "fsdp":
            if t.activation_checkpointing:
                checkpoint_blocks(model)
            net = loss_module(model, device, compiled=compiled)
            opt = make_optimizer(model, t)
            state, resumed = TrainState.begin(run_dir, model, opt, run_hash, device, resume, t.steps)
            choice = training_precision(model, t, spec.train_len, device, saved=state.precision if resumed else None)
            state.precision = choice.name  # a checkpoint keeps the choice for a resumed run
            return cls(model, net, opt, state, resumed, choice)
        choice = training_precision(model, t, spec.train_len, device, saved=saved_precision(run_dir) if resume else None)
        sharded = ShardedTraining(model, device, choice.dtype, t.activation_checkpointing)
        net = loss_module(sharded.model, device, compiled=compiled)
        opt = make_optimizer(sharded.model, t)
        state, resumed = TrainState.begin(run_dir, sharded.model, opt, run_hash, device, resume, t.steps)
        state.precision = choice.name
        return cls(sharded.model, net, opt, state, resumed, choice, sharded)
