"""The step events: what the training thread records of each step, and how rows are made of them.

The hot path of a :class:`~profiler.core.session.Session` makes no row. At each step boundary it reads the clock
and puts one event ``(code, name id, t, x, y)`` into its sink, one C call: an array of doubles that the sampler
process's shared-memory ring takes in batches (:meth:`profiler.core.sampler_process.ring.RingWriter.flush_events`) or,
where rows are wanted in the training process itself, a list (:class:`ListLog`). An :class:`Assembler` turns the
events back into :class:`~profiler.core.rows.StepRow` and :class:`~profiler.core.rows.PhaseRow`: in the sampler
process for the store, and in the training process only for what asks for rows there (a hook's ``on_step``,
``Session.recent``).

Events (``t``: the Session's clock; run-queue readings ``x`` in seconds, NaN where not read; device marks are ids,
-1 for none):

- ``FETCH t x y``: the loop asks for the next batch. The open step ends at ``t``; step ``y`` starts there.
- ``BATCH t x y``: its batch came at ``t`` (``y`` items, -1: cannot be told). Until then the step waits for data.
  ``x`` NaN: this step's run queue is not read (the Session's RUNQ_BUDGET), whatever its start's reading.
- ``OPEN t x y``: step ``y`` opened from outside (a framework's loop) at ``t``; ``x`` NaN: its run queue is not
  read.
- ``WAIT - x y``: ``x`` seconds more of data wait in the open step (``y``: the run queue's reading after it).
- ``SAMPLES - x``: ``x`` items more in the open step (-1: a batch whose size cannot be told).
- ``END t x``: the step in flight ends at ``t`` (a step still waiting for its batch is dropped: the loader ended).
- ``ENTER a t x y`` / ``EXIT a t x y``: phase ``a`` (a name id) starts / ends; ``y``: its device mark.
- ``SPAN a t x``: phase ``a`` ran from ``t`` to ``x`` (timed elsewhere), nested in the innermost open phase.
- ``DEV - t x``: device mark ``x`` completed at run time ``t``.
- ``GPU a t x y``: in a kernel window (:mod:`profiler.core.kernel_windows.windows`), the device ran an activity from
  ``t`` to ``x`` launched at ``y`` (NaN: not known); ``a`` = stream x 4 + kind (0 kernel, 1 copy, 2 set, 3 collective:
  ``profiler.core.kernel_windows.windows.KINDS``).
- ``GWIN a t x y``: kernel window ``a`` held the training thread from ``t`` (its opening began) to ``x`` (its
  closing ended; the ``GPU`` events since the last ``GWIN`` are its activities); ``y``: seconds the training
  thread spent opening and closing it. The steps that overlap that span are recorded apart
  (:mod:`profiler.analysis.apart`).
- ``GREC a t``: kernel window ``a``'s recording of steps ended at ``t`` (its boundary), while its stop goes on
  on the window thread: the steps after ``t`` are held but not recorded (the next ``GWIN`` carries it).

Invariants: rows come out in step order; a step whose phases carry device marks waits for all of them (the
Session bounds that at ``max_lag`` steps); an event that does not fit the state (an EXIT with no ENTER, after the
stream was joined mid-step) is ignored, so a reader may start anywhere and makes whole steps from its first FETCH
or OPEN.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from profiler.core.rows import KernelWindow, PhaseRow, StepRow

FETCH, BATCH, OPEN, WAIT, SAMPLES, END, ENTER, EXIT, SPAN, DEV, GPU, GWIN, GREC = range(1, 14)
Event = tuple[int, int, float, float, float]
NAN = math.nan
NO_MARK = -1.0


class EventSink(Protocol):
    """Where a Session puts its step events: ``put(event)``, from any thread (atomic under the GIL)."""

    put: Callable[[Event], object]

    def name_id(self, name: str) -> int:
        """A phase name's id in this stream (announced before the first event that uses it)."""

    def flush_events(self) -> None:
        """Hand on the events put so far (the Session's tick): to the sampler process, say."""


