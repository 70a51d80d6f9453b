"""TickReads: the sources only the training process can read of itself, read on its training thread at the Session's
hand-overs (every 64 steps or 0.1 s), each at most at its ``max_hz``: no thread of stallscope's wakes for them.

Why not a thread: a sampler thread in the training process (and the thread it reads each source on) wakes the
GIL-bound loop beside it at every round, to read figures that take microseconds. The pin source (the pin-memory
threads' CPU, the pinned bytes) is the default one: the pin threads are found by their Python names and the pinned
bytes by torch's allocator, neither visible from outside the process. A hand-over already runs there, with the
caches cold; one reading a second at one of them costs the loop under 0.01% (benchmarks/fastloop_parts.py).

Invariants:
- A source is read only where its probe (``open()``) said it works, at most ``max_hz`` (1 Hz when it names none).
- ``read()`` never reaches the training loop: an exception is counted, the first of each source reported once as
  a run event, and the source read again at its next turn; :class:`~profiler.core.sources.base.SourceLost` retires it.
- Between hand-overs nothing is read: a step longer than a source's period delays its reading to the next one (the
  pin source's CPU share is over the period between its readings, so it stays exact).
- ``close()`` takes a last reading of each and returns each source's health as the sampler's stats give it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from profiler.core.sources.base import Source, SourceLost

SampleRow = tuple[float, str, str, float | None]


class TickReads:
    """Sources read at the training thread's hand-overs (see the module)."""

    def __init__(
        self,
        sources: Sequence[Source],
        sink: Callable[[list[SampleRow]], object],
        on_event: Callable[[float, str, str, str], object],
        now: Callable[[], float],
    ) -> None:
        """``sink``: where a reading's rows go (the ring); ``on_event(t, kind, message, source)``; ``now``: run
        seconds."""
        self._sink, self._on_event, self._now = sink, on_event, now
        self._health: dict[str, dict[str, object]] = {}
        self._active: list[tuple[Source, float]] = []  # (source, its period in s)
        self._due: list[float] = []
        for src in sources:
            try:
                reason = src.open()
            except Exception as exc:  # noqa: BLE001 - a probe that fails is an unavailable source, not a failed run
                reason = f"{type(exc).__name__}: {exc}"
            self._health[src.name] = {"status": "available" if reason is None else f"unavailable: {reason}",
                                      "errors": 0, "last_error": None}  # fmt: skip
            if reason is None:
                self._active.append((src, 1.0 / float(getattr(src, "max_hz", 1.0))))
                self._due.append(-math.inf)

    def __bool__(self) -> bool:
        return bool(self._active)

    def at(self) -> None:
        """A hand-over: read each source whose period has passed."""
        t = self._now()
        rows: list[SampleRow] = []
        for i, (src, period) in enumerate(self._active):
            if t >= self._due[i]:
                self._due[i] = t + period
                rows.extend(self._read(src, t))
        if rows:
            self._sink(rows)

    def _read(self, src: Source, t: float) -> list[SampleRow]:
        health = self._health[src.name]
        try:
            values = src.read()
        except SourceLost as exc:
            health["status"] = f"lost: {exc}"
            self._active = [(s, p) for s, p in self._active if s is not src]
            self._due = [-math.inf] * len(self._active)
            self._on_event(t, "warning", f"source {src.name} lost: {exc}", src.name)
            return []
        except Exception as exc:  # noqa: BLE001 - a source's failure is counted and said once, never the loop's
            health["errors"] = int(health["errors"]) + 1  # type: ignore[call-overload]
            health["last_error"] = f"{type(exc).__name__}: {exc}"
            if health["errors"] == 1:
                self._on_event(t, "warning", f"source {src.name} read failed: {health['last_error']}", src.name)
            return []
        return [(t, src.name, m, None if math.isnan(v) else v) for m, v in values.items()]

    def close(self) -> dict[str, dict[str, object]]:
        """The last reading of each source, its close; each source's health (``SamplerStats.to_meta``'s shape)."""
        t = self._now()
        rows = [row for src, _ in self._active for row in self._read(src, t)]
        if rows:
            self._sink(rows)
        for src, _ in self._active:
            try:
                src.close()
            except Exception as exc:  # noqa: BLE001 - a handle that fails to close at the run's end: kept in its health
                self._health[src.name]["last_error"] = f"close: {type(exc).__name__}: {exc}"
        self._active, self._due = [], []
        return self._health
