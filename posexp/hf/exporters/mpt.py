"""alibi -> ``MptForCausalLM``: MPT's norms have no bias (transformers sets them to None), so only a run trained with
``model.norm_bias=false`` maps; its MLP is always ``4 x d_model`` wide (``mlp_ratio`` 4); its slopes are ALiBi's, the
reference code's rule for head counts that are not a power of two included; it adds ``-m (L-1-j)`` to row ``i``
instead of ``-m (i-j)``, the same softmax (:mod:`posexp.hf.architectures`)."""

from __future__ import annotations

from typing import Any, Optional

from posexp.hf.exporters import EXPORTERS, Exporter, Mapping, common_config, hidden, put
from posexp.model.gpt import GPT


@EXPORTERS.register("mpt")
class MPT(Exporter):
    encoder = "alibi"
    target = "MPT"

    def refusal(self, model: GPT) -> Optional[str]:
        shape = model.shape
        if getattr(shape, "norm_bias", True):
            return ("an alibi run exports to MPT, whose LayerNorms have no bias, only when trained without "
                    "one: train it with model.norm_bias=false")
        if hidden(model) != 4 * shape.d_model:
            return (f"MPT's MLP is 4 x d_model wide; this alibi run has model.mlp_ratio={shape.mlp_ratio:g}: "
                    "train it with model.mlp_ratio=4")
        return None

    def mapping(self, model: GPT, reach: int) -> Mapping:
        from transformers import MptConfig

        shape = model.shape
        attn = {"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0, "clip_qkv": None, "softmax_scale": None,
                "qk_ln": False, "prefix_lm": False}
        config = MptConfig(d_model=shape.d_model, n_heads=shape.n_heads, n_layers=shape.n_layers, expansion_ratio=4,
                           max_seq_len=reach, layer_norm_epsilon=model.ln_f.eps, learned_pos_emb=False,
                           attn_config=attn, no_bias=True, resid_pdrop=0.0, emb_pdrop=0.0, logit_scale=None,
                           **common_config(model))
        return Mapping("MptForCausalLM", f"alibi -> MPT (max_seq_len={reach}, exact)", config, _fill, reach)


def _fill(model: Any, hf: Any) -> None:
    t = hf.transformer
    put(t.wte.weight, model.wte.weight)
    for block, b in zip(model.blocks, t.blocks):
        put(b.norm_1.weight, block.ln1.weight)
        put(b.norm_2.weight, block.ln2.weight)
        put(b.attn.Wqkv.weight, block.attn.qkv.weight)  # both [q | k | v], each split into heads alike
        put(b.attn.out_proj.weight, block.attn.proj.weight)
        put(b.ffn.up_proj.weight, block.mlp.fc.weight)
        put(b.ffn.down_proj.weight, block.mlp.proj.weight)
    put(t.norm_f.weight, model.ln_f.weight)
    put(hf.lm_head.weight, model.lm_head.weight)
