"""Where each loader process's time goes: on a CPU, waiting for one, or blocked, and blocked on what.

For the loop thread of each loader worker (its process's first thread) and for the training process's main
thread: schedstat fields 1 and 2 give the exact time on a CPU and runnable-but-waiting in each sampling period;
the rest of the period the thread was off the CPU. A poller thread reads, :data:`POLL_HZ` times a second on
average (at random intervals), each thread's state (``/proc/PID/task/TID/stat`` field 3) and, when it is
blocked, the system call it is blocked in (``/proc/PID/task/TID/syscall``) and what that call waits on
(``/proc/PID/fd/N``: a regular file, a socket, a pipe). The off-CPU share of a window is split in the
proportions of the window's blocked polls:

- ``storage``: a read-family call on a regular file, or uninterruptible sleep (state D: disk I/O, a page
  fault on a mapped file);
- ``network``: a call on a socket (read, recv, send, connect, accept, or a poll/select/epoll on sockets);
- ``queue``: a read or poll on pipes only. A loader worker does this waiting for the main process to send it
  the next indices: it is ahead of the training (every prefetch slot full);
- ``sleep``: ``nanosleep``/``clock_nanosleep`` (``time.sleep``); ``lock``: ``futex`` (a lock, a condition, a
  join); ``other``: any other call, or none could be read.

docs/metrics.md, "Loader time", defines the figures. Reading another process's ``syscall`` and memory needs the
permission ptrace needs (root, or the same user on a process stallscope started); where it is refused the
blocked share is ``other`` (``ThreadProbe.refused`` holds the reason; the report does not show it yet).
Invariants: the first reading of a thread is NaN (figures are differences); a worker is its pid and start
time, as in :mod:`.sched`.
"""

from __future__ import annotations

import math
import os
import platform
import random
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from profiler.core.sources.base import SourceEnded
from profiler.core.sources.sched import PROC, parse, schedstat_path, start_time

POLL_HZ = 25.0
CATEGORIES = ("storage", "network", "queue", "sleep", "lock", "other")
_NAN = math.nan

# system call numbers by machine: read family, socket calls, poll family, sleep, futex
_CALLS = {
    "x86_64": {
        "read": (0, 17, 19, 295, 327), "write": (1, 18, 20, 296, 328),
        "socket": (42, 43, 44, 45, 46, 47, 288, 299, 307),
        "poll": (7, 271), "select": (23, 270), "epoll": (232, 281, 441),
        "sleep": (35, 230), "lock": (202, 449), "restart": (219,),
    },
    "aarch64": {
        "read": (63, 65, 67, 69, 286), "write": (64, 66, 68, 70, 287),
        "socket": (202, 203, 206, 207, 211, 212, 242, 243, 269),
        "poll": (73,), "select": (72,), "epoll": (22, 441),
        "sleep": (101, 115), "lock": (98, 449), "restart": (128,),
    },
}  # fmt: skip
# a call interrupted (by py-spy pausing the process, a signal) resumes as restart_syscall: the kernel function
# it waits in (/proc/PID/task/TID/wchan) names the original call's family; its argument registers are unchanged
_WCHAN = (("poll", "poll"), ("select", "select"), ("ep_poll", "epoll"), ("nanosleep", "sleep"), ("futex", "lock"))
MAX_FDS = 64  # a poll on more fds than this is classified by its first MAX_FDS


def calls(machine: str | None = None) -> dict[int, str]:
    """System call number -> its family on this machine (empty where the numbers are not known)."""
    table = _CALLS.get(machine or platform.machine(), {})
    return {n: family for family, numbers in table.items() for n in numbers}


def fd_kind(target: str) -> str:
    """What ``readlink /proc/PID/fd/N`` names: ``file``, ``socket``, ``pipe`` or ``other``."""
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    return "file" if target.startswith("/") else "other"


def of_kinds(kinds: set[str]) -> str:
    """A wait on several fds: on a socket is network; on pipes only, a queue; else other."""
    if "socket" in kinds:
        return "network"
    if kinds == {"pipe"}:
        return "queue"
    return "storage" if kinds == {"file"} else "other"


