"""``precision=auto`` on a CPU with native bf16 matmuls: a measurement of the run's own training step, and the
machine's cache of it (:func:`measured_cpu_precision`, cached per machine under ``$POSEXP_CACHE/precision``).

:func:`training_precision` hands :func:`posexp.runtime.precision.choose_precision` a probe of the run's training
step (forward, fp32 cross-entropy, backward of the model being trained, at its widths and at the run's
``batch x train_len`` up to :data:`PROBE_TOKENS` tokens), the workload the probe stands for (the cache key) and
the machine's cache folder. The probe leaves the weights, their gradients and every RNG state as it found them,
so a run's numbers do not depend on whether its choice was measured now or read from the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from posexp.config.schema import TrainConfig
from posexp.data.tokens import cache_root
from posexp.model.gpt import GPT
from posexp.runs.atomic import atomic_write_json
from posexp.runtime.device import autocast
from posexp.runtime.precision import PrecisionChoice, choose_precision, cpu_name
from posexp.training import distributed


# bf16 has to take at most this fraction of fp32's time, in every round, to be chosen: within the margin the
# two are as fast, and a noisy measurement on a shared machine must not pick bf16; fp32 wins those, being the
# numerics every table was made with
BF16_MARGIN = 0.95


PROBE_ROUNDS = 3


PROBE_MIN_SECONDS = 0.05  # a tiny workload repeats its probe within a round until a round takes about this long


PROBE_FORMAT = 2  # in the cache key: a change of how the probe measures measures again


def machine_key(workload: dict) -> dict:
    """What a measured precision choice holds for: this CPU, its bf16 units, torch, the thread count, the workload."""
    flags = {flag: bool(getattr(torch.cpu, f"_is_{flag}_supported", lambda: False)())
             for flag in ("avx512_bf16", "amx_tile")}
    return {"probe": PROBE_FORMAT, "cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability(),
            **flags, "torch": torch.__version__, "threads": torch.get_num_threads(), "workload": workload}


def time_precisions(probe: Callable[[torch.dtype], None], rounds: int = PROBE_ROUNDS,
                    clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """Seconds per ``probe`` call in fp32 and bf16: one warm-up each, then ``rounds`` interleaved rounds (the
    order alternating, so a load change hits both alike), each of as many calls as take about
    :data:`PROBE_MIN_SECONDS`. The default clock is the process's CPU time, which leaves out the time other
    processes held the cores. The global RNG states are left as found."""
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    dtypes = [torch.float32, torch.bfloat16]
    with torch.random.fork_rng(devices=[]):
        warm = []
        for dtype in dtypes:
            start = clock()
            probe(dtype)
            warm.append(clock() - start)
        reps = max(1, min(50, math.ceil(PROBE_MIN_SECONDS / max(min(warm), 1e-6))))
        for r in range(rounds):
            for dtype in dtypes if r % 2 == 0 else dtypes[::-1]:
                start = clock()
                for _ in range(reps):
                    probe(dtype)
                times[str(dtype).replace("torch.", "")].append(round((clock() - start) / reps, 6))
    return times


def measured_cpu_precision(probe: Callable[[torch.dtype], None], workload: dict, cache_dir: Optional[Path] = None,
                           clock: Callable[[], float] = time.process_time) -> PrecisionChoice:
    """``precision=auto`` on a CPU with native bf16 matmuls: bf16 only if its probe step is faster in every round.

    bf16 is chosen when it took at most :data:`BF16_MARGIN` of fp32's time in each of the
    :data:`PROBE_ROUNDS` interleaved rounds (:func:`time_precisions`); otherwise fp32. The measurement is kept
    in ``cache_dir/precision/<key>.json``, keyed on :func:`machine_key`, so every later run of the workload on
    this machine makes the same choice without measuring; a cache that cannot be written only costs the probe.
    """
    key = machine_key(workload)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(cache_dir) / "precision" / f"{digest}.json" if cache_dir is not None else None
    cached = None
    if path is not None and path.is_file():
        try:
            cached = json.loads(path.read_text())
            cached = cached if cached.get("key") == json.loads(json.dumps(key, default=str)) else None
        except (OSError, ValueError, AttributeError):
            cached = None
    times = cached["seconds"] if cached else time_precisions(probe, clock=clock)
    if path is not None and cached is None:
        try:
            atomic_write_json(path, {"key": key, "seconds": times})
        except OSError:
            pass
    fp32, bf16 = times["float32"], times["bfloat16"]
    bf16_wins = all(b <= BF16_MARGIN * f for f, b in zip(fp32, bf16))
    dtype = torch.bfloat16 if bf16_wins else torch.float32
    faster = "bf16 is faster in every round" if bf16_wins else (
        "fp32 is faster" if min(fp32) <= min(bf16) else
        f"bf16 is not {1 - BF16_MARGIN:.0%} faster in every round")
    rounds = ", ".join(f"{f * 1e3:.1f}/{b * 1e3:.1f}" for f, b in zip(fp32, bf16))
    reason = (f"measured on this CPU (threads={key['threads']}): a training step's forward and backward took "
              f"{min(fp32) * 1e3:.1f} ms in fp32, {min(bf16) * 1e3:.1f} ms in bf16 (CPU time, best of "
              f"{len(fp32)} interleaved rounds; fp32/bf16 per round {rounds} ms): {faster}"
              + (f"; measured by an earlier run, read from {path}" if cached else ""))
    return PrecisionChoice(dtype, "auto", reason, {"seconds": times, "workload": workload, "cached": bool(cached),
                                                   **({"file": str(path)} if path is not None else {})})


# train.log's logger, as the trainer's
log = logging.getLogger("posexp.train")


# tokens per probe step: the run's batch up to this many (enough rows that every matmul has the run's widths
# and a realistic row count; a large batch would only make the probe longer)
PROBE_TOKENS = 8192


def probe_workload(model: GPT, rows: int, length: int) -> dict:
    """What the probe computes: the model's shape and encoder, and the probe batch ``rows x length``."""
    s = model.shape
    return {"encoder": model.encoder.label, "d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads,
            "mlp_ratio": s.mlp_ratio, "vocab": s.vocab_size, "attn_block_size": s.attn_block_size,
            "rows": rows, "length": length}


