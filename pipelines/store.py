"""An emulated store: the built-in data sets' file reads paced as a store that serves one read at a time at a
given throughput would deliver them (``stallscope run --store-mbps N``; ``whatif --storage-mbps N --check``).

The store is one next-free time in shared memory, made by the training process before its loader starts
(:func:`install`) and inherited by the workers it forks: a read of ``n`` bytes starts when the store is free (or
now) and ends ``n / rate`` later; the reader sleeps until then. The time each read waited (queueing behind
other processes' reads, then its own transfer) and its bytes are summed, as the stage clock sums its stages,
and read by :func:`totals`. Without :func:`install` nothing is paced (one ``None`` check per read).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from profiler.core.sources.stages import SharedDoubles, store_totals

_NEXT, _RATE, _WAIT, _BYTES, _READS = range(5)  # _WAIT.. in the order profiler.core.sources.stages reads them
_state: Any = None  # (the shared array, its lock), once installed


def install(mbps: float) -> None:
    """Pace every read of the built-in data sets at ``mbps`` MB/s (10^6 bytes), from now on, in this process and
    the loader workers it starts afterwards."""
    global _state  # noqa: PLW0603 - one store per process tree, inherited by forked workers
    if not mbps > 0:
        raise ValueError(f"store throughput {mbps!r} MB/s: allowed a number > 0")
    values = SharedDoubles(5)  # the sampler process reads it too (its memory file is passed to it)
    values[_RATE] = mbps * 1e6
    _state = (values, multiprocessing.Lock())


def uninstall() -> None:
    global _state  # noqa: PLW0603
    _state = None


def mbps() -> float | None:
    """The emulated store's throughput in MB/s; None when reads are not paced."""
    return None if _state is None else float(_state[0][_RATE]) / 1e6


def pace(nbytes: int) -> None:
    """Wait as the store would make a read of ``nbytes`` wait: behind the reads before it, then its transfer."""
    if _state is None:
        return
    values, lock = _state
    now = time.perf_counter()
    with lock:
        done = max(now, values[_NEXT]) + nbytes / values[_RATE]
        values[_NEXT] = done
    wait = done - now
    if wait > 0:
        time.sleep(wait)
    with lock:
        values[_WAIT] += max(0.0, time.perf_counter() - now)
        values[_BYTES] += nbytes
        values[_READS] += 1


def totals() -> dict[str, float]:
    """Seconds the reads waited, bytes and reads, summed over the loader processes; empty when not installed."""
    if _state is None:
        return {}
    values, _lock = _state
    return store_totals(values)


def counters() -> SharedDoubles | None:
    """The shared array, when reads are paced."""
    return None if _state is None else _state[0]


def set_page_cache(root: Path, state: str) -> tuple[int, int]:
    """Put the files under ``root`` in the page cache ("warm": each read once) or out of it ("cold": each
    flushed, then dropped with ``posix_fadvise(DONTNEED)``, which needs no root); (files, bytes) touched."""
    if state not in ("warm", "cold"):
        raise ValueError(f"page cache {state!r}: allowed warm or cold")
    files = nbytes = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            if state == "warm":
                while chunk := os.read(fd, 1 << 20):
                    nbytes += len(chunk)
            else:
                os.fdatasync(fd)  # dirty pages are not dropped: a freshly generated file must be written first
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                nbytes += os.fstat(fd).st_size
        finally:
            os.close(fd)
        files += 1
    return files, nbytes
