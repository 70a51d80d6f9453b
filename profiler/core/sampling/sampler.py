"""Background sampler: samples every metric source on absolute deadlines, paced by one thread
(docs/metrics.md, "Sampler health", has the timings).

Invariants:
- Deadlines are absolute (``t0 + k / hz``): lateness never drifts; a passed deadline is skipped and counted.
- Nothing a source raises reaches the caller: counted per source with its last reason; ``SourceLost`` retires it.
- Every call into a source runs on that source's own thread and every wait on one is bounded, so a hung
  hardware call holds up only that thread (a read out for ``call_timeout_s`` retires its source).
- ``start``/``stop`` are idempotent under a lock, a fresh thread per start; memory is bounded (a ``deque``
  for the live view; the full record goes to ``sink``).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from profiler.core.sources.base import Paced, Rescans, Source, SourceEnded, SourceLost
from profiler.core.sources.memory import Taken
from profiler.core.sources.sched import run_delay_s, schedstat_path

log = logging.getLogger("stallscope")

MAX_HZ = 100.0
SampleRow = tuple[float, str, str, float | None]
SampleSink = Callable[[list[SampleRow]], None]
EventSink = Callable[[float, str, str, str | None], None]
CALL_TIMEOUT_S = 2.0  # a read that takes longer is hung: NVML's slowest query (PCIe) blocks ~20 ms per GPU
OPEN_TIMEOUT_S = 10.0  # nvmlInit on a many-GPU machine without persistence mode can take seconds
LAST_ROUND_S = 0.5  # how long the last round at a stop waits for the reads it starts
_POLL_S = 0.05  # how often a wait on a slow call checks for a stop
_T = TypeVar("_T")
Reading = dict[str, float]  # what a source's read() returns


class _Result(Generic[_T]):
    """One call's outcome, handed from a source's thread to the waiting thread: once ``done``, ``error`` or else
    ``value``; ``since`` is when it was queued (``time.monotonic``)."""

    __slots__ = ("done", "error", "runq_at_start", "since", "value")
    value: _T  # set by run() when the call returns

    def __init__(self, runq_s: float | None = None) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.since = time.monotonic()
        self.runq_at_start = runq_s  # the calling thread's run-queue wait when queued (None: not measured)

    def run(self, fn: Callable[[], _T]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which decides
            self.error = exc
        self.done.set()


class _SourceThread:
    """A thread that makes every call to one source, so a call that never returns blocks only that thread.

    Calls run in order. A waiter gives up at its deadline and leaves the call ``pending``; the thread, a
    daemon, finishes it whenever (if ever) it returns and then runs what was queued after it.
    """

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"stallscope-source-{name}", daemon=True)
        self._thread.start()  # returns once the thread runs: its native_id is set
        self.pending: _Result[Reading] | None = None  # the read in flight, until collected

    def submit(self, fn: Callable[[], _T]) -> _Result[_T]:
        result: _Result[_T] = _Result(self.runq_s())
        self._q.put(lambda: result.run(fn))
        return result

    def runq_s(self) -> float | None:
        """This thread's run-queue wait so far (schedstat: runnable, given no CPU); None where not readable. The
        file is opened per call, not held: a sampler's threads outlive no file of theirs."""
        tid = self._thread.native_id
        if tid is None:
            return None
        try:
            with open(schedstat_path("self", tid), "rb") as f:
                return run_delay_s(f.read(128))
        except (OSError, ValueError, IndexError):
            return None

    def out_s(self, result: _Result[Reading]) -> float:
        """How long ``result`` has been out, less the time this thread waited for a CPU meanwhile: on a host
        whose cores are all taken, a read that is only waiting for a CPU is not a call that hangs (a CI run
        retired a loader's stage counters, a sum over a shared array, whose thread waited past 2 s)."""
        out = time.monotonic() - result.since
        now = self.runq_s()
        if now is not None and result.runq_at_start is not None:
            out -= max(0.0, now - result.runq_at_start)
        return out

    def collect(self, until: float, stop: threading.Event) -> _Result[Reading] | None:
        """The pending read's outcome once back, waiting until ``until`` (monotonic) or a stop; else None."""
        result = self.pending
        if result is None:
            return None
        while not result.done.wait(min(_POLL_S, max(0.0, until - time.monotonic()))):
            if time.monotonic() >= until or stop.is_set():
                return None
        self.pending = None
        return result

    def finish(self, fn: Callable[[], object] | None = None) -> None:
        """Queue a last call (never waited for) and let the thread end after it."""
        if fn is not None:
            self.submit(fn)
        self._q.put(None)

    def _run(self) -> None:
        while (call := self._q.get()) is not None:
            call()


