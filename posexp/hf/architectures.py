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

from typing import Any, Optional

import torch

from posexp.config.schema import eval_lengths
from posexp.errors import PosexpError
from posexp.hf.exporters import EXPORTERS, Exporter, Mapping, zero_biases
from posexp.model.gpt import GPT

# MPT builds its ALiBi table for max_seq_len keys and reads no further; rope (NeoX) and ALiBi read any length, so the
# config says at least posexp's longest default evaluation, 16 x train_len
REACH_MULTIPLE = 16


def exporters() -> list[Exporter]:
    """One of each registered exporter (:data:`~posexp.hf.exporters.EXPORTERS`), by its transformers model_type."""
    return [cls() for cls in EXPORTERS.values()]


def exportable() -> tuple[str, ...]:
    """The encoders an exporter takes, in the registry's order."""
    return tuple(e.encoder for e in exporters())


EXPORTABLE = exportable()  # the built-in exporters' encoders: learned, rope, alibi


def refusal(encoder: str) -> str:
    """The one line for an encoding no exporter takes, naming each exporter's encoder and family."""
    each = ", ".join(f"{e.encoder} -> {e.target}" for e in exporters())
    return (f"encoder={encoder} cannot be exported to transformers: only {', '.join(exportable())} map onto a "
            f"transformers class exactly ({each})")


def plan(model: GPT, cfg: Any) -> Mapping:
    """The mapping of a run's model (``model``, built from ``cfg``) by the exporter that takes its encoder, or why
    there is none.

    Raises:
        PosexpError: an encoding no exporter takes, an option its exporter cannot hold exactly (its own
            refusal), or a run evaluated at randomized positions.
    """
    name = str(cfg.encoder["name"])
    exporter = next((e for e in exporters() if e.takes(model, name)), None)
    if exporter is None:
        raise PosexpError(refusal(name))
    _check_common(model, name)
    _check_positions(cfg)
    why = exporter.refusal(model)
    if why is not None:
        raise PosexpError(why)
    reach = max(REACH_MULTIPLE * int(cfg.train_len), max(eval_lengths(cfg)))
    return exporter.mapping(model, reach)


def _check_common(model: GPT, name: str) -> None:
    shape, enc = model.shape, model.encoder
    if getattr(shape, "ssmax", False):
        raise PosexpError(f"a run trained with model.ssmax=true cannot be exported: no transformers class scales "
                          f"attention logits by s log n; {', '.join(exportable())} runs without it export")
    if enc.layer_window is not None or any(e is not enc for e in enc.for_layers(shape.n_layers)):
        raise PosexpError(f"this {name} run attends within a window or mixes encodings per layer, which the "
                          "transformers classes cannot; a plain learned, rope or alibi run exports")


def _check_positions(cfg: Any) -> None:
    """A run trained with randomized positions (Ruoss et al. 2023) is evaluated at sorted positions drawn from its
    range (:mod:`posexp.model.positions`), while a transformers model reads ``0 .. L-1``: its logits would not be the
    run's. PoSE changes training only, so a PoSE run exports."""
    if cfg.train.positions == "randomized":
        raise PosexpError("a run trained with train.positions=randomized cannot be exported: its own evaluation reads "
                          "sorted random positions, a transformers model reads 0..L-1, so the logits would not be the "
                          "run's; runs trained with train.positions=contiguous or pose export")


def build(mapping: Mapping, model: GPT, dtype: Optional[torch.dtype] = None) -> Any:
    """The transformers model of ``mapping`` holding ``model``'s weights, in eval mode.

    Every parameter of the target starts as NaN, so one the mapping missed cannot pass for a weight.
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_config(mapping.config, dtype=dtype or model.wte.weight.dtype)
    with torch.no_grad():
        for p in hf.parameters():
            p.fill_(float("nan"))
        zero_biases(hf)
        mapping.fill(model, hf)
    missed = [name for name, p in hf.named_parameters() if torch.isnan(p).any()]
    if missed:
        raise PosexpError(f"internal: the export left {', '.join(missed[:3])} unset")
    return hf.eval()


__all__ = ["EXPORTABLE", "Mapping", "build", "exportable", "exporters", "plan", "refusal"]
