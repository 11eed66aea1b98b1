"""The model seam: what evaluation needs of a causal language model, whichever model it is.

Evaluation (the perplexity protocols, loss by position, window baselines and sinks, the context-extension
scalings, the accuracy tasks) reads a model only through :class:`EvaluableLM`: tokens in, logits or per-token
losses out at given positions; which scalings it offers and how long a sequence it reads; how it reads one
evaluated length (:class:`Reading`: its positions scaled, attending within a window); and how it saves memory
when a length runs out of it. posexp's own :class:`~posexp.model.gpt.GPT` is one implementation
(:mod:`posexp.model.seam`); a Hugging Face transformers causal LM is another (:mod:`posexp.hf.model`).
Evaluation never asks which one it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ContextManager, Optional, Protocol, runtime_checkable

from torch import Tensor

from posexp.model.window import AttentionWindow

NO_SCALING = "none"


@dataclass(frozen=True)
class Reading:
    """How a model reads the windows of one evaluated length.

    Attributes:
        scaling: the context-extension method (``eval.scaling``; :mod:`posexp.encoders.scaling`), ``none`` as trained.
        factor: its factor ``s`` (ReRoPE: its window ``w``; dynamic NTK: the factor ``a`` of its formula).
        train_len: the length the model was trained at (for a pretrained model, its original context length),
            from which the scalings stretch.
        length: the length of the windows read (dynamic NTK computes its base for it).
        longrope_factors: LongRoPE's per-frequency rescale factors ``lambda_i`` (``eval.longrope_factors``).
        longrope_start: LongRoPE's ``n^``: the first positions keep the trained rotation (``eval.longrope_start``).
        window: every layer attends within this window (``eval.window`` / ``eval.sinks``); None = the whole past.
        remap: a position remapping with all its options (``self_extend``, ``string``, ``dca``, ``ms_poe``;
            :class:`posexp.encoders.remapping.Remapping`), None otherwise.
        options: what a row of this reading records as ``scaling_options``, the method's settings beside its factor:
            a remapping's other options (``Remapping.text``), LongRoPE's factors and ``n^``
            (:func:`posexp.runs.longrope.options_text`); None when the factor is all there is.
    """

    scaling: str = NO_SCALING
    factor: float = 1.0
    train_len: int = 0
    length: int = 0
    longrope_factors: Optional[tuple[float, ...]] = None
    window: Optional[AttentionWindow] = None
    longrope_start: int = 0  # after window: Reading(...) built positionally keeps its meaning
    remap: Optional[Any] = None
    options: Optional[str] = None


@runtime_checkable
class EvaluableLM(Protocol):
    """A causal LM as evaluation sees it.

    ``label`` names it in rows and messages (an encoding's label, a pretrained model's name).
    ``max_length`` is the longest sequence it reads as it is, None when no table or limit bounds it.
    """

    @property
    def label(self) -> str: ...

    @property
    def max_length(self) -> Optional[int]: ...

    def eval(self) -> object: ...

    def check_scaling(self, kind: str) -> Optional[str]:
        """None when the model offers ``kind`` (``none`` always); else why it does not apply to this model, so that
        its rows are "not applicable".

        Raises:
            ConfigError: ``kind`` cannot be asked of this model at all (unknown, or refused as a user error).
        """
        ...

    def reading(self, how: Reading) -> ContextManager[None]:
        """Within the block, :meth:`logits` and :meth:`token_losses` read as ``how`` says (positions scaled,
        attending within the window); on leaving it the model reads as it did, memory settings included."""
        ...

    def length_refusal(self, how: Reading, length: int) -> Optional[str]:
        """Why the model, read as ``how`` says, cannot read ``length`` tokens (more positions than it has), or None."""
        ...

    def logits(self, idx: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        """Logits ``(B, L, vocab)`` of tokens ``idx (B, L)`` at positions ``pos (L,)`` (None: ``0 .. L-1``)."""
        ...

    def token_losses(self, idx: Tensor, targets: Tensor, pos: Optional[Tensor] = None) -> Tensor:
        """Cross-entropy in nats of each target, ``(B, L)``, in fp32; an implementation may chunk the vocabulary
        projection so that a long sequence never holds all its logits at once."""
        ...

    def shrink(self) -> Optional[str]:
        """After an out-of-memory error: use less memory per forward pass (until the current reading ends) and say
        how, e.g. "query blocks of 64"; None when nothing is left to shrink."""
        ...

    def memory_settings(self) -> dict:
        """What a row records of how its forward passes ran (e.g. ``attn_block_size``)."""
        ...


__all__ = ["EvaluableLM", "NO_SCALING", "Reading"]
