"""The node's sampler of a multi-rank job: the host, and every rank's process tree, from one thread.

The launcher (profiler.launch) is the parent of the node's ranks; each rank is the parent of its loader workers.
A rank is a descendant whose environment has ``RANK`` and whose parent's has not (its workers inherit the
variable), or, for ranks that set ``RANK`` after they started (the elastic launcher's function entrypoints, whose
``/proc/PID/environ`` does not show it), a pid the ``announced`` callable maps to its rank. Each rank's tree is
read by its own :class:`~profiler.sources.host.HostSource` (cached psutil objects, children rescanned every
second), and its metrics are renamed per rank:

- ``rank{R}.cpu_pct`` (rank process + its workers), ``rank{R}.main.cpu_pct``, ``rank{R}.workers.cpu_pct``,
  ``rank{R}.rss_mb`` (the tree), all % of one core / MiB as the host source's;
- ``rank{R}.alive``: 1 while the rank's process runs, 0 from the first reading after it is gone (so the store
  says when, within one sampling period, each rank ended: the job report names the first to die);
- ``sys.cpu_pct``, ``sys.mem_used_pct`` and the launcher's own ``proc.main.*``, from a host source on the
  launcher.

Invariant: a rank found once keeps its label R (its global rank) for the whole run.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from profiler.sources.base import SourceLost
from profiler.sources.host import HostSource

_RENAME = {
    "proc.total.cpu_pct": "cpu_pct",
    "proc.main.cpu_pct": "main.cpu_pct",
    "proc.children.cpu_pct": "workers.cpu_pct",
    "proc.total.rss_mb": "rss_mb",
}


def environ_rank(proc: Any) -> int | None:
    """The ``RANK`` in a process's environment (torch.distributed's launcher sets it), None when it has none or
    the environment cannot be read."""
    try:
        value = proc.environ().get("RANK")
    except Exception:  # noqa: BLE001 - gone, no permission, a zombie: not a rank we can read
        return None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class RankTreeSource:
    """:class:`~profiler.sources.base.Source` over a launcher's ranks; see the module docstring."""

    name = "ranks"

    def __init__(
        self,
        pid: int | None = None,
        *,
        announced: Callable[[], dict[int, int]] | None = None,
        refresh_s: float = 0.5,
        psutil_module: ModuleType | None = None,
    ) -> None:
        self._pid = os.getpid() if pid is None else pid
        self._announced = announced
        self._refresh_s = refresh_s
        self._ps: Any = psutil_module
        self._launcher: HostSource | None = None
        self._ranks: dict[int, HostSource] = {}  # rank -> its tree's source, while it runs
        self._pids: dict[int, int] = {}  # rank -> pid (kept after it ends)
        self._gone: dict[int, float] = {}  # rank -> time.time() when first found gone
        self._last_scan = -math.inf
        self._lock = threading.Lock()

    def open(self) -> str | None:
        if self._ps is None:
            try:
                import psutil
            except ImportError:
                return "psutil not installed"
            self._ps = psutil
        self._launcher = HostSource(self._pid, psutil_module=self._ps)
        return self._launcher.open()

    def read(self) -> dict[str, float]:
        launcher = self._launcher
        if launcher is None:
            raise RuntimeError("RankTreeSource.read() called before a successful open()")
        base = launcher.read()  # SourceLost when the launcher itself is gone
        out = {k: v for k, v in base.items() if k.startswith(("sys.", "proc.main."))}
        with self._lock:
            now = time.monotonic()
            if now - self._last_scan >= self._refresh_s:
                self._scan(now)
            for rank, source in list(self._ranks.items()):
                try:
                    values = source.read()
                except SourceLost:
                    self._end(rank)
                    continue
                out |= {f"rank{rank}.{new}": values[old] for old, new in _RENAME.items() if old in values}
                out[f"rank{rank}.alive"] = 1.0
            for rank in self._gone:
                out[f"rank{rank}.alive"] = 0.0
        return out

    def close(self) -> None:
        with self._lock:
            for source in self._ranks.values():
                source.close()
            self._ranks.clear()
            if self._launcher is not None:
                self._launcher.close()

    def ended(self) -> dict[int, float]:
        """Rank -> when (``time.time()``) the sampler first found its process gone."""
        with self._lock:
            return dict(self._gone)

    def rank_pids(self) -> dict[int, int]:
        """Rank -> pid of every rank found so far (ended ones included)."""
        with self._lock:
            return dict(self._pids)

    def _scan(self, now: float) -> None:
        self._last_scan = now
        ps = self._ps
        try:
            procs = ps.Process(self._pid).children(recursive=True)
        except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
            return
        told = self._announced() if self._announced is not None else {}
        ranks = {p.pid: told[p.pid] if p.pid in told else environ_rank(p) for p in procs}
        for proc in procs:
            rank = ranks[proc.pid]
            if rank is None or rank in self._pids:
                continue
            try:
                parent = proc.ppid()
            except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
                continue
            if ranks.get(parent) is not None:
                continue  # a loader worker of a rank: it inherited RANK
            source = HostSource(proc.pid, psutil_module=ps)
            if source.open() is None:
                self._ranks[rank] = source
                self._pids[rank] = proc.pid

    def _end(self, rank: int) -> None:
        source = self._ranks.pop(rank, None)
        if source is not None:
            source.close()
        self._gone.setdefault(rank, time.time())
