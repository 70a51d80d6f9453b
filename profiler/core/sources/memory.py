"""Loader memory that adds up: each process's private (USS) and proportional (PSS) memory, the shared-memory
segment, and the host's available memory, read at a low rate. docs/metrics.md, "Loader memory", defines them.

RSS counts a page shared by the main process and its forked workers in every one of them, so it neither adds
up nor shows a worker copying the parent's pages as it touches them (copy-on-read: a Python object's reference
count is written when it is read). USS (pages only this process maps) and PSS (each page divided among the
processes that map it) do: the job's memory is the sum of PSS, and a worker's USS grows by the pages it copied.
Both come from ``/proc/PID/smaps_rollup`` (psutil ``memory_full_info``), which walks the process's page tables:
6-12 ms a process here (a torch process of 500 MiB, and each of its workers). So the source keeps its own cost
to a budget: after each reading it waits until that reading's CPU time is :data:`BUDGET` of the time since (and
at least :data:`EVERY_S`): 23 ms for the main process and 2 workers gives a reading every 4.6 s.
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


def gone(info: _FullInfo) -> bool:
    """A reading of a process that is exiting: its memory already torn down (a worker read as its loader stopped it
    read 0 MiB of USS, which is no figure of its memory)."""
    return info.uss <= 0 or info.rss <= 0


# readings taken elsewhere (the training process, at its loop's end): pid -> (USS, PSS, shared) MiB
Taken = dict[int, tuple[float, float, float]]
# the stored rows' source for those readings: a worker read after it is a worker being stopped (its Python freeing its
# memory as it exits: the analysis leaves such readings out; profiler.analysis.memory.LOOP_END spells it too)
LOOP_END = "memory-loop-end"


def take(pids: list[int], read: Callable[[int], _FullInfo] = full_info) -> Taken:
    """Each of ``pids``'s USS, PSS and shared MiB (one that cannot be read is left out): the reading the training
    process takes of its loader's workers where its loop ends (profiler.core.sampling.worker_memory_asks)."""
    out: Taken = {}
    for pid in pids:
        try:
            info = read(pid)
        except Exception:  # noqa: BLE001 - exited or not readable: left out
            continue
        if not gone(info):
            out[pid] = (info.uss / _MIB, info.pss / _MIB, max(0, info.rss - info.uss) / _MIB)
    return out


def shm_files(pid: int) -> dict[tuple[int, int], int]:
    """The shared-memory files (``/dev/shm``, where torch puts the batches its workers send) that ``pid`` maps or
    holds open: (device, inode) -> bytes (the larger of the file's size and its largest mapping). A batch a
    worker has sent but the training process has not yet taken is only an open descriptor in the worker (torch's
    file_descriptor sharing); one the training process took is a mapping there."""
    out: dict[tuple[int, int], int] = {}
    with open(f"/proc/{pid}/maps", "rb") as f:
        maps = f.read()  # at once: the kernel generates the file anew for each read, line by line costs 3x
    for line in maps.splitlines() if b" /dev/shm/" in maps else ():
        if b" /dev/shm/" in line:
            span, _perms, _offset, dev, inode, *_ = line.split(maxsplit=5)
            lo, _, hi = span.partition(b"-")
            major, _, minor = dev.partition(b":")
            key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            out[key] = max(out.get(key, 0), int(hi, 16) - int(lo, 16))
    fds = f"/proc/{pid}/fd"
    for name in os.listdir(fds):
        path = f"{fds}/{name}"
        try:
            if not os.readlink(path).startswith("/dev/shm/"):
                continue
            st = os.stat(path)
        except OSError:  # closed meanwhile
            continue
        key = (st.st_dev, st.st_ino)
        out[key] = max(out.get(key, 0), st.st_size)
    return out


def available_mb() -> float:
    import psutil

    return float(psutil.virtual_memory().available) / _MIB


