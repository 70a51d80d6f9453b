"""The hooks a Session drives: every sink of a run's steps (the run store's ThreadRecorder, the Prometheus exporter,
a live feed, a sweep's early stop, any future sink) implements :class:`SessionHook`.

Invariants: Session calls ``on_step`` on the training thread once per step, in batches (its tick), so a hook's
``on_step`` only appends or queues (the store's is a queue put). A hook that makes rows elsewhere says so: its
``step_events()`` returns where the Session puts its step events (:class:`profiler.core.steps.events.EventSink`;
the sampler process's ring) and ``wants_rows = False`` spares it ``on_step``; where no hook takes rows, the
training process makes none; a hook that must stop the training (a store that can no
longer write, under ``store_errors="raise"``) says so through :meth:`Recorder.halt`, never by raising from
``on_step``. Session imports no sink: the sinks of ``Session(out_dir, ...)`` come from the factory installed
with :func:`install` (``profiler/runs/sinks.py`` installs :func:`profiler.runs.sinks.default_sinks`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from profiler.core.rows import PhaseRow, StepRow
from profiler.core.sources.base import Source, SourceRecipe
from profiler.core.steps.events import EventSink
from profiler.core.store.writer import StoreWriteError

if TYPE_CHECKING:
    from profiler.core.sampler_process.views import ViewRecipe
    from profiler.core.sampling.sampler import Sampler
    from profiler.core.sources.memory import Taken


class RunSummary(Protocol):
    """What the core knows of a run's Summary (``profiler.analysis.summary.Summary``, built above the core by the
    summarizer a recorder is given): only that it is the ``summary.json`` object. The core hands it on untouched;
    ``profiler.runs.session.Session`` gives it its full type."""

    def to_dict(self) -> dict[str, object]:
        """The summary.json object."""
        ...


class SessionView(Protocol):
    """What a hook may read of the Session that drives it."""

    @property
    def meta(self) -> dict[str, object]: ...

    @property
    def t0(self) -> float: ...

    @property
    def status(self) -> str | None: ...

    @property
    def sampler(self) -> Sampler | None: ...

    @property
    def recent(self) -> deque[tuple[StepRow, list[PhaseRow]]]: ...


class SessionHook(Protocol):
    """A sink of a Session's run: told when it starts, of each run fact, step and event, and when it ends."""

    def on_start(self, session: SessionView) -> None:
        """Before the first step (the ThreadRecorder creates its store here; an exporter binds its port)."""

    def on_meta(self, items: Mapping[str, object]) -> None:
        """Run facts recorded with :meth:`Session.annotate`."""

    def on_step(self, row: StepRow, phases: Sequence[PhaseRow]) -> None:
        """One resolved step and its phases (training thread: append or queue only)."""

    def on_event(self, kind: str, message: str) -> None:
        """A free-form event (warning, skipped sample, ...)."""

    def on_close(self, status: str, error: str | None) -> None:
        """The run ended: ``complete``, ``interrupted`` or ``failed`` (with where)."""


class Recorder(SessionHook, Protocol):
    """The hook that keeps the run: its store, its sampler and, after close, its Summary."""

    @property
    def sampler(self) -> Sampler | None: ...

    @property
    def summary(self) -> RunSummary | None: ...

    @property
    def failure(self) -> StoreWriteError | None:
        """Why the store stopped writing (it keeps what it committed before), else None."""

    def halt(self, step: int) -> BaseException | None:
        """The exception that stops the training before ``step`` (a store that stopped writing, when the owner
        asked for that), else None. Called once per step."""

    def committed_steps(self) -> list[StepRow]:
        """The step rows the store holds so far, read back from it."""

    def rescan_soon(self) -> None:
        """A loader has just started its workers: sources that follow the process tree look at their next read."""

    def read_memory_soon(self, taken: Taken | None = None) -> None:
        """Read the loader workers' memory at the next round, off its schedule
        (profiler.core.sampling.worker_memory_asks); with ``taken``, store the readings the training process took of
        them now, at its loop's end."""

    def start_pyspy(self, pid: int, *, rate: int, attach_timeout_s: float, unavailable: str) -> str | None:
        """Record ``pid`` and its subprocesses with py-spy until close; None when it attached (or was asked to),
        else the reason (stored and shown as ``unavailable.format(problem=...)``)."""

    def add_views(self, recipes: Sequence[ViewRecipe], fallback: Callable[[], object]) -> bool:
        """Live views (a dashboard, the Prometheus endpoint) served by another process while the run records: True
        when they are (``fallback()`` shows them from this process should that process not start or be lost),
        False when this recorder has no other process (the caller shows them here). Given before the start."""


