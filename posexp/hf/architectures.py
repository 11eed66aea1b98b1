"""posexp's model as a transformers class: which class each encoding maps onto, and the weights moved across.

posexp's block (:mod:`posexp.model.gpt`) is pre-norm: ``x + attn(LN(x))`` then ``x + mlp(LN(x))``, LayerNorms
with a bias (without one under ``model.norm_bias=false``), linear layers without bias, exact (erf) GELU, attention
scaled by ``1/sqrt(head_dim)``, a final LayerNorm and an output layer tied to the token embeddings unless
``model.tie_embeddings=false``. Three transformers classes compute the same function:

==========  ===================  ==================================================================================
encoding    class                what makes it exact
==========  ===================  ==================================================================================
learned     ``GPT2LMHeadModel``  ``activation_function="gelu"`` (erf; GPT-2's own ``gelu_new`` is the tanh
                                 approximation), the linear biases GPT-2 has set to zero, Conv1D weights
                                 transposed, ``n_positions`` = the trained table's rows.
rope        ``GPTNeoXForCausal   ``use_parallel_residual=False`` (posexp's sequential block), ``hidden_act="gelu"``,
            LM``                 no attention biases and zero MLP biases, ``partial_rotary_factor`` = the rotated
                                 share of a head, ``rope_theta`` = ``base``. Both rotate halves (``x_i`` with
                                 ``x_{i+d/2}``) of the first rotated features; NeoX's fused q/k/v rows are grouped
                                 per head, so posexp's ``[q | k | v]`` rows are regrouped.
alibi       ``MptForCausalLM``   MPT's norms have no bias (transformers sets them to None), so only a run trained with
                                 ``model.norm_bias=false`` maps; its MLP is always ``4 x d_model`` wide (``mlp_ratio``
                                 4); its slopes are ALiBi's, the reference code's rule for head counts that are not a
                                 power of two included; it adds ``-m (L-1-j)`` to row ``i`` instead of ``-m (i-j)``,
                                 the same softmax (the two differ by a constant per row).
==========  ===================  ==================================================================================

Why MPT for ALiBi: Falcon (``alibi=True``) multiplies the ALiBi term by ``1/sqrt(head_dim)`` with the logits and
computes it in bfloat16, so its slopes are not ALiBi's; Bloom normalises the embeddings with an extra LayerNorm and
uses the tanh approximation of GELU. Neither can hold posexp's model exactly.

Exact means the same function: the exported model's fp32 logits differ from posexp's only by float rounding (rope:
NeoX computes ``theta_i`` in float32 where posexp rounds the float64 value; alibi: MPT's per-row offset ``-m (L-1-i)``
grows with the length, and its rounding with it: about 2e-5 at 2048 tokens for the default model, 1e-6 at 128).
:func:`posexp.hf.export.export_loaded` measures that difference on every export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from posexp.config.schema import eval_lengths
from posexp.errors import PosexpError
from posexp.model.gpt import GPT

EXPORTABLE = ("learned", "rope", "alibi")
# MPT builds its ALiBi table for max_seq_len keys and reads no further; rope (NeoX) and ALiBi read any length, so the
# config says at least posexp's longest default evaluation, 16 x train_len
REACH_MULTIPLE = 16


@dataclass
class Mapping:
    """Which transformers class holds a run's model, and how its weights go across.

    Attributes:
        architecture: the transformers class, as config.json's ``architectures`` names it.
        description: one line for posexp_export.json and the command's output.
        config: the transformers config (a ``PretrainedConfig``).
        fill: copies posexp's weights into a model built from ``config``.
        max_length: the longest sequence the target reads (its config's ``n_positions``, ``max_seq_len`` or
            ``max_position_embeddings``), the tokenizer's ``model_max_length`` too.
    """

    architecture: str
    description: str
    config: Any
    fill: Callable[[Any, Any], None]
    max_length: int


def refusal(encoder: str) -> str:
    """The one line for an encoding that does not export."""
    return (f"encoder={encoder} cannot be exported to transformers: only {', '.join(EXPORTABLE)} map onto a "
            "transformers class exactly (learned -> GPT-2, rope -> GPT-NeoX, alibi -> MPT)")


def plan(model: GPT, cfg: Any) -> Mapping:
    """The mapping of a run's model (``model``, built from ``cfg``), or why there is none.

    Raises:
        PosexpError: an encoding or an option with no exact counterpart in the target class.
    """
    from posexp.encoders.alibi import ALiBi
    from posexp.encoders.learned import Learned
    from posexp.encoders.rope import RoPE

    name = str(cfg.encoder["name"])
    enc = model.encoder
    builders = {(Learned, "learned"): _gpt2, (RoPE, "rope"): _neox, (ALiBi, "alibi"): _mpt}
    build = builders.get((type(enc), name))
    if build is None:
        raise PosexpError(refusal(name))
    _check_common(model, name)
    reach = max(REACH_MULTIPLE * int(cfg.train_len), max(eval_lengths(cfg)))
    return build(model, reach)


def _check_common(model: GPT, name: str) -> None:
    shape, enc = model.shape, model.encoder
    if getattr(shape, "ssmax", False):
        raise PosexpError(f"a run trained with model.ssmax=true cannot be exported: no transformers class scales "
                          f"attention logits by s log n; {', '.join(EXPORTABLE)} runs without it export")
    if enc.layer_window is not None or any(e is not enc for e in enc.for_layers(shape.n_layers)):
        raise PosexpError(f"this {name} run attends within a window or mixes encodings per layer, which the "
                          "transformers classes cannot; a plain learned, rope or alibi run exports")


def _hidden(model: GPT) -> int:
    """The MLP's width, ``int(mlp_ratio * d_model)``."""
    return int(model.shape.mlp_ratio * model.shape.d_model)


