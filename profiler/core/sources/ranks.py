"""Ranks of a torch.distributed job found from outside, and their CPU: the processes of a launcher's tree
that torch.distributed would call rank R (how: docs/zero-code.md, "Ranks from their environment", and
docs/multi-rank.md for ranks that announce their pid through ``announced``).

Metrics per rank R: ``rank{R}.main.cpu_pct``, ``rank{R}.workers.cpu_pct``, ``rank{R}.cpu_pct``, ``rank{R}.rss_mb``
and ``rank{R}.alive``, with CPU % as :mod:`profiler.core.sources.host` means it.

Invariants: the tree is rescanned at most every ``refresh_s`` seconds; a process's environment is read when
it is first seen and at each rescan until it names a rank (a launcher's fork names none until it execs); a
process that is gone or unreadable is dropped, never an error; only the loss of the root raises
:class:`~profiler.core.sources.base.SourceEnded`. Without ranks the source reads nothing (an empty reading).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from profiler.core.sources.base import ProcessHandle, SourceEnded

_MIB = float(1 << 20)
# What makes two processes the same rank: a worker forked from rank R carries exactly its environment
_IDENTITY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
             "TORCHELASTIC_RESTART_COUNT")  # fmt: skip


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


RankMeta = dict[str, int | list[int] | None]  # one rank as a run's meta ``ranks`` holds it


@dataclass(frozen=True, slots=True)
class RankProcess:
    """One rank process as its environment names it; ``worker_pids``: the processes seen under it."""

    rank: int
    pid: int
    local_rank: int | None = None
    world_size: int | None = None
    node_rank: int | None = None  # torchrun's GROUP_RANK
    worker_pids: tuple[int, ...] = field(default_factory=tuple)

    def to_meta(self) -> RankMeta:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node_rank": self.node_rank,
            "worker_pids": list(self.worker_pids),
        }


def rank_identity(environ: Mapping[str, str]) -> tuple[str | None, ...] | None:
    """The environment variables that name a rank, or None when ``environ`` has no integer ``RANK``."""
    if _int(environ.get("RANK")) is None:
        return None
    return tuple(environ.get(k) for k in _IDENTITY)


class _Handle(ProcessHandle, Protocol):
    """What this source calls besides a process source's own."""

    def environ(self) -> dict[str, str]: ...

    def ppid(self) -> int: ...

    def children(self, recursive: bool) -> Sequence[_Handle]: ...


@dataclass
class _Proc:
    handle: _Handle
    ppid: int
    identity: tuple[str | None, ...] | None
    environ: dict[str, str]
    primed: bool = False


