"""Session: a profiled run of a training loop. It times each step's phases (its hot path is
:class:`~profiler.core.steps.clock.StepClock`) and hands the steps to its hooks (the run store's recorder, the
Prometheus exporter, ...: :mod:`profiler.core.hooks`); it imports none of them.

A step starts the moment the loop asks the loader for its batch and ends when it asks for the next one.
``wrap(loader)`` measures the time blocked in ``next()`` (data wait); ``phase(name)`` measures named parts of
the step (``h2d``, ``compute``, or any user name). Whatever the step spent outside these is "other".

Invariants:
- The hot path makes no row and hands its step events on in batches (:mod:`profiler.core.steps.clock`); on CUDA it
  never synchronizes per step.
- Exiting the ``with`` block records a status: ``complete``; ``interrupted`` for KeyboardInterrupt or a
  signal the CLI turned into :class:`Interrupted`; ``failed`` (with where) for any other exception, which
  propagates unchanged. Every step recorded so far stays in the store.
- A run store that stops writing (disk full, over quota, its directory removed): with ``store_errors="warn"``
  (the default, a user's own loop) the training goes on and the store's writer says so once; with
  ``"raise"`` (the CLI's runner) the recorder's :meth:`~profiler.core.hooks.Recorder.halt` gives the error that
  the next step raises out of ``wrap()``, naming the file, the step and the last step kept.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

from profiler.core.hooks import HookSet, Recorder, ServingHook, SessionHook, SinkOptions, make_sinks
from profiler.core.kernel_windows.windows import KernelRecorder, KernelWindows, WindowPlan, make_recorder, parse_plan
from profiler.core.rows import TAIL_KEY, PhaseRow, StepRow, held_steps
from profiler.core.sources import sched as schedstat
from profiler.core.sources.base import Source, SourceRecipe
from profiler.core.steps.batch_facts import loader_facts
from profiler.core.steps.clock import HANDOFF_STEPS, Phase, StepClock
from profiler.core.steps.device_marks import DeviceMarks
from profiler.core.steps.device_timers import DeviceInfo, DeviceTimer, make_timer, resolve_device
from profiler.core.steps.events import EventSink
from profiler.core.steps.local_rows import RECENT, RowsHere, RowSink

if TYPE_CHECKING:
    from profiler.core.hooks import RunSummary
    from profiler.core.sampling.sampler import Sampler

_T = TypeVar("_T")  # what a wrapped iterable yields
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


class Session:
    """Profile a training loop (docs/quickstart.md, "Instrumenting your own training loop")."""

    __slots__ = (
        "__weakref__", "_clock", "_error", "_exporter", "_hooks", "_kw", "_kw_plan", "_kw_recorder", "_max_lag",
        "_meta", "_recent", "_recorder", "_row_sinks", "_rows_asked", "_st", "_started", "_status", "_steps",
        "_stream", "_t0", "_timer", "device", "out_dir", "phase", "sample_hz", "warmup",
    )  # fmt: skip
    # ``with s.phase(name):`` times a named part of the current step (a context manager, one per name). It is the
    # phase table's own lookup, C for a name seen before: no Python frame a step (core.steps.clock.PhaseTable)
    phase: Callable[[str], Phase]
    _kw: KernelWindows | None  # the kernel windows' schedule, from the start where the device has a recorder

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
        log_to: object = None,
        log_every_s: float = 10.0,
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
        ``prometheus``: "[ADDR:]PORT" served while the session runs (checked here, bound at start); ``log_to``:
        experiment trackers ("tensorboard:DIR", "mlflow[:URI]", "wandb", or a list) given the run's stall/ figures
        every ``log_every_s`` seconds, off the training thread (docs/integrations.md); ``hooks``:
        more sinks, started after the run's own; ``max_lag``: steps whose device events may be pending; ``sources``
        and ``sampling``: docs/architecture.md, "Two processes"; ``kernel_windows``: when the device's own activity is
        recorded (``off``, ``auto``, ``AFTER:STEPS[:EVERY]``: :mod:`profiler.core.kernel_windows.windows`), by
        ``kernel_recorder`` (default: CUPTI on CUDA, the simulated device's own, none on CPU); ``steps``: the
        measured steps the loop will run after the warm-up, where known: ``auto`` then records one window after
        them, for which the loop runs :attr:`tail_steps` steps more (docs/metrics.md, "Kernel windows' cost")."""
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.out_dir = Path(out_dir)
        self.device = device if isinstance(device, DeviceInfo) else resolve_device(device)
        self.sample_hz, self.warmup, self._clock, self._max_lag = sample_hz, warmup, clock, max_lag
        self._meta: dict[str, object] = {**_run_facts(self.device, warmup, sample_hz), **(meta or {})}
        options = SinkOptions(self.out_dir, self._meta, sample_hz, sources, clock, store_errors, prometheus, sampling)
        sinks = make_sinks(dataclasses.replace(options, log_to=log_to, log_every_s=log_every_s))
        self._recorder: Recorder = sinks.recorder
        self._hooks = HookSet([*sinks.hooks, sinks.recorder, *hooks])  # an exporter binds first
        self._exporter, self._timer = sinks.exporter, timer
        self._kw_plan = kernel_windows if not isinstance(kernel_windows, str) else parse_plan(kernel_windows)
        self._kw_recorder, self._kw = kernel_recorder, None
        self._steps, self._started, self._t0 = steps, False, 0.0
        self._status: str | None = None  # the run's end, once known, and its error
        self._error: str | None = None
        self._st = StepClock(
            clock, self._recorder, self.annotate,
            warmup=warmup, halts=store_errors == "raise", handoff_steps=min(HANDOFF_STEPS, max_lag + 1),
        )  # fmt: skip
        self.phase = self._st.phases.__getitem__
        if steps is not None:  # the loop's end, where the workers' last memory reading is asked before it
            self._st.wreads.run_length(steps)
        # where the step events go (set at start): a hook's stream (the sampler process's ring), rows made here
        self._stream: EventSink | None = None
        self._row_sinks: tuple[RowSink, ...] = ()
        self._recent: deque[tuple[StepRow, list[PhaseRow]]] = deque(maxlen=RECENT)
        self._rows_asked = False  # recent was asked for before the start

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

    def start(self) -> Self:
        """Start the hooks in order (an exporter binds first: a port in use records nothing); a hook that fails
        to start ends those started before it, and its error propagates."""
        if self._started:
            return self
        self._started = self._st.phases.started = True
        self._t0 = self._clock()
        if self._timer is None:
            self._timer = make_timer(self.device, self._now)
        elif callable(bind := getattr(self._timer, "bind", None)):
            bind(self._now)  # a timer given to the Session (the simulated device's) joins the run's clock
        self._meta["device_timer"] = self._timer.kind if self._timer is not None else "host-perf-counter"
        st = self._st
        st.marks = st.edges.marks = DeviceMarks(self._timer, self._max_lag) if self._timer is not None else None
        st.read_edges = st.marks is not None
        self._meta["kernel_windows"] = self._plan_windows()
        st.windows = self._kw
        self._hooks.start(self)
        self._connect()
        reason = st.edges.reason = schedstat.probe()
        self.annotate(schedstat=f"unavailable: {reason}" if reason else "available")
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
        index = self._st.next_index
        n = self._kw.tail_at(index) if self._kw is not None else 0
        if n:
            self._st.tick_next()
            self.annotate(**{TAIL_KEY: index})
        return n

    def _connect(self) -> None:
        """The step events go to the first hook that takes them (the sampler process's ring), and to a log here
        when a hook takes rows instead."""
        self._stream, rows = self._hooks.connect()
        self._row_sinks = tuple(rows)
        if self._stream is not None:
            self._st.send_to(self._stream)
            # the sampler process reads the windows' activities (core.kernel_windows.trace_file)
            if self._kw is not None:
                self._kw.handoff = self.out_dir
        if self._stream is None or rows or self._rows_asked:
            self._want_rows()

    def __enter__(self) -> Self:
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
            self._hooks.meta(items)

    def event(self, kind: str, message: str) -> None:
        """Record a free-form event (warning, skipped sample, ...) at the current time."""
        if self._started:
            self._hooks.event(kind, message)

    def close(self, status: str = "complete", error: str | None = None) -> RunSummary | None:
        """End the run: close the open step, drain device events, then the hooks in reverse order (the
        ThreadRecorder: sampler, py-spy, store, summary.json); returns the run's Summary (None if it could not be
        built; the store still holds the run)."""
        if not self._started or self._status is not None:
            return self.summary()
        self._status, self._error = status, error
        for why in self._st.close():
            self.event("warning", f"kernel windows: {why}")
        if self._st.unattributed:
            self.event("warning", f"{self._st.unattributed} phase(s) ran outside any step")
        self._hooks.close(status, error)
        return self.summary()

    def summary(self) -> RunSummary | None:
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

    # -- the steps (the hot path: profiler.core.steps.clock) ----------------------------------------------
    def _now(self) -> float:
        return self._clock() - self._t0

    def wrap(
        self, iterable: Iterable[_T], *, samples: int | Callable[[_T], int | None] | None = None
    ) -> Generator[_T, None, None]:
        """Yield from ``iterable``; time blocked in ``next()`` is the step's data wait. ``samples``: the items in a
        batch (a number, or a function of the batch; default: its length where it can be told)."""
        if not self._started:
            raise RuntimeError("Session.wrap() needs a started session: use `with Session(...) as s:`")
        self.note_loader(iterable)
        return self._st.wrap(iterable, samples)

    @property
    def in_step(self) -> bool:
        """Whether a step is open (phases entered now are charged to it)."""
        return self._st.step >= 0

    @property
    def waiting_since(self) -> float | None:
        """When (a :attr:`clock` reading) the ``next()`` that :meth:`wrap` is in now began; None outside one."""
        return self._st.waiting_since

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
        self._st.open_step(self._clock() if t_start is None else t_start)

    def add_wait(self, seconds: float) -> None:
        """Add ``seconds`` blocked fetching a batch to the open step's data wait (no step open: ignored)."""
        self._st.add_wait(seconds)

    def add_samples(self, n: int | None) -> None:
        """Count a batch of ``n`` items in the open step; None (a batch whose size cannot be told) makes the
        step's count unknown, as under ``wrap()``."""
        self._st.add_samples(n)

    def close_step(self, t_end: float | None = None) -> None:
        """End the open step at ``t_end`` (now when None): the loop left it (an epoch ended). No step open: nothing."""
        self._st.close_step(t_end)

    def span(self, name: str, t_start: float, t_end: float) -> None:
        """Record a part of the current step that was timed elsewhere, from two :attr:`clock` readings (a DDP
        communication hook's, for the "sync" a rank spent waiting for the others' gradients). It nests in the
        innermost open phase ("compute/sync"), or is top-level when none is open. Host-timed: it carries no
        device times."""
        if not t_start <= t_end:
            raise ValueError(f"span {name!r} ends ({t_end}) before it starts ({t_start})")
        self._st.span(name, t_start, t_end)

    @property
    def clock(self) -> Callable[[], float]:
        """The clock that times steps and phases (``time.perf_counter`` unless given): :meth:`span` takes its
        readings."""
        return self._clock

    @property
    def recent(self) -> deque[tuple[StepRow, list[PhaseRow]]]:
        """The newest steps (at most RECENT), as rows made in this process: from the first time they are asked
        for (a live view, a sweep's early stop), or from the start where a hook takes rows. Rows are made every
        HANDOFF_STEPS steps or HANDOFF_S; the hot path makes none where nothing asks."""
        if self._st.here is None and self._status is None:
            if self._started:
                self._want_rows()
            else:
                self._rows_asked = True  # from the start
        return self._recent

    def _want_rows(self) -> None:
        """Keep the step events here too, from now on, for rows in this process (any thread may ask)."""
        st = self._st
        here = RowsHere(st.names, (self._t0, self.warmup, st.next_index), self._row_sinks, self._hooks, self._recent)
        st.keep_rows(here, self._stream)

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
