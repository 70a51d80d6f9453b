"""Weights & Biases: attached to ``wandb.run``, the user's run in this process.

``wandb.init`` is called only where no run exists (``stallscope report --to wandb`` in a process of its own: a
new run, or ``WANDB_RUN_ID``'s resumed), and that run alone is finished at close. Points are logged without
``step=`` (W&B drops a step lower than its own current one) on the ``stall/step`` axis:
``define_metric("stall/*", step_metric="stall/step")``. Summary figures and words go to the run's summary; the
HTML report is an artifact.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.trackers.analysis import STEP, Point


class WandbTracker:
    name = "wandb"

    def __init__(self, run_name: str | None = None) -> None:
        import wandb

        run: Any = wandb.run
        self._owned = run is None
        if run is None:
            run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "stallscope"),
                name=run_name,
                id=os.environ.get("WANDB_RUN_ID"),
                resume="allow" if os.environ.get("WANDB_RUN_ID") else None,
            )
        self._run: Any = run
        run.define_metric(STEP)
        run.define_metric("stall/*", step_metric=STEP)

    def log(self, points: Sequence[Point]) -> None:
        by_step: dict[int, dict[str, float]] = {}
        for p in points:
            by_step.setdefault(p.step, {})[p.name] = p.value
        for step in sorted(by_step):
            self._run.log({STEP: step, **by_step[step]})

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        self._run.summary.update(dict(figures))

    def log_text(self, name: str, text: str) -> None:
        self._run.summary[name] = text

    def log_artifact(self, path: Path) -> None:
        import wandb

        art = wandb.Artifact(f"stallscope-report-{self._run.id}", type="stallscope-report")
        art.add_file(str(path))
        self._run.log_artifact(art)

    def close(self) -> None:
        if self._owned:
            self._run.finish()