class ThreadProbe:
    """One thread's state and system call, read from ``/proc``; every read is best-effort."""

    def __init__(self, pid: int, tid: int, root: str = PROC, table: Mapping[int, str] | None = None) -> None:
        self.pid, self.tid, self.root = pid, tid, root
        self.table = calls() if table is None else table
        self.refused: str | None = None  # why syscall or memory could not be read (permission), once known
        self._fds: dict[str, int] = {}  # stat, syscall, mem: opened once, read with pread (a poll is ~3 reads)

    def _pread(self, name: str, size: int, offset: int = 0) -> bytes | None:
        fd = self._fds.get(name)
        path = f"{self.root}/{self.pid}/{name}" if name == "mem" else f"{self.root}/{self.pid}/task/{self.tid}/{name}"
        try:
            if fd is None:
                fd = self._fds[name] = os.open(path, os.O_RDONLY)
            return os.pread(fd, size, offset)
        except PermissionError:
            self.refused = f"{path}: permission denied (needs the permission ptrace needs)"
        except (OSError, OverflowError, ValueError):
            pass
        return None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def state(self) -> str | None:
        raw = self._pread("stat", 512)
        if not raw:
            return None
        rest = raw[raw.rfind(b")") + 2 :]
        return rest[:1].decode() or None

    def blocked_on(self, state: str) -> str:
        """The category of a thread seen blocked (state S or D)."""
        call = self._syscall()
        family = self.table.get(call[0]) if call is not None else None
        if family == "restart":
            family = self._wchan_family()
        if call is None or family is None:
            return "storage" if state == "D" else "other"
        args = call[1]
        if family in ("read", "write"):
            kind = self._fd(args[0])
            by_kind = {"socket": "network", "pipe": "queue", "file": "storage"}
            return by_kind.get(kind, "storage" if state == "D" else "other")
        if family in ("poll", "select", "epoll"):
            return of_kinds(self._waited(family, args))
        return "network" if family == "socket" else family  # sleep, lock

    def _syscall(self) -> tuple[int, list[int]] | None:
        raw = self._pread("syscall", 256)
        fields = raw.split() if raw else []
        if not fields or not fields[0].lstrip(b"-").isdigit():
            return None  # "running", or "-1 ..." (not in a call)
        try:
            return int(fields[0]), [int(a, 16) for a in fields[1:7]]
        except ValueError:
            return None

    def _wchan_family(self) -> str | None:
        try:
            with open(f"{self.root}/{self.pid}/task/{self.tid}/wchan") as f:
                wchan = f.read()
        except OSError:
            return None
        return next((family for part, family in _WCHAN if part in wchan), None)

    def _fd(self, fd: int) -> str:
        try:
            return fd_kind(os.readlink(f"{self.root}/{self.pid}/fd/{fd}"))
        except OSError:
            return "other"

    def _waited(self, family: str, args: list[int]) -> set[str]:
        """The kinds of the fds a poll, select or epoll waits on (empty when they cannot be read)."""
        try:
            if family == "poll":
                n = min(args[1], MAX_FDS)
                raw = self._memory(args[0], 8 * n)
                fds = [struct.unpack_from("i", raw, 8 * i)[0] for i in range(n)] if raw else []
            elif family == "select":
                n = min(args[0], 1024)
                raw = self._memory(args[1], (n + 7) // 8) if args[1] else b""
                fds = [i for i in range(n) if raw and raw[i // 8] >> (i % 8) & 1][:MAX_FDS]
            else:
                fds = self._epoll_targets(args[0])
        except (struct.error, IndexError):
            return set()
        return {self._fd(fd) for fd in fds if fd >= 0}

    def _memory(self, address: int, size: int) -> bytes:
        if size <= 0 or address <= 0:
            return b""
        return self._pread("mem", size, address) or b""

    def _epoll_targets(self, epfd: int) -> list[int]:
        try:
            with open(f"{self.root}/{self.pid}/fdinfo/{epfd}") as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        return [int(line.split()[1]) for line in lines if line.startswith("tfd:")][:MAX_FDS]


class _Thread:
    """A watched loop thread: its probe, schedstat file and last (cpu, runq) ns, and its polls so far."""

    def __init__(self, pid: int, root: str, table: Mapping[int, str]) -> None:
        self.pid = pid
        self.start = start_time(pid, root)
        self.probe = ThreadProbe(pid, pid, root, table)
        self.fd = os.open(schedstat_path(pid, pid, root), os.O_RDONLY)
        self.prev: tuple[int, int] | None = None
        self.prev_io: tuple[int, int] | None = None
        self.blocked: Counter[str] = Counter()
        try:
            self.io_fd: int | None = os.open(f"{root}/{pid}/io", os.O_RDONLY)
        except OSError:
            self.io_fd = None  # not permitted here: the reads are not measured

    def io(self) -> tuple[int, int] | None:
        """The process's (bytes through read calls, bytes read from storage) so far (``/proc/PID/io`` rchar,
        read_bytes), None where it cannot be read."""
        if self.io_fd is None:
            return None
        try:
            raw = os.pread(self.io_fd, 512, 0)
            fields = dict(line.split(b":", 1) for line in raw.splitlines() if b":" in line)
            return int(fields[b"rchar"]), int(fields[b"read_bytes"])
        except (OSError, KeyError, ValueError):
            return None

    def times(self) -> tuple[int, int] | None:
        try:
            cpu, runq, _ = parse(os.pread(self.fd, 64, 0))
        except (OSError, ValueError):
            return None
        return cpu, runq

    def close(self) -> None:
        os.close(self.fd)
        if self.io_fd is not None:
            os.close(self.io_fd)
        self.probe.close()


class BlockedSource:
    """Sampled CPU / run-queue / blocked split of the main thread and each loader worker's loop thread.

    ``workers`` returns label -> pid as ``HostSource.pid_labels`` does (its ``main`` entry is the training
    process); metrics are ``loader.<label>.<part>_pct``, % of the period, for ``cpu``, ``runq`` and ``off``;
    ``loader.<label>.polls_<category>``, the period's blocked polls in each of :data:`CATEGORIES`; and
    ``loader.<label>.read_mbps`` / ``storage_mbps``, the process's bytes through read calls and read from
    storage rather than the page cache (``/proc/PID/io`` rchar, read_bytes), MB/s.
    """

    name = "loader"

    def __init__(
        self,
        pid: int | None = None,
        *,
        workers: Callable[[], Mapping[str, int]] | None = None,
        poll_hz: float = POLL_HZ,
        rescan_s: float = 1.0,
        root: str = PROC,
        clock: Callable[[], float] = time.monotonic,
        table: Mapping[int, str] | None = None,
    ) -> None:
        if not poll_hz > 0:
            raise ValueError(f"poll_hz must be > 0, got {poll_hz!r}")
        self.pid = os.getpid() if pid is None else pid
        self._workers_of = workers
        self._period = 1.0 / poll_hz
        self._root, self._clock = root, clock
        self._table = calls() if table is None else table
        self._threads: dict[str, _Thread] = {}
        self._gone: set[str] = set()
        self._last_t: float | None = None
        self._last_scan = -math.inf
        self._rescan_s = rescan_s
        self._rescan_due = False  # rescan_soon(): set from any thread, taken by the next read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def open(self) -> str | None:
        try:
            with open(schedstat_path(self.pid, self.pid, self._root), "rb") as f:
                f.read(64)
        except OSError as exc:
            return f"cannot read the training process's schedstat: {exc.strerror or exc}"
        with self._lock:
            self._watch("main", self.pid)
            self._last_t = None
            self._take(self._clock())
        self._stop.clear()
        self._poller = threading.Thread(target=self._poll_loop, name="stallscope-loader-poll", daemon=True)
        self._poller.start()
        return None

    def read(self) -> dict[str, float]:
        with self._lock:
            if "main" not in self._threads:
                raise RuntimeError("BlockedSource.read() called before a successful open()")
            now = self._clock()
            # workers come and go rarely (a loader's iter() says when); rescanning costs reads. A label the host
            # source found since is watched at once: iter()'s word can reach this source before the host has them
            # (a 1 s run then had no worker row, and its loader time per item was not measured)
            if self._rescan_due or now - self._last_scan >= self._rescan_s or self._unwatched():
                self._last_scan, self._rescan_due = now, False
                self._rescan()
            return self._take(now)

    def rescan_soon(self) -> None:
        """Rescan the workers at the next read (:class:`~profiler.core.sources.base.Rescans`)."""
        self._rescan_due = True

    def _unwatched(self) -> bool:
        """A worker label listed that is neither watched nor gone (a dict copy: no /proc read)."""
        listed = self._workers_of() if self._workers_of else {}
        return any(k != "main" and k not in self._threads and k not in self._gone for k in listed)

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=2.0)
            self._poller = None
        with self._lock:
            for t in self._threads.values():
                t.close()
            self._threads.clear()

    def poll_once(self) -> None:
        """One poll of every watched thread (the poller thread calls this POLL_HZ times a second)."""
        with self._lock:
            threads = list(self._threads.values())
        for t in threads:
            state = t.probe.state()
            if state in ("S", "D"):
                category = t.probe.blocked_on(state)
                with self._lock:
                    t.blocked[category] += 1

    def _poll_loop(self) -> None:
        # exponential intervals (a Poisson process): polls at a fixed period alias with a loader whose items
        # take the same period, and would see the same part of every item (measured: a 20 ms sleep and a 20 ms
        # spin per item, polled every 40 ms, read 0% asleep)
        rng = random.Random()
        while not self._stop.wait(rng.expovariate(1.0 / self._period)):
            self.poll_once()

    def _watch(self, label: str, pid: int) -> None:
        try:
            self._threads[label] = _Thread(pid, self._root, self._table)
        except OSError:
            self._gone.add(label)  # exited before it was seen: labels are never reused

    def _rescan(self) -> None:
        listed = {k: v for k, v in (self._workers_of() if self._workers_of else {}).items() if k != "main"}
        for label, pid in listed.items():
            known = self._threads.get(label)
            if known is None and label not in self._gone:
                self._watch(label, pid)
            elif known is not None and (known.pid != pid or start_time(pid, self._root) != known.start):
                self._drop(label)

    def _drop(self, label: str) -> None:
        t = self._threads.pop(label, None)
        if t is not None:
            t.close()
        self._gone.add(label)

    def _take(self, now: float) -> dict[str, float]:
        dt, self._last_t = (None if self._last_t is None else now - self._last_t), now
        out: dict[str, float] = {}
        for label, t in list(self._threads.items()):
            times = t.times()
            if times is None:
                if label == "main":
                    raise SourceEnded(f"process {self.pid} exited (its main thread's schedstat is gone)")
                self._drop(label)
                continue
            prev = t.prev
            t.prev = times if prev is None or dt is None or dt <= 0 else within(prev, times, dt)
            blocked, t.blocked = t.blocked, Counter()
            out.update(split(label, prev, t.prev, dt, blocked))
            prev_io, t.prev_io = t.prev_io, t.io()
            out.update(io_rates(label, prev_io, t.prev_io, dt))
        return out


def io_rates(
    label: str, prev: tuple[int, int] | None, now: tuple[int, int] | None, dt: float | None
) -> dict[str, float]:
    """The process's MB/s through read calls (files, sockets, pipes) and read from storage over the period."""
    if prev is None or now is None or dt is None or dt <= 0:
        return {f"loader.{label}.read_mbps": _NAN, f"loader.{label}.storage_mbps": _NAN}
    return {
        f"loader.{label}.read_mbps": max(0, now[0] - prev[0]) / dt / 1e6,
        f"loader.{label}.storage_mbps": max(0, now[1] - prev[1]) / dt / 1e6,
    }


def within(prev: tuple[int, int], now: tuple[int, int], dt: float) -> tuple[int, int]:
    """The (cpu, runq) ns counters as far as a period of ``dt`` s can hold them: at most ``dt`` of the two together,
    the rest carried into the next period. The kernel adds a wait for a CPU to schedstat only when the thread gets
    one (and a running thread's CPU time at the next tick), so a wait that spans periods lands whole in the period
    it ended in, which then read over 100% on a CPU and waiting (1,482 of 32,966 periods in one suite's stores, up
    to 395%), where the periods before had counted that wait off the CPU: the parts summed to more than 100%."""
    room = int(dt * 1e9)
    cpu = min(now[0] - prev[0], room)
    runq = min(now[1] - prev[1], room - max(cpu, 0))
    return prev[0] + cpu, prev[1] + runq


def split(
    label: str, prev: tuple[int, int] | None, now: tuple[int, int], dt: float | None, blocked: Counter[str]
) -> dict[str, float]:
    """One thread's period: % on a CPU, % waiting for one, % off the CPU, and its blocked polls by category.

    The polls are counts, not shares: a period of 0.1 s holds two or three polls, too few to split its own
    off-CPU time; the analysis splits the off-CPU time of a whole window by the window's polls.
    """
    keys = [f"loader.{label}.{part}_pct" for part in ("cpu", "runq", "off")]
    polls = [f"loader.{label}.polls_{c}" for c in CATEGORIES]
    if prev is None or dt is None or dt <= 0:
        return dict.fromkeys(keys + polls, _NAN)
    cpu = max(0.0, (now[0] - prev[0]) / (dt * 1e9) * 100.0)
    runq = max(0.0, (now[1] - prev[1]) / (dt * 1e9) * 100.0)
    out = dict(zip(keys, (cpu, runq, max(0.0, 100.0 - cpu - runq)), strict=True))
    out.update((key, float(blocked[c])) for key, c in zip(polls, CATEGORIES, strict=True))
    return out
