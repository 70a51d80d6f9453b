"""Session: times each training step's phases and hands each step to its hooks (the run store's ThreadRecorder,
the Prometheus exporter, ...: :mod:`profiler.core.hooks`); it imports none of them.

A step starts the moment the loop asks the loader for its batch and ends when it asks for the next one.
``wrap(loader)`` measures the time blocked in ``next()`` (data wait); ``phase(name)`` measures named parts of
the step (``h2d``, ``compute``, or any user name). Whatever the step spent outside these is "other".

Invariants:
- The hot path (``next()`` wrapper, phase enter/exit) makes no row: a ``perf_counter`` read and one step event
  (:mod:`profiler.core.stepevents`) put with one C call; on one step in k (RUNQ_BUDGET) one ``pread`` of the
  training thread's run-queue counter at each boundary; on CUDA an event record. Rows are made from the events by
  whoever reads them: the sampler process (its ring takes the events every HANDOFF_STEPS steps or HANDOFF_S), and
  this process only for a hook that takes rows or for :attr:`Session.recent` once asked for
  (``benchmarks/overhead.py`` measures the cost: under 1% of a 1.7 ms step is the target).
- On CUDA, a step's device marks wait in a FIFO until their events have completed; their times are put as events
  (``DEV``) by polling ``Event.query()`` at later ticks, never by a per-step synchronize. Lag is bounded by
  ``max_lag`` steps: past that, the oldest step is waited for. ``close()`` drains the FIFO.
- Exiting the ``with`` block records a status: ``complete``; ``interrupted`` for KeyboardInterrupt or a
  signal the CLI turned into :class:`Interrupted`; ``failed`` (with where) for any other exception, which
  propagates unchanged. Every step recorded so far stays in the store.
- A run store that stops writing (disk full, over quota, its directory removed): with ``store_errors="warn"``
  (the default, a user's own loop) the training goes on and the store's writer says so once; with
  ``"raise"`` (the CLI's runner) the recorder's :meth:`~profiler.core.hooks.Recorder.halt` gives the error that
  the next step raises out of ``wrap()``, naming the file, the step and the last step kept.
- Run-queue wait (``runq_s``) is that of the thread that iterates the first ``wrap()``; phases entered on
  any other thread store NULL rather than another thread's figure.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from profiler.core.batches import BatchLen, loader_facts
from profiler.core.devices import DeviceInfo, DeviceTimer, make_timer, resolve_device
from profiler.core.devmarks import DeviceMarks
from profiler.core.hooks import Recorder, ServingHook, SessionHook, SinkOptions, make_sinks
from profiler.core.kernelwin import KernelRecorder, KernelWindows, WindowPlan, make_recorder, parse_plan
from profiler.core.rows import TAIL_KEY, PhaseRow, StepRow, held_steps
from profiler.core.sources import sched as schedstat
from profiler.core.sources.base import Source, SourceRecipe
from profiler.core.stepevents import (
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
    Assembler,
    Event,
    EventSink,
    ListLog,
    Tee,
)
from profiler.core.workerreads import WorkerReads

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.sampler import Sampler

_T = TypeVar("_T")  # what a wrapped iterable yields
# A phase entered within this long of the boundary before it (the step's next() returning, or the phase before it
# exiting) takes that boundary's schedstat reading and CUDA event as its own start: one read and one event per
# boundary rather than two. What the gap holds (a few microseconds of the loop's own bookkeeping: run-queue wait,
# device work launched in it) is charged to the phase that follows; the host clock is read afresh.
ADJACENT_S = 50e-6
# The step events are handed on (to the sampler process's ring: one record) every HANDOFF_STEPS steps or HANDOFF_S
# seconds, whichever comes first, and then the rows wanted in this process are made. Right after a step's compute
# the training thread's caches hold the model's data, not stallscope's code: a hand-over of 70 events measured
# 40-55 us there, 1 us an operation (a lock, a copy, a slice), in a 1.6 ms loop (benchmarks/overhead.py); every 64
# steps that is under 1 us a step. A loop's end (its loader exhausted or left) hands on what is pending at once, and
# the watch thread does once a second. A SIGKILL loses the steps not yet handed on: at most HANDOFF_STEPS steps or
# HANDOFF_S (or the second of a step longer than that).
HANDOFF_STEPS = 64
HANDOFF_S = 0.1
RECENT = 1024  # resolved steps kept for live views and a sweep's early stop
# the run facts a user may give in meta= that the report and the recommendations read (None until given)
LABELS = ("scenario", "pipeline", "batch_size", "workers", "pin_memory")


class Interrupted(BaseException):
    """Raised into the training loop by the CLI's SIGINT/SIGTERM handler.

    A BaseException, like KeyboardInterrupt, so that code catching ``Exception`` (a source probe, a user's
    dataset) cannot swallow the stop.
    """

    def __init__(self, signame: str) -> None:
        super().__init__(f"stopped by {signame}")
        self.signame = signame


class _Phase:
    """``with session.phase(name)``: one per name, reused (it keeps no state of its own: the stack is the session's)."""

    __slots__ = ("_id", "_name", "_outside", "_s")

    def __init__(self, session: Session, name: str, ident: int) -> None:
        self._s, self._name, self._id = session, name, ident
        self._outside = "\0" + name  # on the stack for this phase entered outside any step (it records nothing)

    def __enter__(self) -> _Phase:
        s = self._s
        if s._step < 0:  # before the first batch or after the loop: no step to charge it to
            s._stack.append(self._outside)
            return self
        s._stack.append(self._name)
        if s._read_edges:
            x, m = s._edge_enter()
            s._put((ENTER, self._id, s._clock(), x, m))
        else:
            s._put((ENTER, self._id, s._clock(), NAN, NO_MARK))
        return self

    def __exit__(self, *exc: object) -> None:
        s = self._s
        t = s._clock()
        stack = s._stack
        top = stack[-1] if stack else None
        if top != self._name:
            if top == self._outside:
                stack.pop()
                s._unattributed += 1
                return
            raise ValueError(
                f"phase {self._name!r} ended but the innermost open phase is {[n.lstrip(chr(0)) for n in stack[-1:]]}"
            )
        if s._read_edges:
            x, m = s._edge_exit(t, len(stack) == 1)  # its mark is made while it is still the innermost phase
            stack.pop()
            s._put((EXIT, self._id, t, x, m))
        else:
            stack.pop()
            s._put((EXIT, self._id, t, NAN, NO_MARK))
        if s._step < 0:  # the loop ended inside it
            s._unattributed += 1


class Session:
    """Profile a training loop (docs/quickstart.md, "Instrumenting your own training loop")."""

    # slotted: the hot path's attributes sit at fixed offsets (a step's few reads and writes touch little memory)
    __slots__ = (
        "__weakref__", "_asm", "_clock", "_error", "_exporter", "_halts", "_handoff_steps", "_hooks", "_kw",
        "_kw_plan", "_kw_recorder", "_last_edge", "_last_tick", "_log", "_marks", "_max_lag",
        "_meta", "_names", "_next_index", "_phase_of", "_put", "_read_edges", "_recent", "_recorder", "_row_sinks",
        "_rows_asked", "_rq_on", "_rq_step", "_runq", "_runq_every", "_runq_reason", "_sink", "_stack", "_started",
        "_status", "_step", "_steps", "_stream", "_t0", "_tick_step", "_tick_t", "_timer", "_unattributed",
        "_waiting_since", "_wreads", "device", "out_dir", "sample_hz", "warmup",
    )  # fmt: skip

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        sample_hz: float = 10.0,
        device: str | DeviceInfo = "auto",
        warmup: int = 0,
        meta: dict[str, object] | None = None,
        sources: Sequence[Source | SourceRecipe] | None = None,
        prometheus: str | int | None = None,
        sampling: str = "process",
        hooks: Sequence[SessionHook] = (),
        store_errors: str = "warn",
        clock: Callable[[], float] = time.perf_counter,
        timer: DeviceTimer | None = None,
        max_lag: int = 32,
        kernel_windows: str | WindowPlan | None = "auto",
        kernel_recorder: KernelRecorder | None = None,
        steps: int | None = None,
    ) -> None:
        """``meta``: run facts for the store (scenario, pipeline, batch_size, workers, pin_memory, or any other);
        ``prometheus``: "[ADDR:]PORT" served while the session runs (checked here, bound at start); ``hooks``:
        more sinks, started after the run's own; ``max_lag``: steps whose device events may be pending; ``sources``
        and ``sampling``: docs/architecture.md, "Two processes"; ``kernel_windows``: when the device's own activity is
        recorded (``off``, ``auto``, ``AFTER:STEPS[:EVERY]``: :mod:`profiler.core.kernelwin`), by
        ``kernel_recorder`` (default: CUPTI on CUDA, the simulated device's own, none on CPU); ``steps``: the
        measured steps the loop will run after the warm-up, where known: ``auto`` then records one window after
        them, for which the loop runs :attr:`tail_steps` steps more (docs/metrics.md, "Kernel windows' cost")."""
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.out_dir = Path(out_dir)
        self.device = device if isinstance(device, DeviceInfo) else resolve_device(device)
        self.sample_hz, self.warmup = sample_hz, warmup
        self._clock, self._max_lag = clock, max_lag
        self._handoff_steps = min(HANDOFF_STEPS, max_lag + 1)
        self._meta: dict[str, object] = {**_run_facts(self.device, warmup, sample_hz), **(meta or {})}
        sinks = make_sinks(
            SinkOptions(self.out_dir, self._meta, sample_hz, sources, clock, store_errors, prometheus, sampling)
        )
        self._recorder: Recorder = sinks.recorder
        self._hooks: list[SessionHook] = [*sinks.hooks, sinks.recorder, *hooks]  # an exporter binds first
        self._exporter = sinks.exporter
        self._halts = store_errors == "raise"
        self._runq: schedstat.ThreadSched | None = None
        self._runq_reason: str | None = None
        self._timer: DeviceTimer | None = timer
        self._kw_plan = kernel_windows if not isinstance(kernel_windows, str) else parse_plan(kernel_windows)
        self._kw_recorder = kernel_recorder
        self._kw: KernelWindows | None = None
        self._steps = steps
        self._started, self._t0 = False, 0.0
        self._init_hot_path()
        self._status: str | None = None
        self._error: str | None = None

    def _init_hot_path(self) -> None:
        # where the step events go (set at start): a hook's stream (the sampler process's ring), a log here for
        # rows made in this process, or both
        self._stream: EventSink | None = None
        self._sink: EventSink = ListLog()
        self._put: Callable[[Event], object] = self._sink.put
        self._log: ListLog | None = None
        self._asm: Assembler | None = None
        self._row_sinks: tuple[Callable[[StepRow, Sequence[PhaseRow]], None], ...] = ()
        self._recent: deque[tuple[StepRow, list[PhaseRow]]] = deque(maxlen=RECENT)
        self._rows_asked = False  # recent was asked for before the start
        self._names: dict[int, str] = {}  # the phase names' ids in the stream
        self._phase_of: dict[str, _Phase] = {}
        self._stack: list[str] = []
        self._step, self._next_index, self._unattributed = -1, 0, 0  # the open step (-1: none), the next one's index
        self._waiting_since: float | None = None  # a clock reading while wrap()'s next() is in progress
        # this step's boundaries are read (schedstat on one step in _runq_every: RUNQ_BUDGET; device marks)
        self._read_edges, self._rq_on = self._timer is not None, False
        self._rq_step: schedstat.ThreadSched | None = None  # _runq while the open step's schedstat is read
        self._runq_every = 1
        # the open step's last boundary (clock, run queue, device mark): a phase entered right after shares it
        self._last_edge: tuple[float, float, float] | None = None
        self._marks: DeviceMarks | None = None  # the steps' device marks (set at start where there is a timer)
        self._last_tick = (0, 0.0)  # the last _tick's (step, time)
        self._tick_step, self._tick_t = 0, 0.0  # the next tick is due at this step or this time
        self._wreads = WorkerReads(self.warmup)  # the first epoch's asks for the workers' memory

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.out_dir

    @property
    def meta(self) -> dict[str, object]:
        """The run facts recorded in the store's meta table so far (a copy)."""
        return dict(self._meta)

    @property
    def status(self) -> str | None:
        """None while running; then "complete", "interrupted" or "failed"."""
        return self._status

    @property
    def error(self) -> str | None:
        """For a failed or interrupted run: what stopped it, and where."""
        return self._error

    @property
    def waiting_since(self) -> float | None:
        """When (a :attr:`clock` reading) the ``next()`` that :meth:`wrap` is in now began; None outside one."""
        return self._waiting_since

    @property
    def t0(self) -> float:
        """The run's zero on :attr:`clock` (set by :meth:`start`)."""
        return self._t0

    @property
    def sampler(self) -> Sampler | None:
        """The recorder's background sampler (None before start)."""
        return self._recorder.sampler

    @property
    def exporter(self) -> ServingHook | None:
        """The Prometheus endpoint of ``prometheus=`` (its ``url``), else None."""
        return self._exporter

    def start(self) -> Session:
        """Start the hooks in order (an exporter binds first: a port in use records nothing); a hook that fails
        to start ends those started before it, and its error propagates."""
        if self._started:
            return self
        self._started = True
        self._t0 = self._clock()
        if self._timer is None:
            self._timer = make_timer(self.device, self._now)
        elif callable(bind := getattr(self._timer, "bind", None)):
            bind(self._now)  # a timer given to the Session (the simulated device's) joins the run's clock
        self._meta["device_timer"] = self._timer.kind if self._timer is not None else "host-perf-counter"
        self._marks = DeviceMarks(self._timer, self._max_lag) if self._timer is not None else None
        self._meta["kernel_windows"] = self._plan_windows()
        started: list[SessionHook] = []
        try:
            for hook in self._hooks:
                hook.on_start(self)
                started.append(hook)
        except BaseException as exc:
            for hook in reversed(started):
                hook.on_close("failed", str(exc))
            raise
        self._connect()
        self._runq_reason = schedstat.probe()
        self.annotate(schedstat=f"unavailable: {self._runq_reason}" if self._runq_reason else "available")
        return self

    def _plan_windows(self) -> str:
        """Set up the kernel windows (where the device has a recorder); what the run records of them, in words."""
        plan = self._kw_plan
        if plan is None:
            return "off"
        rec = self._kw_recorder or make_recorder(self.device.kind, self._timer, self._clock)
        if rec is None:
            return f"none: no kernel recorder for a {self.device.kind} device"
        if (plan := plan.known_length(self._steps)).tail:  # auto, the run's length known: after its steps
            self._meta[TAIL_KEY] = plan.first(self.warmup)
        self._kw = KernelWindows(plan, rec, self.warmup, self._clock)
        return f"{rec.source}: {plan.describe()}"

    @property
    def tail_steps(self) -> int:
        """The steps a loop of known length (``steps=``) runs after its measured ones for their window (0: none)."""
        return self._kw.tail_steps if self._kw is not None else 0

    def tail_now(self) -> int:
        """The measured steps ended early (a sweep's stop rule): the tail window opens at the next step; its steps."""
        n = self._kw.tail_at(self._next_index) if self._kw is not None else 0
        if n:
            self._tick_step = self._next_index
            self.annotate(**{TAIL_KEY: self._next_index})
        return n

    def _connect(self) -> None:
        """The step events go to the first hook that takes them (the sampler process's ring), and to a log here
        when a hook takes rows instead."""
        rows: list[Callable[[StepRow, Sequence[PhaseRow]], None]] = []
        for hook in self._hooks:
            stream = getattr(hook, "step_events", None)
            sink = stream() if callable(stream) else None
            if sink is not None and self._stream is None:
                self._stream = sink
            elif getattr(hook, "wants_rows", True):
                rows.append(hook.on_step)
        self._row_sinks = tuple(rows)
        if self._stream is not None:
            self._sink = self._stream
            self._put = self._stream.put
            if self._kw is not None:  # the sampler process reads the windows' activities (core.kerneltrace)
                self._kw.handoff = self.out_dir
        if self._stream is None or rows or self._rows_asked:
            self._want_rows()

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close("complete")
        elif isinstance(exc, (KeyboardInterrupt, Interrupted)):
            self.close("interrupted", error=str(exc) or "KeyboardInterrupt")
        else:
            self.close("failed", error=_where(exc, tb))

    def annotate(self, **items: object) -> None:
        """Record run facts (loader knobs, model name, ...) in the store's meta table."""
        self._meta.update(items)
        if self._started:
            for hook in self._hooks:
                hook.on_meta(items)

    def event(self, kind: str, message: str) -> None:
        """Record a free-form event (warning, skipped sample, ...) at the current time."""
        if self._started:
            for hook in self._hooks:
                hook.on_event(kind, message)

    def close(self, status: str = "complete", error: str | None = None) -> Summary | None:
        """End the run: close the open step, drain device events, then the hooks in reverse order (the
        ThreadRecorder: sampler, py-spy, store, summary.json); returns the run's Summary (None if it could not be
        built; the store still holds the run)."""
        if not self._started or self._status is not None:
            return self.summary()
        self._status, self._error = status, error
        if self._step >= 0:
            x = self._runq_now()
            self._end(self._clock(), x)
        if self._kw is not None:
            self._kw.close(self._put)
            for why in self._kw.skipped:
                self.event("warning", f"kernel windows: {why}")
        self._flush(drain=True)
        if self._runq is not None:
            self._runq.close()
            self._runq = None
        if self._unattributed:
            self.event("warning", f"{self._unattributed} phase(s) ran outside any step")
        for hook in reversed(self._hooks):
            hook.on_close(status, error)
        return self.summary()

    def summary(self) -> Summary | None:
        """The run's Summary, built once when the session closed from the rows read back from its store (None
        while it runs). When the store stopped writing mid-run (disk full, the directory removed: training went
        on, as it should), it is the Summary of the steps the store committed before it stopped."""
        return self._recorder.summary

    def step_times(self) -> list[float]:
        """Seconds of each measured step (neither warm-up nor held by a kernel window) the store holds, in order,
        read back from it: while the run goes on, those committed so far (at most ``flush_s`` behind)."""
        return [s.t_end - s.t_start for s in self._measured_rows()]

    def own_step_times(self) -> list[float]:
        """:meth:`step_times` less each step's run-queue wait (runnable, given no CPU), for the steps whose wait was
        measured (every step, or one in k of short ones: RUNQ_BUDGET): the steps on a core of their own."""
        rows = self._measured_rows()
        return [s.t_end - s.t_start - s.runq_s for s in rows if s.runq_s is not None and math.isfinite(s.runq_s)]

    def _measured_rows(self) -> list[StepRow]:
        steps, t0, kw = self._recorder.committed_steps(), self._t0, self._kw
        held = held_steps([(a - t0, b - t0) for a, b in kw.spans] if kw else [], steps, self._meta.get(TAIL_KEY))
        return [s for s in steps if not s.warmup and s.step not in held]

    @property
    def recording(self) -> Recorder:
        """The hook that keeps the run (the ThreadRecorder: store, sampler, py-spy)."""
        return self._recorder

    # -- hot path ---------------------------------------------------------------------------------
    def _now(self) -> float:
        return self._clock() - self._t0

    def _iterate(self, iterable: Iterable[_T]) -> Iterator[_T]:
        """iter(): where a DataLoader starts its workers; the sampler then looks for them at its next reading. Not
        where none can have started: a loader without workers, or one whose persistent workers' iterator is the
        one it had (a scan of the process tree every epoch cost the sampler process a third of its CPU in a fast
        loop: benchmarks/overhead.py)."""
        before = getattr(iterable, "_iterator", None)
        it = iter(iterable)
        workers = getattr(iterable, "num_workers", None)
        same = before is not None and getattr(iterable, "_iterator", None) is before
        if not (same or (workers == 0 and self._next_index > 0)):
            self._recorder.rescan_soon()
        return it

    def wrap(
        self, iterable: Iterable[_T], *, samples: int | Callable[[_T], int | None] | None = None
    ) -> Generator[_T, None, None]:
        """Yield from ``iterable``; time blocked in ``next()`` is the step's data wait."""
        if not self._started:
            raise RuntimeError("Session.wrap() needs a started session: use `with Session(...) as s:`")
        self.note_loader(iterable)
        count = samples if callable(samples) else (lambda _b: samples) if samples is not None else BatchLen()
        clock = self._clock
        rq = self._thread_runq()
        halt = self._recorder.halt if self._halts else None
        t_iter: float | None = clock()
        x_iter = rq.run_delay_s() if rq is not None and self._next_index % self._runq_every == 0 else NAN
        it = self._iterate(iterable)  # the workers' start: that wait belongs to the first step
        self._wreads.begin(iterable, self._next_index, clock())
        try:
            while True:
                t0 = self._waiting_since = clock()
                index = self._next_index
                read = rq is not None and index % self._runq_every == 0  # this step's schedstat is read
                if t_iter is not None:
                    t0, x0, t_iter = t_iter, x_iter, None
                else:
                    x0 = self._boundary_runq(t0, rq) if read or self._rq_on else NAN
                if halt is not None and self._step >= 0:
                    self._halt_before(index, t0, x0, halt)
                # the step before ends at t0 (its row is made by whoever reads the events, not here); the next one
                # starts there and waits for its batch
                self._last_edge = None
                if (dm := self._marks) is not None and dm.open:
                    dm.end_step(self._put)
                self._put((FETCH, 0, t0, x0, index))
                try:
                    batch = next(it)
                except StopIteration:  # the loader ended: no step waits for a batch
                    self._end(t0, NAN)
                    self._flush()
                    return
                except BaseException:  # the loader failed: the step before still ended at t0
                    self._end(t0, NAN)
                    self._flush()
                    raise
                self._got(index, clock(), read, rq, count(batch))
                yield batch
        finally:
            self._waiting_since = None
            # the loop broke out or raised: the step in flight ends now
            if self._step >= 0 and self._status is None:
                self._end(clock(), self._runq_now())
                self._flush()

    def _halt_before(self, index: int, t: float, x: float, halt: Callable[[int], BaseException | None]) -> None:
        """Before step ``index`` (``wrap`` and ``open_step``): what the recorder says stops the training (a store
        that stopped writing, with ``store_errors="raise"``) ends the open step at ``t`` and is raised."""
        if (stop := halt(index)) is not None:
            self._end(t, x)
            raise stop

    def _got(self, index: int, t1: float, read: bool, rq: schedstat.ThreadSched | None, n: int | None) -> None:
        """Step ``index`` has its batch (``n`` items) at ``t1``: it is open."""
        self._waiting_since = None
        x1 = rq.run_delay_s() if read and rq is not None else NAN
        self._put((BATCH, 0, t1, x1, -1.0 if n is None else n))
        if self._opened(index, t1, read, rq):
            self._last_edge = (t1, x1, NO_MARK)

    def _opened(self, index: int, t: float, read: bool, rq: schedstat.ThreadSched | None) -> bool:
        """Step ``index`` is open from ``t`` (its event put; ``wrap`` and ``open_step``): the hot path's state, and
        the tick when one is due. True when this step's boundaries are read (schedstat, device marks)."""
        self._step, self._next_index = index, index + 1
        self._rq_on, self._rq_step = read, rq if read else None
        self._read_edges = fine = read or self._timer is not None
        if index >= self._tick_step or t >= self._tick_t:
            self._tick(index, t)
        return fine

    def _end(self, t: float, x: float) -> None:
        """The open step (if any) ends at ``t`` (``x``: the run queue's reading there); a step still waiting for
        its batch is dropped."""
        self._put((END, 0, t, x, NAN))
        self._step, self._rq_on, self._rq_step, self._last_edge = -1, False, None, None
        if (dm := self._marks) is not None and dm.open:
            dm.end_step(self._put)

    def _tick(self, index: int, t: float) -> None:
        """Every ``HANDOFF_STEPS`` steps or ``HANDOFF_S``: the schedstat budget from the steps since the last tick,
        the device marks that completed, and the rows wanted in this process."""
        n = index - self._last_tick[0]
        if n > 0:
            self._runq_every = schedstat.runq_every((t - self._last_tick[1]) / n)
        self._last_tick = (index, t)
        self._tick_step, self._tick_t = index + self._handoff_steps, t + HANDOFF_S
        if (kw := self._kw) is not None:
            kw.at(index, self._put)
            self._tick_step = min(self._tick_step, kw.next_index)
        if self._wreads.due(index, t):
            self._recorder.read_memory_soon()
        self._flush()

    def _flush(self, drain: bool = False) -> None:
        """Put the completed device marks' times (``drain``: wait for all), hand the events on (the sampler
        process's ring), and make the rows wanted here."""
        if (dm := self._marks) is not None and dm.pending:
            dm.poll(self._put, drain)
        self._sink.flush_events()
        if self._log is not None:
            self._deliver(drain)

    def _deliver(self, final: bool = False) -> None:
        """The rows of the events put since the last call, to the hooks that take rows and to :attr:`recent`."""
        log, asm = self._log, self._asm
        if log is None or asm is None:
            return
        asm.feed(log.take())
        if final:
            asm.finish()
        sinks, recent = self._row_sinks, self._recent
        for row, phases in asm.take():
            for on_step in sinks:
                on_step(row, phases)
            recent.append((row, phases))
        for window in asm.take_windows():  # a hook that takes rows keeps them (a ThreadRecorder)
            for hook in self._hooks:
                if callable(on_window := getattr(hook, "on_window", None)) and getattr(hook, "wants_rows", True):
                    on_window(window)

    def _edge_enter(self) -> tuple[float, float]:
        """A phase's start on a step whose boundaries are read (schedstat, device marks): (run queue, mark).
        Entered within ADJACENT_S of the boundary before it, it takes that boundary's reading and mark."""
        edge, dm = self._last_edge, self._marks
        if edge is not None and self._clock() - edge[0] < ADJACENT_S:
            self._last_edge = None
            return edge[1], edge[2] if edge[2] >= 0 or dm is None else dm.mark()
        m = dm.mark() if dm is not None else NO_MARK
        return self._runq_now(), m

    def _edge_exit(self, t: float, top: bool) -> tuple[float, float]:
        """A phase's end at ``t`` on such a step; a top-level one leaves its reading for the phase after it."""
        x = self._runq_now()
        m = self._marks.mark() if self._marks is not None else NO_MARK
        self._last_edge = (t, x, m) if top else None
        return x, m

    def _runq_now(self) -> float:
        """The training thread's run-queue wait so far (s), on a step whose schedstat is read and on that thread;
        else NaN."""
        rq = self._rq_step
        return rq.run_delay_s() if rq is not None and rq.ident == threading.get_ident() else NAN

    def _boundary_runq(self, t: float, rq: schedstat.ThreadSched | None) -> float:
        """The run-queue reading at a step boundary at ``t``: right after the last phase's exit (ADJACENT_S), that
        exit's reading; else a new one."""
        edge = self._last_edge
        if edge is not None and edge[1] == edge[1] and t - edge[0] < ADJACENT_S:
            return edge[1]
        return rq.run_delay_s() if rq is not None else NAN

    # -- steps driven from outside: a framework's loop that fetches its own batches (profiler/integrations/) --
    def open_step(self, t_start: float | None = None) -> None:
        """End the open step at ``t_start`` (a :attr:`clock` reading; now when None) and open the next one there.

        For a loop that fetches its batches itself (Lightning's, Hugging Face's Trainer), where :meth:`wrap`
        cannot stand between the loop and its loader: the hooks that see the fetch give its duration to
        :meth:`add_wait` and the batch's size to :meth:`add_samples`; phases work as under ``wrap()``. The
        run-queue wait is that of the thread that opens the first step, read when these are called: from the
        call here to the last ``add_wait`` (data) and to the step's end (step)."""
        if not self._started:
            raise RuntimeError("Session.open_step() needs a started session: call start() first")
        t = self._clock() if t_start is None else t_start
        rq = self._thread_runq()
        index = self._next_index
        read = rq is not None and index % self._runq_every == 0
        x = rq.run_delay_s() if rq is not None and (read or self._rq_on) else NAN
        if self._step >= 0:
            if self._halts:
                self._halt_before(index, t, x, self._recorder.halt)
            self._end(t, x)
        self._put((OPEN, 0, t, x if read else NAN, index))
        self._opened(index, t, read, rq)

    def add_wait(self, seconds: float) -> None:
        """Add ``seconds`` blocked fetching a batch to the open step's data wait (no step open: ignored)."""
        if self._step >= 0:
            self._put((WAIT, 0, 0.0, seconds, self._runq_now()))

    def add_samples(self, n: int | None) -> None:
        """Count a batch of ``n`` items in the open step; None (a batch whose size cannot be told) makes the
        step's count unknown, as under ``wrap()``."""
        if self._step >= 0:
            self._put((SAMPLES, 0, 0.0, -1.0 if n is None else float(n), NAN))

    def close_step(self, t_end: float | None = None) -> None:
        """End the open step at ``t_end`` (now when None): the loop left it (an epoch ended). No step open: nothing."""
        if self._step >= 0:
            x = self._runq_now()
            self._end(self._clock() if t_end is None else t_end, x)
            self._flush()

    @property
    def in_step(self) -> bool:
        """Whether a step is open (phases entered now are charged to it)."""
        return self._step >= 0

    def phase(self, name: str) -> _Phase:
        """Context manager timing a named part of the current step."""
        p = self._phase_of.get(name)
        if p is None:
            if not self._started:  # nothing to charge it to yet: it counts as outside any step
                return _Phase(self, name, -1)
            p = self._phase_of[name] = _Phase(self, name, self._name_id(name))
        return p

    def _name_id(self, name: str) -> int:
        ident = self._sink.name_id(name)
        self._names[ident] = name
        return ident

    @property
    def clock(self) -> Callable[[], float]:
        """The clock that times steps and phases (``time.perf_counter`` unless given): :meth:`span` takes its
        readings."""
        return self._clock

    def span(self, name: str, t_start: float, t_end: float) -> None:
        """Record a part of the current step that was timed elsewhere, from two :attr:`clock` readings (a DDP
        communication hook's, for the "sync" a rank spent waiting for the others' gradients). It nests in the
        innermost open phase ("compute/sync"), or is top-level when none is open. Host-timed: it carries no
        device times."""
        if not t_start <= t_end:
            raise ValueError(f"span {name!r} ends ({t_end}) before it starts ({t_start})")
        if self._step < 0:
            self._unattributed += 1
            return
        self._put((SPAN, self._name_id(name), t_start, t_end, NAN))

    @property
    def recent(self) -> deque[tuple[StepRow, list[PhaseRow]]]:
        """The newest steps (at most RECENT), as rows made in this process: from the first time they are asked
        for (a live view, a sweep's early stop), or from the start where a hook takes rows. Rows are made every
        HANDOFF_STEPS steps or HANDOFF_S; the hot path makes none where nothing asks."""
        if self._log is None and self._status is None:
            if self._started:
                self._want_rows()
            else:
                self._rows_asked = True  # from the start
        return self._recent

    def _want_rows(self) -> None:
        """Keep the step events here too, from now on, for rows in this process (any thread may ask)."""
        log = ListLog(dict(self._names))
        self._asm = Assembler(self._t0, self.warmup, log.names, first_step=self._next_index)
        self._log = log
        self._sink = sink = log if self._stream is None else Tee(self._stream, log)
        self._put = sink.put

    def _thread_runq(self) -> schedstat.ThreadSched | None:
        """The run-queue reader of the thread that iterates the first ``wrap()``; None on any other thread
        and where schedstat is unavailable (then the hot path does nothing extra)."""
        rq = self._runq
        if rq is not None:
            return rq if rq.ident == threading.get_ident() else None
        if self._runq_reason is not None:
            return None
        try:
            rq = schedstat.ThreadSched()
        except OSError as exc:
            self._runq_reason = f"cannot open the training thread's schedstat: {exc.strerror or exc}"
            self.annotate(schedstat=f"unavailable: {self._runq_reason}")
            return None
        self._runq = rq
        self.annotate(
            schedstat_tid=rq.tid,
            schedstat_path=rq.path.replace("/self/", f"/{os.getpid()}/"),
            schedstat_budget={
                "cost_s": schedstat.RUNQ_COST_S,
                "share": schedstat.RUNQ_BUDGET,
                "max_every": schedstat.RUNQ_MAX_EVERY,
            },
        )
        return rq

    def note_loader(self, loader: object) -> None:
        """Take workers / pin_memory / batch_size from a DataLoader the user did not describe (``wrap()`` does
        it for the loader it is given; a framework's integration for the loader its trainer holds)."""
        found = {key: value for key, value in loader_facts(loader).items() if self._meta.get(key) is None}
        if found:
            self.annotate(**found)


def _run_facts(device: DeviceInfo, warmup: int, sample_hz: float) -> dict[str, object]:
    """The meta every run starts with; the labels a user may give (scenario, loader facts) are None until given."""
    return {
        **dict.fromkeys(LABELS),
        "run_id": uuid.uuid4().hex[:12],
        "warmup_steps": warmup,
        "device": device.to_dict(),
        "sample_hz": sample_hz,
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
    }


def _where(exc: BaseException, tb: TracebackType | None) -> str:
    """``ValueError: msg (at file.py:123 in fn)`` for the innermost frame of the traceback."""
    where = ""
    while tb is not None:
        frame, lineno = tb.tb_frame, tb.tb_lineno
        where = f" (at {os.path.basename(frame.f_code.co_filename)}:{lineno} in {frame.f_code.co_name})"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc}{where}"
