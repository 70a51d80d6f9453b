"""DeviceMarks: the device's view of a run's step boundaries, read without waiting for the device.

Where the Session has a device timer (:class:`~profiler.core.steps.device_timers.DeviceTimer`: CUDA events, the
simulated device's), each boundary of a step whose edges are read records a mark on the device's stream, numbered in
order. Invariants:
- The open step's marks go in flight when it ends; their times are put (``DEV`` events: the mark's time, its id)
  once the device has passed a step's last mark (a step's marks complete in order on its stream), oldest first.
- At most ``max_lag`` ended steps are in flight: past that, the oldest is waited for (the loop is held at most that
  far ahead of the device's clock readings), and at the run's close every one is (``drain``).
- Each event is released to the timer once its time is put (a CUDA event pool reuses it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from profiler.core.steps.device_timers import DeviceTimer
from profiler.core.steps.events import DEV, Event


class DeviceMarks:
    """The marks of the open step and of the ended steps whose device times are not yet known."""

    __slots__ = ("_in_flight", "_max_lag", "_n", "open", "timer")

    def __init__(self, timer: DeviceTimer, max_lag: int) -> None:
        self.timer = timer
        self._max_lag = max_lag
        self.open: list[tuple[float, object]] = []  # the open step's marks (id, event)
        self._in_flight: deque[list[tuple[float, object]]] = deque()  # ended steps' marks, not yet known complete
        self._n = 0

    def mark(self) -> float:
        """A mark (an event recorded on the device's stream) in the open step; its id."""
        m = float(self._n)
        self._n += 1
        self.open.append((m, self.timer.mark()))
        return m

    def end_step(self, put: Callable[[Event], object]) -> None:
        """The open step ended: its marks wait for their times, at most ``max_lag`` steps of them."""
        self._in_flight.append(self.open)
        self.open = []
        if len(self._in_flight) > self._max_lag:
            self.poll(put, drain=False)

    @property
    def pending(self) -> bool:
        """Whether an ended step's marks wait for their times."""
        return bool(self._in_flight)

    @property
    def in_flight(self) -> int:
        """The ended steps whose marks wait for their times."""
        return len(self._in_flight)

    def poll(self, put: Callable[[Event], object], drain: bool) -> None:
        """Put the device times of the steps whose marks completed, oldest first; past ``max_lag`` steps in flight,
        or with ``drain``, the oldest is waited for."""
        timer, in_flight = self.timer, self._in_flight
        while in_flight:
            marks = in_flight[0]
            last = marks[-1][1]
            if not timer.done(last):
                if not drain and len(in_flight) <= self._max_lag:
                    return
                timer.wait(last)
            in_flight.popleft()
            for m, ev in marks:
                put((DEV, 0, timer.time_of(ev), m, math.nan))
            for _, ev in marks:
                timer.release(ev)
