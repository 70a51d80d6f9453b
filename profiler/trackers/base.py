"""What every tracker adapter is (:class:`Tracker`), the targets users name (``tensorboard:DIR``, ``mlflow[:URI]``,
``wandb``), and the one-line errors: a bad target (:class:`TargetError`, a ValueError) and a tracker that cannot
be used (:class:`TrackerError`: its package missing, naming the extra to install, or its open failed).

Each adapter imports its library when opened, never at import: a missing package costs only the command that
asks for it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from profiler.trackers.analysis import Point

KINDS = ("tensorboard", "mlflow", "wandb")
ALLOWED = "allowed tensorboard:DIR, mlflow, mlflow:TRACKING_URI or wandb"
# the package each tracker needs, and the extra that installs it
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


class TargetError(ValueError):
    """A target that names no tracker: one line naming it and what is allowed."""


class TrackerError(Exception):
    """A tracker that cannot be used (its package missing: the extra to install; its open failed): one line."""


class Tracker(Protocol):
    """One experiment tracker. Every call may block or raise: callers on a training process call it from a thread
    of their own (:class:`profiler.trackers.deliver.Delivery`)."""

    name: str

    def log(self, points: Sequence[Point]) -> None:
        """Step-series points, on the tracker's step axis (``stall/step``)."""

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        """The run's figures (``stall/run/...``), once, at the run's last step."""

    def log_text(self, name: str, text: str) -> None:
        """Words (the verdict and recommendations) where the tracker keeps text."""

    def log_artifact(self, path: Path) -> None:
        """A file (the HTML report) where the tracker keeps artifacts; nothing where it keeps none."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed target: ``kind`` and its argument (the TensorBoard log directory, the MLflow tracking URI) and,
    for MLflow, the run to write to (resolved where the user's run is active)."""

    kind: str
    arg: str | None = None
    run_id: str | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "arg": self.arg, "run_id": self.run_id}


def parse_target(text: str) -> Target:
    """``tensorboard:DIR`` | ``mlflow`` | ``mlflow:URI`` | ``wandb`` -> Target; TargetError otherwise."""
    kind, sep, arg = text.strip().partition(":")
    if kind not in KINDS:
        raise TargetError(f"'{text}': not a tracker: {ALLOWED}")
    if kind == "tensorboard" and not arg:
        raise TargetError(f"'{text}': tensorboard needs its log directory (tensorboard:DIR): {ALLOWED}")
    if kind == "wandb" and sep:
        raise TargetError(f"'{text}': wandb takes no argument (its project comes from WANDB_PROJECT): {ALLOWED}")
    return Target(kind, arg or None)


def parse_targets(texts: str | Sequence[str] | None) -> list[Target]:
    """One target, a comma-separated list, or a list of them (none: empty)."""
    if texts is None:
        return []
    items = texts.split(",") if isinstance(texts, str) else [t for x in texts for t in x.split(",")]
    return [parse_target(t) for t in items if t.strip()]


def extra_line(kind: str) -> str:
    return f"{kind} needs the {PACKAGES[kind]} package: pip install 'stallscope[{kind}]'"


def check_installed(target: Target) -> None:
    """TrackerError naming the extra to install when the target's package is missing (found, not imported)."""
    if importlib.util.find_spec(PACKAGES[target.kind]) is None:
        raise TrackerError(extra_line(target.kind))


def open_tracker(target: Target, *, run_name: str | None = None) -> Tracker:
    """The adapter for ``target``, opened (TrackerError: its package missing; the library's own error when its
    open fails: an unwritable directory, an unreachable server)."""
    check_installed(target)
    if target.kind == "tensorboard":
        from profiler.trackers.to_tensorboard import TensorBoardTracker

        return TensorBoardTracker(target.arg or ".")
    if target.kind == "mlflow":
        from profiler.trackers.to_mlflow import MlflowTracker

        return MlflowTracker(target.arg, target.run_id, run_name)
    from profiler.trackers.to_wandb import WandbTracker

    return WandbTracker(run_name)
