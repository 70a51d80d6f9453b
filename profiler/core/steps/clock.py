"""StepClock: a Session's hot path. It times each step and its phases as step events and hands them on.

A step starts the moment the loop asks the loader for its batch and ends when it asks for the next one.
``wrap(loader)`` measures the time blocked in ``next()`` (data wait); ``phase(name)`` measures named parts of
the step (``h2d``, ``compute``, or any user name). Whatever the step spent outside these is "other".

Invariants:
- The hot path (``next()`` wrapper, phase enter/exit) makes no row: a ``perf_counter`` read and one step event
  (:mod:`profiler.core.steps.events`) put with one C call; on one step in k (RUNQ_BUDGET) one ``pread`` of the
  training thread's run-queue counter at each boundary; on CUDA an event record (:mod:`profiler.core.steps.boundaries`).
- Every HANDOFF_STEPS steps or HANDOFF_S (a tick) the events are handed on: to the sampler process's ring, and
  made into rows here only for a hook that takes rows or for ``Session.recent`` once asked for
  (:mod:`profiler.core.steps.local_rows`). ``benchmarks/overhead.py`` measures the cost: under 1% of a 1.7 ms step.
- On CUDA, a step's device marks wait in a FIFO until their events have completed; their times are put as events
  (``DEV``) by polling ``Event.query()`` at later ticks, never by a per-step synchronize. Lag is bounded by
  ``max_lag`` steps: past that, the oldest step is waited for. ``close()`` drains the FIFO
  (:mod:`profiler.core.steps.device_marks`).
- A recorder that must stop the training (a store that stopped writing, with ``store_errors="raise"``) gives the
  error that the next step raises out of ``wrap()`` or ``open_step()``; the open step ends first.
- Run-queue wait (``runq_s``) is that of the thread that iterates the first ``wrap()``; phases entered on
  any other thread store NULL rather than another thread's figure.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TypeVar

from profiler.core.hooks import Recorder
from profiler.core.kernel_windows.windows import KernelWindows
from profiler.core.sampling.worker_memory_asks import WorkerReads
from profiler.core.sources import sched as schedstat
from profiler.core.steps.batch_facts import BatchLen
from profiler.core.steps.boundaries import StepEdges
from profiler.core.steps.device_marks import DeviceMarks
from profiler.core.steps.events import (
    BATCH,
    END,
    ENTER,
    EXIT,
    FETCH,
    NAN,
    NO_MARK,
    OPEN,
    SAMPLES,
    SPAN,
    WAIT,
    Event,
    EventSink,
    ListLog,
    Tee,
)
from profiler.core.steps.local_rows import RowsHere

_T = TypeVar("_T")  # what a wrapped iterable yields
# The step events are handed on (to the sampler process's ring: one record) every HANDOFF_STEPS steps or HANDOFF_S
# seconds, whichever comes first, and then the rows wanted in this process are made. Right after a step's compute
# the training thread's caches hold the model's data, not stallscope's code: a hand-over of 70 events measured
# 40-55 us there, 1 us an operation (a lock, a copy, a slice), in a 1.6 ms loop (benchmarks/overhead.py); every 64
# steps that is under 1 us a step. A loop's end (its loader exhausted or left) hands on what is pending at once, and
# the watch thread does once a second. A SIGKILL loses the steps not yet handed on: at most HANDOFF_STEPS steps or
# HANDOFF_S (or the second of a step longer than that).
HANDOFF_STEPS = 64
HANDOFF_S = 0.1
# Right after the model's compute, or the loader's next(), stallscope's code runs cold: in the fast loop of
# benchmarks/fastloop_parts.py (3.6 ms steps) each Python call on the hot path cost the training thread 2-10 us of
# CPU, a generator layer alone 13-28 us, where a loop of empty steps shows well under 1 us. So a step whose edges
# are not read (no run-queue reading, no device mark: most steps of a fast loop) takes the batch's arrival inline in
# wrap(), with no call to _got or _opened.


class Phase:
    """``with session.phase(name)``: one per name, reused (it keeps no state of its own: the stack is the clock's)."""

    __slots__ = ("_c", "_id", "_name", "_outside")

    def __init__(self, clock: StepClock, name: str, ident: int) -> None:
        self._c, self._name, self._id = clock, name, ident
        self._outside = "\0" + name  # on the stack for this phase entered outside any step (it records nothing)

    def __enter__(self) -> Phase:
        c = self._c
        if c.step < 0:  # before the first batch or after the loop: no step to charge it to
            c.stack.append(self._outside)
            return self
        c.stack.append(self._name)
        if c.read_edges:
            x, m = c.edges.enter()
            c.put((ENTER, self._id, c.clock(), x, m))
        else:
            c.put((ENTER, self._id, c.clock(), NAN, NO_MARK))
        return self

    def __exit__(self, *exc: object) -> None:
        c = self._c
        t = c.clock()
        stack = c.stack
        top = stack[-1] if stack else None
        if top != self._name:
            if top == self._outside:
                stack.pop()
                c.unattributed += 1
                return
            raise ValueError(
                f"phase {self._name!r} ended but the innermost open phase is {[n.lstrip(chr(0)) for n in stack[-1:]]}"
            )
        if c.read_edges:
            x, m = c.edges.exit(t, len(stack) == 1)  # its mark is made while it is still the innermost phase
            stack.pop()
            c.put((EXIT, self._id, t, x, m))
        else:
            stack.pop()
            c.put((EXIT, self._id, t, NAN, NO_MARK))
        if c.step < 0:  # the loop ended inside it
            c.unattributed += 1


class PhaseTable(dict[str, Phase]):
    """The phases by name, made on first use. ``Session.phase`` is this dict's own ``__getitem__``: a loop that
    writes ``with s.phase("compute"):`` every step finds a known phase in C, with no Python frame (two method calls
    before, each a few us on a step whose caches the model's compute has emptied: docs/benchmarks.md, the fast
    loop); a name not seen yet goes through :meth:`__missing__`. Until the Session starts (``started``) a phase is
    not kept: it counts as outside any step."""

    __slots__ = ("_clock", "started")

    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self._clock, self.started = clock, False

    def __missing__(self, name: str) -> Phase:
        if not self.started:  # nothing to charge it to yet: it counts as outside any step
            return Phase(self._clock, name, -1)
        p = self[name] = Phase(self._clock, name, self._clock.name_id(name))
        return p


class StepClock:
    """The open step, the phase stack and where the step events go. The Session that owns it sets ``marks``,
    ``windows`` and ``read_edges`` at its start, and where the events go (:meth:`send_to`, :meth:`keep_rows`)."""

    # slotted: the hot path's attributes sit at fixed offsets (a step's few reads and writes touch little memory)
    __slots__ = (
        "_annotate", "_at_tick", "_halts", "_handoff_steps", "_last_tick", "_recorder", "_sink",
        "_tick_step", "_tick_t", "clock", "closed", "edges", "here", "marks", "names", "next_index", "phases",
        "put", "read_edges", "stack", "step", "taken", "unattributed", "waiting_since", "windows", "wreads",
    )  # fmt: skip

    def __init__(
        self,
        clock: Callable[[], float],
        recorder: Recorder,
        annotate: Callable[..., None],
        *,
        warmup: int,
        halts: bool,
        handoff_steps: int,
    ) -> None:
        """``recorder``: the hook that keeps the run (asked to rescan, to read memory, whether to halt);
        ``annotate``: where run facts found here go (the training thread's schedstat); ``halts``: a recorder's halt
        stops the training (``store_errors="raise"``); ``handoff_steps``: the steps between hand-overs."""
        self.clock, self._recorder, self._annotate = clock, recorder, annotate
        # what the recorder reads on this thread at a hand-over (the pin source: core.sampling.on_training_thread),
        # where it has any
        self._at_tick: Callable[[], None] | None = getattr(recorder, "at_tick", None)
        self._halts, self._handoff_steps = halts, handoff_steps
        # where the step events go: a hook's stream (the sampler process's ring), a log here for rows made in this
        # process, or both
        self._sink: EventSink = ListLog()
        self.put: Callable[[Event], object] = self._sink.put
        # the index of the last step opened, stored at its opening: the ring's header where there is one (a sampler
        # process that outlives a killed training process reads how many steps were taken there; 20 ns a step)
        self.taken: memoryview = memoryview(bytearray(8)).cast("q")
        self.here: RowsHere | None = None  # the rows made in this process, once a hook or `recent` wants them
        self.names: dict[int, str] = {}  # the phase names' ids in the stream
        self.phases = PhaseTable(self)
        self.stack: list[str] = []
        self.step, self.next_index, self.unattributed = -1, 0, 0  # the open step (-1: none), the next one's index
        self.waiting_since: float | None = None  # a clock reading while wrap()'s next() is in progress
        # this step's boundaries are read (the run queue on one step in StepEdges.every: RUNQ_BUDGET; device marks)
        self.read_edges = False
        self.edges = StepEdges(clock)
        self.marks: DeviceMarks | None = None  # the steps' device marks (where there is a timer)
        self.windows: KernelWindows | None = None  # the kernel windows' schedule (where the device has a recorder)
        self._last_tick = (0, 0.0)  # the last tick's (step, time)
        self._tick_step, self._tick_t = 0, 0.0  # the next tick is due at this step or this time
        self.wreads = WorkerReads(warmup)  # the first epoch's asks for the workers' memory
        self.closed = False

    # -- where the events go ----------------------------------------------------------------------
    def send_to(self, stream: EventSink) -> None:
        """The step events go to ``stream`` (the sampler process's ring)."""
        self._sink, self.put = stream, stream.put
        self.taken = getattr(stream, "taken", self.taken)

    def keep_rows(self, here: RowsHere, stream: EventSink | None) -> None:
        """Keep the step events here too, from now on, for rows in this process (``here``; any thread may ask)."""
        self._sink = sink = here.log if stream is None else Tee(stream, here.log)
        self.put = sink.put
        self.here = here

    # -- wrap(): the loop asks the loader -----------------------------------------------------------
    def wrap(  # noqa: PLR0915 - the hot path kept inline (HANDOFF_S's note)
        self, iterable: Iterable[_T], samples: int | Callable[[_T], int | None] | None
    ) -> Generator[_T, None, None]:
        """Yield from ``iterable``; time blocked in ``next()`` is the step's data wait."""
        count = samples if callable(samples) else (lambda _b: samples) if samples is not None else BatchLen()
        clock, edges = self.clock, self.edges
        rq = edges.thread_reader(self._annotate)
        halt = self._recorder.halt if self._halts else None
        t_iter: float | None = clock()
        x_iter = rq.run_delay_s() if rq is not None and self.next_index % edges.every == 0 else NAN
        it = self._iterate(iterable)  # the workers' start: that wait belongs to the first step
        self.wreads.begin(iterable, self.next_index, clock())
        try:
            while True:
                t0 = self.waiting_since = clock()
                index = self.next_index
                read = rq is not None and index % edges.every == 0  # this step's run queue is read
                if t_iter is not None:
                    t0, x0, t_iter = t_iter, x_iter, None
                else:
                    x0 = edges.boundary(t0, rq) if read or edges.on else NAN
                if halt is not None and self.step >= 0:
                    self._halt_before(index, t0, x0, halt)
                # the step before ends at t0 (its row is made by whoever reads the events, not here); the next one
                # starts there and waits for its batch
                edges.last = None
                if (dm := self.marks) is not None and dm.open:
                    dm.end_step(self.put)
                self.put((FETCH, 0, t0, x0, index))
                try:
                    batch = next(it)
                except BaseException as exc:  # the loader ended (no step waits for a batch) or failed: the step
                    self.end(t0, NAN)  # before still ended at t0
                    self.flush()
                    if isinstance(exc, StopIteration):
                        return
                    raise
                t1 = clock()
                if read or dm is not None:
                    self._got(index, t1, read, rq, count(batch))
                else:  # a fast loop's common step, nothing read at its edges: _got, _opened inline (HANDOFF_S's note)
                    self.put((BATCH, 0, t1, NAN, -1.0 if (n := count(batch)) is None else n))
                    self.waiting_since, self.step, self.next_index = None, index, index + 1
                    self.taken[0] = index  # its own statement: a 4-name assignment builds a tuple (+40 ns a step)
                    if self.read_edges:  # the step before was read
                        edges.on, edges.step_rq, self.read_edges = False, None, False
                    if index >= self._tick_step or t1 >= self._tick_t:
                        self._tick(index, t1)
                yield batch
        finally:
            self.waiting_since = None
            # the loop broke out or raised: the step in flight ends now
            if self.step >= 0 and not self.closed:
                self.end(clock(), edges.now())
                self.flush()
                # the workers' memory before dropping the iterator stops them (a loader that keeps it: an ask)
                if (taken := self.wreads.at_end(it, kept=getattr(iterable, "_iterator", None) is it)) is not None:
                    self._recorder.read_memory_soon(taken)

    def _iterate(self, iterable: Iterable[_T]) -> Iterator[_T]:
        """iter(): where a DataLoader starts its workers; the sampler then looks for them at its next reading. Not
        where none can have started: a loader without workers, or one whose persistent workers' iterator is the
        one it had (a scan of the process tree every epoch cost the sampler process a third of its CPU in a fast
        loop: benchmarks/overhead.py)."""
        before = getattr(iterable, "_iterator", None)
        it = iter(iterable)
        workers = getattr(iterable, "num_workers", None)
        same = before is not None and getattr(iterable, "_iterator", None) is before
        if not (same or (workers == 0 and self.next_index > 0)):
            self._recorder.rescan_soon()
        return it

    def _halt_before(self, index: int, t: float, x: float, halt: Callable[[int], BaseException | None]) -> None:
        """Before step ``index`` (``wrap`` and ``open_step``): what the recorder says stops the training (a store
        that stopped writing, with ``store_errors="raise"``) ends the open step at ``t`` and is raised."""
        if (stop := halt(index)) is not None:
            self.end(t, x)
            raise stop

    def _got(self, index: int, t1: float, read: bool, rq: schedstat.ThreadSched | None, n: int | None) -> None:
        """Step ``index`` has its batch (``n`` items) at ``t1``: it is open."""
        self.waiting_since = None
        x1 = rq.run_delay_s() if read and rq is not None else NAN
        # the clock right after the reading: a wait for the core after it (in put, in _opened) is then in the gap
        # a phase entered next must be within to share the reading (edges.ADJACENT_S), not hidden from that check
        t_read = self.clock() if read else t1
        self.put((BATCH, 0, t1, x1, -1.0 if n is None else n))
        if self._opened(index, t1, read, rq):  # a phase entered right after takes this reading (edges.ADJACENT_S)
            self.edges.last = (t_read, x1, NO_MARK)

    def _opened(self, index: int, t: float, read: bool, rq: schedstat.ThreadSched | None) -> bool:
        """Step ``index`` is open from ``t`` (its event put; ``wrap`` and ``open_step``): the hot path's state, and
        the tick when one is due. True when this step's boundaries are read (schedstat, device marks)."""
        self.step, self.next_index = index, index + 1
        self.taken[0] = index
        edges = self.edges
        edges.on, edges.step_rq = read, rq if read else None
        self.read_edges = fine = read or self.marks is not None
        if index >= self._tick_step or t >= self._tick_t:
            self._tick(index, t)
        return fine

    def end(self, t: float, x: float) -> None:
        """The open step (if any) ends at ``t`` (``x``: the run queue's reading there); a step still waiting for
        its batch is dropped."""
        self.put((END, 0, t, x, NAN))
        self.step = -1
        self.edges.ended()
        if (dm := self.marks) is not None and dm.open:
            dm.end_step(self.put)

    # -- ticks: the hand-over -----------------------------------------------------------------------
    def _tick(self, index: int, t: float) -> None:
        """Every ``HANDOFF_STEPS`` steps or ``HANDOFF_S``: the schedstat budget from the steps since the last tick,
        the kernel windows due, the memory readings asked, the device marks that completed, and the hand-over."""
        n = index - self._last_tick[0]
        if n > 0:
            self.edges.budget((t - self._last_tick[1]) / n)
        self._last_tick = (index, t)
        self._tick_step, self._tick_t = index + self._handoff_steps, t + HANDOFF_S
        if (kw := self.windows) is not None:
            kw.at(index, self.put)
            self._tick_step = min(self._tick_step, kw.next_index)
        if self.wreads.due(index, t):
            self._recorder.read_memory_soon()
        if self._at_tick is not None:
            self._at_tick()
        self.flush()

    def tick_next(self) -> None:
        """The next step ticks (the kernel windows' schedule changed)."""
        self._tick_step = self.next_index

    def flush(self, drain: bool = False) -> None:
        """Put the completed device marks' times (``drain``: wait for all), hand the events on (the sampler
        process's ring), and make the rows wanted here."""
        if (dm := self.marks) is not None and dm.pending:
            dm.poll(self.put, drain)
        self._sink.flush_events()
        if self.here is not None:
            self.here.deliver(drain)

    # -- steps driven from outside (Session.open_step and the calls after it) ------------------------------
    def open_step(self, t: float) -> None:
        """End the open step at ``t`` and open the next one there."""
        rq = self.edges.thread_reader(self._annotate)
        index = self.next_index
        read = rq is not None and index % self.edges.every == 0
        x = rq.run_delay_s() if rq is not None and (read or self.edges.on) else NAN
        if self.step >= 0:
            if self._halts:
                self._halt_before(index, t, x, self._recorder.halt)
            self.end(t, x)
        self.put((OPEN, 0, t, x if read else NAN, index))
        self._opened(index, t, read, rq)

    def add_wait(self, seconds: float) -> None:
        if self.step >= 0:
            self.put((WAIT, 0, 0.0, seconds, self.edges.now()))

    def add_samples(self, n: int | None) -> None:
        if self.step >= 0:
            self.put((SAMPLES, 0, 0.0, -1.0 if n is None else float(n), NAN))

    def close_step(self, t_end: float | None) -> None:
        if self.step >= 0:
            x = self.edges.now()
            self.end(self.clock() if t_end is None else t_end, x)
            self.flush()

    def name_id(self, name: str) -> int:
        """A phase name's id in the step events (announced to the sink the first time)."""
        ident = self._sink.name_id(name)
        self.names[ident] = name
        return ident

    def span(self, name: str, t_start: float, t_end: float) -> None:
        if self.step < 0:
            self.unattributed += 1
            return
        self.put((SPAN, self.name_id(name), t_start, t_end, NAN))

    def close(self) -> list[str]:
        """The run ends: the open step ends now, the kernel windows close, every device mark and event is handed on.
        Returns the kernel windows' warnings (those skipped, and why)."""
        self.closed = True
        if self.step >= 0:
            x = self.edges.now()
            self.end(self.clock(), x)
        skipped: list[str] = []
        if self.windows is not None:
            self.windows.close(self.put)
            skipped = list(self.windows.skipped)
        self.flush(drain=True)
        self.edges.close()
        return skipped