def training_precision(model: GPT, t: TrainConfig, train_len: int, device: torch.device,
                       saved: Optional[str] = None, cache_dir: Optional[Path] = None) -> PrecisionChoice:
    """The precision of ``model``'s training under the settings ``t``.

    Args:
        model: the model about to train, on ``device``, in training mode.
        t: ``train.precision`` and ``train.batch_size`` are read.
        train_len: the training context length.
        saved: the dtype name a resumed run's earlier sessions trained in: ``auto`` keeps it, so a resumed
            run computes what an uninterrupted one would.
        cache_dir: where measured choices are kept (default: the machine's posexp cache, ``$POSEXP_CACHE``).
    """
    if saved and t.precision == "auto":
        log.info("precision %s (auto): kept from the run's first session", saved)
        return PrecisionChoice(getattr(torch, saved), "auto", f"{saved}, the choice this run made when it started "
                                                              "(resumed from its checkpoint)")
    rows = max(1, min(t.batch_size, PROBE_TOKENS // max(1, train_len)))
    length = min(train_len, PROBE_TOKENS)
    idx = torch.randint(0, model.shape.vocab_size, (rows, length + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)

    def probe(dtype: torch.dtype) -> None:
        with autocast(device, dtype):
            loss = model.token_losses(idx[:, :-1], idx[:, 1:]).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    workload, where = probe_workload(model, rows, length), cache_root(None) if cache_dir is None else cache_dir
    choice = choose_precision(t.precision, device, lambda: measured_cpu_precision(probe, workload, where))
    # under torchrun every rank computes in rank 0's choice (one process: the choice as it is)
    dtype_name, reason, probed = distributed.broadcast((choice.name, choice.reason, choice.probe))
    log.info("precision %s (%s): %s", dtype_name, choice.asked, reason)
    return PrecisionChoice(getattr(torch, dtype_name), choice.asked, reason, probed)