class ListLog:
    """The events kept in this process, for an :class:`Assembler` here (``take()`` hands them over)."""

    def __init__(self, names: dict[int, str] | None = None) -> None:
        self.names: dict[int, str] = names if names is not None else {}
        self._ids = {name: ident for ident, name in self.names.items()}
        self._events: list[Event] = []
        self.put: Callable[[Event], object] = self._events.append

    def name_id(self, name: str) -> int:
        ident = self._ids.get(name)
        if ident is None:
            ident = self._ids[name] = len(self._ids)
            self.names[ident] = name
        return ident

    def flush_events(self) -> None:
        pass  # take() reads them here

    def take(self) -> list[Event]:
        """The events put since the last call (one appended meanwhile by another thread stays for the next)."""
        events = self._events
        n = len(events)
        out = events[:n]
        del events[:n]
        return out


class Tee:
    """The events to a stream (the sampler process's ring) and to a :class:`ListLog` here, with the stream's ids."""

    def __init__(self, stream: EventSink, log: ListLog) -> None:
        self.stream, self.log = stream, log
        to_stream, to_log = stream.put, log.put

        def put(ev: Event) -> None:
            to_stream(ev)
            to_log(ev)

        self.put: Callable[[Event], object] = put

    def flush_events(self) -> None:
        self.stream.flush_events()

    def name_id(self, name: str) -> int:
        ident = self.stream.name_id(name)
        self.log.names[ident] = name
        return ident


def _none(x: float) -> float | None:
    return None if x != x else x  # noqa: PLR0124 - NaN stands for "not read"


class _Open:
    """The step being assembled."""

    __slots__ = ("index", "live", "marks", "phases", "pos", "rq0", "rq_wait", "samples", "t0", "unknown", "wait")

    def __init__(self, index: int, t0: float, rq0: float, pos: int) -> None:
        self.index, self.t0, self.rq0, self.pos = index, t0, rq0, pos
        self.live = False  # its batch came (FETCH opens a step that waits for it; OPEN one that is live)
        self.wait, self.rq_wait = 0.0, NAN
        self.samples: int | None = None
        self.unknown = False
        self.phases: list[PhaseRow] = []
        self.marks: list[tuple[PhaseRow, float, float]] = []  # phases whose device times are still to come


