"""When the training process asks for a reading of its loader workers' memory, besides the memory source's schedule.

The memory source reads smaps as often as half a percent of a core allows: a worker's reading (psutil
``memory_full_info``: a walk of its page tables in the kernel) costs 7-8 ms of CPU here, the training process's ~10
ms, so a round of the three comes every ~5 s (profiler/core/sources/memory.py). A run shorter than that had one
reading per process, and a worker's growth (copy-on-read of a data set held as Python objects) was never seen
(issue #56, and again issue #65: ``run SCENARIO --workers 2 --steps 150`` over 400,000 dicts, 150 steps of 64 in
2.2 s, ``readings: 1``). So in the first ``wrap()`` of a loader with workers the training process asks for
:data:`ASKS` readings of the workers alone: at the measured window's first step, then at gaps that double from
:data:`EARLY_GAP_S` (0.5, 1, 2 s: a long loop's schedule reads it after its first seconds) or, where the loop's end
is known, spaced evenly in time up to :data:`READ_AHEAD_S` before it, whichever comes first, the last at that point:
while the workers still live (a loader without ``persistent_workers`` ends them when its iterator is exhausted or
dropped). The loop's end is the nearer of the epoch's (``len(loader)``) and the run's
(:meth:`WorkerReads.run_length`: ``Session(steps=)``, which ``run --steps N`` gives); it is projected from the mean
step since the first ask, at each hand-over. The late reading was missing in #65: the asks were placed at a quarter,
half and three quarters of the epoch, and 150 steps of a 6,250-step epoch reached none of them. And a loop that
breaks out of its ``wrap()`` (a ``break``, an exception, ``close()``, as ``run`` does after its last step) drops the
loader's iterator, which stops its workers at once: there the training process reads them itself, once, before
letting go (:meth:`WorkerReads.at_end`: ~7.5 ms of its CPU a worker here, after the last step, 19-32 ms for two on
a loaded host), and the sampler process stores that reading under the workers' labels. A loader that keeps its
iterator (``persistent_workers``) keeps its workers past the break: there the break sends an ask instead, and the
training thread reads nothing. An exhausted epoch stops its workers inside the loader's last
``next()``, before any code of ours runs: there only the asks read them.

Growth needs four readings in the window (profiler/analysis/memory.py); the fifth is the one to spare where an ask
meets a reading already under way and the two become one. The asks are checked at the Session's hand-overs (every
64 steps or 0.1 s), never per step; the reading itself is the sampler process's (its next round). Later wraps keep
the schedule alone: five extra readings (~16 ms of CPU each for two workers, in the sampler process) an epoch would
exceed the budget on an epoch shorter than ~16 s.

A reading walks each worker's page tables holding that worker's memory-map lock, in the sampler process, which runs
niced: preempted mid-walk on a busy host it holds a worker that is mapping its next batch. With more workers than
cores the loader keeps the cores busy by itself, and there the asks stalled it: a model-bound run of 8 workers on 2
cores beside two busy processes read 5.6-8% loader stall against its twin's 0 in 4 of 17 runs with the asks, 1 of
20 without (tests/test_sim_device.py's twin test, 2026-11-28). So a loader with more workers than cores gets no
asks: its run keeps the schedule. Only the workers are read when asked, never the training process (its walk would
hold the training thread's mappings the same way).
"""

from __future__ import annotations

import contextlib
import math
import os

from profiler.core.sources.memory import Taken, take

