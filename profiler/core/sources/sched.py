"""Run-queue wait: how long threads were runnable but not running, from Linux schedstat (what it means and
how it is read: docs/metrics.md, the contention section). :class:`ThreadSched` serves the training thread's
hot path (one ``pread``, parsed later by :func:`run_delay_s`); :class:`SchedSource` samples the process's
threads and each loader worker.

Invariants:
- A thread reading its own counter is running, so the difference of two of its own reads is exactly its
  run-queue wait between them.
- Every figure is a difference of two readings: a first reading is NaN (not 0); a thread first seen enters a
  sum from its next reading. Rates are ``100 * run delay / period`` (a sum over threads: % of one core).
- Thread and worker lists are rescanned at most every ``rescan_s``; a worker is its pid and start time (a
  recycled pid is not the old worker). Only the loss of the main thread raises :class:`SourceEnded`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial

from profiler.core.sources.base import SourceEnded

PROC = "/proc"
FIELD = "field 2 (run delay: ns runnable but waiting for a CPU)"
_NAN = math.nan
_READ = 64  # three decimal counters and two spaces fit in 64 bytes until the year 2500


def parse(raw: bytes) -> tuple[int, int, int]:
    """schedstat bytes -> (ns on CPU, ns waiting on a run queue, timeslices); ValueError if malformed."""
    fields = raw.split()
    if len(fields) < 3:
        raise ValueError(f"schedstat has {len(fields)} fields, expected 3: {raw[:40]!r}")
    return int(fields[0]), int(fields[1]), int(fields[2])


def run_delay_s(raw: bytes) -> float:
    """Run-queue wait in seconds from one schedstat reading (field 2; the kernel separates by one space)."""
    return int(raw.split(b" ", 2)[1]) / 1e9


def delay_between(r0: bytes | None, r1: bytes | None) -> float | None:
    """Run-queue wait (s) between two readings of one thread's schedstat; None when either is missing."""
    if r0 is None or r1 is None:
        return None
    return run_delay_s(r1) - run_delay_s(r0)


def schedstat_path(pid: int | str, tid: int, root: str = PROC) -> str:
    return f"{root}/{pid}/task/{tid}/schedstat"


def probe(pid: int | str = "self", tid: int | None = None, root: str = PROC) -> str | None:
    """None when a thread's schedstat can be read and counts, else a one-line reason.

    Defaults to the calling thread. A counter that reads ``0 0 0`` for a thread that is running is
    scheduler statistics switched off, not an idle thread (a running thread has run at least once).
    """
    if not sys.platform.startswith("linux") and root == PROC:
        return f"schedstat is Linux-only (this is {sys.platform})"
    path = schedstat_path(pid, threading.get_native_id() if tid is None else tid, root)
    try:
        with open(path, "rb") as f:
            raw = f.read(_READ)
    except FileNotFoundError:
        return f"{path} does not exist (kernel without CONFIG_SCHED_INFO)"
    except PermissionError:
        return f"no permission to read {path}"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    try:
        off = parse(raw) == (0, 0, 0)
    except ValueError as exc:
        return f"unreadable {path}: {exc}"
    return f"{path} reads 0 0 0 (scheduler statistics are off in this kernel)" if off else None