def _norm(ln: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    """A LayerNorm's weight and bias (zeros for a norm trained without one)."""
    bias = ln.bias if ln.bias is not None else torch.zeros_like(ln.weight)
    return ln.weight, bias


def _set(param: Tensor, value: Tensor) -> None:
    if param.shape != value.shape:
        raise PosexpError(f"internal: a weight of shape {tuple(value.shape)} met a parameter of shape "
                          f"{tuple(param.shape)}")
    param.copy_(value)


def _zero_biases(target: nn.Module) -> None:
    """posexp's linear layers have no bias: any the target class has is zero."""
    for module in target.modules():
        bias = getattr(module, "bias", None)
        if not isinstance(module, nn.LayerNorm) and isinstance(bias, nn.Parameter):
            nn.init.zeros_(bias)


def _common_config(model: GPT) -> dict:
    """Keys every target takes alike: no dropout, the tying of the output layer, the document separator as EOS
    (set by the caller), no BOS or padding."""
    return {"vocab_size": model.shape.vocab_size, "tie_word_embeddings": bool(model.shape.tie_embeddings),
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


# -- learned -> GPT-2 -------------------------------------------------------------------------------------------------

def _gpt2(model: GPT, reach: int) -> Mapping:
    from transformers import GPT2Config

    shape, rows = model.shape, int(getattr(model.encoder, "wpe").weight.shape[0])  # the table's rows
    config = GPT2Config(n_embd=shape.d_model, n_layer=shape.n_layers, n_head=shape.n_heads, n_inner=_hidden(model),
                        n_positions=rows, activation_function="gelu", layer_norm_epsilon=model.ln_f.eps,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=True,
                        scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
                        **_common_config(model))
    return Mapping("GPT2LMHeadModel", f"learned positions -> GPT-2 (n_positions={rows}, exact)", config, _fill_gpt2,
                   rows)


def _fill_gpt2(model: Any, hf: Any) -> None:
    t = hf.transformer
    _set(t.wte.weight, model.wte.weight)
    _set(t.wpe.weight, model.encoder.wpe.weight)
    for block, h in zip(model.blocks, t.h):
        for ours, theirs in ((block.ln1, h.ln_1), (block.ln2, h.ln_2)):
            _set(theirs.weight, _norm(ours)[0])
            _set(theirs.bias, _norm(ours)[1])
        # Conv1D keeps weights as (in, out), nn.Linear as (out, in); c_attn's columns are [q | k | v] as posexp's rows
        _set(h.attn.c_attn.weight, block.attn.qkv.weight.T)
        _set(h.attn.c_proj.weight, block.attn.proj.weight.T)
        _set(h.mlp.c_fc.weight, block.mlp.fc.weight.T)
        _set(h.mlp.c_proj.weight, block.mlp.proj.weight.T)
    _set(t.ln_f.weight, _norm(model.ln_f)[0])
    _set(t.ln_f.bias, _norm(model.ln_f)[1])
    _set(hf.lm_head.weight, model.lm_head.weight)


# -- rope -> GPT-NeoX -------------------------------------------------------------------------------------------------

def _neox(model: GPT, reach: int) -> Mapping:
    from transformers import GPTNeoXConfig

    enc: Any = model.encoder
    if enc.scaling is not None or enc.freq_schedule != "exponential":
        raise PosexpError("only a rope run with the exponential frequency schedule theta_i = base^(-2i/d) and no "
                          "fine-tuning scaling exports (GPT-NeoX's rotary); this run has "
                          f"freq_schedule={enc.freq_schedule}" + (f", scaling={enc.scaling[0]}" if enc.scaling else ""))
    shape = model.shape
    fraction = enc.rot_dim / enc.head_dim
    if int(enc.head_dim * fraction) != enc.rot_dim:
        raise PosexpError(f"GPT-NeoX cannot rotate {enc.rot_dim} of {enc.head_dim} features per head exactly")
    rope = {"rope_type": "default", "rope_theta": float(enc.base), "partial_rotary_factor": fraction}
    config = GPTNeoXConfig(hidden_size=shape.d_model, num_hidden_layers=shape.n_layers,
                           num_attention_heads=shape.n_heads, intermediate_size=_hidden(model), hidden_act="gelu",
                           max_position_embeddings=reach, layer_norm_eps=model.ln_f.eps, use_parallel_residual=False,
                           attention_bias=False, attention_dropout=0.0, hidden_dropout=0.0, rope_parameters=rope,
                           **_common_config(model))
    return Mapping("GPTNeoXForCausalLM", f"rope -> GPT-NeoX (base {enc.base:g}, {enc.rot_dim}/{enc.head_dim} "
                                         "features rotated, exact)", config, _fill_neox, reach)


def _per_head_qkv(weight: Tensor, n_heads: int) -> Tensor:
    """posexp's fused rows ``[q_0..q_H | k_0..k_H | v_0..v_H]`` regrouped per head, as NeoX's
    ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``."""
    d_in = weight.shape[1]
    per = weight.view(3, n_heads, -1, d_in)  # (3, H, Dh, D)
    return per.transpose(0, 1).reshape(-1, d_in)  # (H * 3 * Dh, D)


def _fill_neox(model: Any, hf: Any) -> None:
    t = hf.gpt_neox
    _set(t.embed_in.weight, model.wte.weight)
    for block, layer in zip(model.blocks, t.layers):
        for ours, theirs in ((block.ln1, layer.input_layernorm), (block.ln2, layer.post_attention_layernorm)):
            _set(theirs.weight, _norm(ours)[0])
            _set(theirs.bias, _norm(ours)[1])
        _set(layer.attention.query_key_value.weight, _per_head_qkv(block.attn.qkv.weight, model.shape.n_heads))
        _set(layer.attention.dense.weight, block.attn.proj.weight)
        _set(layer.mlp.dense_h_to_4h.weight, block.mlp.fc.weight)
        _set(layer.mlp.dense_4h_to_h.weight, block.mlp.proj.weight)
    _set(t.final_layer_norm.weight, _norm(model.ln_f)[0])
    _set(t.final_layer_norm.bias, _norm(model.ln_f)[1])
    _set(hf.lm_head.weight, model.lm_head.weight)


# -- alibi -> MPT -----------------------------------------------------------------------------------------------------

def _mpt(model: GPT, reach: int) -> Mapping:
    from transformers import MptConfig

    shape = model.shape
    if getattr(shape, "norm_bias", True):
        raise PosexpError("an alibi run exports to MPT, whose LayerNorms have no bias, only when trained without "
                          "one: train it with model.norm_bias=false")
    if _hidden(model) != 4 * shape.d_model:
        raise PosexpError(f"MPT's MLP is 4 x d_model wide; this alibi run has model.mlp_ratio={shape.mlp_ratio:g}: "
                          "train it with model.mlp_ratio=4")
    attn = {"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0, "clip_qkv": None, "softmax_scale": None,
            "qk_ln": False, "prefix_lm": False}
    config = MptConfig(d_model=shape.d_model, n_heads=shape.n_heads, n_layers=shape.n_layers, expansion_ratio=4,
                       max_seq_len=reach, layer_norm_epsilon=model.ln_f.eps, learned_pos_emb=False,
                       attn_config=attn, no_bias=True, resid_pdrop=0.0, emb_pdrop=0.0, logit_scale=None,
                       **_common_config(model))
    return Mapping("MptForCausalLM", f"alibi -> MPT (max_seq_len={reach}, exact)", config, _fill_mpt, reach)


def _fill_mpt(model: Any, hf: Any) -> None:
    t = hf.transformer
    _set(t.wte.weight, model.wte.weight)
    for block, b in zip(model.blocks, t.blocks):
        _set(b.norm_1.weight, block.ln1.weight)
        _set(b.norm_2.weight, block.ln2.weight)
        _set(b.attn.Wqkv.weight, block.attn.qkv.weight)  # both [q | k | v], each split into heads alike
        _set(b.attn.out_proj.weight, block.attn.proj.weight)
        _set(b.ffn.up_proj.weight, block.mlp.fc.weight)
        _set(b.ffn.down_proj.weight, block.mlp.proj.weight)
    _set(t.norm_f.weight, model.ln_f.weight)
    _set(hf.lm_head.weight, model.lm_head.weight)


def build(mapping: Mapping, model: GPT, dtype: Optional[torch.dtype] = None) -> Any:
    """The transformers model of ``mapping`` holding ``model``'s weights, in eval mode.

    Every parameter of the target starts as NaN, so one the mapping missed cannot pass for a weight.
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_config(mapping.config, dtype=dtype or model.wte.weight.dtype)
    with torch.no_grad():
        for p in hf.parameters():
            p.fill_(float("nan"))
        _zero_biases(hf)
        mapping.fill(model, hf)
    missed = [name for name, p in hf.named_parameters() if torch.isnan(p).any()]
    if missed:
        raise PosexpError(f"internal: the export left {', '.join(missed[:3])} unset")
    return hf.eval()


__all__ = ["EXPORTABLE", "Mapping", "build", "plan", "refusal"]
