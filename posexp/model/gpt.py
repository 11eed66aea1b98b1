"""A small pre-norm causal Transformer whose positional encoding is a plug-in.

The model calls the encoder's hooks (``embed``, ``rotate``, ``bias``, ``scores``,
``transform``, ``normalise``) and never asks which encoder it holds. There is no ``block_size`` assertion:
reading longer contexts than the training length is the point of the project.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posexp.config.schema import ModelConfig
from posexp.encoders.contract import ContentLogits, PositionalEncoder
from posexp.errors import require
from posexp.model.fused import causal_block_mask, flex_attend, fused_by_default
from posexp.model.seam import OwnModelSeam
from posexp.model.window import AttentionWindow, layer_window, visible_keys


@dataclass
class ModelShape(ModelConfig):
    """The ``model`` group's widths, depth and heads (:class:`posexp.config.schema.ModelConfig`, the one place they
    are declared, with their defaults) and the vocabulary, which the tokenizer decides."""

    vocab_size: int = 256


INITS = ("gpt2", "pytorch")  # model.init: GPT-2's N(0, 0.02), or each layer's PyTorch default
# SSMax's s at initialisation (model.ssmax, Nakanishi 2025): 0.43, where public implementations start it
SSMAX_INIT = 0.43


def check_shape(shape: ModelConfig) -> None:
    require(shape.d_model > 0, "model.d_model", f"must be a positive integer (got {shape.d_model})")
    require(shape.n_heads > 0, "model.n_heads", f"must be a positive integer (got {shape.n_heads})")
    require(shape.n_layers > 0, "model.n_layers", f"must be a positive integer (got {shape.n_layers})")
    require(shape.d_model % shape.n_heads == 0, "model.d_model",
            f"must be divisible by model.n_heads (got d_model={shape.d_model}, n_heads={shape.n_heads})")
    require(shape.mlp_ratio > 0, "model.mlp_ratio", f"must be > 0 (got {shape.mlp_ratio})")
    require(0 <= shape.dropout < 1, "model.dropout", f"must be in [0, 1) (got {shape.dropout})")
    require(shape.attn_block_size > 0, "model.attn_block_size",
            f"must be a positive integer (got {shape.attn_block_size})")
    init = getattr(shape, "init", "gpt2")  # a run saved before the key existed: GPT-2's
    require(init in INITS, "model.init", f"must be one of {', '.join(INITS)} (got {init!r})")


def layer_norm(shape: ModelConfig) -> nn.LayerNorm:
    """A LayerNorm over the model width (Ba et al. 2016), with its bias unless ``model.norm_bias=false``."""
    return nn.LayerNorm(shape.d_model, bias=getattr(shape, "norm_bias", True))  # a run saved before the key: biased


class AttentionPlan:
    """Per-forward state shared by the layers that use one encoder: positions and, when the
    whole sequence is one query block, the additive bias computed once for all those layers;
    on the fused path, the encoder's ``score_mod`` and the causal block mask, also built once.

    Args:
        fused: attend through FlexAttention with the encoder's ``score_mod`` where it has one
            (:mod:`posexp.model.fused`); the blocked path otherwise.
        window: keys older than this window (and not sinks) are masked too (:mod:`posexp.model.window`); an
            encoding that would attend through plain causal SDPA then takes the blocked path.
    """

    def __init__(self, encoder: PositionalEncoder, pos: Tensor, block_size: int, fused: bool = False,
                 window: Optional[AttentionWindow] = None):
        self.encoder = encoder
        self.pos = pos
        self.block_size = block_size
        self.window = window
        self.needs_mask = (encoder.uses_bias or encoder.uses_scores or encoder.explicit_attention
                           or window is not None)
        self.fused = (fused and encoder.uses_score_mod and not encoder.uses_scores
                      and not encoder.explicit_attention)
        self._full_bias: Optional[Tensor] = None
        self._flex: Optional[tuple] = None

    def flex(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Causal attention over the whole sequence with the encoder's bias inside the fused kernel."""
        if self._flex is None:
            L = self.pos.shape[0]
            block_mask = causal_block_mask(L, L, 0, self.pos.device, self.window)
            self._flex = (self.encoder.score_mod(self.pos, self.pos), block_mask)
        score_mod, block_mask = self._flex
        return flex_attend(q, k, v, score_mod, block_mask, kernel_options=self.encoder.flex_kernel_options)

    def bias(self, start: int, end: int, dtype: torch.dtype) -> Optional[Tensor]:
        """Additive logits ``(1, H, end-start, end)`` for queries ``start:end`` over keys ``0:end``,
        causal mask included (a mask, never None, on this path)."""
        L = self.pos.shape[0]
        whole = start == 0 and end == L
        if whole and self._full_bias is not None:
            return self._full_bias
        q_pos, k_pos = self.pos[start:end], self.pos[:end]
        bias = self.encoder.bias(q_pos, k_pos) if self.encoder.uses_bias else None
        q_idx = torch.arange(start, end, device=self.pos.device)
        k_idx = torch.arange(end, device=self.pos.device)
        future = k_idx[None, :] > q_idx[:, None]  # (Lq, Lk)
        if self.window is not None:
            future = future | self.window.hidden(q_idx[:, None], k_idx[None, :])  # masked the same way
        if bias is None:
            mask = torch.zeros(future.shape, dtype=dtype, device=future.device)
        else:
            mask = bias.to(dtype)
        # 4-D: with a 3-D mask SDPA on CPU falls back to its unfused math path (torch 2.13)
        mask = mask.masked_fill(future, float("-inf")).view(1, -1, *future.shape)  # (1, H or 1, Lq, Lk)
        if whole:
            self._full_bias = mask
        return mask


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.n_heads = shape.n_heads
        self.head_dim = shape.d_model // shape.n_heads
        self.qkv = nn.Linear(shape.d_model, 3 * shape.d_model, bias=False)
        self.proj = nn.Linear(shape.d_model, shape.d_model, bias=False)
        self.dropout = shape.dropout
        # FlexAttention's kernels tile the head width: a power of two, at least 16
        self.fusable = self.head_dim >= 16 and self.head_dim & (self.head_dim - 1) == 0
        # Scalable-Softmax (Nakanishi 2025): a learned s per head; no parameter at all when off
        self.ssmax: Optional[nn.Parameter] = None
        if getattr(shape, "ssmax", False):
            self.ssmax = nn.Parameter(torch.full((shape.n_heads,), SSMAX_INIT))

    def ssmax_scale(self, plan: AttentionPlan, L: int) -> Tensor:
        """SSMax's ``s * log n`` of each head and query row, ``(H, L, 1)``: ``n`` the keys the row attends to.

        Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", §2: ``softmax`` of the logits ``z``
        over ``n`` keys becomes ``n^(s z_i) / sum_j n^(s z_j) = softmax((s log n) z)``, which keeps the
        largest attention weight from fading as ``n`` grows. Applied to the query, so every logit term
        computed from it (``q . k`` and an encoder's ``scores``) is multiplied; an additive position bias that
        does not read the query (alibi, t5, ...) is not.
        """
        n = visible_keys(torch.arange(L, device=plan.pos.device), plan.window)  # (L,)
        assert self.ssmax is not None
        return (self.ssmax[:, None] * n.to(self.ssmax.dtype).log()[None, :])[..., None]  # (H, L, 1)

    def forward(self, x: Tensor, plan: AttentionPlan) -> Tensor:
        B, L, D = x.shape
        enc = plan.encoder
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, Dh)
        if enc.uses_rotate:
            q, k = enc.rotate(q, k, plan.pos, plan.pos)
        if self.ssmax is not None:
            q = q * self.ssmax_scale(plan, L).to(q.dtype)  # (B, H, L, Dh), logits times s log n
        p = self.dropout if self.training else 0.0
        if enc.uses_attend:  # an evaluation-time position remapping attends itself (posexp/encoders/remapping.py)
            y = enc.attend(q, k, v, plan.pos, plan.block_size)  # (B, H, L, Dh)
        elif plan.fused and p == 0.0 and self.fusable:  # FlexAttention has no attention dropout
            y = plan.flex(q, k, v)  # (B, H, L, Dh)
        elif not plan.needs_mask:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)  # (B, H, L, Dh)
        else:
            content = enc.transform(x, q, k, plan.pos) if enc.uses_transform else None
            outs = [self._block(q, k, v, plan, start, min(start + plan.block_size, L), content, p)
                    for start in range(0, L, plan.block_size)]
            y = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]  # (B, H, L, Dh)
        y = y.transpose(1, 2).reshape(B, L, D)
        return self.proj(y)

    def _block(self, q: Tensor, k: Tensor, v: Tensor, plan: AttentionPlan, start: int, end: int,
               content: Optional[ContentLogits], p: float) -> Tensor:
        """Queries ``start:end`` over keys ``0:end``, ``(B, H, end - start, Dh)``: the bias, scores and content
        terms added to the logits, then softmax (SDPA) or the encoder's own ``normalise``."""
        enc = plan.encoder
        qb, kb, vb = q[:, :, start:end], k[:, :, :end], v[:, :, :end]
        mask = plan.bias(start, end, q.dtype)  # (1, H, Lq, Lk)
        if enc.uses_scores:
            extra = enc.scores(qb, kb, plan.pos[start:end], plan.pos[:end])
            mask = mask + extra.to(q.dtype)  # (B, H, Lq, Lk)
        if content is not None:
            mask = mask + content(start, end).to(q.dtype)  # (B, H, Lq, Lk)
        if not enc.uses_normalise:
            return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=p)
        logits = (qb @ kb.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask  # SDPA's scale; (B, H, Lq, Lk)
        weights = enc.normalise(logits, plan.pos[start:end], plan.pos[:end])
        return F.dropout(weights, p, training=p > 0) @ vb


class MLP(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        hidden = int(shape.mlp_ratio * shape.d_model)
        self.fc = nn.Linear(shape.d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, shape.d_model, bias=False)
        self.drop = nn.Dropout(shape.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.ln1 = layer_norm(shape)
        self.attn = CausalSelfAttention(shape)
        self.ln2 = layer_norm(shape)
        self.mlp = MLP(shape)

    def forward(self, x: Tensor, plan: AttentionPlan) -> Tensor:
        x = x + self.attn(self.ln1(x), plan)
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(OwnModelSeam, nn.Module):
    """Decoder-only language model with a pluggable positional encoder; evaluation reads it through the model seam
    (:class:`~posexp.model.seam.OwnModelSeam`).

    Args:
        shape: widths, depth, heads.
        encoder: the positional encoding; its parameters (if any) train with the model. Its
            ``embed`` acts once on the input; block ``i`` calls the hooks of
            ``encoder.for_layers(n_layers)[i]`` (the encoder itself unless it mixes encodings per layer).

    Attributes:
        fused_attention: whether bias encoders with a ``score_mod`` attend through FlexAttention; None (the
            default) = where it runs fused (CUDA, :func:`posexp.model.fused.fused_by_default`).
        attention_window: every layer attends only within this window (``eval.window`` / ``eval.sinks``,
            :mod:`posexp.model.window`); None (the default) = the whole causal past.
    """

    fused_attention: Optional[bool] = None
    attention_window: Optional[AttentionWindow] = None

    def __init__(self, shape: ModelShape, encoder: PositionalEncoder):
        super().__init__()
        check_shape(shape)
        self.shape = shape
        self.encoder = encoder
        encoder.for_layers(shape.n_layers)  # a per-layer mix builds (and checks) its layers here
        self.wte = nn.Embedding(shape.vocab_size, shape.d_model)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layers))
        self.ln_f = layer_norm(shape)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        if shape.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        # the encoder initialises its own parameters; init=pytorch keeps each layer's default initialisation
        if shape.init == "gpt2":
            untied = () if shape.tie_embeddings else (self.lm_head,)
            for module in (self.wte, self.blocks, *untied):
                module.apply(self._init_weights)
            # GPT-2's scaled init of the residual projections, 1/sqrt(2 * n_layers) (Radford et al. 2019, §2.3)
            for name, p in self.named_parameters():
                if name.endswith("proj.weight") and not name.startswith("encoder."):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * shape.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        """Logits ``(B, L, vocab)`` for tokens ``idx (B, L)`` at positions ``pos (L,)`` (default ``0..L-1``)."""
        B, L = idx.shape
        if pos is None:
            pos = torch.arange(L, device=idx.device)
        x = self.wte(idx)  # (B, L, D)
        if self.encoder.uses_embed:
            x = self.encoder.embed(x, pos)
        x = self.drop(x)
        # each block attends with its own layer's encoder (the same one for all, unless mixed)
        plans: dict[int, AttentionPlan] = {}
        fused = fused_by_default(idx.device) if self.fused_attention is None else self.fused_attention
        for block, enc in zip(self.blocks, self.encoder.for_layers(len(self.blocks))):
            if id(enc) not in plans:
                window = layer_window(self.attention_window, enc.layer_window, enc.layer_chunked)  # its own, or eval's
                # by default an encoder that opts out trains on the blocked path (evaluation stays fused)
                default_ok = enc.fused_training or not torch.is_grad_enabled()
                use_fused = fused and (default_ok or self.fused_attention is True)
                plans[id(enc)] = AttentionPlan(enc, pos, self.shape.attn_block_size, use_fused, window)
            x = block(x, plans[id(enc)])
        return self.lm_head(self.ln_f(x))  # (B, L, vocab)

    def token_losses(self, idx: Tensor, targets: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        """Cross-entropy in nats of each target token, ``(B, L)``, accumulated in fp32."""
        logits = self(idx, pos)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
