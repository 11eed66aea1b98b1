"""Training-time position tricks that work with any encoding.

Keys of the ``train`` group, all off by default:

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

``train.positions=pose`` (Zhu et al. 2024, "PoSE: Efficient Context Window Extension of LLMs via
Positional Skip-wise Training", ICLR 2024, §3.2, and the authors' ``train_preprocess_function_pose`` in
dwzhu-pku/PoSE ``src/train_pose.py``)
    Training keeps its window of ``train_len`` tokens but reads it at positions that reach the target
    length ``train.pose_target_len`` (default: the longest evaluation length). The window is cut into two
    chunks, as the authors' code does (the paper allows ``N`` and uses 2): the first chunk's length is drawn
    uniformly from ``1 .. (train_len + 1) // 2``; its positions start at 0 (the code's revision: a skip bias
    of 0 for the first chunk "makes the coverage more uniform for large relative positions"); the second
    chunk's skip bias ``u`` is drawn uniformly from ``0 .. pose_target_len - train_len``, so its positions run
    ``len1 + u .. train_len - 1 + u`` and the last one is at most ``pose_target_len - 1``. Within each chunk
    positions are contiguous, and so is the text: the window is a contiguous slice of the corpus (the paper's
    ``v_i = 0``; the authors' code also skips text between the chunks, taken from documents up to five times
    the window). As for randomized positions, one draw per step is shared by the batch. Evaluation reads
    ordinary positions ``0 .. L - 1``: PoSE changes training only.

``train.curriculum=linear`` (sequence-length warmup; Li, Zhang & He 2022, "The
Stability-Efficiency Dilemma: Investigating Sequence Length Warmup for Training GPT
Models", NeurIPS 2022: the linear pacing function
``seqlen_t = seqlen_s + (seqlen_e - seqlen_s) * min(t / T, 1)``, truncated to a multiple of 8)
    The training length grows linearly from ``train.curriculum_start_len`` to ``train_len``
    over the first ``train.curriculum_steps`` steps, then stays at ``train_len``. The number
    of windows per batch stays ``train.batch_size``, so early steps see fewer tokens; the
    ``tokens`` column of ``metrics.csv`` counts the tokens actually trained on.

All are deterministic functions of ``(seed, step)``, so a resumed run takes the
same steps as an uninterrupted one.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from posexp.config.schema import Config, default_max_position, eval_lengths

POSITION_SCHEMES = ("contiguous", "randomized", "pose")
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


def pose_positions(length: int, target_len: int, rng: np.random.Generator) -> np.ndarray:
    """Positions ``(length,)`` of one PoSE window: two contiguous chunks, the second moved by a skip bias.

    Zhu et al. (2024), §3.2, with the authors' sampling (``src/train_pose.py``): the first chunk has
    ``len1 ~ U{1, ..., (length + 1) // 2}`` tokens at positions ``0 .. len1 - 1``; the second has the
    remaining ``length - len1`` tokens at ``len1 + u .. length - 1 + u`` with ``u ~ U{0, ..., target_len - length}``.
    So every position is below ``target_len`` and every relative distance up to ``target_len - 1`` can be drawn.
    """
    if not 0 < length <= target_len:
        raise ValueError(f"a PoSE window of {length} tokens needs a target length >= {length}, got {target_len}")
    first = int(rng.integers(1, (length + 1) // 2, endpoint=True))  # len1 ~ U{1..(L+1)//2}
    skip = int(rng.integers(0, target_len - length, endpoint=True))  # u ~ U{0..T-L}
    pos = np.arange(length, dtype=np.int64)
    pos[first:] += skip
    return pos


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
        self.target_len: Optional[int] = None
        if self.scheme == "pose":
            self.target_len = int(t.pose_target_len or max(eval_lengths(cfg)))
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
        if self.scheme == "contiguous":
            return None
        rng = np.random.default_rng([self.seed, step, _TRAIN_STREAM])
        if self.scheme == "pose":
            assert self.target_len is not None
            return torch.from_numpy(pose_positions(length, self.target_len, rng)).to(device)
        assert self.max_position is not None
        return torch.from_numpy(randomized_positions(length, self.max_position, rng)).to(device)

    def eval_positions(self, length: int) -> Optional[np.ndarray]:
        """Positions ``(length,)`` for every evaluation window of ``length``; None = contiguous."""
        if not self.randomized:
            return None
        rng = np.random.default_rng([self.seed, length, _EVAL_STREAM])
        return randomized_positions(length, self.max_position, rng)

    def eval_supports(self, length: int) -> bool:
        return not self.randomized or length <= self.max_position

    def eval_refusal(self, length: int) -> Optional[str]:
        """Why a window of ``length`` tokens cannot be read (more positions than the range trained), or None."""
        if self.eval_supports(length):
            return None
        return f"trained with randomized positions drawn from 0..{self.max_position - 1} (train.max_position)"

    def describe(self) -> Optional[dict]:
        """What ``results.json`` records under ``run.positions``; None when both tricks are off."""
        if self.scheme == "contiguous" and self.curriculum == "none":
            return None
        out: dict = {"scheme": self.scheme}
        if self.scheme == "pose":
            out.update(target_len=self.target_len, chunks=2, train_draw="one per step, shared by the batch",
                       eval="contiguous positions 0..L-1")
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