ASKS = 5  # readings asked in the window: its first step, then four spaced evenly to READ_AHEAD_S before its end
# the last reading is asked this long before the loop's projected end: the ask waits for the Session's hand-over
# (0.1 s), the sampler process's drain (0.1 s) and its next round (0.1 s at 10 Hz), and the reading takes tens of ms
READ_AHEAD_S = 0.5
EARLY_GAP_S = 0.5  # the second ask at most this long after the first, each later gap at most twice the one before
MIN_STEPS = 8  # a shorter loop gets no extra reading
_UNKNOWN = 1 << 62  # the end of a loop whose length is not known


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WorkerReads:
    """When, in the first ``wrap()`` of a loader with workers, to ask for a reading of their memory (see the
    module): ``begin`` plans, ``due`` says at each hand-over."""

    __slots__ = ("_asked", "_end", "_end_read", "_first", "_i0", "_last_t", "_planned", "_run_end", "_t0", "_warmup")

    def __init__(self, warmup: int) -> None:
        self._warmup = warmup
        self._planned = False
        self._run_end: int | None = None  # the index after the run's last measured step, where known
        self._first = 0  # the step of the first ask
        self._end = 0  # the index after the loop's last step (0: no ask planned, or all made)
        self._asked = 0
        self._i0, self._t0 = 0, math.nan  # the step and time of the first ask
        self._last_t = math.nan  # the time of the latest ask
        self._end_read = False  # a loop that breaks out with its workers alive reads them (at_end), once

    def run_length(self, steps: int) -> None:
        """The run takes ``steps`` measured steps after its warm-up (``Session(steps=)``): its loop ends there."""
        self._run_end = self._warmup + steps

    def begin(self, loader: object, index: int, t: float) -> None:
        """A ``wrap()`` of ``loader`` starts at step ``index`` at ``t``: the first with workers plans the asks; any
        later one, nothing."""
        workers = getattr(loader, "num_workers", 0)
        if self._planned or not isinstance(workers, int) or workers <= 0:
            return
        self._planned = True
        if workers > _cores():  # more workers than cores: see the module (an asked reading stalled the loader)
            return
        ends = [] if self._run_end is None else [self._run_end]
        with contextlib.suppress(TypeError):  # no length (an IterableDataset's loader): the run's, or none
            ends.append(index + len(loader))  # type: ignore[arg-type]
        first = max(index, self._warmup)
        end = min(ends) if ends else _UNKNOWN  # unknown: the first ask only (see due)
        if end - first < MIN_STEPS:
            return
        self._first, self._end, self._end_read = first, end, True

    def due(self, index: int, t: float) -> bool:
        """Whether to ask for a reading now, at the hand-over of step ``index`` (time ``t``)."""
        if not self._end or index < self._first:
            return False
        if index >= self._end:  # the loop is past its end (a later epoch's steps): no more asks
            self._end = 0
            return False
        if not self._asked:
            self._asked, self._i0, self._t0, self._last_t = 1, index, t, t
            return True
        if index <= self._i0 or not self._due_at(index, t):
            return False
        self._asked += 1
        self._last_t = t
        if self._asked >= ASKS:
            self._end = 0
        return True

    def _due_at(self, index: int, t: float) -> bool:
        """Whether the next ask after the first is due at ``t``: its gap doubles from EARLY_GAP_S (a long loop's
        growth is seen in its first seconds; the schedule reads it after them), and where the end is known the asks
        are spaced evenly up to the last, READ_AHEAD_S before the end projected from the mean step since the first."""
        soon = self._last_t + EARLY_GAP_S * (1 << (self._asked - 1))
        if self._end == _UNKNOWN:
            return t >= soon
        step_s = (t - self._t0) / (index - self._i0)
        last = t + (self._end - index) * step_s - READ_AHEAD_S  # when the last ask is due
        left = ASKS - self._asked
        return t >= last or (left > 1 and t >= min(soon, self._last_t + (last - self._last_t) / left))

    def at_end(self, iterator: object, kept: bool = False) -> Taken | None:
        """A loop broke out of its ``wrap()`` (a break, an exception, ``close()``; not the loader's own end, where its
        workers are already gone) while ``iterator``, the loader's, still holds its workers, which dropping it stops:
        their memory read now, here, the first time (see the module); else None. ``kept``: the loader keeps the
        iterator (``persistent_workers``), so the workers outlive the break: an empty reading, which the caller
        sends as an ask, and the sampler process reads them at its next round, off the training thread (a read here
        cost the training thread 19-32 ms of CPU at each break: docs/benchmarks.md, the fast loop)."""
        if not self._end_read:
            return None
        self._end_read = False
        if kept:
            return {}
        return take(worker_pids(iterator)) or None


def worker_pids(iterator: object) -> list[int]:
    """The worker processes of a DataLoader's iterator (torch's ``_workers``; the processes it keeps), else this
    process's children that run its own command line (forked workers: the memory source reads only those it knows
    as workers); none where they cannot be listed."""
    workers = getattr(iterator, "_workers", None)
    if isinstance(workers, list):
        return [pid for w in workers if isinstance(pid := getattr(w, "pid", None), int)]
    try:
        import psutil

        me = psutil.Process()
        mine = me.cmdline()
        return [c.pid for c in me.children() if c.cmdline() == mine]
    except Exception:  # noqa: BLE001 - psutil missing, a child gone: no reading, the run goes on
        return []
