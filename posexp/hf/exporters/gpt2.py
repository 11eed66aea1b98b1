"""learned -> ``GPT2LMHeadModel``: ``activation_function="gelu"`` (erf; GPT-2's own ``gelu_new`` is the tanh
approximation), the linear biases GPT-2 has set to zero, Conv1D weights transposed, ``n_positions`` = the trained
table's rows (:mod:`posexp.hf.architectures` says why each mapping is exact)."""

from __future__ import annotations

from typing import Any

from posexp.hf.exporters import EXPORTERS, Exporter, Mapping, common_config, hidden, norm, put
from posexp.model.gpt import GPT


@EXPORTERS.register("gpt2")
class GPT2(Exporter):
    encoder = "learned"
    target = "GPT-2"

    def mapping(self, model: GPT, reach: int) -> Mapping:
        from transformers import GPT2Config

        shape, rows = model.shape, int(getattr(model.encoder, "wpe").weight.shape[0])  # the table's rows
        config = GPT2Config(n_embd=shape.d_model, n_layer=shape.n_layers, n_head=shape.n_heads, n_inner=hidden(model),
                            n_positions=rows, activation_function="gelu", layer_norm_epsilon=model.ln_f.eps,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, scale_attn_weights=True,
                            scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
                            **common_config(model))
        return Mapping("GPT2LMHeadModel", f"learned positions -> GPT-2 (n_positions={rows}, exact)", config, _fill,
                       rows)


def _fill(model: Any, hf: Any) -> None:
    t = hf.transformer
    put(t.wte.weight, model.wte.weight)
    put(t.wpe.weight, model.encoder.wpe.weight)
    for block, h in zip(model.blocks, t.h):
        for ours, theirs in ((block.ln1, h.ln_1), (block.ln2, h.ln_2)):
            put(theirs.weight, norm(ours)[0])
            put(theirs.bias, norm(ours)[1])
        # Conv1D keeps weights as (in, out), nn.Linear as (out, in); c_attn's columns are [q | k | v] as posexp's rows
        put(h.attn.c_attn.weight, block.attn.qkv.weight.T)
        put(h.attn.c_proj.weight, block.attn.proj.weight.T)
        put(h.mlp.c_fc.weight, block.mlp.fc.weight.T)
        put(h.mlp.c_proj.weight, block.mlp.proj.weight.T)
    put(t.ln_f.weight, norm(model.ln_f)[0])
    put(t.ln_f.bias, norm(model.ln_f)[1])
    put(hf.lm_head.weight, model.lm_head.weight)
