"""A loader stuck because shared memory ran out: found while the training waits, ended instead of waiting forever.

When /dev/shm is full, the allocation that fails may be in a worker's main thread (torch sends the error on and
``next()`` raises it: the run fails naming the worker) or in the thread that feeds the worker's queue: there
multiprocessing prints the traceback and drops the batch, and the training process waits for that batch forever
(torch's DataLoader has no timeout by default). A fresh-clone CI run met the second: ``stallscope run`` on a 12 MiB
segment hung until the test's 120 s timeout, where eight runs before and after it failed in 8-21 s.

:class:`ShmWatch` checks about once a second while the training loop is inside ``next()``. When the wait has gone on
for ``stuck_s`` with less than one batch of the segment free at every check since, it records what it saw and
kills the loader's worker processes; torch then raises "worker killed" in the training process, and the runner
fails the run naming shared memory (profiler.drivers.runner). A wait that ends, or a check that finds room for a
batch, starts the count again: a slow loader with room in the segment is never stopped.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import shutil
import threading
from collections.abc import Callable

from profiler.core.sources.memory import SHM

STUCK_S = 15.0  # a wait this long with the segment full at every check is a stuck loader
EVERY_S = 1.0

Segment = Callable[[], "tuple[float, float] | None"]  # (free MiB, size MiB), or None where it cannot be read


def segment_mb() -> tuple[float, float] | None:
    """The shared-memory segment's free and total MiB now (None where it cannot be read)."""
    try:
        seg = shutil.disk_usage(SHM)
    except OSError:
        return None
    return seg.free / 2**20, seg.total / 2**20


def kill_workers() -> None:
    """Kill this process's multiprocessing children (a DataLoader's workers): torch's SIGCHLD handler then raises
    in the training process, which was waiting for them."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):
            child.kill()


class ShmWatch:
    """Watches one run's loader for a wait that shared memory explains (see the module's docstring).

    ``waiting_since`` gives when the ``next()`` in progress began (None outside one), on ``clock``; ``batch_mb``
    a batch's MiB (None while unknown: then nothing is judged)."""

    def __init__(
        self,
        waiting_since: Callable[[], float | None],
        clock: Callable[[], float],
        batch_mb: Callable[[], float | None],
        *,
        segment: Segment = segment_mb,
        stop: Callable[[], None] = kill_workers,
        stuck_s: float = STUCK_S,
        every_s: float = EVERY_S,
    ) -> None:
        self.waiting_since, self.clock, self.batch_mb = waiting_since, clock, batch_mb
        self.segment, self.stop, self.stuck_s, self.every_s = segment, stop, stuck_s, every_s
        self.finding: str | None = None  # what it saw when it stopped the workers
        self._wait: float | None = None  # the wait being judged (its start)
        self._full_since: float | None = None  # the first check of that wait from which the segment stayed full
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> bool:
        """One look; True once the loader was found stuck (the workers are then stopped, once)."""
        if self.finding is not None:
            return True
        started = self.waiting_since()
        if started != self._wait:
            self._wait, self._full_since = started, None
        need, seg = (self.batch_mb(), self.segment()) if started is not None else (None, None)
        if started is None or need is None or seg is None or seg[0] >= need:
            self._full_since = None
            return False
        now = self.clock()
        if self._full_since is None:
            self._full_since = now
        if now - self._full_since < self.stuck_s:
            return False
        free, size = seg
        self.finding = (
            f"no batch came for {now - started:.0f} s while shared memory was full ({free:.1f} MiB free of "
            f"{size:.0f}, a batch needs {need:.1f}): a worker could not send its batch (the queue's thread prints "
            "'unable to allocate shared memory' and drops it), and torch's DataLoader would have waited for it "
            "forever, so stallscope stopped the workers"
        )
        self.stop()
        return True

    def start(self) -> ShmWatch:
        self._thread = threading.Thread(target=self._run, name="stallscope-shm-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            if self.check():
                return

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