class Assembler:
    """Rows from step events (see the module). ``t0``: the run's zero on the Session's clock; ``warmup``: the
    steps so marked; ``first_step``: the first step it hands out (a reader that resumes reads the events of steps
    handed out before again: those are dropped), and where :attr:`resume` points before it opens."""

    def __init__(self, t0: float, warmup: int, names: dict[int, str] | None = None, first_step: int = 0) -> None:
        self.t0, self.warmup = t0, warmup
        self.names: dict[int, str] = names if names is not None else {}
        self.next_step = self._first = first_step
        self._step: _Open | None = None
        self._stack: list[tuple[int, float, float, float, bool]] = []  # name id, t, runq, mark, in a step
        self._held: deque[tuple[StepRow, list[PhaseRow], _Open]] = deque()  # waiting for device marks
        self._dev: dict[float, float] = {}
        self._out: list[tuple[StepRow, list[PhaseRow]]] = []
        self._acts: list[tuple[int, int, float, float, float]] = []  # the open kernel window's activities
        self._recorded = NAN  # where the closing window's recorded steps ended (GREC), run seconds
        self._windows: list[KernelWindow] = []

    @property
    def resume(self) -> tuple[int, int] | None:
        """(stream position, index) of the oldest step not yet handed out; None when every step begun is."""
        st = self._held[0][2] if self._held else self._step
        return (st.pos, st.index) if st is not None else None

    def feed(self, events: Iterable[Event], pos: int = 0) -> None:
        """Apply ``events`` (``pos``: the stream position of the first, for :attr:`resume`)."""
        for ev in events:
            self.apply(ev, pos)

    def apply(self, ev: Event, pos: int = 0) -> None:
        code, a, t, x, y = ev
        st = self._step
        if code in (FETCH, OPEN):
            if st is not None and st.live:
                self._end(st, t, x)
            self._step = st = _Open(int(y), t, x, pos)
            self.next_step = st.index + 1
            st.live = code == OPEN
        elif code == BATCH:
            if st is not None and not st.live:
                st.live, st.wait = True, t - st.t0
                if x != x:  # noqa: PLR0124 - this step's run queue is not read (RUNQ_BUDGET): its start is not its own
                    st.rq0 = NAN
                st.rq_wait = x - st.rq0
                st.samples = None if y < 0 else int(y)
        elif code == ENTER:
            self._stack.append((a, t, x, y, st is not None))
        elif code == EXIT:
            self._exit(a, t, x, y)
        elif code == SPAN:
            if st is not None:
                self._phase(st, a, t, x, rq=NAN)
        elif code == END:
            if st is not None and st.live:
                self._end(st, t, x)
            elif st is not None:
                self.next_step = st.index  # its batch never came: no step
            self._step = None
        elif code == WAIT:
            if st is not None:
                st.wait += x
                if y == y:  # noqa: PLR0124 - read after this wait
                    st.rq_wait = y - st.rq0
        elif code == SAMPLES:
            if st is not None and not st.unknown:
                st.unknown = x < 0
                st.samples = None if x < 0 else (st.samples or 0) + int(x)
        elif code == DEV:
            self._dev[x] = t
            self._release()
        elif code == GPU:
            t0 = self.t0
            self._acts.append((a >> 2, a & 3, t - t0, x - t0, y - t0))
        elif code == GWIN:
            self._windows.append(KernelWindow(a, t - self.t0, x - self.t0, y, self._acts, self._recorded))
            self._acts, self._recorded = [], NAN
        elif code == GREC:
            self._recorded = t - self.t0

    def _exit(self, a: int, t: float, x: float, y: float) -> None:
        stack, st = self._stack, self._step
        if not stack or stack[-1][0] != a:
            return  # joined after its ENTER
        _, t_in, x_in, y_in, in_step = stack.pop()
        if st is not None and in_step:
            self._phase(st, a, t_in, t, rq=x - x_in, marks=(y_in, y))

    def _phase(
        self,
        st: _Open,
        a: int,
        t_in: float,
        t_out: float,
        *,
        rq: float,
        marks: tuple[float, float] = (NO_MARK, NO_MARK),
    ) -> None:
        names, stack = self.names, self._stack
        name = names[a]
        depth = len(stack)
        if depth:
            name = "/".join([*(names[e[0]] for e in stack), name])
        t0 = self.t0
        row = PhaseRow(st.index, name, depth, t_in - t0, t_out - t0, None, None, _none(rq))
        st.phases.append(row)
        if marks[0] >= 0 and marks[1] >= 0:
            st.marks.append((row, *marks))

    def _end(self, st: _Open, t: float, x: float) -> None:
        if st.index < self._first:
            return
        t0 = self.t0
        row = StepRow(
            st.index, st.t0 - t0, t - t0, st.wait, None if st.unknown else st.samples, st.index < self.warmup,
            _none(st.rq_wait), _none(x - st.rq0),
        )  # fmt: skip
        if st.marks or self._held:
            self._held.append((row, st.phases, st))
            self._release()
        else:
            self._out.append((row, st.phases))

    def _release(self, force: bool = False) -> None:
        held, dev = self._held, self._dev
        while held:
            row, phases, st = held[0]
            if not force and any(m0 not in dev or m1 not in dev for _, m0, m1 in st.marks):
                return
            held.popleft()
            if st.marks:
                times = {id(p): (dev.get(m0), dev.get(m1)) for p, m0, m1 in st.marks}
                for _, m0, m1 in st.marks:
                    dev.pop(m0, None)
                    dev.pop(m1, None)
                phases = [p if (got := times.get(id(p))) is None else PhaseRow(
                    p.step, p.name, p.depth, p.t_start, p.t_end, got[0], got[1], p.runq_s) for p in phases]  # fmt: skip
            self._out.append((row, phases))

    def finish(self) -> None:
        """The stream ended: a step still open is dropped (its end is not known); held steps go out, device times
        missing where their marks never came."""
        if self._step is not None:
            self.next_step = self._step.index
        self._step = None
        self._release(force=True)

    def take(self) -> list[tuple[StepRow, list[PhaseRow]]]:
        """The rows made since the last call, in step order."""
        out, self._out = self._out, []
        return out

    def take_windows(self) -> list[KernelWindow]:
        """The kernel windows completed since the last call."""
        out, self._windows = self._windows, []
        return out
