"""Loader memory that adds up: each process's private (USS) and proportional (PSS) memory, the shared-memory
segment, and the host's available memory, read at a low rate. docs/metrics.md, "Loader memory", defines them.

RSS counts a page shared by the main process and its forked workers in every one of them, so it neither adds
up nor shows a worker copying the parent's pages as it touches them (copy-on-read: a Python object's reference
count is written when it is read). USS (pages only this process maps) and PSS (each page divided among the
processes that map it) do: the job's memory is the sum of PSS, and a worker's USS grows by the pages it copied.
Both come from ``/proc/PID/smaps_rollup`` (psutil ``memory_full_info``), which walks the process's page tables:
6-12 ms a process here (a torch process of 500 MiB, and each of its workers). So the source keeps its own cost
to a budget: after each reading it waits until that reading's time is :data:`BUDGET` of the time since (and at
least :data:`EVERY_S`): 23 ms for the main process and 2 workers gives a reading every 4.6 s.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Protocol

EVERY_S = 1.0  # at least this long between readings
BUDGET = 0.005  # at most this share of one core spent reading
SHM = "/dev/shm"
_MIB = 1024 * 1024


class _FullInfo(Protocol):
    @property
    def uss(self) -> int: ...

    @property
    def pss(self) -> int: ...

    @property
    def rss(self) -> int: ...


def full_info(pid: int) -> _FullInfo:
    import psutil

    info: _FullInfo = psutil.Process(pid).memory_full_info()
    return info


def available_mb() -> float:
    import psutil

    return float(psutil.virtual_memory().available) / _MIB


class MemorySource:
    """USS, PSS and shared MiB of the training process and each loader worker, ``/dev/shm`` use, host available.

    ``processes`` returns label -> pid (``HostSource.pid_labels``: ``main`` and the workers). Metrics, at most
    every ``every_s`` and as often as ``budget`` allows: ``mem.<label>.uss_mb``, ``pss_mb``, ``shared_mb``
    (RSS - USS), ``mem.total.pss_mb`` (the sum of PSS: the job's memory), ``mem.shm.used_mb`` / ``size_mb``,
    ``mem.host.available_mb``. Between readings it returns nothing; a process that cannot be read (exited, no
    permission) is left out of that reading.
    """

    name = "memory"

    def __init__(
        self,
        processes: Callable[[], Mapping[str, int]],
        *,
        every_s: float = EVERY_S,
        budget: float = BUDGET,
        clock: Callable[[], float] = time.monotonic,
        read: Callable[[int], _FullInfo] = full_info,
        shm: str = SHM,
    ) -> None:
        self._processes = processes
        self.every_s, self.budget = every_s, budget
        self._clock = clock
        self._read = read
        self._shm = shm
        self._next = -math.inf

    def open(self) -> str | None:
        try:
            self._read(os.getpid())
        except Exception as exc:  # noqa: BLE001 - any failure means: not measurable here, said once
            return f"cannot read /proc/self/smaps_rollup: {exc}"
        return None

    def read(self) -> dict[str, float]:
        now = self._clock()
        if now < self._next:
            return {}
        out = self._reading()
        spent = self._clock() - now
        self._next = now + max(self.every_s, spent / self.budget if self.budget > 0 else 0.0)
        return out

    def _reading(self) -> dict[str, float]:
        out: dict[str, float] = {}
        total = 0.0
        for label, pid in sorted(self._processes().items()):
            try:
                info = self._read(pid)
            except Exception:  # noqa: BLE001 - exited or not readable: left out of this reading
                continue
            out[f"mem.{label}.uss_mb"] = info.uss / _MIB
            out[f"mem.{label}.pss_mb"] = info.pss / _MIB
            out[f"mem.{label}.shared_mb"] = max(0, info.rss - info.uss) / _MIB
            total += info.pss / _MIB
        if out:
            out["mem.total.pss_mb"] = total
        try:
            usage = shutil.disk_usage(self._shm)
            out["mem.shm.used_mb"], out["mem.shm.size_mb"] = usage.used / _MIB, usage.total / _MIB
        except OSError:
            pass
        out["mem.host.available_mb"] = available_mb()
        return out

    def close(self) -> None:
        return None
