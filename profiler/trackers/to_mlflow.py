"""MLflow: metrics and artifacts written with an ``MlflowClient`` to one run, named by its id.

The run is the user's active run where one is (its id is taken in the process that has it and passed here), or
``MLFLOW_RUN_ID``'s; only where neither is, one is made through the client (in ``MLFLOW_EXPERIMENT_ID``'s or
``MLFLOW_EXPERIMENT_NAME``'s experiment, else the default) and ended at close. Never the fluent API: a fluent
call with no active run starts a new one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.trackers.analysis import Point

BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics


def active_run() -> tuple[str | None, str | None]:
    """(the tracking URI, the active run's id) of this process's MLflow, where the mlflow package is here and a
    run is active; else the tracking URI alone (or None without mlflow)."""
    try:
        import mlflow
    except ImportError:
        return None, None
    run = mlflow.active_run()
    return mlflow.get_tracking_uri(), run.info.run_id if run is not None else os.environ.get("MLFLOW_RUN_ID")


class MlflowTracker:
    name = "mlflow"

    def __init__(self, tracking_uri: str | None, run_id: str | None, run_name: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self._client: Any = MlflowClient(tracking_uri=tracking_uri)
        run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
        self._owned = run_id is None
        if run_id is None:
            run = self._client.create_run(self._experiment(), run_name=run_name)
            run_id = run.info.run_id
        self.run_id: str = run_id

    def _experiment(self) -> str:
        if (eid := os.environ.get("MLFLOW_EXPERIMENT_ID")) is not None:
            return eid
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if name is None:
            return "0"  # the store's default experiment
        found = self._client.get_experiment_by_name(name)
        return str(found.experiment_id) if found is not None else str(self._client.create_experiment(name))

    def _metrics(self, items: Sequence[tuple[str, int, float]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, step, value in items]
        for i in range(0, len(metrics), BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + BATCH], synchronous=True)

    def log(self, points: Sequence[Point]) -> None:
        self._metrics([(p.name, p.step, p.value) for p in points])

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        self._metrics([(name, step, value) for name, value in figures.items()])

    def log_text(self, name: str, text: str) -> None:
        self._client.log_text(self.run_id, text, f"stallscope/{name.replace('/', '_')}.md")

    def log_artifact(self, path: Path) -> None:
        self._client.log_artifact(self.run_id, str(path), "stallscope")

    def close(self) -> None:
        if self._owned:
            self._client.set_terminated(self.run_id)
