"""Weights & Biases: one W&B run per posexp run, its files in ``RUN_DIR/wandb``; a sweep's jobs share a
group named after the sweep folder.

Offline unless the user set it up otherwise (``logger.wandb.mode``, ``$WANDB_MODE``, or an API key from
``wandb login`` / ``$WANDB_API_KEY``): nothing is sent that the user did not ask for, and ``wandb sync``
uploads an offline run later.

The config is the run's W&B config; ``train/loss``, ``train/lr``, ``train/tokens_per_s`` are logged at
the training step; each evaluation point takes the next W&B step, with ``eval/length`` as the x axis of
every ``eval/*`` series, its value also in the summary as ``<series>_L<length>``, all rows in a table;
the results and figures are an artifact, the figures also images.
"""

from __future__ import annotations

import contextlib
import netrc
import os
from pathlib import Path
from typing import Any, Iterator, List, Optional
from urllib.parse import urlparse

from posexp.errors import ConfigError
from posexp.runs.row import ROW_KEY
from posexp.tracking.tracker import TRACKERS, Point, RunIdentity, Tracker, check_reachable, point_key

MODES = ("online", "offline", "disabled")
ROW_COLUMNS = (*ROW_KEY, "value")  # the W&B table of results rows: their key, then the value


def api_key_configured() -> bool:
    """Whether W&B could log in without asking: ``$WANDB_API_KEY``, or a ``wandb login`` entry in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(configured) -> str:
    """``logger.wandb.mode`` if set, else ``$WANDB_MODE``, else online only where an API key is configured.

    Raises:
        ConfigError: a mode W&B does not have.
    """
    mode = configured or os.environ.get("WANDB_MODE") or ("online" if api_key_configured() else "offline")
    mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)  # W&B's older names
    if mode not in MODES:
        key = "logger.wandb.mode" if configured else "WANDB_MODE"
        raise ConfigError(key, f"unknown W&B mode {mode!r}; choose one of: {', '.join(MODES)}")
    return mode


@contextlib.contextmanager
def _writable_homes(run_dir: Path) -> Iterator[None]:
    """W&B keeps its core's logs, its cache, artifact staging files and settings under the home folder; where that
    cannot be written (a read-only HOME) its core printed a score of raw log lines on the run's terminal and the
    evaluation's artifacts failed. Then those folders are the run's ``wandb/home/`` (W&B's own WANDB_CACHE_DIR,
    WANDB_DATA_DIR and WANDB_CONFIG_DIR, unless the user set them; XDG_CACHE_HOME while its core starts)."""
    from posexp.runs.atomic import unwritable

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    if unwritable(cache) is None:
        yield
        return
    home = run_dir / "wandb" / "home"
    for key in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        os.environ.setdefault(key, str(home / key.split("_")[1].lower()))  # the run's later artifacts too
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home / "xdg-cache")
    try:
        yield
    finally:
        if before is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = before


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    needs_module = "wandb"

    def __init__(self, run, step: int = 0):
        self.run = run
        self.step = step  # the last W&B step used: evaluation points are logged after it

    @classmethod
    def _init(cls, run: RunIdentity, **kwargs):
        import wandb

        if os.environ.get("WANDB_MODE") == "":  # unset, as resolve_mode read it (W&B itself rejects "")
            del os.environ["WANDB_MODE"]
        if kwargs.get("mode") == "online":
            check_reachable(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai", "logger.wandb.mode")
        # console="off": the run's own progress bar and messages stay as they are
        settings = wandb.Settings(console="off", silent=True)
        with _writable_homes(Path(run.run_dir)):
            wb = wandb.init(dir=str(run.run_dir), settings=settings, reinit="create_new", **kwargs)
        wb.define_metric("eval/length")
        wb.define_metric("eval/*", step_metric="eval/length")
        return wb

    @classmethod
    def start(cls, run: RunIdentity, project: str = "posexp", entity: Optional[str] = None,  # type: ignore[override]
              mode: Optional[str] = None, tags: List[str] = []) -> "WandbTracker":  # noqa: B006 - never changed
        """Args: mode: online | offline | disabled; null = $WANDB_MODE, else online only where an API key is
        configured."""
        wb = cls._init(run, project=project, entity=entity, group=run.group, name=run.name, tags=list(tags),
                       config=run.config, mode=resolve_mode(mode))
        return cls(wb)

    @classmethod
    def check(cls, mode: Optional[str] = None, **options: Any) -> None:
        resolve_mode(mode)

    @classmethod
    def reopen(cls, record: dict, run: RunIdentity) -> "WandbTracker":
        wb = cls._init(run, project=record["project"], entity=record.get("entity"), id=record["id"],
                       resume="allow", mode=resolve_mode(record.get("mode")))
        return cls(wb, step=int(record.get("step", 0)))

    def log_train(self, step: int, values: dict[str, float]) -> None:
        self.step = max(self.step, step)
        self.run.log({f"train/{k}": v for k, v in values.items()}, step=step)

    def log_curve(self, step: int, values: dict[str, float]) -> None:
        self.step = max(self.step, step)
        self.run.log(dict(values), step=step)

    def log_eval(self, points: list[Point], rows: list[dict]) -> None:
        import wandb

        for p in points:
            self.step += 1
            self.run.log({"eval/length": p.length, p.name: p.value}, step=self.step)
            self.run.summary[point_key(p)] = p.value
        table = wandb.Table(columns=list(ROW_COLUMNS))
        for r in rows:
            metric = r.get("metric") or "ppl"
            table.add_data(metric, *(r.get(c) for c in ROW_COLUMNS[1:-1]), r.get(metric, r.get("value")))
        self.step += 1
        self.run.log({"eval/rows": table}, step=self.step)

    def log_artifacts(self, files: list[Path]) -> None:
        """The files as one W&B artifact (a new version each time a command reports), the figures also as images."""
        import wandb

        results = wandb.Artifact(f"results-{self.run.id}", type="results")
        for f in files:
            results.add_file(str(f), name=f.name)
        self.run.log_artifact(results)
        images = {f"figures/{f.stem}": wandb.Image(str(f)) for f in files if f.suffix == ".png"}
        if images:
            self.step += 1
            self.run.log(images, step=self.step)

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)

    def record(self) -> dict:
        return {"id": self.run.id, "project": self.run.project, "entity": self.run.entity or None,
                "mode": "offline" if self.run.offline else None, "dir": str(Path(self.run.dir).parent.resolve()),
                "step": self.step}

    def where(self) -> str:
        if self.run.offline:
            folder = Path(self.run.dir).parent
            return f"wandb: offline run {self.run.id} in {folder} (upload it with: wandb sync {folder})"
        return f"wandb: {self.run.url or self.run.id}"
