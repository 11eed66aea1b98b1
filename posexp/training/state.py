"""What a training run carries from one step to the next, and writes into its resumable checkpoint.

The fields of :class:`TrainState` are the keys of the trainer state file
(``checkpoint/step-NNNNNNNN.state.pt``, :mod:`posexp.training.checkpoint`), so saving
and resuming read one definition; the optimizer state, every RNG state and the
thread count are taken from the running process when saving, not carried.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import torch

from posexp.config.identity import RunHash
from posexp.training.checkpoint import load_resume, rng_states, save_resume, set_rng_states
from posexp.training.sharding import is_sharded

# the logger name train.log and users' logging filters have always seen, wherever the module lives
log = logging.getLogger("posexp.train")

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """The training loop's counters and running loss, as saved in (and restored from) a resumable checkpoint.

    A resumed run takes the same steps on the same batches with the same RNG states as
    an uninterrupted one, so on the same machine and thread count it ends with bitwise
    the same weights: nothing else the loop carries changes the numbers it computes.
    """

    step: int = 0  # optimizer steps done; the batch of step s is a function of (seed, s)
    tokens: int = 0  # training tokens seen, of the global batch
    last_logged_step: int = 0  # the step of the last metrics row
    loss: float = math.nan  # the mean loss of the last metrics row
    running_loss: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # summed since that row
    elapsed_s: float = 0.0  # training wall time of the run's earlier sessions
    resumed_at: list[int] = field(default_factory=list)  # the steps this run continued from
    precision: str = ""  # the dtype of the forward pass (float32 / bfloat16), which a resumed precision=auto keeps
    data_fingerprint: Optional[str] = None  # the corpus (or task instances) it trains on, which a resume must find

    @classmethod
    def begin(cls, run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, run_hash: RunHash,
              device: torch.device, resume: bool, total_steps: int) -> tuple["TrainState", bool]:
        """A fresh state, or with ``resume`` the run's latest checkpoint loaded into it, ``model`` and ``optimizer``.

        Returns:
            The state, and whether it came from a checkpoint.

        Raises:
            PosexpError: a resumable checkpoint that cannot be used.
        """
        if resume:
            loaded = cls.load(run_dir, model, optimizer, run_hash, device)
            if loaded is not None:
                log.info("resumed at step %d of %d", loaded.step, total_steps)
                return loaded, True
            log.info("no resumable checkpoint yet; training from step 0")
        state = cls(running_loss=torch.zeros((), device=device), resumed_at=[0] if resume else [])
        return state, False

    @classmethod
    def load(cls, run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, run_hash: RunHash,
             device: torch.device) -> Optional["TrainState"]:
        """The state of the latest resumable checkpoint, with its weights, optimizer and RNG states restored.

        Returns:
            None when the run folder has no resumable checkpoint.
        """
        saved = load_resume(run_dir, model, optimizer, run_hash, device)
        if saved is None:
            return None
        state = cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})
        state.running_loss = state.running_loss.to(device)
        state.resumed_at = [*state.resumed_at, state.step]
        if saved.get("threads") not in (None, torch.get_num_threads()):
            log.warning("resuming with %d threads, the run started with %s: the numbers may differ in the "
                        "last digits from an uninterrupted run", torch.get_num_threads(), saved["threads"])
        set_rng_states(saved["rng"])
        return state

    def saved_form(self, optimizer: torch.optim.Optimizer, elapsed_s: float, sharded: bool = False) -> dict[str, Any]:
        """The trainer state file's contents: the fields, the optimizer, every RNG and the thread count.

        Args:
            elapsed_s: the run's training wall time up to now (the field holds that of earlier sessions).
        """
        saved = {f.name: getattr(self, f.name) for f in fields(self)}
        saved.update(running_loss=self.running_loss.detach().cpu(), elapsed_s=elapsed_s,
                     rng=rng_states(), threads=torch.get_num_threads())
        if not sharded:  # a sharded optimizer's moments go into the DCP folder, beside the weights' shards
            saved["optimizer"] = optimizer.state_dict()
        return saved

    def save(self, run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, run_hash: RunHash,
             elapsed_s: float) -> Optional[Path]:
        """Write the weights and this state as the run's latest resumable checkpoint; returns ``resume.json``.

        A sharded model's ranks all call it (each writes its shards); the others than rank 0 get None.
        """
        sharded = is_sharded(model)
        return save_resume(run_dir, model, self.saved_form(optimizer, elapsed_s, sharded), run_hash, optimizer)

    def advance(self, loss: torch.Tensor, tokens: int) -> None:
        """Count one finished step of ``tokens`` tokens whose mean loss is ``loss`` (on the device: no sync)."""
        self.running_loss += loss
        self.tokens += tokens
        self.step += 1

    def close_interval(self) -> float:
        """The mean loss since the last metrics row (the one host sync per interval); starts the next interval."""
        self.loss = (self.running_loss / (self.step - self.last_logged_step)).item()
        self.running_loss.zero_()
        self.last_logged_step = self.step
        return self.loss
