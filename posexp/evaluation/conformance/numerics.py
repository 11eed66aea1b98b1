"""What an encoding costs and how it behaves in finite precision: length, memory, determinism, bf16, speed."""

from __future__ import annotations

import math
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from posexp.config.schema import ModelConfig
from posexp.encoders import create
from posexp.evaluation.conformance.probe import (
    EncoderFactory, LargestTensor, Probe, build_model, causal_diff, encodable, finite, relative_diff, tokens)
from posexp.evaluation.conformance.result import FAIL, NOT_APPLICABLE, PASS, Check, within
from posexp.model.gpt import ModelShape
from posexp.runtime.device import autocast

LINEAR_GROWTH = 1.25  # largest tensor ~ L^p: blocked attention has p = 1, a full L x L matrix p = 2
BF16 = 5e-2  # max |bf16 - fp32| of the logits, relative to max |fp32 logit|: bf16 keeps 8 bits of mantissa
MAX_SLOWDOWN = 10.0  # forward + backward time relative to rope at the default shape
SPEED_ROUNDS = 7


def _forward_backward(model, idx: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    logits = model(idx)
    F.cross_entropy(logits.float().flatten(0, 1), idx.roll(-1, dims=1).flatten()).backward()
    return logits


def _grads(model) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters() if p.grad is not None]


def check_length(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, block=probe.long_block)
    encoder = model.encoder
    declared = encoder.max_length
    ran, problems = [], []
    for L in probe.lengths:
        if not encoder.supports(L):
            if declared is None or L <= declared:
                problems.append(f"refuses {L} tokens without declaring max_length below it")
            continue
        logits = _forward_backward(model, tokens(probe, L, batch=1))
        if not finite(logits, *_grads(model)):
            problems.append(f"NaN/inf in the {'outputs' if not finite(logits) else 'gradients'} at {L} tokens")
        ran.append(L)
    if declared is not None and declared < probe.lengths[-1]:
        if encoder.supports(declared + 1):
            problems.append(f"declares max_length={declared} but accepts {declared + 1} tokens")
        elif encoder.supports(declared):
            logits = _forward_backward(model, tokens(probe, declared, batch=1))
            ran.append(declared)
            if not finite(logits, *_grads(model)):
                problems.append(f"NaN/inf at max_length={declared}")
    longest = max(ran, default=0)
    refusal = f", refused past max_length={declared}" if declared is not None and declared < probe.lengths[-1] else ""
    detail = f"forward + backward at {', '.join(map(str, sorted(set(ran)))) or 'no length'} tokens{refusal}"
    status = FAIL if problems else PASS
    return Check("length", status, float(longest), f"16x = {probe.lengths[-1]} or max_length",
                 "; ".join(problems) if problems else detail)


@torch.no_grad()
def check_memory(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe, block=probe.long_block)
    longest = probe.lengths[-1]
    if not model.encoder.supports(longest):  # within the declared max_length
        longest = model.encoder.max_length or 0
    short, long = longest // 4, longest
    if short < 2 * probe.long_block:
        return Check("memory linear in length", NOT_APPLICABLE, None, "",
                     f"max_length={longest} is too short to see growth past blocks of {probe.long_block}")
    largest = []
    for L in (short, long):
        with LargestTensor() as mode:
            model(tokens(probe, L, batch=1))
        largest.append(mode.largest)
    exponent = math.log(largest[1] / largest[0]) / math.log(long / short)
    return within("memory linear in length", exponent, LINEAR_GROWTH,
                  f"largest tensor of a forward pass (blocks of {probe.long_block} queries) ~ L^p: "
                  f"{largest[0] / 2 ** 10:,.0f} KiB at {short} tokens, {largest[1] / 2 ** 10:,.0f} KiB at {long}",
                  fmt=".2f")


def check_determinism(make_encoder: EncoderFactory, probe: Probe) -> Check:
    runs = []
    for _ in range(2):
        model = build_model(make_encoder, probe)
        logits = _forward_backward(model, tokens(probe, probe.train_len))
        runs.append([logits.detach(), *_grads(model)])
    if len(runs[0]) != len(runs[1]):
        return Check("determinism", FAIL, None, "== 0", "the two runs have gradients for different parameters")
    worst = max(causal_diff(a, b) for a, b in zip(*runs))
    return within("determinism", worst, 0.0, "two seeded builds, forward + backward: outputs and gradients, "
                                             "max abs difference", fmt="g")


def check_bf16(make_encoder: EncoderFactory, probe: Probe) -> Check:
    model = build_model(make_encoder, probe)
    idx = tokens(probe, probe.train_len)
    reference = _forward_backward(model, idx).detach()
    with autocast(idx.device, torch.bfloat16):
        logits = _forward_backward(model, idx)
    if not finite(logits, *_grads(model)):
        return Check("bf16", FAIL, None, f"<= {BF16:.0e}", "NaN/inf under bf16 autocast")
    error = relative_diff(logits.detach(), reference)
    return within("bf16", error, BF16, "bf16 autocast vs fp32, forward + backward: max |difference| of the "
                                       "logits / max |fp32 logit|", fmt=".0e")


def _seconds(model, idx: torch.Tensor) -> float:
    start = time.perf_counter()
    _forward_backward(model, idx)
    return time.perf_counter() - start


def check_speed(make_encoder: EncoderFactory, probe: Probe) -> Check:
    default = ModelConfig()
    shape = ModelShape(**asdict(default), vocab_size=256)
    models = {}
    for name, factory in (("rope", lambda d, h: create("rope", d, h)), ("it", make_encoder)):
        models[name] = build_model(factory, probe, shape=shape)
    train_len = encodable(models["it"].encoder, 128)  # configs/config.yaml's, within a max_length
    idx = torch.randint(256, (1, train_len), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(SPEED_ROUNDS + 1):  # interleaved, in alternating order; the first round a warm-up
        for name in sorted(models, reverse=bool(round_ % 2)):
            seconds = _seconds(models[name], idx)
            if round_:
                times[name].append(seconds)
    # the fastest of the rounds: what the code costs, not what other processes took from it meanwhile
    best = {name: min(seconds) for name, seconds in times.items()}
    ratio = best["it"] / best["rope"]
    return within("speed vs rope", ratio, MAX_SLOWDOWN,
                  f"forward + backward, default model (d_model {default.d_model}, {default.n_layers} layers, "
                  f"{default.n_heads} heads), {train_len} tokens, best of {SPEED_ROUNDS}: "
                  f"{best['it'] * 1e3:.1f} ms vs {best['rope'] * 1e3:.1f} ms",
                  fmt=".0f")


__all__ = ["check_bf16", "check_determinism", "check_length", "check_memory", "check_speed"]
