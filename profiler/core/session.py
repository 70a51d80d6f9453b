"""Session: times each training step's phases and hands each step to its hooks (the run store's Recording,
the Prometheus exporter, ...: :mod:`profiler.core.hooks`); it imports none of them.

A step starts the moment the loop asks the loader for its batch and ends when it asks for the next one.
``wrap(loader)`` measures the time blocked in ``next()`` (data wait); ``phase(name)`` measures named parts of
the step (``h2d``, ``compute``, or any user name). Whatever the step spent outside these is "other".

Invariants:
- The hot path (``next()`` wrapper, phase enter/exit) does a ``perf_counter`` read, a list append, on
  CUDA an event record, and where schedstat is available one ``pread`` of the training thread's run-queue
  counter (bytes, parsed when the step is resolved). Everything else (row building, store writes,
  analysis) happens at step end or off-thread. Budget: < 20 us per phase on a 2-core CPU
  (``benchmarks/overhead.py`` measures it).
- On CUDA, a step's record waits in a FIFO until its events have completed; it is resolved by polling
  ``Event.query()`` at later step ends, never by a per-step synchronize. Lag is bounded by ``max_lag``
  steps: past that, the oldest step is waited for. ``close()`` drains the FIFO.
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
from typing import TYPE_CHECKING, Any

from profiler.core.devices import DeviceInfo, DeviceTimer, make_timer, resolve_device
from profiler.core.hooks import Recorder, ServingHook, SessionHook, SinkOptions, make_sinks
from profiler.core.rows import PhaseRow, StepRow
from profiler.core.sources import sched as schedstat
from profiler.core.sources.base import Source, SourceRecipe

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.sampler import Sampler

# name, depth, host start, host end, device events (CUDA), schedstat raws at enter and exit
_PhaseRec = tuple[str, int, float, float, Any, Any, bytes | None, bytes | None]
_Raws = tuple[bytes | None, bytes | None, bytes | None]
# step, t_start, t_end (run time), data wait, samples, warm-up: a step before it is resolved into a StepRow
_StepRec = tuple[int, float, float, float, int | None, bool]


# A phase entered within this long of the boundary before it (the step's next() returning, or the phase before it
# exiting) takes that boundary's schedstat reading and CUDA event as its own start: one read and one event per
# boundary rather than two. What the gap holds (a few microseconds of the loop's own bookkeeping: run-queue wait,
# device work launched in it) is charged to the phase that follows; the host clock is read afresh.
ADJACENT_S = 50e-6
# Steps are resolved (rows built, handed to the hooks) in batches: every RESOLVE_EVERY steps or RESOLVE_S seconds,
# whichever comes first. Right after a step's compute the training thread's caches hold the model's data, not
# stallscope's code: one step's bookkeeping took 45 us there against 8 us a step in a batch (benchmarks/overhead.py).
# A loop's end (its loader exhausted or left) resolves what is pending at once. A SIGKILL loses the steps not yet
# resolved: at most RESOLVE_EVERY steps or RESOLVE_S.
RESOLVE_EVERY = 32
RESOLVE_S = 0.02
RECENT = 1024  # resolved steps kept for live views and a sweep's early stop
# The training thread's schedstat is read at a step's boundaries (its start, its batch's arrival, its phases) on
# every step where that costs under RUNQ_BUDGET of the step, and on one step in k of shorter ones (k up to
# RUNQ_MAX_EVERY, from the last batch of steps' mean time): those reads cost RUNQ_COST_S a step in a fast loop
# (benchmarks/overhead.py: the training thread's CPU time per step with and without them, 41-78 us against 11-16 at
# 1.7 ms steps; the syscalls' own time is 7-10 us, the rest the caches and branch predictors they leave cold).
# Every step is timed by the clock all the same; the run-queue figures are those of the steps read (docs/metrics.md).
RUNQ_COST_S = 45e-6
RUNQ_BUDGET = 0.005
RUNQ_MAX_EVERY = 32
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


def batch_len(batch: Any) -> int | None:
    """Items in a batch: leading dim of the first tensor-like found; None when it cannot be told."""
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, (list, tuple)) and batch:
            first = batch[0]
            if not (hasattr(first, "shape") or isinstance(first, (list, tuple, dict))):
                return len(batch)  # a batch of plain items
            batch = first
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            return None
    return None


class _Phase:
    __slots__ = ("_ev0", "_name", "_r0", "_s", "_t0")

    def __init__(self, session: Session, name: str) -> None:
        self._s = session
        self._name = name

    def __enter__(self) -> _Phase:
        s = self._s
        s._stack.append(self._name)
        rq = s._rq_step
        edge = s._edge
        t0 = s._clock()
        if edge is not None and t0 - edge[0] < ADJACENT_S and (rq is None or edge[2] is not None):
            # right after the step's next() or the phase before: that boundary's event and schedstat reading are
            # this one's (the clock is read afresh: the host times stay exact)
            self._ev0 = edge[1] if edge[1] is not None or s._timer is None else s._timer.mark()
            self._r0, self._t0 = edge[2], t0
            s._edge = None
            return self
        self._ev0 = s._timer.mark() if s._timer is not None else None
        self._r0 = rq.raw() if rq is not None and rq.ident == threading.get_ident() else None
        self._t0 = s._clock()
        return self

    def __exit__(self, *exc: object) -> None:
        s = self._s
        t1 = s._clock()
        rq = s._rq_step
        r1 = rq.raw() if rq is not None and self._r0 is not None else None
        ev1 = s._timer.mark() if s._timer is not None else None
        stack = s._stack
        if not stack or stack[-1] != self._name:
            raise ValueError(f"phase {self._name!r} ended but the innermost open phase is {stack[-1:]}")
        depth = len(stack) - 1
        name = "/".join(stack) if depth else self._name
        stack.pop()
        if s._step < 0:  # before the first batch or after the loop: no step to charge it to
            s._unattributed += 1
            return
        s._edge = (t1, ev1, r1) if not depth else None  # the next top-level phase may start from here
        s._phases.append((name, depth, self._t0, t1, self._ev0, ev1, self._r0, r1))


class Session:
    """Profile a training loop. See DESIGN.md "Python API"."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        sample_hz: float = 10.0,
        device: str | DeviceInfo = "auto",
        warmup: int = 0,
        meta: dict[str, Any] | None = None,
        sources: Sequence[Source | SourceRecipe] | None = None,
        prometheus: str | int | None = None,
        sampling: str = "process",
        hooks: Sequence[SessionHook] = (),
        store_errors: str = "warn",
        clock: Callable[[], float] = time.perf_counter,
        timer: DeviceTimer | None = None,
        max_lag: int = 32,
    ) -> None:
        """``meta``: run facts for the store (scenario, pipeline, batch_size, workers, pin_memory, or any other);
        ``prometheus``: "[ADDR:]PORT" served while the session runs (checked here, bound at start); ``hooks``:
        more sinks, started after the run's own; ``max_lag``: steps whose device events may be pending; ``sources``
        and ``sampling``: docs/architecture.md, "Two processes"."""
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.out_dir = Path(out_dir)
        self.device = device if isinstance(device, DeviceInfo) else resolve_device(device)
        self.sample_hz, self.warmup = sample_hz, warmup
        self._clock, self._max_lag = clock, max_lag
        self._resolve_every, self._resolved_at = min(RESOLVE_EVERY, max_lag + 1), 0.0
        self._meta: dict[str, Any] = {**_run_facts(self.device, warmup, sample_hz), **(meta or {})}
        sinks = make_sinks(
            SinkOptions(self.out_dir, self._meta, sample_hz, sources, clock, store_errors, prometheus, sampling)
        )
        self._recorder: Recorder = sinks.recorder
        self._hooks: list[SessionHook] = [*sinks.hooks, sinks.recorder, *hooks]  # an exporter binds first
        self._exporter = sinks.exporter
        self._halts = store_errors == "raise"
        # hot-path state
        self._stack: list[str] = []
        self._phases: list[_PhaseRec] = []
        # the open step's last boundary (clock, event, schedstat raw): a phase entered right after shares it
        self._edge: tuple[float, Any, bytes | None] | None = None
        self._step, self._step_t0, self._step_wait = -1, 0.0, 0.0  # the open step (index -1: none), its start, wait
        self._step_samples: int | None = None
        self._waiting_since: float | None = None  # a clock reading while wrap()'s next() is in progress
        self._samples_unknown = False  # a step opened by open_step() took a batch whose size cannot be told
        self._pending: deque[tuple[_StepRec, list[_PhaseRec], _Raws]] = deque()
        self._runq: schedstat.ThreadSched | None = None
        self._runq_reason: str | None = None
        # _runq while the open step's schedstat is read, which is on one step in _runq_every (RUNQ_BUDGET)
        self._rq_step: schedstat.ThreadSched | None = None
        self._runq_every = 1
        self._step_raws: tuple[bytes | None, bytes | None] = (None, None)
        self._next_index, self._unattributed = 0, 0
        # live view: the newest resolved steps, bounded
        self.recent: deque[tuple[StepRow, list[PhaseRow]]] = deque(maxlen=RECENT)
        self._timer: DeviceTimer | None = timer
        self._started, self._t0 = False, 0.0
        self._step_sinks: tuple[Callable[[StepRow, Sequence[PhaseRow]], None], ...] = ()
        self._status: str | None = None
        self._error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.out_dir

    @property
    def meta(self) -> dict[str, Any]:
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
        started: list[SessionHook] = []
        try:
            for hook in self._hooks:
                hook.on_start(self)
                started.append(hook)
        except BaseException as exc:
            for hook in reversed(started):
                hook.on_close("failed", str(exc))
            raise
        self._step_sinks = tuple(hook.on_step for hook in self._hooks)
        self._runq_reason = schedstat.probe()
        self.annotate(schedstat=f"unavailable: {self._runq_reason}" if self._runq_reason else "available")
        return self

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

    def annotate(self, **items: Any) -> None:
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
        Recording: sampler, py-spy, store, summary.json); returns the run's Summary (None if it could not be
        built; the store still holds the run)."""
        if not self._started or self._status is not None:
            return self.summary()
        self._status, self._error = status, error
        if self._step >= 0:
            rq = self._rq_step
            self._end_step(self._clock(), rq.raw() if rq is not None and rq.ident == threading.get_ident() else None)
        self._resolve(drain=True)
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
        """Seconds of each measured (non-warm-up) step the store holds, in order, read back from it: while the
        run goes on, those committed so far (at most ``flush_s`` behind); after close, every one."""
        return [s.t_end - s.t_start for s in self._recorder.committed_steps() if not s.warmup]

    def own_step_times(self) -> list[float]:
        """:meth:`step_times` less each step's run-queue wait (the training thread runnable but given no CPU): the
        steps as the training would take them on a core of its own, for the steps whose wait was measured (every
        step, or one in k of short ones: RUNQ_BUDGET); empty where none was."""
        return [
            s.t_end - s.t_start - s.runq_s
            for s in self._recorder.committed_steps()
            if not s.warmup and s.runq_s is not None and math.isfinite(s.runq_s)
        ]

    @property
    def recording(self) -> Recorder:
        """The hook that keeps the run (the Recording: store, sampler, py-spy)."""
        return self._recorder

    # -- hot path ---------------------------------------------------------------------------------
    def _now(self) -> float:
        return self._clock() - self._t0

    def _iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """iter(): where a DataLoader starts its workers; the sampler then looks for them at its next reading."""
        it = iter(iterable)
        self._recorder.rescan_soon()
        return it

    def wrap(
        self, iterable: Iterable[Any], *, samples: int | Callable[[Any], int | None] | None = None
    ) -> Generator[Any, None, None]:
        """Yield from ``iterable``; time blocked in ``next()`` is the step's data wait."""
        if not self._started:
            raise RuntimeError("Session.wrap() needs a started session: use `with Session(...) as s:`")
        self.note_loader(iterable)
        count = samples if callable(samples) else (lambda _b: samples) if samples is not None else batch_len
        clock = self._clock
        rq = self._thread_runq()
        raw = rq.raw if rq is not None else None
        halt = self._recorder.halt if self._halts else None
        t_iter: float | None = clock()
        r_iter = raw() if raw else None
        it = self._iterate(iterable)  # the workers' start: that wait belongs to the first step
        try:
            while True:
                t0 = self._waiting_since = clock()
                read = raw is not None and self._next_index % self._runq_every == 0  # this step's schedstat
                r0 = self._boundary_raw(t0, raw) if read or self._rq_step is not None else None
                # the step before ends at t0, but its row is made after next() returns: the bookkeeping (sinks,
                # the store's queue) is not the loader's time, and on a busy host it can wait for a CPU or a lock
                ended: list[_PhaseRec] | None = None
                if self._step >= 0:
                    if halt is not None and (stop := halt(self._next_index)) is not None:
                        self._end_step(t0, r0)
                        raise stop
                    ended, self._phases = self._phases, []
                elif t_iter is not None:
                    t0, t_iter, r0 = t_iter, None, r_iter
                try:
                    batch = next(it)
                except StopIteration:
                    if ended is not None:
                        self._end_step(t0, r0, ended)
                    self._resolve()
                    return
                except BaseException:
                    if ended is not None:  # the loader failed: the step before still ended at t0
                        self._end_step(t0, r0, ended)
                    raise
                t1, self._waiting_since = clock(), None
                r1 = raw() if read and raw else None
                if ended is not None:
                    self._end_step(t0, r0, ended)
                self._open(t0, t1, (r0, r1) if read else None, count(batch))
                yield batch
        finally:
            self._waiting_since = None
            # the loop broke out or raised: the step in flight ends now
            if self._step >= 0 and self._status is None:
                self._end_step(clock(), raw() if raw and self._rq_step is not None else None)
                self._resolve()

    def _open(self, t0: float, t1: float, raws: tuple[bytes | None, bytes | None] | None, samples: int | None) -> None:
        """Open the next step under wrap(): it began at ``t0`` and its batch came at ``t1``; ``raws``: the training
        thread's schedstat at both (None: this step's is not read, RUNQ_BUDGET)."""
        self._edge = (t1, None, raws[1] if raws is not None else None)
        self._step_raws = raws if raws is not None else (None, None)
        self._rq_step = self._runq if raws is not None else None
        self._step, self._next_index = self._next_index, self._next_index + 1
        self._step_t0, self._step_wait = t0, t1 - t0
        self._step_samples = samples

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
        read = rq is not None and self._next_index % self._runq_every == 0
        raw = rq.raw() if rq is not None and (read or self._rq_step is not None) else None
        if self._step >= 0:
            self._end_step(t, raw)
            if self._halts and (stop := self._recorder.halt(self._next_index)) is not None:
                raise stop  # as wrap() does: the user asked training to stop
        self._step = self._next_index
        self._next_index += 1
        self._step_t0 = t
        self._step_wait = 0.0
        self._step_samples = None
        self._samples_unknown = False
        self._step_raws = (raw if read else None, None)
        self._rq_step = rq if read else None

    def add_wait(self, seconds: float) -> None:
        """Add ``seconds`` blocked fetching a batch to the open step's data wait (no step open: ignored)."""
        if self._step >= 0:
            self._step_wait += seconds
            start = self._step_raws[0]
            if start is not None and (rq := self._rq_step) is not None and rq.ident == threading.get_ident():
                self._step_raws = (start, rq.raw())

    def add_samples(self, n: int | None) -> None:
        """Count a batch of ``n`` items in the open step; None (a batch whose size cannot be told) makes the
        step's count unknown, as under ``wrap()``."""
        if self._step < 0 or self._samples_unknown:
            return
        if n is None:
            self._samples_unknown, self._step_samples = True, None
        else:
            self._step_samples = (self._step_samples or 0) + n

    def close_step(self, t_end: float | None = None) -> None:
        """End the open step at ``t_end`` (now when None): the loop left it (an epoch ended). No step open: nothing."""
        if self._step >= 0:
            rq = self._rq_step
            raw = rq.raw() if rq is not None and rq.ident == threading.get_ident() else None
            self._end_step(self._clock() if t_end is None else t_end, raw)

    @property
    def in_step(self) -> bool:
        """Whether a step is open (phases entered now are charged to it)."""
        return self._step >= 0

    def phase(self, name: str) -> _Phase:
        """Context manager timing a named part of the current step."""
        return _Phase(self, name)

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
        stack = self._stack
        full = "/".join([*stack, name]) if stack else name
        self._phases.append((full, len(stack), t_start, t_end, None, None, None, None))

    def _end_step(self, t_end: float, r_end: bytes | None = None, phases: list[_PhaseRec] | None = None) -> None:
        """End the open step at ``t_end`` with ``phases`` (those recorded since it began, taken out of the list
        already; None: take them now)."""
        if phases is None:
            phases, self._phases = self._phases, []
        self._edge = None
        t0 = self._t0
        # a plain tuple here: the StepRow is made when the step is resolved, in a batch (RESOLVE_EVERY)
        row = (
            self._step,
            self._step_t0 - t0,
            t_end - t0,
            self._step_wait,
            self._step_samples,
            self._step < self.warmup,
        )
        self._step, self._rq_step = -1, None
        pending = self._pending
        pending.append((row, phases, (*self._step_raws, r_end)))
        if len(pending) >= self._resolve_every or t_end - self._resolved_at >= RESOLVE_S:
            self._resolved_at = t_end
            first, last = pending[0][0], pending[-1][0]
            self._runq_every = runq_every((last[2] - first[1]) / len(pending))
            self._resolve()

    def _resolve(self, drain: bool = False) -> None:
        timer, pending, t0 = self._timer, self._pending, self._t0
        while pending:
            rec, phases, raws = pending[0]
            last = next((p[5] for p in reversed(phases) if p[5] is not None), None) if timer is not None else None
            if timer is not None and last is not None and not timer.done(last):
                if not drain and len(pending) <= self._max_lag:
                    return
                timer.wait(last)
            pending.popleft()
            row = step_runq(rec, raws)
            out: list[PhaseRow] = []
            events: dict[int, Any] = {}  # adjacent phases share the event at their boundary: released once
            for name, depth, a, b, ev0, ev1, r0, r1 in phases:
                rq = schedstat.delay_between(r0, r1)
                if timer is not None and ev0 is not None:
                    dev0, dev1 = timer.time_of(ev0), timer.time_of(ev1)
                    out.append(PhaseRow(row.step, name, depth, a - t0, b - t0, dev0, dev1, runq_s=rq))
                    events[id(ev0)], events[id(ev1)] = ev0, ev1
                else:
                    out.append(PhaseRow(row.step, name, depth, a - t0, b - t0, runq_s=rq))
            for ev in events.values():
                timer.release(ev)  # type: ignore[union-attr]
            for on_step in self._step_sinks:
                on_step(row, out)
            self.recent.append((row, out))

    def _boundary_raw(self, t: float, raw: Callable[[], bytes] | None) -> bytes | None:
        """The schedstat reading at a step boundary at ``t``: right after the last phase's exit (ADJACENT_S), that
        exit's reading; else a new one (None without schedstat)."""
        edge = self._edge
        if edge is not None and edge[2] is not None and t - edge[0] < ADJACENT_S:
            return edge[2]
        return raw() if raw else None

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
            schedstat_budget={"cost_s": RUNQ_COST_S, "share": RUNQ_BUDGET, "max_every": RUNQ_MAX_EVERY},
        )
        return rq

    def note_loader(self, loader: Any) -> None:
        """Take workers / pin_memory / batch_size from a DataLoader the user did not describe (``wrap()`` does
        it for the loader it is given; a framework's integration for the loader its trainer holds)."""
        found = {key: value for key, value in loader_facts(loader).items() if self._meta.get(key) is None}
        if found:
            self.annotate(**found)