class RankSource:
    """psutil-backed :class:`~profiler.core.sources.base.Source` of the ranks under ``root_pid`` (see the module)."""

    name = "ranks"

    def __init__(
        self,
        root_pid: int,
        *,
        refresh_s: float = 1.0,
        announced: Callable[[], dict[int, int]] | None = None,
        psutil_module: ModuleType | None = None,
    ) -> None:
        self._root_pid = root_pid
        self._announced = announced
        self._ended: dict[int, float] = {}  # rank -> time.time() when its process was first found gone
        self._refresh_s = refresh_s
        self._ps: Any = psutil_module
        self._root: _Handle | None = None
        self._procs: dict[int, _Proc] = {}
        self._seen: dict[int, RankProcess] = {}  # rank pid -> the rank, kept after it exits
        self._last_refresh = -math.inf
        self._lock = threading.Lock()  # ranks() is called from another thread than read()

    def open(self) -> str | None:
        if self._ps is None:
            try:
                import psutil
            except ImportError:
                return "psutil not installed"
            self._ps = psutil
        try:
            self._root = self._ps.Process(self._root_pid)
        except self._ps.NoSuchProcess:
            return f"process {self._root_pid} not found"
        return None

    def ended(self) -> dict[int, float]:
        """Rank -> when (``time.time()``) its process was first found gone. Checks every rank seen so far now, so
        a death since the last reading is not missed (it is then timed now, at most one period late)."""
        ps = self._ps
        with self._lock:
            for rank_pid, rank in self._seen.items():
                if rank.rank in self._ended or ps is None:
                    continue
                try:
                    gone = ps.Process(rank_pid).status() == ps.STATUS_ZOMBIE
                except (ps.NoSuchProcess, ps.ZombieProcess):
                    gone = True
                except ps.AccessDenied:
                    gone = False
                if gone:
                    self._ended[rank.rank] = time.time()
            return dict(self._ended)

    def ranks(self) -> list[RankProcess]:
        """Every rank process seen so far (exited ones included), by rank then pid."""
        with self._lock:
            return sorted(self._seen.values(), key=lambda r: (r.rank, r.pid))

    def read(self) -> dict[str, float]:
        if self._root is None:
            raise RuntimeError("RankSource.read() called before a successful open()")
        with self._lock:
            now = time.monotonic()
            if now - self._last_refresh >= self._refresh_s:
                self._refresh(now)
            owner = self._owners()
            out: dict[str, float] = {}
            for pid, rank_pid in owner.items():
                reading = self._read(pid)
                if reading is None:
                    continue
                r = self._seen[rank_pid].rank
                part = "main" if pid == rank_pid else "workers"
                cpu, rss = reading
                for key, value in (
                    (f"rank{r}.{part}.cpu_pct", cpu),
                    (f"rank{r}.cpu_pct", cpu),
                    (f"rank{r}.rss_mb", rss),
                ):
                    out[key] = out.get(key, 0.0) + value
            for rank_pid in set(owner.values()):
                out.setdefault(f"rank{self._seen[rank_pid].rank}.workers.cpu_pct", 0.0)
            for rank_pid, rank in self._seen.items():
                alive = rank_pid in self._procs
                if not alive:
                    self._ended.setdefault(rank.rank, time.time())
                out[f"rank{rank.rank}.alive"] = 1.0 if alive else 0.0
        return out

    def close(self) -> None:
        with self._lock:
            self._root = None
            self._procs.clear()

    def _read(self, pid: int) -> tuple[float, float] | None:
        p = self._procs[pid]
        ps = self._ps
        try:
            with p.handle.oneshot():
                if p.handle.status() == ps.STATUS_ZOMBIE:
                    raise ps.ZombieProcess(pid)
                cpu = float(p.handle.cpu_percent(None))
                rss = p.handle.memory_info().rss / _MIB
        except (ps.NoSuchProcess, ps.ZombieProcess):
            del self._procs[pid]
            return None
        except ps.AccessDenied:
            # alive but unreadable: no figure this time, and not taken for ended (it would be found again at the
            # next rescan and flap between alive and ended)
            return None
        first, p.primed = not p.primed, True
        return (math.nan if first else cpu), rss

    def _owners(self) -> dict[int, int]:
        """Live pid -> the pid of the rank process it belongs to (itself for a rank process)."""
        owner: dict[int, int] = {}
        for pid in self._procs:
            cur, hops = pid, 0
            while cur in self._procs and hops < 64:
                if cur in self._seen:
                    owner[pid] = cur
                    break
                cur, hops = self._procs[cur].ppid, hops + 1
        return owner

    def _refresh(self, now: float) -> None:
        ps, root = self._ps, self._root
        if root is None:
            raise RuntimeError("RankSource: refreshed before a successful open()")
        self._last_refresh = now
        try:
            listed = root.children(recursive=True)
        except (ps.NoSuchProcess, ps.ZombieProcess) as exc:
            raise SourceEnded(f"process {self._root_pid} exited") from exc
        except ps.AccessDenied:
            return
        live = {p.pid for p in listed}
        for pid in set(self._procs) - live:
            del self._procs[pid]
        told = self._announced() if self._announced is not None else {}
        for proc in listed:
            known = self._procs.get(proc.pid)
            if known is not None and known.handle == proc:
                if known.identity is None:
                    self._identify_again(known, told.get(proc.pid))
                continue
            try:
                environ = proc.environ()
                ppid = proc.ppid()
                proc.cpu_percent(None)
            except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
                continue
            if proc.pid in told and _int(environ.get("RANK")) is None:  # a rank that set RANK after it started
                environ = {**environ, "RANK": str(told[proc.pid])}
            self._procs[proc.pid] = _Proc(proc, ppid, rank_identity(environ), environ)
        for pid, p in self._procs.items():
            parent = self._procs.get(p.ppid)
            if (
                p.identity is not None
                and pid not in self._seen
                and (parent is None or parent.identity != p.identity)
                and not self._under_rank(pid)
            ):
                env = p.environ
                self._seen[pid] = RankProcess(
                    rank=int(env["RANK"]),
                    pid=pid,
                    local_rank=_int(env.get("LOCAL_RANK")),
                    world_size=_int(env.get("WORLD_SIZE")),
                    node_rank=_int(env.get("GROUP_RANK")),
                )
        for rank_pid, pids in self._workers().items():
            old = self._seen[rank_pid]
            merged = tuple(sorted(set(old.worker_pids) | pids))
            if merged != old.worker_pids:
                self._seen[rank_pid] = RankProcess(
                    old.rank, old.pid, old.local_rank, old.world_size, old.node_rank, merged
                )

    def _identify_again(self, known: _Proc, announced_rank: int | None) -> None:
        """Re-reads the environment of a process that named no rank when first seen. A launcher's rank is first a
        fork of the launcher, which has no RANK until it execs the script: seen in that window, it would stay
        unnamed, and its first loader worker (forked after the exec, with the rank's environment) would be taken
        for the rank."""
        try:
            environ = known.handle.environ()
        except (self._ps.NoSuchProcess, self._ps.ZombieProcess, self._ps.AccessDenied):
            return
        if announced_rank is not None and _int(environ.get("RANK")) is None:  # it announced itself since
            environ = {**environ, "RANK": str(announced_rank)}
        known.environ, known.identity = environ, rank_identity(environ)

    def _under_rank(self, pid: int) -> bool:
        """Whether a rank process is among ``pid``'s ancestors (then ``pid`` is one of its workers). A rank that
        has exited still counts: its worker, still alive and listed with the rank as its parent, is not a rank."""
        cur, hops = self._procs[pid].ppid, 0
        while hops < 64:
            if cur in self._seen:
                return True
            if cur not in self._procs:
                return False
            cur, hops = self._procs[cur].ppid, hops + 1
        return False

    def _workers(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for pid, rank_pid in self._owners().items():
            if pid != rank_pid:
                out.setdefault(rank_pid, set()).add(pid)
        return out
