"""The pin-memory thread and the pinned memory it holds: the CPU a DataLoader's ``pin_memory=True`` costs in the
training process (pytorch/pytorch#25010), and torch's pinned host allocator's bytes.

A DataLoader that pins starts one thread per iterator in the training process, named by ``threading`` after its
target (``Thread-3 (_pin_memory_loop)``); it copies every batch the workers send into page-locked memory. This
source finds those threads by name (so only in the training process: another process's Python thread names are
not visible from outside) and reads each one's CPU time from ``/proc/self/task/TID/schedstat`` (exact, 1-2 us a
read). Pinned bytes come from ``torch.cuda.host_memory_stats()`` where CUDA is already initialised (never
initialised here: a run that pins on CUDA has done it).

Metrics: ``pin.cpu_pct`` (all pin threads, 100 = one core, over the period since the last reading; NaN at a
thread's first reading), ``pin.threads``, ``pin.pinned_mb``. No pin thread and nothing pinned: nothing.
docs/metrics.md, "Loader memory", defines them.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterable

PIN_TARGET = "(_pin_memory_loop)"  # threading's name for a thread whose target is DataLoader's pin loop
_MIB = 1024 * 1024


def pin_threads() -> list[int]:
    """The native ids of this process's live pin-memory threads."""
    return [t.native_id for t in threading.enumerate() if t.name.endswith(PIN_TARGET) and t.native_id is not None]


def thread_cpu_ns(tid: int) -> int:
    """A thread of this process: its time on a CPU so far, ns (schedstat field 1)."""
    with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
        return int(f.read().split()[0])


def pinned_bytes() -> float:
    """torch's pinned host allocator's bytes (active + cached); NaN where torch or CUDA is not in use."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return math.nan
    stats = torch.cuda.host_memory_stats()
    value = stats.get("allocated_bytes.current", math.nan)
    return float(value)


class PinSource:
    """``pin.cpu_pct`` of the pin-memory threads and ``pin.pinned_mb`` (see the module docstring)."""

    name = "pin"
    # read in the training process: once a second is enough for a CPU share over the period and a byte count
    max_hz = 1.0
    # on the training thread at the Session's hand-overs (core.sampling.on_training_thread), not on a sampler thread: a
    # thread of its own woke the GIL-bound loop for a read of microseconds (issue #65)
    at_ticks = True

    def __init__(
        self,
        *,
        threads: Callable[[], Iterable[int]] = pin_threads,
        cpu_ns: Callable[[int], int] = thread_cpu_ns,
        pinned: Callable[[], float] = pinned_bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threads, self._cpu_ns, self._pinned, self._clock = threads, cpu_ns, pinned, clock
        self._last: dict[int, tuple[float, int]] = {}  # tid -> (time, cpu ns) at its last reading

    def open(self) -> str | None:
        return None

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        now, seen, busy, span = self._clock(), {}, 0.0, math.nan
        for tid in self._threads():
            try:
                ns = self._cpu_ns(tid)
            except OSError:  # ended meanwhile
                continue
            seen[tid] = (now, ns)
            if tid in self._last:
                t0, ns0 = self._last[tid]
                busy += (ns - ns0) / 1e9
                span = max(now - t0, 0.0) if math.isnan(span) else span
        self._last = seen
        if seen:
            out["pin.threads"] = float(len(seen))
            out["pin.cpu_pct"] = 100 * busy / span if span > 0 else math.nan
        pinned = self._pinned()
        if not math.isnan(pinned):
            out["pin.pinned_mb"] = pinned / _MIB
        return out

    def close(self) -> None:
        return None
