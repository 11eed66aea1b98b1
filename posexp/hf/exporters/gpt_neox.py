"""rope -> ``GPTNeoXForCausalLM``: ``use_parallel_residual=False`` (posexp's sequential block), ``hidden_act="gelu"``,
no attention biases and zero MLP biases, ``partial_rotary_factor`` = the rotated share of a head, ``rope_theta`` =
``base``. Both rotate halves (``x_i`` with ``x_{i+d/2}``) of the first rotated features; NeoX's fused q/k/v rows are
grouped per head, so posexp's ``[q | k | v]`` rows are regrouped (:mod:`posexp.hf.architectures`)."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from posexp.hf.exporters import EXPORTERS, Exporter, Mapping, common_config, hidden, norm, put
from posexp.model.gpt import GPT


@EXPORTERS.register("gpt_neox")
class GPTNeoX(Exporter):
    encoder = "rope"
    target = "GPT-NeoX"

    def refusal(self, model: GPT) -> Optional[str]:
        enc: Any = model.encoder
        if enc.scaling is not None or enc.freq_schedule != "exponential":
            return ("only a rope run with the exponential frequency schedule theta_i = base^(-2i/d) and no "
                    "fine-tuning scaling exports (GPT-NeoX's rotary); this run has "
                    f"freq_schedule={enc.freq_schedule}" + (f", scaling={enc.scaling[0]}" if enc.scaling else ""))
        if int(enc.head_dim * (enc.rot_dim / enc.head_dim)) != enc.rot_dim:
            return f"GPT-NeoX cannot rotate {enc.rot_dim} of {enc.head_dim} features per head exactly"
        return None

    def mapping(self, model: GPT, reach: int) -> Mapping:
        from transformers import GPTNeoXConfig

        enc: Any = model.encoder
        shape = model.shape
        fraction = enc.rot_dim / enc.head_dim
        rope = {"rope_type": "default", "rope_theta": float(enc.base), "partial_rotary_factor": fraction}
        config = GPTNeoXConfig(hidden_size=shape.d_model, num_hidden_layers=shape.n_layers,
                               num_attention_heads=shape.n_heads, intermediate_size=hidden(model), hidden_act="gelu",
                               max_position_embeddings=reach, layer_norm_eps=model.ln_f.eps,
                               use_parallel_residual=False, attention_bias=False, attention_dropout=0.0,
                               hidden_dropout=0.0, rope_parameters=rope, **common_config(model))
        return Mapping("GPTNeoXForCausalLM", f"rope -> GPT-NeoX (base {enc.base:g}, {enc.rot_dim}/{enc.head_dim} "
                                             "features rotated, exact)", config, _fill, reach)


def _per_head_qkv(weight: Tensor, n_heads: int) -> Tensor:
    """posexp's fused rows ``[q_0..q_H | k_0..k_H | v_0..v_H]`` regrouped per head, as NeoX's
    ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``."""
    d_in = weight.shape[1]
    per = weight.view(3, n_heads, -1, d_in)  # (3, H, Dh, D)
    return per.transpose(0, 1).reshape(-1, d_in)  # (H * 3 * Dh, D)


def _fill(model: Any, hf: Any) -> None:
    t = hf.gpt_neox
    put(t.embed_in.weight, model.wte.weight)
    for block, layer in zip(model.blocks, t.layers):
        for ours, theirs in ((block.ln1, layer.input_layernorm), (block.ln2, layer.post_attention_layernorm)):
            put(theirs.weight, norm(ours)[0])
            put(theirs.bias, norm(ours)[1])
        put(layer.attention.query_key_value.weight, _per_head_qkv(block.attn.qkv.weight, model.shape.n_heads))
        put(layer.attention.dense.weight, block.attn.proj.weight)
        put(layer.mlp.dense_h_to_4h.weight, block.mlp.fc.weight)
        put(layer.mlp.dense_4h_to_h.weight, block.mlp.proj.weight)
    put(t.final_layer_norm.weight, norm(model.ln_f)[0])
    put(t.final_layer_norm.bias, norm(model.ln_f)[1])
    put(hf.lm_head.weight, model.lm_head.weight)
