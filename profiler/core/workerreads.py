"""When the training process asks for a reading of its loader workers' memory, besides the memory source's schedule.

The memory source reads smaps as often as half a percent of a core allows: about every 4.6 s for the training
process and two workers (profiler/core/sources/memory.py). A run shorter than that had one reading per process,
taken when the workers appeared, and a worker's growth (copy-on-read of a data set held as Python objects) was
never seen (issue #56: 150 steps in 2.8 s, ``uss_start_mb == uss_end_mb``). So during the first epoch of a loader
with workers and a length, the training process asks for a reading at five points: the first measured step, a
quarter, half and three quarters through the epoch, and its end less :data:`READ_AHEAD_S` (placed at three quarters
from the mean step so far), while the workers still live: a loader without ``persistent_workers`` ends them when its
iterator is exhausted. Growth needs four readings in the window (profiler/analysis/memory.py); the fifth is the one
to spare where an ask meets a reading already under way and the two become one, or the last comes after the workers
ended (with four asks the CI, beside the suite, named no growth; with five, beside two busy processes here, one
worker's last reading came after it ended, and four were left). The asks are checked at
the Session's hand-overs (every 64 steps or 0.1 s), never per step; the reading itself is the sampler process's (its
next round). Later epochs keep the schedule alone: the five extra readings (~23 ms of CPU each, in the sampler
process) would exceed the budget on an epoch shorter than ~23 s.

A reading walks each worker's page tables holding that worker's memory-map lock, in the sampler process, which runs
niced: preempted mid-walk on a busy host it holds a worker that is mapping its next batch. With more workers than
cores the loader keeps the cores busy by itself, and there the asks stalled it: a model-bound run of 8 workers on 2
cores beside two busy processes read 5.6-8% loader stall against its twin's 0 in 4 of 17 runs with the asks, 1 of
20 without (tests/test_sim_device.py's twin test, 2026-11-28). So a loader with more workers than cores gets no
asks: its run keeps the schedule. Only the workers are read when asked, never the training process (its walk would
hold the training thread's mappings the same way).
"""

from __future__ import annotations

import math
import os

# the last reading is asked this long before the epoch's end: the ask waits for the Session's hand-over (0.1 s),
# the sampler process's drain (0.1 s) and its next round (0.1 s at 10 Hz), and the reading takes tens of ms
READ_AHEAD_S = 0.5


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


MIN_STEPS = 8  # a shorter epoch gets no extra reading


class WorkerReads:
    """The steps of the first epoch with workers at which to ask for a memory reading (see the module)."""

    __slots__ = ("_end", "_marks", "_planned", "_t0", "_warmup")

    def __init__(self, warmup: int) -> None:
        self._warmup = warmup
        self._planned = False
        self._marks: list[int] = []
        self._end = (0, 0)  # (the epoch's first step, its length): where its last reading goes
        self._t0 = math.nan

    def begin(self, loader: object, index: int, t: float) -> None:
        """A ``wrap()`` of ``loader`` starts at step ``index`` at ``t``: the first with workers and a length plans
        the readings; any later one, nothing."""
        workers = getattr(loader, "num_workers", 0)
        if self._planned or not isinstance(workers, int) or workers <= 0:
            return
        if workers > _cores():  # more workers than cores: see the module (an asked reading stalled the loader)
            self._planned = True
            return
        try:
            n = len(loader)  # type: ignore[arg-type]
        except TypeError:  # no length (an IterableDataset's loader): the schedule alone
            return
        self._planned = True
        if n < MIN_STEPS:
            return
        first = max(index, self._warmup)
        self._marks = sorted({first, index + n // 4, index + n // 2, index + 3 * n // 4})
        self._end, self._t0 = (index, n), t

    def due(self, index: int, t: float) -> bool:
        """Whether to ask for a reading now, at step ``index`` (time ``t``): a mark passed since the last ask."""
        marks = self._marks
        if not marks or index < marks[0]:
            return False
        while marks and index >= marks[0]:
            marks.pop(0)
        start, n = self._end
        if not marks and n:  # three quarters in: the last one, READ_AHEAD_S before the end at the mean step so far
            step_s = (t - self._t0) / max(1, index - start)
            ahead = math.ceil(READ_AHEAD_S / step_s) if step_s > 0 else 1
            marks.append(max(index + 1, start + n - 1 - ahead))
            self._end = (start, 0)
        return True