class MemorySource:
    """USS, PSS and shared MiB of the training process and each loader worker, ``/dev/shm`` use, host available.

    ``processes`` returns label -> pid (``HostSource.pid_labels``: ``main`` and the workers). Metrics, at most
    every ``every_s`` and as often as ``budget`` allows: ``mem.<label>.uss_mb``, ``pss_mb``, ``shared_mb``
    (RSS - USS), ``mem.total.pss_mb`` (the sum of PSS: the job's memory), ``mem.host.available_mb``; on a
    schedule of its own under the same rule, ``mem.shm.job_mb`` (the ``/dev/shm`` files the job's processes map
    or hold open, from ``/proc/PID/maps`` and ``/proc/PID/fd``: its batches in flight; 0.4 ms a process here);
    at every call (one ``statvfs``, microseconds) ``mem.shm.used_mb`` / ``size_mb`` (the whole segment, every
    process's). A process that cannot be read (exited, no permission) is left out of that reading.
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
        maps: Callable[[int], Mapping[tuple[int, int], int]] = shm_files,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._processes = processes
        self.every_s, self.budget = every_s, budget
        self._clock = clock
        self._read = read
        self._shm = shm
        self._maps = maps
        self._cpu_clock = cpu_clock
        self._next = -math.inf  # the next smaps reading
        self._next_maps = -math.inf  # the next reading of the job's /dev/shm files (maps: ~10x cheaper than smaps)
        self._workers_read = False  # a smaps reading has covered a process besides the main one
        self._workers_next = False  # read_workers_next(): the next read takes the workers' smaps, off the schedule
        self._missed = 0  # asks made before any worker was found, each made at a read once they are

    def open(self) -> str | None:
        try:
            self._read(os.getpid())
        except Exception as exc:  # noqa: BLE001 - any failure means: not measurable here, said once
            return f"cannot read /proc/self/smaps_rollup: {exc}"
        return None

    def read_all_next(self) -> None:
        """The next read takes smaps and the job's /dev/shm files whatever their schedule (the sampler's last round)."""
        self._next = self._next_maps = -math.inf

    def read_workers_next(self) -> None:
        """The next read takes the loader workers' smaps (not the training process's), off the schedule: the
        training process asks while its workers live (profiler.core.sampling.worker_memory_asks). Not the training
        process's own: a walk of its page tables holds its memory-map lock, and a reader preempted mid-walk on a busy
        host (this process runs niced) held the training thread's next mapping of a batch (a model-bound run's loader
        then stalled 8% against 0 in 2 of 7 runs beside two busy processes)."""
        self._workers_next = True

    def labelled(self, taken: Taken) -> dict[str, float]:
        """Readings taken elsewhere by pid, as this source's figures (``mem.<label>.uss_mb`` ...), for the processes
        it knows (a pid it does not know, no figure)."""
        labels = {pid: label for label, pid in self._processes().items()}
        out: dict[str, float] = {}
        for pid, (uss, pss, shared) in taken.items():
            if (label := labels.get(pid)) is not None:
                out.update({f"mem.{label}.uss_mb": uss, f"mem.{label}.pss_mb": pss, f"mem.{label}.shared_mb": shared})
        return out

    def read(self) -> dict[str, float]:
        # the ask is taken before the reading: one that comes while this read runs is for the next
        asked, self._workers_next = self._workers_next, False
        out = self._segment()
        if len(self._processes()) <= 1:
            # asked before the workers were found (the host source finds them a round or more after they start: 0.4-1
            # s beside other work here, the run's window half over in a fast short run): made once they are, one a
            # read, so that a short run still has its readings spread over what is left of it
            self._missed += asked
            asked = False
        elif not asked and self._missed and self._workers_read:  # after their first reading
            self._missed -= 1
            asked = True
        if not self._workers_read and len(self._processes()) > 1:
            # the loader's workers have just appeared: read them now, not seconds later (a short run had no worker
            # reading at all); later ones keep the budget's schedule
            self._workers_read = True
            self.read_all_next()
        now, cpu = self._clock(), self._cpu_clock()
        if now >= self._next_maps:
            out.update(self._job_shm())
            self._next_maps = now + self._wait(self._cpu_clock() - cpu)
        now = self._clock()
        if now >= self._next:
            out.update(self._reading())
            self._next = now + self._wait(self._clock() - now)
        elif asked:
            out.update(self._reading(workers_only=True))
        return out

    def _wait(self, spent_s: float) -> float:
        """How long until the next reading of a kind whose last one took ``spent_s``. The job's shared-memory files
        are paced on the reading thread's CPU time (a reading during the training process's set-up waited 94 ms for
        the GIL, and the next came 18 s later); smaps on wall time, which backs off further on a busy host: its
        walk of a process's page tables holds that process's memory-map lock while it runs."""
        return max(self.every_s, spent_s / self.budget if self.budget > 0 else 0.0)

    def _job_shm(self) -> dict[str, float]:
        files: dict[tuple[int, int], int] = {}
        read = 0
        for pid in self._processes().values():
            try:
                mapped = self._maps(pid)
            except Exception:  # noqa: BLE001 - exited or not readable: left out of this reading
                continue
            read += 1
            for key, size in mapped.items():
                files[key] = max(files.get(key, 0), size)
        return {"mem.shm.job_mb": sum(files.values()) / _MIB} if read else {}

    def _segment(self) -> dict[str, float]:
        try:
            usage = shutil.disk_usage(self._shm)
        except OSError:
            return {}
        return {"mem.shm.used_mb": usage.used / _MIB, "mem.shm.size_mb": usage.total / _MIB}

    def _reading(self, workers_only: bool = False) -> dict[str, float]:
        out: dict[str, float] = {}
        total = 0.0
        for label, pid in sorted(self._processes().items()):
            if workers_only and label == "main":
                continue
            try:
                info = self._read(pid)
            except Exception:  # noqa: BLE001 - exited or not readable: left out of this reading
                continue
            if gone(info):
                continue
            out[f"mem.{label}.uss_mb"] = info.uss / _MIB
            out[f"mem.{label}.pss_mb"] = info.pss / _MIB
            out[f"mem.{label}.shared_mb"] = max(0, info.rss - info.uss) / _MIB
            total += info.pss / _MIB
        if out and not workers_only:  # the job's total needs every process's reading at once
            out["mem.total.pss_mb"] = total
        out["mem.host.available_mb"] = available_mb()
        return out

    def close(self) -> None:
        return None
