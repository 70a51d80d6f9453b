"""Host metrics: CPU and resident memory of the training process, its workers and the whole machine (the
metrics and their meaning: docs/metrics.md). Sampled at 10-100 Hz beside the training on as few as two cores,
so it caches ``psutil.Process`` objects, rescans the tree at most every ``children_refresh_s`` and reads each
process inside ``oneshot()``.

Invariants:
- CPU % is psutil's per-process meaning (100 = one core); a process's first CPU reading is NaN, not 0.
- Worker labels ``w0, w1, ...`` follow first appearance and are never reused (:meth:`HostSource.pid_labels`);
  a worker that has exited reports nothing, not zero.
- A child that vanishes between listing and reading is dropped; only the loss of the main process raises
  :class:`SourceEnded` (its exit), :class:`SourceLost` (no permission). ``rss_mb`` is MiB.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from profiler.core.sources.base import ProcessHandle, SourceEnded, SourceLost

_MIB = float(1 << 20)


_NAN = math.nan


class HostSource:
    """psutil-backed :class:`~profiler.core.sources.base.Source` for one process tree and the host."""

    name = "host"

    def __init__(
        self,
        pid: int | None = None,
        *,
        children_refresh_s: float = 1.0,
        psutil_module: ModuleType | None = None,
    ) -> None:
        if children_refresh_s < 0:
            raise ValueError(f"children_refresh_s must be >= 0, got {children_refresh_s!r}")
        self._pid = os.getpid() if pid is None else pid
        self._refresh_s = children_refresh_s
        self._ps: Any = psutil_module  # psutil (untyped), or a stand-in from tests; None until open()
        self._main: ProcessHandle | None = None
        # Live children by pid; a pid leaves this map when its process is found gone.
        self._children: dict[int, ProcessHandle] = {}
        # Live child pid -> worker index. Labels outlive their process so a label is never reused.
        self._index: dict[int, int] = {}
        self._labels: dict[str, int] = {}
        self._next_index = 0
        self._unprimed: set[int] = set()
        self._main_read = False
        # Children that failed a read, so a rescan that lists them again does not re-adopt them.
        self._dropped: dict[int, ProcessHandle] = {}
        self._last_refresh = -math.inf
        self._rescan_due = False  # rescan_soon(): set from any thread, taken by the next read
        # psutil keeps system-wide cpu_percent state per calling thread, so a reading is only
        # meaningful on the thread that made the previous call.
        self._sys_cpu_thread: int | None = None
        # pid_labels() may be called from another thread than the sampler's read().
        self._lock = threading.Lock()

    def open(self) -> str | None:
        if self._ps is None:
            try:
                import psutil
            except ImportError:
                return "psutil not installed"
            self._ps = psutil
        ps = self._ps
        try:
            main = ps.Process(self._pid)
            main.cpu_percent(None)
        except ps.NoSuchProcess:
            return f"process {self._pid} not found"
        except ps.AccessDenied:
            return f"no permission to read process {self._pid}"
        ps.cpu_percent(None)
        with self._lock:
            self._main = main
            self._main_read = False
            self._sys_cpu_thread = threading.get_ident()
            self._labels["main"] = self._pid
            self._refresh_children(time.monotonic())
        return None

    def read(self) -> dict[str, float]:
        if self._main is None:
            raise RuntimeError("HostSource.read() called before a successful open()")
        ps = self._ps
        with self._lock:
            now = time.monotonic()
            if self._rescan_due or now - self._last_refresh >= self._refresh_s:
                self._rescan_due = False
                self._refresh_children(now)
            try:
                # open() primed it moments ago: CPU % over that sliver is tick noise (0% or 700%), not a reading
                main_cpu, main_rss = self._read_process(self._main, first=not self._main_read)
                self._main_read = True
            except (ps.NoSuchProcess, ps.ZombieProcess) as exc:
                raise SourceEnded(f"process {self._pid} exited") from exc
            except ps.AccessDenied as exc:
                raise SourceLost(f"lost permission to read process {self._pid}") from exc

            out: dict[str, float] = {"proc.main.cpu_pct": main_cpu, "proc.main.rss_mb": main_rss}
            kids_cpu: list[float] = []
            kids_rss: list[float] = []
            for pid, proc in list(self._children.items()):
                try:
                    cpu, rss = self._read_process(proc, first=pid in self._unprimed)
                except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
                    # Workers come and go (persistent_workers=False, shutdown); a gone one is not an error.
                    self._drop(pid)
                    continue
                self._unprimed.discard(pid)
                label = f"w{self._index[pid]}"
                out[f"proc.{label}.cpu_pct"] = cpu
                out[f"proc.{label}.rss_mb"] = rss
                kids_cpu.append(cpu)
                kids_rss.append(rss)

            # A sum with an unknown term is unknown: NaN propagates rather than under-reporting.
            children_cpu = math.fsum(kids_cpu)
            children_rss = math.fsum(kids_rss)
            out["proc.children.cpu_pct"] = children_cpu
            out["proc.children.rss_mb"] = children_rss
            out["proc.total.cpu_pct"] = main_cpu + children_cpu
            out["proc.total.rss_mb"] = main_rss + children_rss
            out["sys.cpu_pct"] = self._system_cpu()
            out["sys.mem_used_pct"] = float(ps.virtual_memory().percent)
        return out

    def close(self) -> None:
        with self._lock:
            self._main = None
            self._children.clear()
            self._index.clear()
            self._unprimed.clear()
            self._dropped.clear()
            self._last_refresh = -math.inf

    def rescan_soon(self) -> None:
        """Rescan the tree at the next read (:class:`~profiler.core.sources.base.Rescans`)."""
        self._rescan_due = True

    def pid_labels(self) -> dict[str, int]:
        """Label -> pid for the main process and every worker seen so far (exited ones included)."""
        with self._lock:
            return dict(self._labels)

    def _read_process(self, proc: ProcessHandle, *, first: bool) -> tuple[float, float]:
        ps = self._ps
        with proc.oneshot():
            # An exited but unreaped process still answers with zeros; on Linux status() comes from the
            # same cached stat read as cpu_percent(), so asking costs nothing.
            if proc.status() == ps.STATUS_ZOMBIE:
                raise ps.ZombieProcess(proc.pid)
            cpu = float(proc.cpu_percent(None))
            rss = proc.memory_info().rss / _MIB
        return (_NAN if first else cpu), rss

    def _system_cpu(self) -> float:
        value = float(self._ps.cpu_percent(None))
        tid = threading.get_ident()
        if tid != self._sys_cpu_thread:
            # First call on this thread only primed psutil's per-thread baseline.
            self._sys_cpu_thread = tid
            return _NAN
        return value

    def _refresh_children(self, now: float) -> None:
        ps, main = self._ps, self._main
        if main is None:
            raise RuntimeError("HostSource: children refreshed before a successful open()")
        self._last_refresh = now
        try:
            listed = main.children(recursive=True)
        except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
            # read() reports the main process's own loss; here the old list simply stays.
            return
        listed_pids = {proc.pid for proc in listed}
        for pid in set(self._children) - listed_pids:
            self._forget(pid)
        self._dropped = {pid: p for pid, p in self._dropped.items() if pid in listed_pids}
        # psutil.Process equality includes create time, so a recycled pid compares as a new process.
        # A dropped process (unreaped zombie, no permission) is listed again on every scan; skipping it
        # keeps it from taking a fresh label each time.
        fresh = [
            proc for proc in listed if self._children.get(proc.pid) != proc and self._dropped.get(proc.pid) != proc
        ]
        for proc in _by_birth(fresh, ps):
            if _is_profiler(proc, ps) or _is_self(proc, ps, main.pid):
                # stallscope's own py-spy (loader attribution) and its sampler process are children too, but
                # no loader worker
                self._dropped[proc.pid] = proc
                continue
            self._adopt(proc)

    def _adopt(self, proc: ProcessHandle) -> None:
        ps = self._ps
        pid = proc.pid
        # A known pid here is a recycled one: the old process exited and keeps its label.
        self._forget(pid)
        try:
            with proc.oneshot():
                if proc.status() == ps.STATUS_ZOMBIE:
                    raise ps.ZombieProcess(pid)
                proc.cpu_percent(None)
        except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
            self._dropped[pid] = proc
            return
        self._index[pid] = self._next_index
        self._labels[f"w{self._next_index}"] = pid
        self._next_index += 1
        self._children[pid] = proc
        self._unprimed.add(pid)

    def _drop(self, pid: int) -> None:
        proc = self._children.get(pid)
        if proc is not None:
            self._dropped[pid] = proc
        self._forget(pid)

    def _forget(self, pid: int) -> None:
        self._children.pop(pid, None)
        self._index.pop(pid, None)
        self._unprimed.discard(pid)


def _by_birth(procs: Iterable[ProcessHandle], ps: ModuleType) -> list[ProcessHandle]:
    """Order newly seen processes by start time so worker indices follow spawn order."""

    def key(proc: ProcessHandle) -> tuple[float, int]:
        try:
            return float(proc.create_time()), int(proc.pid)
        except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
            return math.inf, int(proc.pid)

    return sorted(procs, key=key)


_PROFILERS = frozenset({"py-spy"})


SAMPLER_ARGV = (
    "-m",
    "profiler.core.sampler_process",
)  # how the sampler process is started (profiler/core/sampler_process/client.py)


def _is_self(proc: ProcessHandle, ps: ModuleType, main: int) -> bool:
    """stallscope's sampler process (a child of the training process it samples: read from there or from here),
    or, when it reads another process's tree (``main``), a child of the process reading."""
    me = os.getpid()
    if proc.pid == me:
        return True
    try:
        ppid, cmdline = getattr(proc, "ppid", None), getattr(proc, "cmdline", None)
        if main != me and ppid is not None and int(ppid()) == me:
            return True
        return cmdline is not None and tuple(cmdline()[1:3]) == SAMPLER_ARGV
    except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
        return False


def _is_profiler(proc: ProcessHandle, ps: ModuleType) -> bool:
    name = getattr(proc, "name", None)
    if name is None:
        return False
    try:
        return bool(name() in _PROFILERS)
    except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
        return False
