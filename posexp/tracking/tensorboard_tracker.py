"""TensorBoard: event files written with ``torch.utils.tensorboard`` (the ``tensorboard`` package behind it).

Scalars ``train/loss``, ``train/lr``, ``train/tokens_per_s`` against the training step; every evaluation
series (:func:`posexp.tracking.tracker.metric_name`) against the length in tokens; the config in the HParams
dashboard and as text; the run's figures as images and results.json as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from posexp.runs.layout import TENSORBOARD_DIR
from posexp.tracking.tracker import TRACKERS, Point, RunIdentity, Tracker, flat_config


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    needs_module = "tensorboard"

    def __init__(self, log_dir: Path, resume_step: Optional[int] = None, reports: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        # purge_step: TensorBoard hides what an earlier session logged from this step on. A resumed training logs
        # again the steps after its checkpoint; the checkpoint's own step (its loss, its curve point) and the config
        # at step 0 were logged before the checkpoint was written, and no session logs them again.
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)
        self.reports = reports  # the step of the figures and results.json: one per command that reported

    @classmethod
    def start(cls, run: RunIdentity, log_dir: Optional[str] = None) -> "TensorBoardTracker":  # type: ignore[override]
        """Args: log_dir: where the event files go; null = RUN_DIR/tensorboard (a sweep's jobs side by side)."""
        folder = Path(log_dir) if log_dir else run.run_dir / TENSORBOARD_DIR
        tracker = cls(folder, resume_step=run.resume_step)
        if run.resume_step is None:
            tracker.log_config(run.config)
        return tracker

    @classmethod
    def reopen(cls, record: dict, run: RunIdentity) -> "TensorBoardTracker":
        return cls(Path(record["log_dir"]), resume_step=run.resume_step, reports=int(record.get("reports", 0)))

    def log_config(self, config: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        import yaml

        for summary in hparams(flat_config(config), {"train/loss": None}):
            self.writer.file_writer.add_summary(summary)  # type: ignore[attr-defined]  # set in __init__
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "```yaml\n" + text + "```", 0)

    def log_train(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def log_curve(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def log_eval(self, points: list[Point], rows: list[dict]) -> None:
        for p in points:
            self.writer.add_scalar(p.name, p.value, p.length)
        self.writer.flush()

    def log_artifacts(self, files: list[Path]) -> None:
        from matplotlib.image import imread

        self.reports += 1  # train, then every posexp eval: each adds a version, TensorBoard's slider shows them
        for f in files:
            if f.suffix == ".png":
                image = imread(f)[..., :3]  # (H, W, RGB) floats in [0, 1]
                self.writer.add_image(f.stem, image, self.reports, dataformats="HWC")
            elif f.suffix == ".json":
                text = json.dumps(json.loads(f.read_text(encoding="utf-8")), indent=1)
                self.writer.add_text(f.name, "```json\n" + text + "\n```", self.reports)
        self.writer.flush()

    def finish(self, status: str) -> None:
        self.writer.close()

    def record(self) -> dict:
        return {"log_dir": str(self.log_dir.resolve()), "reports": self.reports}

    def where(self) -> str:
        return f"tensorboard: {self.log_dir} (tensorboard --logdir {self.log_dir})"
