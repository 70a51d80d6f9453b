"""Live data feeds: the newest steps and samples of a run, from the Session in this process or from a run
store another process is writing. Both hand the same shapes to ``analysis.live.LiveAggregator``.

Feeds only move data; they compute nothing. ``poll()`` may return rows already returned before (the
aggregator takes each step and sample once), never blocks on the training thread, and never raises for a
store that is briefly locked by its writer (it returns nothing new instead).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from profiler.session import Session
from profiler.store import PhaseRow, StepRow, StoreTail, run_status

Steps = list[tuple[StepRow, Sequence[PhaseRow]]]
Samples = list[tuple[float, dict[str, float]]]


class LiveFeed(Protocol):
    def poll(self) -> tuple[Steps, Samples]: ...

    def status(self) -> str: ...

    def meta(self) -> dict[str, Any]: ...


Monitor = Callable[["LiveFeed"], AbstractContextManager[Any]]
"""A live view over a feed (``render.live.monitor_for``): entered while a run records, exited when it ends."""


class SessionFeed:
    """Reads the Session's bounded buffers (copied whole under the GIL: no lock on the training thread)."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def poll(self) -> tuple[Steps, Samples]:
        sampler = self._s.sampler
        steps: Steps = list(self._s.recent)
        return steps, list(sampler.buffer) if sampler is not None else []

    def status(self) -> str:
        return self._s.status or "running"

    def meta(self) -> dict[str, Any]:
        return self._s.meta


class StoreFeed:
    """Tails ``RUN_DIR/run.sqlite`` while another process writes it."""

    def __init__(self, run_dir: str | Path) -> None:
        self._tail = StoreTail(run_dir)
        self._meta: dict[str, Any] = {}

    def poll(self) -> tuple[Steps, Samples]:
        try:
            meta, steps, samples = self._tail.poll()
        except sqlite3.OperationalError:  # "database is locked" for a moment: try again next poll
            return [], []
        self._meta = meta
        return list(steps), samples

    def status(self) -> str:
        return run_status(self._meta) if self._meta else "running"

    def meta(self) -> dict[str, Any]:
        return self._meta
