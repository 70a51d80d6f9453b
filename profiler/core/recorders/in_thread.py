"""ThreadRecorder: one run's record from start to close in this process — run store, its watchers (the sampler and
py-spy: :mod:`profiler.core.sampling.sampler_and_pyspy`), run status.

Both ways of profiling record through it: a :class:`~profiler.core.session.Session` as its recorder hook, and
:func:`profiler.zerocode.profile.profile_external` directly. docs/store.md, "A run's life", gives the order.
Invariants:
- ``close()`` is idempotent and returns the Summary (the same one on every call); a summary that cannot be
  built is logged, not raised: the store is the record.
- A run store that stops writing never stops the training from here (unless ``store_errors="raise"``: then
  the CLI's runner stops the run); close writes no ``summary.json`` that would claim more than the store holds.
- py-spy is started in one place (:meth:`profiler.core.sampling.sampler_and_pyspy.Watchers.start_pyspy`); one that
  cannot attach is a warning.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.core.rows import KernelWindow, PhaseRow, RunRecord, StepRow
from profiler.core.sampling.sampler import Sampler
from profiler.core.sampling.sampler_and_pyspy import Watchers
from profiler.core.sources.base import Source
from profiler.core.store import RunStore, StoreWriteError

if TYPE_CHECKING:
    from profiler.core.hooks import RunSummary, SessionView
    from profiler.core.sampler_process.views import ViewRecipe
    from profiler.core.sources.memory import Taken

log = logging.getLogger("stallscope")
# (the run's rows, its directory, whether to write summary.json, warn) -> its Summary, None where it failed
Summarizer = Callable[[Callable[[], RunRecord], Path, bool, Callable[[str], None]], "RunSummary | None"]


def log_warning(message: str) -> None:
    """The default ``warn``: one line through the ``stallscope`` logger (the CLI sends it to stderr)."""
    log.warning("stallscope: %s", message)


STORE_ERRORS = ("warn", "raise")  # what a store that stops writing does to the training: said, or stops it


def checked_store_errors(value: str) -> str:
    """``store_errors=`` checked (both recorders): ValueError naming the value and what is allowed."""
    if value not in STORE_ERRORS:
        raise ValueError(f"store_errors={value!r}: allowed 'warn' or 'raise'")
    return value


def running_meta(meta: Mapping[str, object], sample_hz: float, **more: object) -> dict[str, object]:
    """A new run's meta (both recorders): the facts given, ``status`` running, this process and the start."""
    now = time.time()
    return {**meta, "status": "running", "pid": os.getpid(), "started_at": now, "heartbeat": now,
            "sample_hz": sample_hz, **more}  # fmt: skip


def store_failed_line(failure: StoreWriteError) -> str:
    """What both recorders say (with ``store_errors="warn"``) when the store stops writing."""
    return f"{failure}; recording stopped, training goes on ({failure.kept})"


def default_sources(pid: int | None = None, *, nvml: bool = True) -> list[Source]:
    """The sources every run samples: host (psutil) for ``pid``'s process tree, the run-queue wait of its
    threads and workers (schedstat; workers labelled as the host source labels them), where its loader
    processes' time goes (on a CPU, waiting for one, blocked on what), their memory (USS, PSS), NVML, and (in
    this process) the pin-memory thread's CPU and the pinned bytes. ``nvml=False``: not NVML (a simulated device's
    run samples its twin instead)."""
    from profiler.core.sources.blocked import BlockedSource
    from profiler.core.sources.host import HostSource
    from profiler.core.sources.memory import MemorySource
    from profiler.core.sources.nvml import NvmlSource
    from profiler.core.sources.sched import SchedSource

    host = HostSource(pid)
    sources: list[Source] = [
        host,
        SchedSource(pid, workers=host.pid_labels),
        BlockedSource(pid, workers=host.pid_labels),
        MemorySource(host.pid_labels),
        *([NvmlSource()] if nvml else []),
    ]
    if pid is None:  # the pin-memory thread is found by its Python name: only in this process
        from profiler.core.sources.pin import PinSource

        sources.append(PinSource())
    return sources