class ThreadSched:
    """The calling thread's own schedstat, opened once; ``raw()`` is one ``pread``.

    ``ident`` is the Python thread ident of the thread it describes: a caller on another thread must not
    use the readings, which would be this thread's, not its own.
    """

    __slots__ = ("_fd", "ident", "path", "raw", "tid")

    def __init__(self, root: str = PROC) -> None:
        self.tid = threading.get_native_id()
        self.ident = threading.get_ident()
        self.path = schedstat_path("self", self.tid, root)
        self._fd: int | None = os.open(self.path, os.O_RDONLY)
        # A bound partial, not a method: the hot path pays for one C call and nothing else.
        self.raw: Callable[[], bytes] = partial(os.pread, self._fd, _READ, 0)

    def run_delay_s(self) -> float:
        return run_delay_s(self.raw())

    def close(self) -> None:
        """Release the file. Idempotent; ``raw()`` must not be called afterwards."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class _Proc:
    """One process's threads: an open file and the last run delay (ns) per thread."""

    __slots__ = ("fds", "pid", "prev", "start")

    def __init__(self, pid: int, start: str | None) -> None:
        self.pid = pid
        self.start = start
        self.fds: dict[int, int] = {}
        self.prev: dict[int, int] = {}

    def rescan(self, root: str) -> bool:
        """Open newly started threads, close exited ones; False when the process is gone."""
        try:
            tids = {int(t) for t in os.listdir(f"{root}/{self.pid}/task")}
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            self.close()
            return False
        for tid in set(self.fds) - tids:
            self.forget(tid)
        for tid in tids - set(self.fds):
            try:
                self.fds[tid] = os.open(schedstat_path(self.pid, tid, root), os.O_RDONLY)
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited between the listing and the open
        return bool(self.fds)

    def read(self) -> dict[int, int]:
        """Run delay (ns) since the previous read, per thread that has a previous read."""
        out: dict[int, int] = {}
        for tid, fd in list(self.fds.items()):
            try:
                delay = parse(os.pread(fd, _READ, 0))[1]
            except (ProcessLookupError, ValueError):
                # an exited thread's file reads ESRCH (or empty); its last period is lost, not guessed
                self.forget(tid)
                continue
            last = self.prev.get(tid)
            self.prev[tid] = delay
            if last is not None:
                out[tid] = delay - last
        return out

    def forget(self, tid: int) -> None:
        fd = self.fds.pop(tid, None)
        self.prev.pop(tid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for tid in list(self.fds):
            self.forget(tid)


def start_time(pid: int, root: str = PROC) -> str | None:
    """A process's start time (``/proc/<pid>/stat`` field 22, clock ticks since boot), None if unreadable."""
    try:
        with open(f"{root}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields after it follow the last ')'
    rest = stat[stat.rfind(b")") + 2 :].split()
    return rest[19].decode() if len(rest) > 19 else None


class SchedSource:
    """Sampled run-queue wait of the training process, its main thread and its loader workers.

    ``workers`` returns label -> pid for the loader workers (``HostSource.pid_labels`` does: its ``main``
    entry is ignored here), so both sources give a worker the same label.
    """

    name = "sched"

    def __init__(
        self,
        pid: int | None = None,
        *,
        workers: Callable[[], Mapping[str, int]] | None = None,
        rescan_s: float = 1.0,
        root: str = PROC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rescan_s < 0:
            raise ValueError(f"rescan_s must be >= 0, got {rescan_s!r}")
        self.pid = os.getpid() if pid is None else pid
        self._workers_of = workers
        self._rescan_s = rescan_s
        self._root = root
        self._clock = clock
        self._main: _Proc | None = None
        self._workers: dict[str, _Proc] = {}
        self._unprimed: set[str] = set()
        self._gone: set[str] = set()
        self._last_scan = -math.inf
        self._rescan_due = False  # rescan_soon(): set from any thread, taken by the next read
        self._last_t: float | None = None
        # close() may come from another thread than the sampler's read()
        self._lock = threading.Lock()

    def open(self) -> str | None:
        reason = probe(self.pid, self.pid, self._root)
        if reason is not None:
            return reason
        with self._lock:
            self._main = _Proc(self.pid, None)
            self._last_t = None
            now = self._clock()
            self._rescan(now)
            self._take(now)  # primes every counter: the first read() then has a previous reading
        return None

    def read(self) -> dict[str, float]:
        with self._lock:
            if self._main is None:
                raise RuntimeError("SchedSource.read() called before a successful open()")
            now = self._clock()
            if self._rescan_due or now - self._last_scan >= self._rescan_s:
                self._rescan_due = False
                self._rescan(now)
            return self._take(now)

    def rescan_soon(self) -> None:
        """Rescan threads and workers at the next read (:class:`~profiler.core.sources.base.Rescans`)."""
        self._rescan_due = True

    def close(self) -> None:
        with self._lock:
            if self._main is not None:
                self._main.close()
            for proc in self._workers.values():
                proc.close()
            self._main = None
            self._workers.clear()
            self._unprimed.clear()

    def _take(self, now: float) -> dict[str, float]:
        assert self._main is not None
        main = self._main
        deltas = main.read()
        if self.pid not in main.fds:
            raise SourceEnded(f"process {self.pid} exited (its main thread's schedstat is gone)")
        dt, self._last_t = (None if self._last_t is None else now - self._last_t), now
        pct = partial(_pct, dt)
        out = {"sched.main.runq_pct": pct(deltas.get(self.pid)), "sched.proc.runq_pct": pct(sum(deltas.values()))}
        summed: list[float] = []
        for label, proc in list(self._workers.items()):
            got = proc.read()
            if not proc.fds:
                self._drop(label)
                continue
            value = _NAN if label in self._unprimed else pct(sum(got.values()))
            self._unprimed.discard(label)
            out[f"sched.{label}.runq_pct"] = value
            summed.append(value)
        if summed:
            # a sum with an unknown term is unknown: NaN propagates rather than under-reporting
            out["sched.workers.runq_pct"] = math.fsum(summed)
        return out

    def _rescan(self, now: float) -> None:
        assert self._main is not None
        self._last_scan = now
        self._main.rescan(self._root)
        listed = {k: v for k, v in (self._workers_of() if self._workers_of else {}).items() if k != "main"}
        for label in set(self._workers) - set(listed):
            self._drop(label)
        for label, pid in listed.items():
            if label in self._gone:
                continue
            known = self._workers.get(label)
            if known is None:
                proc = _Proc(pid, start_time(pid, self._root))
                if proc.rescan(self._root):
                    self._workers[label] = proc
                    self._unprimed.add(label)
                else:
                    self._gone.add(label)  # exited before we saw it: labels are never reused
            elif known.pid != pid or start_time(pid, self._root) != known.start or not known.rescan(self._root):
                self._drop(label)  # exited, or its pid now belongs to another process

    def _drop(self, label: str) -> None:
        proc = self._workers.pop(label, None)
        if proc is not None:
            proc.close()
        self._unprimed.discard(label)
        self._gone.add(label)


def _pct(dt: float | None, delta_ns: int | None) -> float:
    if dt is None or dt <= 0 or delta_ns is None:
        return _NAN
    return delta_ns / (dt * 1e9) * 100.0


# The training thread's schedstat is read at a step's boundaries (its start, its batch's arrival, its phases) on
# every step where that costs under RUNQ_BUDGET of the step, and on one step in k of shorter ones (k up to
# RUNQ_MAX_EVERY, from the last batch of steps' mean time): those reads cost RUNQ_COST_S a step in a fast loop.
# A read step of two phases reads four times (its start, its batch, each phase's exit; each phase's entry and the
# next step's start take the reading just before them: core/steps/boundaries.py). Each read is one pread of 0.9 us hot,
# but right after the loader's next() or the model's compute it ran cold: 11-41 us a read, 45-200 us a read step in the
# fast loop of benchmarks/fastloop_parts.py (3.6-4.2 ms steps, 2026-11-29, this 2-core host beside other load:
# quiet, the low end). 45 us (issue #44's figure, from a quiet host) read 1 step in 7 at 3.6 ms there, ~35 us a
# step. Every step is timed by the clock all the same; the run-queue figures are those of the steps read
# (docs/metrics.md).
RUNQ_COST_S = 100e-6
RUNQ_BUDGET = 0.002
RUNQ_MAX_EVERY = 32


def runq_every(step_s: float) -> int:
    """Read the training thread's schedstat on one step in this many, for steps of ``step_s`` seconds: its reads
    kept under RUNQ_BUDGET of a step (every step from 50 ms up), at least one step in RUNQ_MAX_EVERY."""
    if not step_s > 0:
        return 1
    return max(1, min(RUNQ_MAX_EVERY, math.ceil(RUNQ_COST_S / (RUNQ_BUDGET * step_s) - 1e-9)))  # 50 ms: 1, not 2
