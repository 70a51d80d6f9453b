"""StepEdges: what a Session reads at the boundaries of a step (its ``next()`` returning, a phase's entry and exit)
besides the host clock: the training thread's run-queue wait (schedstat) and the device's marks.

Invariants:
- The run-queue wait is that of the thread that iterates the first ``wrap()`` (or opens the first step); on any
  other thread, and where schedstat is unavailable, nothing is read (NaN).
- It is read on one step in ``every`` (schedstat's budget, ``RUNQ_BUDGET``: set from the mean step at each hand-over)
  and on every boundary of such a step; a step not read costs the hot path nothing here.
- A phase entered within ADJACENT_S of the boundary before it takes that boundary's reading and device mark as its
  own start (one read and one mark per boundary, not two); the host clock is always read afresh.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from profiler.core.sources import sched as schedstat
from profiler.core.steps.device_marks import DeviceMarks
from profiler.core.steps.events import NAN, NO_MARK

# A phase entered within this long of the boundary before it (the step's next() returning, or the phase before it
# exiting) takes that boundary's schedstat reading and device mark as its own start. What the gap holds (a few
# microseconds of the loop's own bookkeeping: run-queue wait, device work launched in it) is charged to the phase
# that follows.
ADJACENT_S = 50e-6


class StepEdges:
    """The open step's boundary readings and the training thread's run-queue reader (the Session's hot path writes
    ``last``, ``on`` and ``step_rq`` directly: they are the open step's state)."""

    __slots__ = ("_clock", "every", "last", "marks", "on", "reader", "reason", "step_rq")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.marks: DeviceMarks | None = None  # the steps' device marks (set at start where there is a timer)
        self.reader: schedstat.ThreadSched | None = None  # the training thread's (opened at its first step)
        self.reason: str | None = None  # why schedstat is not read, once known
        self.every = 1  # the run queue is read on one step in this many
        self.on = False  # the open step's boundaries read the run queue
        self.step_rq: schedstat.ThreadSched | None = None  # the reader, while the open step's run queue is read
        # the open step's last boundary (clock, run queue, device mark): a phase entered right after shares it
        self.last: tuple[float, float, float] | None = None

    def enter(self) -> tuple[float, float]:
        """A phase's start on a step whose boundaries are read: (run queue, mark). Entered within ADJACENT_S of the
        boundary before it, it takes that boundary's reading and mark."""
        edge, dm = self.last, self.marks
        if edge is not None and self._clock() - edge[0] < ADJACENT_S:
            self.last = None
            return edge[1], edge[2] if edge[2] >= 0 or dm is None else dm.mark()
        m = dm.mark() if dm is not None else NO_MARK
        return self.now(), m

    def exit(self, t: float, top: bool) -> tuple[float, float]:
        """A phase's end at ``t`` on such a step; a top-level one leaves its reading for the phase after it."""
        x = self.now()
        m = self.marks.mark() if self.marks is not None else NO_MARK
        # the gap to the next boundary counts from the end of this reading: a cold read (15-40 us right after a
        # compute) must not make the boundary after it read the counter again
        self.last = (self._clock() if x == x else t, x, m) if top else None  # noqa: PLR0124 - NaN: not read
        return x, m

    def now(self) -> float:
        """The training thread's run-queue wait so far (s), on a step whose run queue is read and on that thread;
        else NaN."""
        rq = self.step_rq
        return rq.run_delay_s() if rq is not None and rq.ident == threading.get_ident() else NAN

    def boundary(self, t: float, rq: schedstat.ThreadSched | None) -> float:
        """The run-queue reading at a step boundary at ``t``: right after the last phase's exit (ADJACENT_S), that
        exit's reading; else a new one."""
        edge = self.last
        if edge is not None and edge[1] == edge[1] and t - edge[0] < ADJACENT_S:
            return edge[1]
        return rq.run_delay_s() if rq is not None else NAN

    def ended(self) -> None:
        """The open step ended: nothing of it is read any more."""
        self.on, self.step_rq, self.last = False, None, None

    def budget(self, mean_step_s: float) -> None:
        """Read the run queue on one step in as many as schedstat's budget allows at this mean step."""
        self.every = schedstat.runq_every(mean_step_s)

    def thread_reader(self, annotate: Callable[..., None]) -> schedstat.ThreadSched | None:
        """The run-queue reader of the thread that asks first (its facts go to ``annotate``); None on any other
        thread and where schedstat is unavailable (then the hot path reads nothing)."""
        rq = self.reader
        if rq is not None:
            return rq if rq.ident == threading.get_ident() else None
        if self.reason is not None:
            return None
        try:
            rq = schedstat.ThreadSched()
        except OSError as exc:
            self.reason = f"cannot open the training thread's schedstat: {exc.strerror or exc}"
            annotate(schedstat=f"unavailable: {self.reason}")
            return None
        self.reader = rq
        annotate(
            schedstat_tid=rq.tid,
            schedstat_path=rq.path.replace("/self/", f"/{os.getpid()}/"),
            schedstat_budget={
                "cost_s": schedstat.RUNQ_COST_S,
                "share": schedstat.RUNQ_BUDGET,
                "max_every": schedstat.RUNQ_MAX_EVERY,
            },
        )
        return rq

    def close(self) -> None:
        """The run ended: the reader's file is closed."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
