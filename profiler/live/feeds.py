"""Live data feeds: the newest steps and samples of a run, from the Session in this process or from a run
store another process is writing. Both hand the same shapes to ``analysis.live.LiveAggregator``. A job's feed
(:class:`JobFeed`) hands each rank's steps and the node sampler's readings to ``analysis.joblive``.

Feeds only move data; they compute nothing. ``poll()`` may return rows already returned before (the
aggregator takes each step and sample once), never blocks on the training thread, and never raises for a
store that is briefly locked by its writer (it returns nothing new instead).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from profiler.core.rows import KernelWindow
from profiler.core.store import DB_NAME, PhaseRow, StepRow, StoreBusy, StoreError, StoreTail, run_status

if TYPE_CHECKING:
    from profiler.core.hooks import SessionView

Steps = list[tuple[StepRow, Sequence[PhaseRow]]]
Samples = list[tuple[float, dict[str, float]]]


class LiveFeed(Protocol):
    def poll(self) -> tuple[Steps, Samples]: ...

    def status(self) -> str: ...

    def meta(self) -> Mapping[str, object]: ...


Monitor = Callable[["LiveFeed"], AbstractContextManager[object]]
"""A live view over a feed (``render.live.monitor_for``): entered while a run records, exited when it ends."""


class SessionFeed:
    """Reads the Session's bounded buffers (copied whole under the GIL: no lock on the training thread)."""

    def __init__(self, session: SessionView) -> None:
        self._s = session
        self._recent = session.recent  # asked for now: the Session makes rows in this process from here on

    def poll(self) -> tuple[Steps, Samples]:
        sampler = self._s.sampler
        steps: Steps = list(self._recent)
        return steps, list(sampler.buffer) if sampler is not None else []

    def status(self) -> str:
        return self._s.status or "running"

    def meta(self) -> Mapping[str, object]:
        return self._s.meta


class StoreFeed:
    """Tails ``RUN_DIR/run.sqlite`` while another process writes it."""

    def __init__(self, run_dir: str | Path) -> None:
        self._tail = StoreTail(run_dir)
        self._meta: dict[str, object] = {}

    def poll(self) -> tuple[Steps, Samples]:
        try:
            meta, steps, samples = self._tail.poll()
        except StoreBusy:  # locked for a moment: try again next poll (the first read must succeed)
            if not self._meta:
                raise
            return [], []
        self._meta = meta
        return list(steps), samples

    def windows(self) -> list[KernelWindow]:
        """Kernel windows stored since the last call."""
        try:
            return self._tail.new_windows()
        except StoreError:  # locked or mid-write: the next poll reads them
            return []

    def status(self) -> str:
        return run_status(self._meta) if self._meta else "running"

    def meta(self) -> dict[str, object]:
        return self._meta


JOB_FILE = "job.json"
_RANK_DIR = re.compile(r"rank-(\d+)")


class JobFeed:
    """Tails a job directory while its launcher runs (docs/multi-rank.md has the layout): every ``rank-R`` store
    as it appears, the node sampler's store ``node-K`` and the launcher's ``job.json``. Read-only, through the
    same incremental reader as ``watch`` (:class:`~profiler.core.store.StoreTail`); a store not created yet, or
    locked for a moment by its writer, is tried again at the next poll."""

    def __init__(self, job_dir: str | Path) -> None:
        self.job_dir = Path(job_dir)
        self._tails: dict[int, StoreTail] = {}
        self._metas: dict[int, dict[str, object]] = {}
        self._node: StoreTail | None = None
        self._node_meta: dict[str, object] = {}
        self._job: dict[str, object] = {}

    def _read_job(self) -> None:
        try:  # job.json is replaced atomically: a read sees the old record or the new one
            doc = json.loads((self.job_dir / JOB_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(doc, dict):
            self._job = doc

    def _discover(self) -> None:
        for db in self.job_dir.glob(f"rank-*/{DB_NAME}"):
            m = _RANK_DIR.fullmatch(db.parent.name)
            if m and int(m[1]) not in self._tails:
                try:
                    self._tails[int(m[1])] = StoreTail(db.parent)
                except StoreError:
                    continue
        if self._node is None:
            want = self._job.get("node_rank")
            names = [f"node-{want}"] if isinstance(want, int) else sorted(p.name for p in self.job_dir.glob("node-*"))
            for name in names:
                if (self.job_dir / name / DB_NAME).exists():
                    self._node = StoreTail(self.job_dir / name)
                    break

    def poll(self) -> tuple[dict[int, Steps], Samples]:
        """Each rank's steps newer than the last poll, and the node sampler's newer readings."""
        self._read_job()
        self._discover()
        steps: dict[int, Steps] = {}
        for rank, tail in sorted(self._tails.items()):
            try:
                meta, rows, _samples = tail.poll()
            except (sqlite3.OperationalError, StoreError):  # locked for a moment, or not yet initialised
                continue
            self._metas[rank] = meta
            steps[rank] = list(rows)
        samples: Samples = []
        if self._node is not None:
            try:
                self._node_meta, _steps, samples = self._node.poll()
            except (sqlite3.OperationalError, StoreError):
                samples = []
        return steps, samples

    def rank_meta(self) -> dict[int, dict[str, object]]:
        return dict(self._metas)

    def rank_status(self, rank: int) -> str:
        meta = self._metas.get(rank)
        return run_status(meta) if meta else "starting"

    def status(self) -> str:
        """job.json's status; a job still "running" whose launcher is gone (its node store's writer has exited
        or its heartbeat is stale) was interrupted."""
        self._read_job()
        if not self._job:  # a job directory without the launcher's record: the ranks' own statuses
            ranks = [run_status(m) for m in self._metas.values()]
            if not ranks or "running" in ranks:
                return "running"
            return next((s for s in ("failed", "interrupted") if s in ranks), "complete")
        status = str(self._job.get("status", "running"))
        if status == "running" and self._node_meta and run_status(self._node_meta) != "running":
            return "interrupted"
        return status

    def meta(self) -> dict[str, object]:
        """job.json's record; once a rank has recorded its meta, the scenario's name, pipeline, batch size and
        workers and the device (kind, simulated options) as that rank recorded them."""
        out = dict(self._job)
        out["device_label"] = self._job.get("device")
        first = next((m for _, m in sorted(self._metas.items()) if isinstance(m.get("device"), dict)), None)
        if first is not None:  # what a rank recorded: the scenario's name and defaults, the resolved device
            out.update(
                {k: first[k] for k in ("scenario", "pipeline", "batch_size", "workers") if first.get(k) is not None}
            )
            out["device"] = first["device"]
        return out
