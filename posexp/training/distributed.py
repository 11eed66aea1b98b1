"""Data-parallel training over several processes, and which of them writes.

``torchrun --nproc_per_node=N -m posexp train ...`` starts N copies of posexp;
each finds its place in the ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` variables
torchrun sets, and they meet through ``MASTER_ADDR:MASTER_PORT`` (``env://``).
Every process draws the same global batch of ``train.batch_size`` windows and
trains on its own contiguous slice of it (:func:`shard`), so the run takes the
same steps on the same data as one process would; DistributedDataParallel
averages the gradients, which for equal slices is the gradient of the global
mean loss.

Only rank 0 writes: the run folder, ``metrics.csv``, checkpoints, results,
plots and Hydra's ``.hydra/`` and ``train.log``. The other ranks run Hydra with
:func:`worker_overrides` (no log file, no saved config, a private scratch folder
in place of the ``${now:...}`` run folder, removed when they finish), and learn
rank 0's run folder from :func:`broadcast`, so the ranks never disagree on it
even when their clocks tick over between them.
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import tempfile
from typing import Any, Iterator

import torch
import torch.distributed as dist

from posexp.errors import ConfigError, PosexpError
from posexp.runtime.device import World, world

# Ranks other than 0 wait for rank 0 at the next collective while it evaluates a run (in a sweep, the
# next job's first one); evaluating to 16x the training length can take long, so the default 10-minute
# (NCCL) / 30-minute (gloo) timeout would abort healthy sweeps.
TIMEOUT = datetime.timedelta(hours=6)


def is_main() -> bool:
    """Whether this process is rank 0 (also when the environment is malformed: then it is the one to say so)."""
    try:
        return world().is_main
    except PosexpError:
        return True


@contextlib.contextmanager
def worker_overrides() -> Iterator[list[str]]:
    """Hydra overrides that keep a rank other than 0 from writing anything; none for rank 0.

    Hydra still needs a run (or sweep) folder to create: it gets a scratch
    folder, removed afterwards. ``hydra/job_logging=disabled`` keeps it from
    opening ``train.log``, ``hydra.output_subdir=null`` from saving ``.hydra/``,
    ``hydra/hydra_logging=disabled`` from repeating rank 0's sweep messages.
    """
    if is_main():
        yield []
        return
    scratch = tempfile.mkdtemp(prefix="posexp-rank-")
    try:
        yield [f"hydra.run.dir={scratch}", f"hydra.sweep.dir={scratch}", "hydra.output_subdir=null",
               "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def shard(batch_size: int, w: World) -> slice:
    """The rows of the global batch that rank ``w.rank`` trains on: one contiguous slice per rank.

    Raises:
        ConfigError: ``train.batch_size`` does not split evenly over the processes (unequal slices
            would weight the ranks' mean losses wrongly when their gradients are averaged).
    """
    if batch_size % w.size:
        raise ConfigError("train.batch_size", f"must be divisible by the number of processes ({w.size}) so that "
                                              f"each trains on an equal slice of the global batch (got {batch_size}); "
                                              f"e.g. train.batch_size={max(w.size, batch_size // w.size * w.size)}")
    per_rank = batch_size // w.size
    return slice(w.rank * per_rank, (w.rank + 1) * per_rank)


def setup(device: torch.device) -> World:
    """Join the process group (once per process): gloo for CPU tensors, NCCL for CUDA ones.

    Raises:
        ConfigError: a device several processes cannot share (``mps``).
    """
    w = world()
    if not w.distributed or dist.is_initialized():
        return w
    if device.type == "mps":
        raise ConfigError("device", "mps runs in one process; start posexp without torchrun, or use "
                                    "device=cpu (gloo) or device=cuda (nccl) with several processes")
    if not dist.is_available():
        raise PosexpError("this build of torch has no torch.distributed; start posexp without torchrun")
    if device.type == "cuda" and dist.is_nccl_available():
        backend = "cpu:gloo,cuda:nccl"  # object broadcasts and barriers on CPU, gradients through NCCL
        dist.init_process_group(backend, init_method="env://", timeout=TIMEOUT, device_id=device)
    else:
        dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
    return w


def shutdown() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects; a no-op in one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait until every rank gets here (a no-op in one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