class ThreadRecorder:
    """The run store and the watchers (:class:`~profiler.core.sampling.sampler_and_pyspy.Watchers`: sampler, py-spy) of
    one run directory, in this process; ``close()`` returns its Summary."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        meta: dict[str, object],
        sample_hz: float,
        sources: Sequence[Source] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        warn: Callable[[str], None] = log_warning,
        store_errors: str = "warn",
        summarize: Summarizer | None = None,
    ) -> None:
        """``summarize``: what builds the Summary at close (``profiler.runs.summarize.summarize_run``, passed in by
        the layers above: the core imports no analysis); None: no Summary."""
        self.out_dir = Path(out_dir)
        self._store_errors = checked_store_errors(store_errors)
        self._meta = meta
        self._sample_hz = sample_hz
        self._sources = sources
        self._clock = clock
        self._warn = warn
        self.t0 = 0.0
        self.store: RunStore | None = None
        self._watch: Watchers | None = None
        self._summary: RunSummary | None = None
        self._summarizer = summarize
        self._closed = False

    def start(self, t0: float | None = None) -> RunStore:
        """Create the store (meta first) and start sampling; ``t0`` is the run's zero on ``clock``."""
        if self.store is not None:
            return self.store
        self.t0 = self._clock() if t0 is None else t0
        self.store = store = RunStore(
            self.out_dir, meta=running_meta(self._meta, self._sample_hz), on_error=self.store_failed
        )
        sources = list(self._sources) if self._sources is not None else default_sources()
        self._watch = Watchers(store, sample_hz=self._sample_hz, sources=sources, t0=self.t0, warn=self._warn,
                               clock=self._clock)  # fmt: skip
        self._watch.start()
        return store

    @property
    def sampler(self) -> Sampler | None:
        """The run's sampler (None before start)."""
        return self._watch.sampler if self._watch is not None else None

    def store_failed(self, failure: StoreWriteError) -> None:
        """The writer thread's one call when the store stops writing."""
        if self._store_errors == "warn":
            self._warn(store_failed_line(failure))

    # -- the Session's recorder hook (profiler.core.hooks.Recorder) --------------------------------------------
    def on_start(self, session: SessionView) -> None:
        self._meta = session.meta  # what the session knows at its start: the facts given and its device timer
        self.start(t0=session.t0)

    def on_meta(self, items: Mapping[str, object]) -> None:
        self.annotate(**items)

    def on_step(self, row: StepRow, phases: Sequence[PhaseRow]) -> None:
        store = self.store
        if store is not None:
            store.put_step(row, phases)

    def on_window(self, window: KernelWindow) -> None:
        """A kernel window the Session recorded (profiler.core.kernel_windows.windows)."""
        store = self.store
        if store is not None:
            store.put_window(window)

    def on_event(self, kind: str, message: str) -> None:
        self.event(kind, message, "session")

    def on_close(self, status: str, error: str | None) -> None:
        self.close(status, error)

    def halt(self, step: int) -> BaseException | None:
        """With ``store_errors="raise"``: the store's failure as the error that stops the training before ``step``."""
        failure = self.store.failure if self.store is not None and self._store_errors == "raise" else None
        return failure.at_step(step) if failure is not None else None

    @property
    def failure(self) -> StoreWriteError | None:
        return self.store.failure if self.store is not None else None

    def committed_steps(self) -> list[StepRow]:
        return self.store.steps() if self.store is not None else []

    def rescan_soon(self) -> None:
        """A loader has just started its workers: the process-tree sources look for them at their next read."""
        if self._watch is not None:
            self._watch.rescan_soon()

    def read_memory_soon(self, taken: Taken | None = None) -> None:
        """The memory source reads the loader workers' memory at the next round, off its schedule; ``taken``: the
        readings this process took of them now (its loop's end), stored as the memory source's."""
        if self._watch is not None:
            self._watch.read_memory_soon(taken, self.now())

    def now(self) -> float:
        """Seconds since the run's zero."""
        return self._clock() - self.t0

    def annotate(self, **items: Any) -> None:
        if self.store is not None:
            self.store.put_meta(**items)

    def event(self, kind: str, message: str, source: str | None = None) -> None:
        if self.store is not None:
            self.store.put_event(self.now(), kind, message, source)

    def add_views(self, recipes: Sequence[ViewRecipe], fallback: Callable[[], object]) -> bool:
        """No other process here to serve them: False, the caller shows them from this process."""
        return False

    def start_pyspy(self, pid: int, *, rate: int, attach_timeout_s: float, unavailable: str) -> str | None:
        """Record ``pid`` and its subprocesses with py-spy until close (:meth:`Watchers.start_pyspy`); after
        :meth:`start`."""
        if self._watch is None:
            raise RuntimeError("start_pyspy() before start(): the run has no store yet")
        return self._watch.start_pyspy(pid, rate=rate, attach_timeout_s=attach_timeout_s, unavailable=unavailable)

    def stop_sampling(self) -> None:
        """Stop the sampler now (zero-code: the target is gone, and a read of its tree only reports that)."""
        if self._watch is not None:
            self._watch.sampler.stop()

    def close(self, status: str, error: str | None = None, **final_meta: Any) -> RunSummary | None:
        """End the run (see the module docstring); the Summary, or None when it could not be built."""
        if self._closed or self.store is None:
            return self._summary
        self._closed = True
        store = self.store
        if self._watch is not None:
            self._watch.close()
        store.put_meta(status=status, error=error, ended_at=time.time(), **final_meta)
        store.close()
        if self._summarizer is not None:
            self._summary = self._summarizer(store.record, self.out_dir, store.failure is None, self._warn)
        return self._summary

    @property
    def pyspy_problem(self) -> str | None:
        """Why py-spy recorded nothing (or stopped badly), when it was asked for; else None."""
        return self._watch.pyspy_problem if self._watch is not None else None

    @property
    def summary(self) -> RunSummary | None:
        """The Summary built at close (None before close)."""
        return self._summary
