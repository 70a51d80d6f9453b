"""Background sampler: reads every metric source on absolute deadlines from one thread.

Invariants:
- Deadlines are absolute (``t0 + k / hz``), so lateness never accumulates into drift. Each sample records
  its lateness and the time its reads took; a deadline already passed when the previous sample ends is
  skipped and counted, never caught up in a burst.
- Nothing raised by a source reaches the caller. Each exception is counted per source with its last
  reason; :class:`~profiler.sources.base.SourceLost` retires the source for the rest of the run.
- ``start``/``stop`` are idempotent and serialised by a lock; every ``start`` gets a fresh thread; ``stop``
  is noticed within one wait because the thread waits on an Event, never in a bare sleep.
- Memory is bounded: the live view reads a ``deque(maxlen=...)``; the full record goes to ``sink``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from profiler.sources.base import Source, SourceLost

log = logging.getLogger("stallscope")

MAX_HZ = 100.0
SampleRow = tuple[float, str, str, float | None]
SampleSink = Callable[[list[SampleRow]], None]
EventSink = Callable[[float, str, str, str | None], None]


@dataclass(slots=True)
class SourceHealth:
    status: str = "available"  # "available" | "unavailable: <reason>" | "lost: <reason>"
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
    ) -> None:
        if not 0 < hz <= MAX_HZ:
            raise ValueError(f"sample rate {hz} Hz is out of range: allowed 0 < hz <= {MAX_HZ:g}")
        self.hz = float(hz)
        self.period = 1.0 / self.hz
        self._sources = list(sources)
        self._active: list[Source] = []
        self._sink = sink
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

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stop.set()
            thread.join(timeout=max(5.0, 3 * self.period))
            for src in self._active:
                try:
                    src.close()
                except Exception as exc:  # noqa: BLE001 - closing is best effort; the run's data is already recorded
                    log.debug("closing source %s failed: %r", src.name, exc)
            self._active = []

    def _now(self) -> float:
        return self._clock() - self._t0

    def _event(self, kind: str, source: str, message: str) -> None:
        if self._on_event is not None:
            self._on_event(self._now(), kind, message, source)

    def _open_sources(self) -> None:
        self._active = []
        for src in self._sources:
            try:
                reason = src.open()
            except Exception as exc:  # noqa: BLE001 - a probe that raises is a probe that failed
                reason = f"probe raised {type(exc).__name__}: {exc}"
            if reason is None:
                self.stats.sources[src.name] = SourceHealth()
                self._active.append(src)
                self._event("source", src.name, "available")
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

    def _sample_once(self, t: float, lateness: float) -> None:
        stats = self.stats
        merged: dict[str, float] = {}
        rows: list[SampleRow] = []
        read_start = self._clock()
        for src in list(self._active):
            try:
                values = src.read()
            except SourceLost as exc:
                self._retire(src, f"lost: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - counted, reason kept, sampler goes on
                health = stats.sources[src.name]
                health.errors += 1
                reason = f"{type(exc).__name__}: {exc}"
                if reason != health.last_error:
                    self._event("source_error", src.name, reason)
                health.last_error = reason
                continue
            merged.update(values)
            rows.extend((t, src.name, m, None if math.isnan(v) else v) for m, v in values.items())
        read_s = self._clock() - read_start
        rows.append((t, "sampler", "sampler.lateness_ms", lateness * 1e3))
        rows.append((t, "sampler", "sampler.read_ms", read_s * 1e3))
        stats.samples += 1
        stats.lateness_sum_s += lateness
        stats.lateness_max_s = max(stats.lateness_max_s, lateness)
        self.buffer.append((t, merged))
        if self._sink is not None:
            try:
                self._sink(rows)
            except Exception as exc:  # noqa: BLE001 - a broken sink must not kill sampling for the live view
                log.debug("sample sink failed: %r", exc)

    def _retire(self, src: Source, status: str) -> None:
        self._active.remove(src)
        health = self.stats.sources[src.name]
        health.status = status
        health.errors += 1
        health.last_error = status
        self._event("source", src.name, status)
        log.warning("stallscope: source %s %s; sampling goes on without it", src.name, status)
        try:
            src.close()
        except Exception as exc:  # noqa: BLE001 - the source is already gone; nothing more to release
            log.debug("closing lost source %s failed: %r", src.name, exc)

    def latest(self) -> tuple[float, dict[str, float]] | None:
        """The newest sample (for live views); None before the first."""
        return self.buffer[-1] if self.buffer else None