class HookSet:
    """A Session's hooks in the order they start (an exporter binds first); they close in reverse order."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: Sequence[SessionHook]) -> None:
        self.hooks = tuple(hooks)

    def __iter__(self) -> Iterator[SessionHook]:
        return iter(self.hooks)

    def start(self, session: SessionView) -> None:
        """Start each in order; one that fails ends those started before it ("failed"), and its error propagates."""
        started: list[SessionHook] = []
        try:
            for hook in self.hooks:
                hook.on_start(session)
                started.append(hook)
        except BaseException as exc:
            for hook in reversed(started):
                hook.on_close("failed", str(exc))
            raise

    def connect(self) -> tuple[EventSink | None, list[Callable[[StepRow, Sequence[PhaseRow]], None]]]:
        """Where the step events go: the first hook's ``step_events()`` that gives a sink (the sampler process's
        ring), and the ``on_step`` of every other hook that takes rows."""
        stream: EventSink | None = None
        rows: list[Callable[[StepRow, Sequence[PhaseRow]], None]] = []
        for hook in self.hooks:
            events = getattr(hook, "step_events", None)
            sink = events() if callable(events) else None
            if sink is not None and stream is None:
                stream = sink
            elif getattr(hook, "wants_rows", True):
                rows.append(hook.on_step)
        return stream, rows

    def meta(self, items: Mapping[str, object]) -> None:
        for hook in self.hooks:
            hook.on_meta(items)

    def event(self, kind: str, message: str) -> None:
        for hook in self.hooks:
            hook.on_event(kind, message)

    def close(self, status: str, error: str | None) -> None:
        for hook in reversed(self.hooks):
            hook.on_close(status, error)


class ServingHook(SessionHook, Protocol):
    """A hook that serves the run's figures while it runs (the Prometheus exporter of ``prometheus=``)."""

    @property
    def url(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What a user passes to ``Session(...)`` that belongs to its sinks rather than to the step timing."""

    out_dir: Path
    meta: dict[str, object]
    sample_hz: float
    sources: Sequence[Source | SourceRecipe] | None = None
    clock: Callable[[], float] = time.perf_counter
    store_errors: str = "warn"
    prometheus: str | int | None = None
    sampling: str = "process"  # "process": a sampler process beside this one; "thread": threads in this one
    log_to: object = None  # experiment trackers logged to while the run records (profiler.trackers.live)
    log_every_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Sinks:
    """A Session's sinks: the recorder, and the other hooks in the order they start (they close in reverse)."""

    recorder: Recorder
    hooks: list[SessionHook] = field(default_factory=list)
    exporter: ServingHook | None = None  # also in ``hooks``


SinkFactory = Callable[[SinkOptions], Sinks]
_factory: list[SinkFactory] = []


def install(factory: SinkFactory) -> None:
    """Make ``factory`` build the sinks of every ``Session(out_dir, ...)`` made from now on."""
    _factory[:] = [factory]


def make_sinks(options: SinkOptions) -> Sinks:
    """The installed factory's sinks for ``options`` (ValueError for a bad option, e.g. a prometheus port)."""
    if not _factory:
        raise RuntimeError("no Session sinks are installed: import profiler (its core package installs them)")
    return _factory[0](options)
