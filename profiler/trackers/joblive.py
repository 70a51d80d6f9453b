"""Live logging of a multi-rank job: ``stallscope run SCENARIO --nproc N --log-to TARGET`` (docs/integrations.md,
"Experiment trackers").

One logger, in the launching process (:func:`follow_job`), beside the job's live view: it tails the node's rank
stores (``rank-R/run.sqlite``, read-only, as ``watch`` does), folds them (:class:`~profiler.trackers.analysis.
JobFold`: a LiveFold per rank, aligned on the steps every rank has passed) and every ``every_s`` hands each
tracker one call holding each rank's point under ``stall/rankR/`` and the slowest rank's under ``stall/``.

Invariants:
- The ranks log nothing themselves: one writer per TensorBoard event file, MLflow run or W&B run, never one per
  rank racing on it.
- At the close (the launcher has returned: every rank's store is closed) it hands the steps left, then the job's
  figures, verdict and HTML report as ``report JOB --to`` writes them: the same functions
  (:func:`~profiler.trackers.export.read_export`, :func:`~profiler.trackers.export.write_figures`) on the same
  stores, so the same numbers.
- A tracker that fails or blocks costs the job nothing (:class:`~profiler.trackers.deliver.Delivery`); the close
  waits for the trackers at most ``close_wait_s``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from profiler.core.background import in_background
from profiler.live.feeds import StoreFeed
from profiler.trackers.analysis import JobFold, Point
from profiler.trackers.base import Target
from profiler.trackers.deliver import Delivery
from profiler.trackers.export import KEEP_ARTIFACTS, Export, read_export, write_figures
from profiler.trackers.live import EVERY_S, POLL_S, deliveries, log_points, mlflow_run

log = logging.getLogger("stallscope")

CLOSE_WAIT_S = 10.0  # the job's figures and HTML report follow its last points; the training has ended by then
_RANK_DIR = re.compile(r"rank-(\d+)")


class RankStores:
    """The node's rank stores as they appear, each tailed into one :class:`JobFold` (under a lock: the logger's
    thread and the close both fold)."""

    def __init__(self, job_dir: Path, ranks: int) -> None:
        self.job_dir = job_dir
        self.fold = JobFold(ranks)
        self._feeds: dict[int, StoreFeed] = {}
        self._lock = threading.Lock()

    def _discover(self) -> None:
        for db in self.job_dir.glob("rank-*/run.sqlite"):
            m = _RANK_DIR.fullmatch(db.parent.name)
            if m and int(m[1]) not in self._feeds:
                with contextlib.suppress(Exception):  # not initialised yet: found again at the next tick
                    self._feeds[int(m[1])] = StoreFeed(db.parent)

    def tick(self) -> None:
        with self._lock:
            self._discover()
            for rank, feed in sorted(self._feeds.items()):
                try:
                    steps, samples = feed.poll()
                    windows = feed.windows()
                except Exception:  # noqa: BLE001 - a store locked or mid-write: its rows come at the next tick
                    continue
                self.fold.add(rank, steps, samples, windows, feed.meta())

    def take(self, *, final: bool = False) -> list[Point]:
        with self._lock:
            return self.fold.take(final=final)


@contextlib.contextmanager
def follow_job(
    job_dir: str | Path,
    targets: Sequence[Target],
    *,
    ranks: int,
    every_s: float = EVERY_S,
    poll_s: float = POLL_S,
    close_wait_s: float = CLOSE_WAIT_S,
) -> Iterator[JobFold]:
    """Log the job in ``job_dir`` (``ranks`` ranks on this node) to ``targets`` while the block runs (see the
    module docstring); the block is the launcher's run."""
    job_dir = Path(job_dir)
    targets = [mlflow_run(t) for t in targets]
    sends = deliveries(targets, job_dir.name)
    stores = RankStores(job_dir, ranks)
    poll_s = min(poll_s, every_s)

    def send(points: list[Point]) -> None:
        if points:
            for d in sends:
                d.submit(functools.partial(log_points, points=points))

    def loop(done: threading.Event) -> None:
        last = time.monotonic()
        while not done.wait(poll_s):
            stores.tick()
            if time.monotonic() - last >= every_s:
                last = time.monotonic()
                send(stores.take())

    try:
        with in_background(loop, name="stallscope-trackers-job", join_s=poll_s + 1.0):
            yield stores.fold
    finally:
        stores.tick()
        send(stores.take(final=True))
        close_with_figures(job_dir, list(zip(targets, sends, strict=True)), close_wait_s)


def close_with_figures(job_dir: Path, sends: Sequence[tuple[Target, Delivery]], wait_s: float) -> None:
    """The job's figures, words and HTML report (where the tracker keeps files) to each tracker, as ``report JOB
    --to`` writes them; then each tracker closed, all within ``wait_s`` of the job's records being read."""
    with tempfile.TemporaryDirectory(prefix="stallscope-joblog-") as tmp:
        export = _read(job_dir)
        html = _html(export, Path(tmp)) if export and any(t.kind in KEEP_ARTIFACTS for t, _ in sends) else None
        deadline = time.monotonic() + wait_s
        for t, d in sends:
            if export is not None:
                keeps = html if t.kind in KEEP_ARTIFACTS else None
                d.submit(functools.partial(write_figures, export=export, html=keeps))
        for _, d in sends:
            d.close(max(0.1, deadline - time.monotonic()))


def _read(job_dir: Path) -> Export | None:
    try:
        return read_export(job_dir)
    except Exception as exc:  # noqa: BLE001 - the points are logged; the figures' loss is said, the job is not failed
        log.warning(
            "stallscope: trackers: the job's figures could not be read from %s: %s: %s",
            job_dir,
            type(exc).__name__,
            exc,
        )
        return None


def _html(export: Export, tmp: Path) -> Path | None:
    try:
        return export.write_html(tmp / "stallscope-report.html")
    except Exception as exc:  # noqa: BLE001 - as above: the figures still go, without the page
        log.warning("stallscope: trackers: the job's HTML report could not be written: %s: %s", type(exc).__name__, exc)
        return None
