"""Live status while a run trains: a plain line every few seconds (works on a pipe, CI, nohup).

Reads the Session's bounded buffer through ``analysis.live.window_stats`` on its own thread; the
training thread never waits on it. The rich live dashboard (issue #5) will sit beside this fallback.
"""

from __future__ import annotations

import math
import sys
import threading
from types import TracebackType
from typing import TextIO

from profiler.analysis.live import window_stats
from profiler.session import Session


def _fmt(x: float, spec: str) -> str:
    return "n/a" if math.isnan(x) else format(x, spec)


def status_line(session: Session, total_steps: int | None = None) -> str | None:
    stats = window_stats(list(session.recent))
    if stats is None:
        return None
    of = f"/{total_steps}" if total_steps else ""
    warm = " (warm-up)" if stats.warmup else ""
    line = (
        f"step {stats.steps_total}{of}{warm}  {_fmt(stats.throughput_samples_per_s, '.1f')} samples/s  "
        f"stall {_fmt(stats.stall_fraction * 100, '.0f')}%  wait {stats.data_wait_ms:.1f} ms  "
        f"h2d {stats.h2d_ms:.1f} ms  compute {stats.compute_ms:.1f} ms  (last {stats.window_steps} steps)"
    )
    latest = session.sampler.latest() if session.sampler is not None else None
    if latest is not None:
        m = latest[1]
        cpu = m.get("proc.total.cpu_pct", math.nan)
        util = m.get("gpu0.util_pct", math.nan)
        line += f"  cpu {_fmt(cpu, '.0f')}%" + ("" if math.isnan(util) else f"  gpu0 {util:.0f}%")
    return line


class PlainLive:
    """Prints :func:`status_line` every ``interval_s`` seconds to ``stream`` while the block runs."""

    def __init__(
        self, session: Session, *, interval_s: float = 5.0, stream: TextIO | None = None, total_steps: int | None = None
    ) -> None:
        self._session = session
        self._interval = interval_s
        self._stream = stream or sys.stderr
        self._total = total_steps
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stallscope-live", daemon=True)

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            line = status_line(self._session, self._total)
            if line:
                print(line, file=self._stream, flush=True)

    def __enter__(self) -> PlainLive:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(timeout=2 * self._interval)
