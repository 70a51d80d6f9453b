"""Which processes of a launcher's tree the ranks source calls rank R, on a fake process table (a fake psutil), so
that the moments a real launcher passes through quickly can be held still: a rank seen before it execs the script,
and a rank that exits while its worker is still listed. tests/test_zerocode_ranks.py checks the same on a real
torchrun job."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from profiler.core.sources.ranks import RankSource

AGENT_ENV = {"PATH": "/usr/bin"}


def rank_env(rank: int) -> dict[str, str]:
    return {**AGENT_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "GROUP_RANK": "0"}


class NoSuchProcess(Exception):
    pass


class ZombieProcess(NoSuchProcess):
    pass


class AccessDenied(Exception):
    pass


@dataclass
class Table:
    """The fake host's processes: pid -> (ppid, environment, status)."""

    procs: dict[int, tuple[int, dict[str, str], str]] = field(default_factory=dict)

    def add(self, pid: int, ppid: int, environ: dict[str, str]) -> None:
        self.procs[pid] = (ppid, environ, "running")

    def execs(self, pid: int, environ: dict[str, str]) -> None:
        ppid, _env, status = self.procs[pid]
        self.procs[pid] = (ppid, environ, status)

    def exits(self, pid: int) -> None:
        """``pid`` becomes a zombie (its parent has not reaped it); its children stay listed under it, as a real
        table lists them until the kernel has reparented them."""
        ppid, env, _status = self.procs[pid]
        self.procs[pid] = (ppid, env, "zombie")

    def psutil(self) -> SimpleNamespace:
        table = self

        class Process:
            def __init__(self, pid: int) -> None:
                if pid not in table.procs:
                    raise NoSuchProcess(pid)
                self.pid = pid

            def __eq__(self, other: object) -> bool:
                return isinstance(other, Process) and other.pid == self.pid

            def __hash__(self) -> int:
                return self.pid

            def _row(self) -> tuple[int, dict[str, str], str]:
                if self.pid not in table.procs:
                    raise NoSuchProcess(self.pid)
                return table.procs[self.pid]

            def children(self, recursive: bool) -> list[Process]:
                out, todo = [], [self.pid]
                while todo:
                    parent = todo.pop(0)
                    kids = sorted(p for p, row in table.procs.items() if row[0] == parent)
                    out += [Process(p) for p in kids]
                    todo += kids
                return out

            def environ(self) -> dict[str, str]:
                _ppid, env, status = self._row()
                if status == "zombie":
                    raise ZombieProcess(self.pid)
                return dict(env)

            def ppid(self) -> int:
                return self._row()[0]

            def status(self) -> str:
                return self._row()[2]

            def cpu_percent(self, interval: float | None) -> float:
                self._row()
                return 10.0

            def memory_info(self) -> SimpleNamespace:
                self._row()
                return SimpleNamespace(rss=1 << 20)

            @contextlib.contextmanager
            def oneshot(self) -> Iterator[None]:
                yield

        return SimpleNamespace(
            Process=Process,
            NoSuchProcess=NoSuchProcess,
            ZombieProcess=ZombieProcess,
            AccessDenied=AccessDenied,
            STATUS_ZOMBIE="zombie",
        )


ROOT, AGENT, RANK0, RANK1, WORKER0, WORKER1 = 100, 101, 200, 201, 300, 301


@pytest.fixture
def table() -> Table:
    t = Table()
    t.add(ROOT, 1, AGENT_ENV)
    t.add(AGENT, ROOT, AGENT_ENV)
    return t


def _source(table: Table) -> RankSource:
    src = RankSource(ROOT, refresh_s=0.0, psutil_module=table.psutil())  # type: ignore[arg-type]
    assert src.open() is None
    return src


def _named(src: RankSource) -> list[tuple[int, int, tuple[int, ...]]]:
    return [(r.rank, r.pid, r.worker_pids) for r in src.ranks()]


def test_a_rank_first_seen_before_it_execs_is_named_once_it_has_and_its_worker_is_not_a_rank(table: Table) -> None:
    src = _source(table)
    table.add(RANK0, AGENT, AGENT_ENV)  # the agent's fork: its environment is still the agent's
    table.add(RANK1, AGENT, rank_env(1))
    src.read()
    assert _named(src) == [(1, RANK1, ())]
    table.execs(RANK0, rank_env(0))  # exec'd the script under torchrun's environment
    table.add(WORKER0, RANK0, rank_env(0))  # a DataLoader worker forked from it
    table.add(WORKER1, RANK1, rank_env(1))
    src.read()
    assert _named(src) == [(0, RANK0, (WORKER0,)), (1, RANK1, (WORKER1,))]
    src.read()  # the second reading of a process has its CPU (the first primes psutil's counter)
    reading = src.read()
    assert reading["rank0.workers.cpu_pct"] == 10.0 and reading["rank0.main.cpu_pct"] == 10.0


def test_a_rank_that_exits_before_its_worker_leaves_the_worker_its_own(table: Table) -> None:
    src = _source(table)
    table.add(RANK0, AGENT, rank_env(0))
    table.add(WORKER0, RANK0, rank_env(0))
    src.read()
    assert _named(src) == [(0, RANK0, (WORKER0,))]
    table.exits(RANK0)
    reading = src.read()  # the zombie rank is dropped from the readings; its worker is still listed
    assert reading["rank0.alive"] == 0.0
    src.read()
    assert _named(src) == [(0, RANK0, (WORKER0,))]
    assert set(src.ended()) == {0}


def test_a_process_that_never_names_a_rank_is_not_one(table: Table) -> None:
    src = _source(table)
    table.add(RANK0, AGENT, AGENT_ENV)
    table.add(WORKER0, RANK0, AGENT_ENV)
    for _ in range(3):
        assert src.read() == {}
    assert _named(src) == []
