"""psutil raising NoSuchProcess or AccessDenied mid-read, for a worker that exits or is replaced while it is
read: the sampler goes on, the surviving processes' figures go on, nothing is logged as an error and the run
completes with a sound store that reports (issue #13). psutil.Process is patched so the failure falls inside
a read, after the worker's status and CPU were read and before its memory is."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import sleep_loader, wait_until

from profiler import Session
from profiler.cli import main
from profiler.core.recorders.in_thread import ThreadRecorder
from profiler.core.sources.host import HostSource
from profiler.core.sources.ranks import RankSource
from profiler.core.store import integrity_ok, load_run
from profiler.runs.summarize import summarize_run

HZ = 50.0


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start sleeping child processes of this (the "training") process; all are killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["/bin/sleep", "30"], env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _fail_mid_read(monkeypatch: pytest.MonkeyPatch, plan: dict[int, tuple[int, type[Exception]]]) -> Counter[int]:
    """``memory_info()`` of pid raises ``exc(pid)`` from its ``n``-th call on, for ``pid: (n, exc)`` in plan."""
    real = psutil.Process.memory_info
    calls: Counter[int] = Counter()

    def memory_info(self: psutil.Process) -> Any:
        calls[self.pid] += 1
        n, exc = plan.get(self.pid, (0, None))
        if exc is not None and calls[self.pid] >= n:
            raise exc(self.pid)
        return real(self)

    # Process.oneshot() switches the cache of memory_info on and off through these attributes
    memory_info.cache_activate = real.cache_activate  # type: ignore[attr-defined]
    memory_info.cache_deactivate = real.cache_deactivate  # type: ignore[attr-defined]
    monkeypatch.setattr(psutil.Process, "memory_info", memory_info)
    return calls


def _series(out: Path, metric: str) -> list[float]:
    return [t for t, _src, m, v in load_run(out).samples if m == metric and v is not None]


def test_workers_that_exit_or_lose_permission_mid_read_leave_the_others_recording(
    tmp_path: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    exits, denied, survives = spawn(), spawn(), spawn()
    calls = _fail_mid_read(monkeypatch, {exits.pid: (6, psutil.NoSuchProcess), denied.pid: (6, psutil.AccessDenied)})
    out = tmp_path / "run"
    host = HostSource(children_refresh_s=0.1)
    caplog.set_level(logging.DEBUG)
    with Session(out, sources=[host], sample_hz=HZ) as s:
        replaced = False
        deadline = time.perf_counter() + 1.2
        for _ in s.wrap(sleep_loader(100_000, 0.002)):
            with s.phase("compute"):
                time.sleep(0.003)
            if not replaced and calls[exits.pid] >= 6:
                exits.kill()  # the worker that failed mid-read now really exits, and a new one takes its place
                exits.wait()
                replacement = spawn()
                replaced = True
            if time.perf_counter() > deadline:
                break
    summ = s.summary()
    assert summ is not None and summ.status == "complete" and summ.steps > 50
    assert replaced
    labels = host.pid_labels()
    by_pid = {pid: label for label, pid in labels.items()}
    assert [by_pid[p.pid] for p in (exits, denied, survives)] == ["w0", "w1", "w2"]
    assert by_pid[replacement.pid] == "w3"  # a new label for the new worker, never w0 again
    assert integrity_ok(out)
    end = load_run(out).samples[-1][0]
    # the survivors' figures run to the end; the failed workers' stop at their failure, with no zero invented
    for metric in ("proc.main.cpu_pct", "proc.w2.rss_mb", "proc.w3.rss_mb"):
        assert _series(out, metric)[-1] > end - 0.2, metric
    for gone in ("w0", "w1"):
        assert _series(out, f"proc.{gone}.rss_mb")[-1] < end - 0.3
    assert summ.sampler.sources["host"] == "available" and summ.sampler.errors.get("host", 0) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["status"] == "complete" and js["sampler"]["sources"]["host"] == "available"


def test_ranks_that_exit_or_deny_reads_mid_read_leave_the_others_recording(
    tmp_path: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = dict(os.environ)
    _rank0, denies, exits = (spawn({**env, "RANK": str(r), "WORLD_SIZE": "3"}) for r in range(3))
    calls = _fail_mid_read(monkeypatch, {denies.pid: (5, psutil.AccessDenied), exits.pid: (5, psutil.NoSuchProcess)})
    secret = spawn()  # a child whose environment cannot be read: not a rank, and no error
    real_environ = psutil.Process.environ

    def environ(self: psutil.Process) -> dict[str, str]:
        if self.pid == secret.pid:
            raise psutil.AccessDenied(self.pid)
        return real_environ(self)

    monkeypatch.setattr(psutil.Process, "environ", environ)
    ranks = RankSource(os.getpid(), refresh_s=0.1)
    out = tmp_path / "run"
    rec = ThreadRecorder(out, meta={"mode": "zero-code"}, sample_hz=HZ, sources=[ranks], summarize=summarize_run)
    caplog.set_level(logging.DEBUG)
    rec.start()
    s = rec.sampler
    assert s is not None and rec.store is not None
    store = rec.store

    def rows() -> list[tuple[float, str, str, float | None]]:
        return store.record().samples

    try:
        assert wait_until(lambda: calls[exits.pid] >= 5, timeout=10)
        exits.kill()  # the rank that failed mid-read now really exits
        exits.wait()
        assert wait_until(lambda: any(m == "rank2.alive" and v == 0.0 for _t, _s, m, v in rows()), timeout=10)
        n = s.stats.samples
        assert wait_until(lambda: s.stats.samples >= n + 10, timeout=10)  # sampling goes on after the loss
    finally:
        summary = rec.close("complete")
    assert summary is not None and summary.status == "complete"
    assert s.stats.sources["ranks"].status == "available" and s.stats.sources["ranks"].errors == 0
    assert [r.rank for r in ranks.ranks()] == [0, 1, 2]
    assert set(ranks.ended()) == {2}  # the rank that denies reads is alive, not ended
    assert integrity_ok(out)
    samples = load_run(out).samples
    last = samples[-1][0]
    late = {m for t, _s, m, v in samples if t > last - 0.1 and v is not None}
    assert {"rank0.cpu_pct", "rank0.rss_mb"} <= late  # the surviving rank is read to the end
    assert not {"rank1.cpu_pct", "rank2.cpu_pct"} & late
    alive1 = {v for t, _s, m, v in samples if m == "rank1.alive" and t > last - 0.5}
    assert alive1 == {1.0}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["status"] == "complete" and js["sampler"]["sources"]["ranks"] == "available"
