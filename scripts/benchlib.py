"""What the benchmarks in ``scripts/`` share: the fixed shape, the models compared, clocks and FLOP counts.

``scripts/bench.py`` (CPU), ``scripts/bench_gpu.py`` (``bench.py --gpu``) and
``scripts/bench_precision.py`` import this module and nothing of each other. The
contenders are posexp's GPT with one encoder per family and, when installed
(``pip install -e '.[bench]'``), transformers' Llama, GPT-2 and Bloom and
x-transformers' decoder with rotary, ALiBi, T5 bias, absolute or no positions.

FLOPs per trained token (counted from the configuration, the convention of
Chowdhery et al. 2022, "PaLM", Appendix B)::

    6 * N + 12 * n_layers * d_model * L
    N = n_layers * (4 * d_model^2 + k * d_model * d_ff) + vocab * d_model
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.config.schema import TrainConfig
from posexp.encoders import create
from posexp.model.gpt import GPT, ModelShape
from posexp.runtime.device import autocast
from posexp.runtime.precision import choose_precision
from posexp.training.precision import training_precision
from posexp.training.optim import make_optimizer

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
FAMILIES = ("none", "rope", "alibi", "t5", "learned")
FAMILY_LABEL = {"none": "NoPE", "rope": "rotary", "alibi": "ALiBi", "t5": "T5 bias", "learned": "learned abs."}


@dataclass(frozen=True)
class Shape:
    vocab: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    seq: int = 256
    batch: int = 16

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model


QUICK = Shape(vocab=256, d_model=64, n_layers=2, n_heads=2, seq=64, batch=4)


def train_flops_per_token(shape: Shape, mlp_matrices: int = 2, d_ff: Optional[int] = None, seq: Optional[int] = None) -> float:
    """Training FLOPs per token, ``6 N + 12 n_layers d L`` (Chowdhery et al. 2022, PaLM, Appendix B)."""
    d, d_ff = shape.d_model, d_ff or shape.d_ff
    n = shape.n_layers * (4 * d * d + mlp_matrices * d * d_ff) + shape.vocab * d
    return 6 * n + 12 * shape.n_layers * d * (seq or shape.seq)


# -- the models ---------------------------------------------------------------------------------

@dataclass
class Contender:
    """One model in the comparison: how to build it and call it, and how it differs from posexp's block."""

    impl: str  # "posexp", "transformers", "x-transformers"
    name: str
    family: str
    build: Callable[[Shape, int], nn.Module]  # (shape, max positions) -> model
    mlp_matrices: int = 2
    notes: str = ""

    @property
    def label(self) -> str:
        return f"{self.impl} {self.name}" if self.impl != "posexp" else f"posexp {self.family}"


def posexp_model(family: str) -> Callable[[Shape, int], nn.Module]:
    def build(shape: Shape, max_len: int) -> nn.Module:
        options = {"max_length": max_len} if family == "learned" else {}
        enc = create(family, d_model=shape.d_model, n_heads=shape.n_heads, **options)
        return GPT(ModelShape(vocab_size=shape.vocab, d_model=shape.d_model, n_layers=shape.n_layers,
                              n_heads=shape.n_heads), enc)

    return build


def _llama(shape: Shape, max_len: int) -> nn.Module:
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_ff,
        num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_heads,
        hidden_act="gelu", max_position_embeddings=max_len, tie_word_embeddings=True, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attn_implementation="sdpa"))


def _gpt2(shape: Shape, max_len: int) -> nn.Module:
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=shape.vocab, n_embd=shape.d_model, n_layer=shape.n_layers, n_head=shape.n_heads,
        n_inner=shape.d_ff, n_positions=max_len, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True, attn_implementation="sdpa"))


def _bloom(shape: Shape, max_len: int) -> nn.Module:
    import transformers

    return transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=shape.vocab, hidden_size=shape.d_model, n_layer=shape.n_layers, n_head=shape.n_heads,
        hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=True))


def _xt(**options) -> Callable[[Shape, int], nn.Module]:
    def build(shape: Shape, max_len: int) -> nn.Module:
        from x_transformers import Decoder, TransformerWrapper

        pos = {k: v for k, v in options.items() if k == "use_abs_pos_emb"}
        layer_options = {k: v for k, v in options.items() if k != "use_abs_pos_emb"}
        if layer_options.get("rotary_pos_emb"):
            layer_options["rotary_emb_dim"] = shape.d_model // shape.n_heads  # the whole head, as posexp
        return TransformerWrapper(
            num_tokens=shape.vocab, max_seq_len=max_len, tie_embedding=True, **pos,
            attn_layers=Decoder(dim=shape.d_model, depth=shape.n_layers, heads=shape.n_heads,
                                attn_dim_head=shape.d_model // shape.n_heads, ff_mult=4, ff_no_bias=True,
                                **{"attn_flash": True, **layer_options}))

    return build