@dataclass(slots=True)
class SourceHealth:
    status: str = "available"  # "available" | "unavailable: <reason>" | "lost: <reason>" | "ended: <reason>"
    errors: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class SamplerStats:
    hz_requested: float
    samples: int = 0
    missed_deadlines: int = 0
    started_at: float | None = None
    stopped_at: float | None = None
    lateness_sum_s: float = 0.0
    lateness_max_s: float = 0.0
    sources: dict[str, SourceHealth] = field(default_factory=dict)

    def to_meta(self) -> dict[str, object]:
        """What the run store keeps of the sampler's own health (meta ``sampler_stats``)."""
        return {
            "missed_deadlines": self.missed_deadlines,
            "sources": {
                k: {"status": h.status, "errors": h.errors, "last_error": h.last_error} for k, h in self.sources.items()
            },
        }

    @property
    def hz_achieved(self) -> float:
        if self.started_at is None or self.samples < 2:
            return math.nan
        end = self.stopped_at if self.stopped_at is not None else self.started_at
        span = end - self.started_at
        return (self.samples - 1) / span if span > 0 else math.nan


class Sampler:
    """Samples ``sources`` at ``hz`` on a background thread.

    ``clock`` returns seconds (default ``time.perf_counter``, the same clock as the step timer) and
    ``t0`` is the run's origin, so sample times and step times share one timeline. ``wait(timeout)``
    blocks until the timeout or a stop and returns True when stopped; tests inject a fake clock and wait.
    ``call_timeout_s`` bounds each read and close of a source, ``open_timeout_s`` its probe (real seconds).
    ``health_rows=False``: no ``sampler.*`` rows of its own (a second sampler of the same run, whose lateness
    would read as the run's sampler's).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        hz: float = 10.0,
        *,
        sink: SampleSink | None = None,
        on_event: EventSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
        t0: float | None = None,
        wait: Callable[[float], bool] | None = None,
        buffer_s: float = 60.0,
        call_timeout_s: float = CALL_TIMEOUT_S,
        open_timeout_s: float = OPEN_TIMEOUT_S,
        health_rows: bool = True,
    ) -> None:
        if not 0 < hz <= MAX_HZ:
            raise ValueError(f"sample rate {hz} Hz is out of range: allowed 0 < hz <= {MAX_HZ:g}")
        self.hz = float(hz)
        self.period = 1.0 / self.hz
        self._sources = list(sources)
        self._active: list[Source] = []
        self._threads: dict[int, _SourceThread] = {}  # by id(source)
        self._call_timeout_s = call_timeout_s
        self._open_timeout_s = open_timeout_s
        self._sink = sink
        self._health_rows = health_rows
        self._on_event = on_event
        self._clock = clock
        self._t0 = clock() if t0 is None else t0
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.stats = SamplerStats(hz_requested=self.hz)
        self.buffer: deque[tuple[float, dict[str, float]]] = deque(maxlen=max(1, int(buffer_s * self.hz)))

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._open_sources()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="stallscope-sampler", daemon=True)
            self._thread.start()

    def stop(self, *, final: bool = False) -> None:
        """Stop sampling; ``final``: one last round first, each source reading every figure it has (a run of a
        second still gets its rarely read figures, smaps' memory)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stop.set()
            # the loop notices the stop within one wait, or within one poll of a read it is waiting on
            thread.join(timeout=max(5.0, 3 * self.period))
            if final and not thread.is_alive():
                self._last_round()
            self._close_all()

    def _last_round(self) -> None:
        self.read_all_soon()
        self._stop.clear()  # collect() gives up on a stop: this round waits for its reads as any other
        try:
            self._collect_out(self._now())
            self._sample_once(self._now(), 0.0, paced=False)
        finally:
            self._stop.set()

    def _collect_out(self, t: float) -> None:
        """Before the last round: the reads still out from earlier rounds, waited for (LAST_ROUND_S in all) and kept,
        so that the last round reads those sources afresh. A memory reading asked just before a run's end was still
        out at its close, and the close's own reading of the training process was never made (a fresh-clone CI)."""
        until, rows = time.monotonic() + LAST_ROUND_S, list[SampleRow]()
        for src in list(self._active):
            worker = self._threads[id(src)]
            if worker.pending is None:
                continue
            res = worker.collect(until, self._stop)
            if res is not None:
                values = self._outcome(src, res)
                rows.extend((t, src.name, m, None if math.isnan(v) else v) for m, v in values.items())
        if self._sink is not None and rows:
            try:
                self._sink(rows)
            except Exception as exc:  # noqa: BLE001 - as in _sample_once
                log.debug("sample sink failed: %r", exc)

    def _now(self) -> float:
        return self._clock() - self._t0

    def _event(self, kind: str, source: str, message: str) -> None:
        if self._on_event is not None:
            self._on_event(self._now(), kind, message, source)

    def _open_sources(self) -> None:
        self._active = []
        self._threads = {}
        # every probe runs at once on its source's thread; start() waits open_timeout_s for them all
        probes = []
        for src in self._sources:
            worker = self._threads[id(src)] = _SourceThread(src.name)
            probes.append((src, worker, worker.submit(src.open)))
        deadline = time.monotonic() + self._open_timeout_s
        for src, worker, probe in probes:
            res = probe if probe.done.wait(max(0.0, deadline - time.monotonic())) else None
            reason: str | None
            if res is None:
                reason = f"its probe did not return within {self._open_timeout_s:g} s (the call hangs)"
                del self._threads[id(src)]
                worker.finish(src.close)
            elif res.error is not None:
                # a probe that raises is a probe that failed
                reason = f"probe raised {type(res.error).__name__}: {res.error}"
            else:
                reason = res.value
            if reason is None:
                self.stats.sources[src.name] = SourceHealth()
                self._active.append(src)
                self._event("source", src.name, "available")
                notes = getattr(src, "notes", None)  # a source's lines on what it reads instead of what it lacks
                for line in notes() if callable(notes) else ():
                    self._event("warning", src.name, line)
            else:
                self.stats.sources[src.name] = SourceHealth(status=f"unavailable: {reason}")
                self._event("source", src.name, f"unavailable: {reason}")
                log.warning("stallscope: source %s unavailable: %s", src.name, reason)

    # -- the thread --------------------------------------------------------------------------------
    def _loop(self) -> None:
        stats = self.stats
        start = self._now()
        stats.started_at = start
        k = 0
        while True:
            deadline = start + k * self.period
            now = self._now()
            self._sample_once(now, max(0.0, now - deadline))
            stats.stopped_at = now
            k += 1
            after = self._now()
            # skip deadlines that have already passed rather than sampling in a burst to catch up
            due = math.ceil((after - start) / self.period)
            if due > k:
                stats.missed_deadlines += due - k
                k = due
            if self._wait(max(0.0, start + k * self.period - self._now())):
                break

    def _sample_once(self, t: float, lateness: float, *, paced: bool = True) -> None:
        """One round of reads at ``t``; ``paced=False``: the last round at a stop, off the deadlines (no
        ``sampler.*`` rows and not counted in the rounds, whose rate is the sampler's achieved rate)."""
        stats = self.stats
        merged: dict[str, float] = {}
        rows: list[SampleRow] = []
        read_start = self._clock()
        # Every source reads at once, each on its own thread. A read not back within half a period is left
        # out of this round and not waited for again: it is collected at a later round (stamped with that
        # round's time, so stored samples stay in time order) or, once out for call_timeout_s, retires its
        # source. So a slow source costs the others one half period of lateness, once.
        # (the last round, at a stop, waits longer for the reads it starts: smaps of a few processes on a busy host
        # outlasts half a period, and there is no later round to collect it; a read still out from an earlier round,
        # perhaps hung, is not waited for: closing waits for no hung call)
        give_up = time.monotonic() + (0.5 * self.period if paced else max(0.5 * self.period, LAST_ROUND_S))
        fresh: set[int] = set()
        for src in self._active:
            worker = self._threads[id(src)]
            if worker.pending is None:
                worker.pending = worker.submit(src.read)
                fresh.add(id(src))
        for src in list(self._active):
            worker = self._threads[id(src)]
            res = worker.collect(give_up if id(src) in fresh else 0.0, self._stop)
            if res is None:
                pending = worker.pending
                out_s = worker.out_s(pending) if pending is not None else 0.0
                if out_s >= self._call_timeout_s and not self._stop.is_set():
                    self._retire(src, f"lost: a read did not return within {self._call_timeout_s:g} s (the call hangs)")
                continue
            values = self._outcome(src, res)
            merged.update(values)
            rows.extend((t, src.name, m, None if math.isnan(v) else v) for m, v in values.items())
        read_s = self._clock() - read_start
        if self._health_rows and paced:
            rows.append((t, "sampler", "sampler.lateness_ms", lateness * 1e3))
            rows.append((t, "sampler", "sampler.read_ms", read_s * 1e3))
        if paced:
            stats.samples += 1
            stats.lateness_sum_s += lateness
            stats.lateness_max_s = max(stats.lateness_max_s, lateness)
        self.buffer.append((t, merged))
        if self._sink is not None and rows:
            try:
                self._sink(rows)
            except Exception as exc:  # noqa: BLE001 - a broken sink must not kill sampling for the live view
                log.debug("sample sink failed: %r", exc)

    def _outcome(self, src: Source, res: _Result[Reading]) -> Reading:
        """A read's values; an exception is counted with its reason (or retires the source), never raised."""
        exc = res.error
        if exc is None:
            return res.value
        if isinstance(exc, SourceEnded):
            self._retire(src, f"ended: {exc}", warn=False)
            return {}
        if isinstance(exc, SourceLost):
            self._retire(src, f"lost: {exc}")
            return {}
        health = self.stats.sources[src.name]
        health.errors += 1
        reason = f"{type(exc).__name__}: {exc}"
        if reason != health.last_error:
            self._event("source_error", src.name, reason)
        health.last_error = reason
        return {}

    def _retire(self, src: Source, status: str, *, warn: bool = True) -> None:
        self._active.remove(src)
        health = self.stats.sources[src.name]
        health.status = status
        if not status.startswith("ended:"):  # what it read ended (its process exited): no read failed
            health.errors += 1
            health.last_error = status
        self._event("source", src.name, status)
        said = status.replace(": ", f" at {self._now():.1f} s: ", 1)  # "lost at 12.3 s: GPU 0: ..."
        (log.warning if warn else log.debug)("stallscope: source %s %s; sampling goes on without it", src.name, said)
        # the source is gone; its close is queued behind any call still hung on its thread, never waited for
        self._threads.pop(id(src)).finish(src.close)

    def _close_all(self) -> None:
        """Close every active source on its own thread, waiting at most ``call_timeout_s`` in all; a source
        with a read still out is not waited for (its close runs after that read, if it ever returns)."""
        waits = []
        for src in self._active:
            worker = self._threads.pop(id(src))
            if worker.pending is not None and not worker.pending.done.is_set():
                worker.finish(src.close)
                continue
            waits.append((src, worker.submit(src.close)))
            worker.finish()
        deadline = time.monotonic() + self._call_timeout_s
        for src, res in waits:
            if not res.done.wait(max(0.0, deadline - time.monotonic())):
                log.debug("closing source %s did not return in time; left to its thread", src.name)
            elif res.error is not None:
                # closing is best effort; the run's data is already recorded
                log.debug("closing source %s failed: %r", src.name, res.error)
        for worker in self._threads.values():
            worker.finish()
        self._active, self._threads = [], {}

    def read_all_soon(self) -> None:
        """Every source that reads some figures on a schedule of its own (memory) reads them all at its next read."""
        for src in list(self._active):
            if isinstance(src, Paced):
                src.read_all_next()

    def read_workers_soon(self) -> None:
        """The memory source reads the loader workers' memory at its next read
        (profiler.core.sampling.worker_memory_asks)."""
        for src in list(self._active):
            if callable(ask := getattr(src, "read_workers_next", None)):
                ask()

    def labelled_memory(self, taken: Taken) -> Reading:
        """Readings of processes taken elsewhere (the training process, where its loop ends), by pid, as the memory
        source's figures: that source knows which pid is which worker."""
        out: Reading = {}
        for src in list(self._active):
            if callable(label := getattr(src, "labelled", None)):
                out.update(label(taken))
        return out

    def rescan_soon(self) -> None:
        """The process tree has just changed (a loader started its workers): every source that rescans it on a
        schedule of its own does so at its next read, within a period, not up to a second later."""
        for src in list(self._active):
            if isinstance(src, Rescans):
                src.rescan_soon()

    def latest(self) -> tuple[float, dict[str, float]] | None:
        """The newest sample (for live views); None before the first."""
        return self.buffer[-1] if self.buffer else None