def runq_every(step_s: float) -> int:
    """Read the training thread's schedstat on one step in this many, for steps of ``step_s`` seconds: its reads
    kept under RUNQ_BUDGET of a step (every step from 9 ms up), at least one step in RUNQ_MAX_EVERY."""
    if not step_s > 0:
        return 1
    return max(1, min(RUNQ_MAX_EVERY, math.ceil(RUNQ_COST_S / (RUNQ_BUDGET * step_s) - 1e-9)))  # 9 ms: 1, not 2


def loader_facts(loader: Any) -> dict[str, Any]:
    """``workers``, ``pin_memory`` and ``batch_size`` of a DataLoader-like object, those it has."""
    return {
        key: getattr(loader, attr)
        for key, attr in (("workers", "num_workers"), ("pin_memory", "pin_memory"), ("batch_size", "batch_size"))
        if isinstance(getattr(loader, attr, None), (int, bool))
    }


def step_runq(rec: _StepRec, raws: _Raws) -> StepRow:
    """The step's row, with its data-wait and whole-step run-queue wait from the raws at start, after next(), end."""
    start, waited, end = raws
    if start is None:
        return StepRow(*rec)
    delay = schedstat.run_delay_s
    t0 = delay(start)
    return StepRow(*rec, None if waited is None else delay(waited) - t0, None if end is None else delay(end) - t0)


def _run_facts(device: DeviceInfo, warmup: int, sample_hz: float) -> dict[str, Any]:
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
