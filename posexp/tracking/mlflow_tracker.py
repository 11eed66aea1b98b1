"""MLflow: one MLflow run per posexp run, through ``MlflowClient`` (no global active run, so the jobs of a
sweep that Hydra runs in one process never write into each other's runs).

Params: the resolved config as dotted keys (and config.yaml as an artifact); metrics ``train/loss``,
``train/lr``, ``train/tokens_per_s`` per training step; each evaluation series with step = the length in
tokens, and each of its points also as ``<series>_L<length>`` for the runs table; artifacts: results.json,
.csv, .md and the figures. A sweep's jobs are children of one parent run named after the sweep folder.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Optional

from posexp.errors import PosexpError
from posexp.tracking.tracker import (TRACKERS, Point, check_reachable, RunIdentity, Tracker, flat_config, point_key, read_records, write_records)

STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
PARAM_CHARS = 6000  # MLflow's limit of one param value
PARENT_WAIT_S = 60.0


def _client(tracking_uri: Optional[str]):
    """A client of ``tracking_uri`` (None: MLflow's own choice: $MLFLOW_TRACKING_URI, else its local default).

    Raises:
        PosexpError: the store cannot be opened, in MLflow's words.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or mlflow.get_tracking_uri()
    check_reachable(uri, "logger.mlflow.tracking_uri")
    if uri.startswith("sqlite:") and importlib.util.find_spec("sqlalchemy") is None:
        # MLflow 3's default store; mlflow-skinny (the tracking client alone) cannot open it
        raise PosexpError(f"logger.mlflow.tracking_uri: the store {uri} (MLflow's default) needs the full MLflow "
                          "package: pip install mlflow (or posexp's extra '.[mlflow]'); or set "
                          "logger.mlflow.tracking_uri=http://HOST:PORT of a running MLflow server")
    try:
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # opens the store now, not at the first metric
    except Exception as e:  # MLflow raises many kinds; each is the user's store setting
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PosexpError(f"logger.mlflow.tracking_uri: MLflow cannot use the tracking store {uri}: {first}") \
            from None
    return client, uri


def _experiment_id(client, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # another sweep job created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _parent_run(client, uri: str, experiment_id: str, run: RunIdentity) -> Optional[str]:
    """The sweep's parent run: made by the first of its jobs to get here, found by the others in the sweep
    folder's trackers.json (jobs may run in parallel processes: an exclusively created lock file elects one)."""
    if run.sweep_dir is None:
        return None
    lock = run.sweep_dir / ".trackers.lock"
    deadline = time.monotonic() + PARENT_WAIT_S
    while True:
        known = read_records(run.sweep_dir).get("mlflow", {})
        if known.get("tracking_uri") == uri and known.get("experiment_id") == experiment_id:
            return known["parent_run_id"]
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if time.monotonic() > deadline:
                raise PosexpError(f"{lock}: another job of the sweep holds it; remove it if no job is running")
            time.sleep(0.2)
            continue
        try:
            parent = client.create_run(experiment_id, run_name=run.group, tags={"posexp.sweep": run.group or ""})
            client.set_terminated(parent.info.run_id, "FINISHED")  # a folder for its children, which it outlives
            records = read_records(run.sweep_dir)
            records["mlflow"] = {"tracking_uri": uri, "experiment_id": experiment_id,
                                 "parent_run_id": parent.info.run_id}
            write_records(run.sweep_dir, records)
            return parent.info.run_id
        finally:
            os.close(fd)
            lock.unlink(missing_ok=True)


@TRACKERS.register("mlflow")
class MLflowTracker(Tracker):
    needs_module = "mlflow"

    def __init__(self, client, uri: str, experiment_id: str, run_id: str):
        self.client, self.uri, self.experiment_id, self.run_id = client, uri, experiment_id, run_id

    @classmethod
    def start(cls, run: RunIdentity, tracking_uri: Optional[str] = None,  # type: ignore[override]
              experiment: str = "posexp") -> "MLflowTracker":
        """Args: tracking_uri: null = $MLFLOW_TRACKING_URI, else MLflow's own local default. experiment: its name."""
        client, uri = _client(tracking_uri)
        experiment_id = _experiment_id(client, experiment)
        tags = {"posexp.run_dir": str(run.run_dir.resolve()), "mlflow.source.name": "posexp train"}
        parent = _parent_run(client, uri, experiment_id, run)
        if parent is not None:
            tags.update({"mlflow.parentRunId": parent, "posexp.sweep": run.group or ""})
        created = client.create_run(experiment_id, run_name=run.name, tags=tags)
        tracker = cls(client, uri, experiment_id, created.info.run_id)
        tracker.log_config(run.config)
        return tracker

    @classmethod
    def reopen(cls, record: dict, run: RunIdentity) -> "MLflowTracker":
        client, uri = _client(record["tracking_uri"])
        tracker = cls(client, uri, record["experiment_id"], record["run_id"])
        if run.resume_step is not None:
            client.update_run(tracker.run_id, status="RUNNING")
        return tracker

    def log_config(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:PARAM_CHARS]) for k, v in flat_config(config).items()]
        for i in range(0, len(params), PARAM_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + PARAM_BATCH])
        self.client.log_dict(self.run_id, config, "config.yaml")

    def log_train(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(f"train/{k}", float(v), now, step)
                                                    for k, v in values.items()])

    def log_curve(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def log_eval(self, points: list[Point], rows: list[dict]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(p.name, p.value, now, p.length) for p in points]
        metrics += [Metric(point_key(p), p.value, now, 0) for p in points]
        for i in range(0, len(metrics), 1000):  # MLflow's limit of metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_artifacts(self, files: list[Path]) -> None:
        for f in files:
            self.client.log_artifact(self.run_id, str(f))

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, STATUS.get(status, "FINISHED"))

    def record(self) -> dict:
        return {"tracking_uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id}

    def where(self) -> str:
        return f"mlflow: run {self.run_id} in {self.uri} (mlflow ui --backend-store-uri {self.uri})"
