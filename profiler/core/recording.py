"""ThreadRecorder: one run's record from start to close — run store, background sampler, py-spy, run status.

Both ways of profiling record through it: a :class:`~profiler.core.session.Session` as its recorder hook, and
:func:`profiler.zerocode.profile.profile_external` directly. docs/store.md, "A run's life", gives the order.
Invariants:
- ``close()`` is idempotent and returns the Summary (the same one on every call); a summary that cannot be
  built is logged, not raised: the store is the record.
- A run store that stops writing never stops the training from here (unless ``store_errors="raise"``: then
  the CLI's runner stops the run); close writes no ``summary.json`` that would claim more than the store holds.
- py-spy is started in one place (:meth:`ThreadRecorder.start_pyspy`); one that cannot attach is a warning.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.core.pyspy import OUTPUT, PySpyRecorder
from profiler.core.rows import KernelWindow, PhaseRow, RunRecord, StepRow
from profiler.core.sampler import Sampler
from profiler.core.sources.base import Source
from profiler.core.store import STACKS_NAMES, RunStore, StoreWriteError, no_world_write

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.hooks import SessionView
    from profiler.core.sampler_process.views import ViewRecipe

log = logging.getLogger("stallscope")
# (the run's rows, its directory, whether to write summary.json, warn) -> its Summary, None where it failed
Summarizer = Callable[[Callable[[], RunRecord], Path, bool, Callable[[str], None]], "Summary | None"]


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
    """The run store, sampler and py-spy of one run directory; ``close()`` returns its Summary."""

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
        on_failure: Callable[[StoreWriteError], None] | None = None,
    ) -> None:
        """``summarize``: what builds the Summary at close (``profiler.runs.summarize.summarize_run``, passed in by
        the layers above: the core imports no analysis); None: no Summary (the sampler process, which records for
        the training process (:mod:`profiler.core.sampler_process`): that process builds it). ``on_failure``: the
        sampler process hears of a store failure."""
        self.out_dir = Path(out_dir)
        self._store_errors = checked_store_errors(store_errors)
        self._meta = meta
        self._sample_hz = sample_hz
        self._sources = sources
        self._clock = clock
        self._warn = warn
        self.t0 = 0.0
        self.store: RunStore | None = None
        self.sampler: Sampler | None = None
        self._pyspy: PySpyRecorder | None = None
        self._pyspy_problem: str | None = None
        self._summary: Summary | None = None
        self._summarizer = summarize
        self._on_failure = on_failure
        self._closed = False

    def start(self, t0: float | None = None, store: RunStore | None = None) -> RunStore:
        """Create the store (meta first) and start sampling; ``t0`` is the run's zero on ``clock``. ``store``: one
        made already (the sampler process's, which writes a store the training process created)."""
        if self.store is not None:
            return self.store
        self.t0 = self._clock() if t0 is None else t0
        if store is not None:
            self.store = store
            self._start_sampler(store)
            return store
        self.store = store = RunStore(
            self.out_dir, meta=running_meta(self._meta, self._sample_hz), on_error=self.store_failed
        )
        self._start_sampler(store)
        return store

    def _start_sampler(self, store: RunStore) -> None:
        sources = list(self._sources) if self._sources is not None else default_sources()
        self.sampler = Sampler(
            sources, self._sample_hz, sink=store.put_samples, on_event=store.put_event, clock=self._clock, t0=self.t0
        )
        self.sampler.start()

    def store_failed(self, failure: StoreWriteError) -> None:
        """The writer thread's one call when the store stops writing."""
        if self._on_failure is not None:
            self._on_failure(failure)
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
        """A kernel window the Session recorded (profiler.core.kernelwin)."""
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
        if self.sampler is not None:
            self.sampler.rescan_soon()

    def read_memory_soon(self) -> None:
        """The memory source reads the loader workers' memory at the next round, off its schedule."""
        if self.sampler is not None:
            self.sampler.read_workers_soon()

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
        """Record ``pid`` and its subprocesses with py-spy until close; None when it attached, else the
        reason, which is stored and shown as ``unavailable.format(problem=...)``."""
        recorder = PySpyRecorder(pid, self.out_dir / OUTPUT, rate=rate, now=self.now)
        # py-spy killed or failing mid-run: said once, when it happens; the run goes on with the sampler
        recorder.on_exit = lambda problem: self._pyspy_ended(unavailable.format(problem=problem), problem)
        problem = recorder.start(attach_timeout_s=attach_timeout_s)
        self.annotate(pyspy_rate=rate, pyspy_started_at=recorder.started_at, pyspy_args=recorder.args)
        if problem:
            self._pyspy_problem = problem
            self.event("warning", problem, "pyspy")
            self._warn(unavailable.format(problem=problem))
            return problem
        self._pyspy = recorder
        return None

    def stop_sampling(self) -> None:
        """Stop the sampler now (zero-code: the target is gone, and a read of its tree only reports that)."""
        if self.sampler is not None:
            self.sampler.stop()

    def close(self, status: str, error: str | None = None, **final_meta: Any) -> Summary | None:
        """End the run (see the module docstring); the Summary, or None when it could not be built."""
        if self._closed or self.store is None:
            return self._summary
        self._closed = True
        store = self.store
        if self.sampler is not None:
            self.sampler.stop(final=True)  # one last round: a short run still has every source's figures
        self._stop_pyspy()
        if self.sampler is not None:
            store.put_meta(sampler_stats=self.sampler.stats.to_meta())
        store.put_meta(status=status, error=error, ended_at=time.time(), **final_meta)
        store.close()
        for name in STACKS_NAMES:  # py-spy creates its file with its own mode
            no_world_write(self.out_dir / name)
        if self._summarizer is not None:
            self._summary = self._summarizer(store.record, self.out_dir, store.failure is None, self._warn)
        return self._summary

    @property
    def pyspy_problem(self) -> str | None:
        """Why py-spy recorded nothing (or stopped badly), when it was asked for; else None."""
        return self._pyspy_problem

    @property
    def summary(self) -> Summary | None:
        """The Summary built at close (None before close)."""
        return self._summary

    def _pyspy_ended(self, line: str, problem: str) -> None:
        self._pyspy_problem = problem
        self.event("warning", problem, "pyspy")
        self.annotate(pyspy_problem=problem)
        self._warn(line)

    def _stop_pyspy(self) -> None:
        recorder = self._pyspy
        if recorder is None:
            if self._pyspy_problem is not None:
                self.annotate(pyspy_problem=self._pyspy_problem)
            return
        problem = recorder.stop()
        if problem and problem != self._pyspy_problem:  # not already said when py-spy ended mid-run
            self._pyspy_problem = problem
            self.event("warning", problem, "pyspy")
            self._warn(problem)
        scheduling = recorder.on_time.scheduling if recorder.on_time is not None else None
        self.annotate(
            pyspy_stopped_at=recorder.stopped_at,
            pyspy_problem=problem,
            pyspy_scheduling=scheduling,
            pyspy_behind_s=recorder.stdout.behind_s,
            pyspy_behind_reports=recorder.stdout.behind_reports,
        )
