"""Training-time position tricks that work with any encoding.

Two keys of the ``train`` group, both off by default:

``train.positions=randomized`` (Ruoss et al. 2023, "Randomized Positional Encodings
Boost Length Generalization of Transformers", §3)
    Each training step draws ``train_len`` distinct positions uniformly from
    ``0 .. train.max_position - 1`` and sorts them, instead of using ``0 .. train_len - 1``:
    the model sees every position up to ``max_position`` (and gaps of every size)
    during training, so the positions of a longer test sequence are not out of
    distribution. As in the paper, evaluation uses the same procedure: a window of
    ``L <= max_position`` tokens gets ``L`` sorted positions drawn from the same range
    (``L > max_position`` is "not applicable"). Two simplifications, both documented in
    the results: one draw per training step is shared by the whole batch (the encoder
    contract takes one position vector per forward), and one draw per evaluation length,
    seeded by ``seed`` and the length, is shared by all windows of that length, so the
    numbers do not depend on how the windows are batched.

``train.curriculum=linear`` (sequence-length warmup; Li, Zhang & He 2022, "The
Stability-Efficiency Dilemma: Investigating Sequence Length Warmup for Training GPT
Models", NeurIPS 2022: the linear pacing function
``seqlen_t = seqlen_s + (seqlen_e - seqlen_s) * min(t / T, 1)``, truncated to a multiple of 8)
    The training length grows linearly from ``train.curriculum_start_len`` to ``train_len``
    over the first ``train.curriculum_steps`` steps, then stays at ``train_len``. The number
    of windows per batch stays ``train.batch_size``, so early steps see fewer tokens; the
    ``tokens`` column of ``metrics.csv`` counts the tokens actually trained on.

Both are deterministic functions of ``(seed, step)``, so a resumed run takes the
same steps as an uninterrupted one.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from posexp.config.schema import Config, default_max_position, eval_lengths

POSITION_SCHEMES = ("contiguous", "randomized")
CURRICULA = ("none", "linear")
CURRICULUM_MULTIPLE = 8  # Li et al. 2022 keep the length a multiple of 8
_TRAIN_STREAM, _EVAL_STREAM = 1, 2  # keep the position draws apart from the batch sampler's streams


def randomized_positions(length: int, max_position: int, rng: np.random.Generator) -> np.ndarray:
    """``length`` distinct positions drawn uniformly from ``0 .. max_position - 1``, sorted.

    Ruoss et al. (2023), §3: the positions of a sequence of length ``N`` are an ordered
    random subset of ``{0, ..., L - 1}`` with ``L`` well above the longest test length.
    """
    if not 0 < length <= max_position:
        raise ValueError(f"cannot draw {length} distinct positions from 0..{max_position - 1}")
    return np.sort(rng.choice(max_position, size=length, replace=False))


def curriculum_length(step: int, train_len: int, start_len: int, warmup_steps: int) -> int:
    """The training length at ``step`` under linear sequence-length warmup (Li et al. 2022).

    ``start_len + (train_len - start_len) * min(step / warmup_steps, 1)``, truncated to a
    multiple of 8 but never below ``start_len`` nor above ``train_len``; ``train_len``
    from step ``warmup_steps`` on.
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return train_len
    grown = start_len + (train_len - start_len) * step / warmup_steps
    truncated = int(grown) // CURRICULUM_MULTIPLE * CURRICULUM_MULTIPLE
    return min(train_len, max(start_len, truncated))


class PositionPlan:
    """The positions and lengths of a run's training steps and evaluation windows.

    Args:
        cfg: the run's typed config (``train.positions``, ``train.max_position``,
            ``train.curriculum``, ``train.curriculum_start_len``, ``train.curriculum_steps``,
            ``train_len``, ``seed``).
    """

    def __init__(self, cfg: Config):
        t = cfg.train
        self.seed = int(cfg.seed)
        self.train_len = int(cfg.train_len)
        self.scheme = t.positions
        self.max_position: Optional[int] = None
        if self.scheme == "randomized":
            self.max_position = int(t.max_position
                                    or default_max_position(self.train_len, max(eval_lengths(cfg))))
        self.curriculum = t.curriculum
        self.start_len = int(t.curriculum_start_len or default_start_len(self.train_len))
        steps = t.curriculum_steps
        self.warmup_steps = int(steps if steps is not None else int(t.steps) // 2)

    @property
    def randomized(self) -> bool:
        return self.scheme == "randomized"

    def length_at(self, step: int) -> int:
        """The sequence length trained on at ``step``."""
        if self.curriculum == "linear":
            return curriculum_length(step, self.train_len, self.start_len, self.warmup_steps)
        return self.train_len

    def train_positions(self, step: int, length: int, device: torch.device) -> Optional[torch.Tensor]:
        """Positions ``(length,)`` for training step ``step``; None = the model's own ``0 .. length - 1``."""
        if not self.randomized:
            return None
        rng = np.random.default_rng([self.seed, step, _TRAIN_STREAM])
        return torch.from_numpy(randomized_positions(length, self.max_position, rng)).to(device)

    def eval_positions(self, length: int) -> Optional[np.ndarray]:
        """Positions ``(length,)`` for every evaluation window of ``length``; None = contiguous."""
        if not self.randomized:
            return None
        rng = np.random.default_rng([self.seed, length, _EVAL_STREAM])
        return randomized_positions(length, self.max_position, rng)

    def eval_supports(self, length: int) -> bool:
        return not self.randomized or length <= self.max_position

    def describe(self) -> Optional[dict]:
        """What ``results.json`` records under ``run.positions``; None when both tricks are off."""
        if not self.randomized and self.curriculum == "none":
            return None
        out: dict = {"scheme": self.scheme}
        if self.randomized:
            out.update(max_position=self.max_position, train_draw="one per step, shared by the batch",
                       eval_draw="one per length, seeded by (seed, length)")
        out["curriculum"] = self.curriculum
        if self.curriculum != "none":
            out.update(start_len=self.start_len, curriculum_steps=self.warmup_steps)
        return out


def default_start_len(train_len: int) -> int:
    """``train_len / 8``, at least 8 tokens (and never above ``train_len``)."""
    return min(train_len, max(CURRICULUM_MULTIPLE, train_len // 8))
