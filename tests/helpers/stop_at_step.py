"""``python tests/helpers/stop_at_step.py STEP posexp-args...``: posexp's CLI, with SIGTERM raised in this process while
training step STEP (0-based) draws its batch, as a user's Ctrl-C or a scheduler's preemption would land.

Started by torchrun, every rank gets the signal at the same step, so a sharded run stops, checkpoints that step in
every rank's shards and exits as an interrupted run does (tests/process/test_fsdp.py resumes it at another world size).
"""

import os
import signal
import sys

from posexp.cli import main
from posexp.data.corpus import BatchSampler

STEP = int(sys.argv[1])
_batch = BatchSampler.batch


def _batch_then_signal(self, at, *args):
    if at == STEP:
        os.kill(os.getpid(), signal.SIGTERM)
    return _batch(self, at, *args)


BatchSampler.batch = _batch_then_signal  # type: ignore[method-assign]
sys.argv = ["posexp", *sys.argv[2:]]
main()