HF_NOTE = "biases in every linear"
PEERS = [
    Contender("transformers", "Llama (RoPE)", "rope", _llama, mlp_matrices=3,
              notes="gated MLP (3 matrices of d x 4d, GELU), RMSNorm, sdpa attention"),
    Contender("transformers", "GPT-2 (learned)", "learned", _gpt2, notes=f"{HF_NOTE}, exact GELU, sdpa attention"),
    Contender("transformers", "Bloom (ALiBi)", "alibi", _bloom,
              notes=f"{HF_NOTE}, tanh-GELU, extra embedding LayerNorm, eager attention"),
    Contender("x-transformers", "rotary", "rope", _xt(rotary_pos_emb=True, use_abs_pos_emb=False),
              notes="bias-free LayerNorm, flash attention"),
    Contender("x-transformers", "ALiBi", "alibi", _xt(alibi_pos_bias=True, use_abs_pos_emb=False),
              notes="bias-free LayerNorm"),
    Contender("x-transformers", "T5 bias", "t5", _xt(rel_pos_bias=True, use_abs_pos_emb=False, attn_flash=False),
              notes="bias-free LayerNorm, its own attention (flash refuses T5 bias)"),
    Contender("x-transformers", "absolute", "learned", _xt(use_abs_pos_emb=True),
              notes="bias-free LayerNorm, embedding scaled by d^-1/2"),
    Contender("x-transformers", "NoPE", "none", _xt(use_abs_pos_emb=False), notes="bias-free LayerNorm"),
]


def peer_available(c: Contender) -> bool:
    module = {"transformers": "transformers", "x-transformers": "x_transformers"}[c.impl]
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def logits_of(model: nn.Module, idx: Tensor) -> Tensor:
    """``(B, L, vocab)`` logits from any contender."""
    if isinstance(model, GPT):
        return model(idx)
    if hasattr(model, "config"):  # transformers
        return model(input_ids=idx, use_cache=False).logits
    return model(idx)


# -- measuring ----------------------------------------------------------------------------------

class Clock:
    """Seconds of ``wall`` time, or of ``cpu`` time (process CPU seconds / threads).

    On a machine other jobs share, wall time includes the time the process waited
    for a core; CPU time does not. With one thread, CPU time is exactly the work done.
    """

    def __init__(self, kind: str = "wall"):
        self.kind, self._now = kind, CLOCKS[kind]
        self.threads = torch.get_num_threads() if kind == "cpu" else 1

    def __call__(self) -> float:
        return self._now() / self.threads


def matmul_gflops(n: int, dtype: torch.dtype, reps: int, clock: Clock) -> float:
    """Median GFLOP/s of an ``n x n`` by ``n x n`` product (2 n^3 FLOPs) after one warm-up."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t0 = clock()
        a @ b
        times.append(clock() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def matmul_peak(sizes: list[int], dtype: torch.dtype, reps: int, clock: Clock) -> dict:
    by_size = {n: matmul_gflops(n, dtype, reps, clock) for n in sizes}
    return {"dtype": str(dtype).replace("torch.", ""), "gflops": max(by_size.values()),
            "by_size": {str(n): round(g, 2) for n, g in by_size.items()}}


def train_config() -> TrainConfig:
    """The default run's training settings, for ``make_optimizer`` and the clip value."""
    return TrainConfig()


class Trainee:
    """A model with its optimizer, taking full training steps on one fixed batch."""

    def __init__(self, c: Contender, shape: Shape, precision: str, batch: Tensor, clock: Clock):
        torch.manual_seed(0)
        self.contender, self.precision = c, precision
        self.model = c.build(shape, shape.seq).train()
        self.cfg = train_config()
        self.opt = make_optimizer(self.model, self.cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        cpu = torch.device("cpu")
        if precision == "auto" and isinstance(self.model, GPT):  # what posexp train decides for this model
            t = dataclasses.replace(self.cfg, precision="auto", batch_size=shape.batch)
            self.choice = training_precision(self.model, t, shape.seq, cpu)
        else:
            self.choice = choose_precision(precision, cpu)
        self.dtype = self.choice.dtype
        self._autocast = lambda: autocast(torch.device("cpu"), self.dtype)
        self.x, self.y = batch[:, :-1], batch[:, 1:]
        self.clock = clock
        self.times: list[float] = []
        self.loss = float("nan")

    def step(self, timed: bool) -> None:
        t0 = self.clock()
        with self._autocast():
            if isinstance(self.model, GPT):
                loss = self.model.token_losses(self.x, self.y).mean()  # what posexp's trainer computes
            else:
                logits = logits_of(self.model, self.x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), self.y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if timed:
            self.times.append(self.clock() - t0)
            self.loss = float(loss.detach())  # after the clock stopped


def all_contenders() -> list[Contender]:
    """posexp's model for every family, then every peer (installed or not)."""
    return [Contender("posexp", f, f, posexp_model(f)) for f in FAMILIES] + PEERS


def best_peer_ratios(rows: list[dict], key: str, where: Optional[Callable[[dict], bool]] = None,
                     targets: Optional[dict[str, float]] = None) -> list[dict]:
    """posexp's fp32 row over the best peer's, per family, among ``rows`` that satisfy ``where``.

    A family whose every peer failed (out of memory) keeps posexp's number with the peers' error
    and no ratio. ``targets`` (family -> ratio) are copied into the entries they name.
    """
    rows = [r for r in rows if where is None or where(r)]
    out = []
    for fam in FAMILIES:
        mine = [r for r in rows if r["impl"] == "posexp" and r["family"] == fam
                and r.get("precision", "fp32") == "fp32" and r.get(key) is not None]
        peers = [r for r in rows if r["impl"] != "posexp" and r["family"] == fam]
        ran = [r for r in peers if r.get(key) is not None]
        if not mine or not peers:
            continue
        entry = {"family": fam, "posexp": mine[0][key]}
        if ran:
            best = max(ran, key=lambda r: r[key])
            entry.update(best_peer=best["label"], peer=best[key], ratio=mine[0][key] / best[key])
        else:
            entry.update(best_peer="every peer: " + peers[0].get("error", "failed"), peer=None, ratio=None)
        if targets is not None:
            entry["target"] = targets.get(fam)
        out.append(entry)
    return out
