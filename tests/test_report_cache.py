"""The report cache (profiler/runs/cache.py): a closed run's Summary and Timeline as built at close, read back
exactly, and read only when it is the store's own; ``report``, ``--html`` and ``--json`` give the same output
from it as from the rows. A killed run's first report writes it (the second reads it: counted, not timed), and a
report killed while writing it leaves the run readable. A store read in bulk (profiler/core/store/columns.py,
profiler/analysis/bulk.py) gives the Summary, Timeline and trace rows its rows give, to the last bit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import sleep_loader, wait_until

from profiler import Session
from profiler.analysis import Summary, summarize
from profiler.analysis.codec import CodecError, allowed, decode, encode
from profiler.analysis.timeline import build_timeline
from profiler.cli import main
from profiler.core.store import columns as columns_module
from profiler.core.store import load_run
from profiler.runs import cache
from profiler.runs.cache import CACHE_NAME, read_cache

ROOT = Path(__file__).resolve().parents[1]


def _count(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> list[str]:
    """Calls of ``module.name`` from now on, one "read" each."""
    calls: list[str] = []
    real: Callable[..., Any] = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append("read") or real(*a, **k))
    return calls


@pytest.fixture(scope="module")
def closed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("cache") / "run"
    with Session(run, sample_hz=20, warmup=2, meta={"scenario": "cached", "batch_size": 4}) as s:
        for _ in s.wrap(sleep_loader(40, 0.004)):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                time.sleep(0.003)
    return run


def test_the_cache_written_at_close_reads_back_what_the_rows_give(closed_run: Path) -> None:
    assert (closed_run / CACHE_NAME).is_file()
    got = read_cache(closed_run)
    assert got is not None
    summary, timeline = got
    rec = load_run(closed_run)
    want = summarize(rec)
    assert repr(summary) == repr(want)  # every field, NaN included (a NaN is not == itself)
    assert json.dumps(summary.to_dict(), sort_keys=True) == json.dumps(want.to_dict(), sort_keys=True)
    assert repr(timeline) == repr(build_timeline(rec))  # its record (not in the repr) is not kept
    assert summary.steps == 38 and len(timeline.bars) == 40


def test_the_codec_makes_only_the_classes_a_summary_holds() -> None:
    classes = allowed(Summary)
    assert "Summary" in classes and "Recommendation" in classes
    with pytest.raises(CodecError, match="'Popen'"):
        decode({"__t": "Popen", "args": ["rm"]}, classes)
    with pytest.raises(CodecError, match="differ"):
        decode({"__t": "Recommendation", "code": "X"}, classes)
    odd = {(1, "a"): (float("nan"), [1, {"__x": 2}])}
    back = decode(json.loads(json.dumps(encode(odd))), classes)
    assert list(back) == [(1, "a")] and back[(1, "a")][1] == [1, {"__x": 2}]


def _report(run: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", str(run), *args]) == 0
    return capsys.readouterr().out


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    if (to / CACHE_NAME).exists():
        os.utime(to / CACHE_NAME)  # a copy keeps the order of the two files' times
    return to


def test_report_from_the_cache_is_the_report_from_the_rows(
    closed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy(closed_run, tmp_path / "run")
    calls: list[str] = []
    real = cache.decode
    monkeypatch.setattr(cache, "decode", lambda doc, classes: calls.append("cache") or real(doc, classes))
    cached = [_report(run, "--json", capsys=capsys), _report(run, capsys=capsys)]
    _report(run, "--html", str(tmp_path / "cached.html"), capsys=capsys)
    assert calls  # the cache was read
    calls.clear()
    rows = []
    for args in (("--json",), (), ("--html", str(tmp_path / "rows.html"))):
        (run / CACHE_NAME).unlink()  # no cache: the rows are read (in bulk), and the cache is written again
        rows.append(_report(run, *args, capsys=capsys))
    assert not calls
    assert cached == rows[:2]
    assert (tmp_path / "cached.html").read_text() == (tmp_path / "rows.html").read_text()


def test_a_cache_of_other_analysis_code_is_replaced_by_the_first_report(
    closed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy(closed_run, tmp_path / "run")
    want = _report(run, "--json", capsys=capsys)
    monkeypatch.setattr(cache, "fingerprint", lambda: "other code")  # today's analysis differs: the rows are read
    bulk = _count(monkeypatch, columns_module, "load_columns")
    assert _report(run, "--json", capsys=capsys) == want and bulk == ["read"]
    assert json.loads((run / CACHE_NAME).read_text())["code"] == "other code"  # written again, by today's code
    assert _report(run, "--json", capsys=capsys) == want and bulk == ["read"]  # and read


def test_the_cache_is_read_only_when_it_is_the_stores_own(closed_run: Path, tmp_path: Path) -> None:
    run = _copy(closed_run, tmp_path / "run")
    assert read_cache(run) is not None
    doc = json.loads((run / CACHE_NAME).read_text())
    others = (("steps", 39), ("run_id", "another"), ("status", "failed"), ("code", "0" * 16), ("meta", "0" * 16))
    for key, other in others:
        (run / CACHE_NAME).write_text(json.dumps({**doc, key: other}))
        assert read_cache(run) is None, key
    (run / CACHE_NAME).write_text(json.dumps(doc))
    assert read_cache(run) is not None
    past = (run / "run.sqlite").stat().st_mtime - 10
    os.utime(run / CACHE_NAME, (past, past))  # older than the store: written before its last rows
    assert read_cache(run) is None
    os.utime(run / CACHE_NAME)
    (run / CACHE_NAME).write_text("{not json")
    assert read_cache(run) is None


# -- a run that was killed, its cache gone: the first report writes it ----------------------------------------------
KILLED = """
import os, signal, sys, time
from profiler import Session
from profiler.core.store import read_head
out, steps = sys.argv[1], int(sys.argv[2])
with Session(out, sample_hz=20, warmup=2, meta={"scenario": "killed", "batch_size": 4}) as s:
    for _ in s.wrap(range(steps)):
        with s.phase("h2d"):
            pass
        with s.phase("compute"):
            time.sleep(0.0005)
    deadline = time.monotonic() + 20
    while read_head(out)[1] < steps and time.monotonic() < deadline:  # every step stored, then the kill
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Session killed (SIGKILL) inside its block after 600 steps: the sampler process closed the store
    ``interrupted`` and wrote its cache (tests/test_killed_report.py), removed here: a store as a sampler process
    killed with it leaves it, with no summary and no cache."""
    run = tmp_path_factory.mktemp("killed") / "run"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(run), "600"], cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL
    from profiler.core.store import read_head

    assert wait_until(lambda: read_head(run)[0].get("status") == "interrupted")
    assert wait_until((run / CACHE_NAME).is_file, timeout=60)  # the sampler process's last act
    (run / CACHE_NAME).unlink()
    assert read_head(run)[1] == 600
    return run


def test_the_first_report_of_a_killed_run_writes_the_cache_the_second_reads(
    killed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _copy(killed_run, tmp_path / "run")
    bulk = _count(monkeypatch, columns_module, "load_columns")
    decoded = _count(monkeypatch, cache, "decode")
    first = [_report(run, "--json", capsys=capsys)]
    assert bulk == ["read"] and not decoded and (run / CACHE_NAME).is_file()
    first.append(_report(run, capsys=capsys))
    first.append(_report(run, "--html", str(tmp_path / "second.html"), capsys=capsys))
    assert bulk == ["read"] and decoded  # the second read and those after: the cache, no row
    assert json.loads(first[0])["status"] == "interrupted" and json.loads(first[0])["steps"] == 598
    (run / CACHE_NAME).unlink()
    rows = [_report(run, "--json", capsys=capsys), _report(run, capsys=capsys)]
    _report(run, "--html", str(tmp_path / "rows.html"), capsys=capsys)
    assert first[:2] == rows and (tmp_path / "second.html").read_text() == (tmp_path / "rows.html").read_text()
    want = summarize(load_run(run))
    assert json.dumps(want.to_dict(), sort_keys=True) == json.dumps(json.loads(rows[0]), sort_keys=True)


HALF_WRITTEN = """
import os, signal, sys
from pathlib import Path
from profiler.runs import read

real = Path.write_text
def half(self, text, *a, **k):  # the cache's temporary file half written, then the process killed
    if self.name.endswith(".tmp"):
        real(self, text[: len(text) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, text, *a, **k)
Path.write_text = half
read.load_bulk(sys.argv[1])
"""


def test_a_report_killed_while_it_writes_the_cache_leaves_the_run_readable(
    killed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(killed_run, tmp_path / "run")
    want = _report(_copy(killed_run, tmp_path / "other"), "--json", capsys=capsys)
    proc = subprocess.run([sys.executable, "-c", HALF_WRITTEN, str(run)], cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL
    left = list(run.glob(f"{CACHE_NAME}.*.tmp"))
    assert len(left) == 1 and not (run / CACHE_NAME).exists()  # half a file, under its temporary name only
    with pytest.raises(ValueError):
        json.loads(left[0].read_text())
    assert read_cache(run) is None
    assert _report(run, "--json", capsys=capsys) == want  # the rows, as if the kill had not been
    assert (run / CACHE_NAME).is_file() and not left[0].exists()  # the cache written; the half file removed
    assert _report(run, "--json", capsys=capsys) == want and read_cache(run) is not None


def _store(run: Path, meta: dict[str, Any], steps: int = 30) -> Path:
    from profiler.core.store import PhaseRow, RunStore, StepRow

    store = RunStore(run, flush_s=0.05, meta={"run_id": run.name, "scenario": "store", **meta})
    for i in range(steps):
        t = i * 0.01
        store.put_step(StepRow(i, t, t + 0.01, 0.002, 4, i < 2), [PhaseRow(i, "compute", 0, t + 0.002, t + 0.009)])
    store.close()
    return run


def _gone_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(proc.stdout)


def test_the_cache_is_written_only_for_a_store_that_will_not_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    live = _store(tmp_path / "live", {"status": "running", "pid": os.getpid(), "heartbeat": now})
    draining = _store(tmp_path / "draining", {"status": "running", "pid": _gone_pid(), "heartbeat": now + 3600})
    gone = _store(tmp_path / "gone", {"status": "running", "pid": _gone_pid()})
    con = sqlite3.connect(gone / "run.sqlite")  # its last heartbeat a minute ago (the writer stamps its own at close)
    with con:
        con.execute("UPDATE meta SET value = ? WHERE key = 'heartbeat'", (json.dumps(now - 60),))
    con.close()
    for run in (live, draining, gone):
        _report(run, "--json", capsys=capsys)
    # a live writer, or one whose pid is gone but whose heartbeat is fresh (its sampler may still be draining)
    assert not (live / CACHE_NAME).exists() and not (draining / CACHE_NAME).exists()
    assert read_cache(gone) is not None  # pid gone and heartbeat stale: the writer is gone for good
    from profiler.core.store import RunStore

    store = RunStore(gone, flush_s=0.05, lock=False)  # it was not: a writer comes back and writes
    store.put_meta(heartbeat=time.time())
    store.close()
    assert read_cache(gone) is None


def test_settled() -> None:
    now = 1000.0
    assert all(cache.settled({"status": s}, now) for s in ("complete", "failed", "interrupted"))
    assert not cache.settled({}, now)
    assert not cache.settled({"status": "running", "pid": os.getpid(), "heartbeat": 0.0}, now)
    assert not cache.settled({"status": "running", "pid": _gone_pid(), "heartbeat": now - 1}, now)
    assert cache.settled({"status": "running", "pid": _gone_pid(), "heartbeat": now - 60}, now)


# -- a store read in bulk gives what its rows give ---------------------------------------------------------------
def _odd_store(run: Path, *, device: str = "cpu") -> Path:
    """Every case the bulk read must keep: warm-up, two phases of one name in a step (out of storage order), the
    ranks' wait nested in compute, a user phase, a phase of no recorded step, unknown batch sizes, run-queue
    waits on some steps, a gap in the step numbers; on ``cuda``, device times."""
    from profiler.core.store import PhaseRow, RunStore, StepRow

    meta = {"run_id": "odd", "status": "running", "pid": 1, "schedstat": "available", "device": {"kind": device}}
    store = RunStore(run, flush_s=1.0, meta=meta)
    for k, i in enumerate([*range(700), *range(705, 1400)]):
        t = k * 1e-3 + (k % 7) * 1e-6
        rq = 1e-5 * (k % 3) if k % 5 == 0 else None
        dev = (t + 3e-4, t + 8e-4) if device == "cuda" else (None, None)
        phases = [
            PhaseRow(i, "h2d", 0, t + 1e-4, t + 3e-4, *dev, rq),
            PhaseRow(i, "compute", 0, t + 4e-4 + (k % 3) * 1e-6, t + 6e-4, *dev, rq),
            PhaseRow(i, "compute", 0, t + 3e-4, t + 4e-4),  # stored after, starts before
            PhaseRow(i, "compute/forward", 1, t + 3e-4, t + 5e-4),
        ]
        if k % 4 == 0:
            phases.append(PhaseRow(i, "compute/sync", 1, t + 5e-4, t + 5.5e-4))
        if k % 9 == 0:
            phases.append(PhaseRow(i, "log", 0, t + 6e-4, t + 7e-4))
        n = None if k == 900 else 8
        store.put_step(StepRow(i, t, t + 1e-3, 1e-4 + (k % 11) * 1e-6, n, k < 30, rq, rq and 2 * rq), phases)
    store.put_step(StepRow(5000, 2.0, 2.01, 0.001, 8, False), [PhaseRow(5001, "h2d", 0, 2.0, 2.001)])
    for k in range(400):
        cpu = None if k % 50 == 0 else 90.0
        store.put_samples(
            [(k * 5e-3, "host", "sys.cpu_pct", 50.0 + k % 13), (k * 5e-3, "host", "proc.main.cpu_pct", cpu)]
        )
    store.put_meta(status="complete")
    store.close()
    return run


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_bulk_read_gives_the_rows_summary_timeline_and_trace(tmp_path: Path, device: str) -> None:
    from profiler.analysis.bulk import summarize_columns
    from profiler.analysis.timeline import timeline_of_columns
    from profiler.core.store.columns import load_columns, load_sparse_of
    from profiler.core.store.reader import load_sparse
    from profiler.render.trace import trace_plan

    runs = [_odd_store(tmp_path / "odd", device=device)]
    if device == "cpu":
        runs += [p for p in (ROOT / "tests" / "data" / "runs").iterdir() if (p / "run.sqlite").exists()]
    for run in runs:
        cols, rec = load_columns(run), load_run(run)
        back = cols.record()
        assert (repr(back.steps), repr(back.phases)) == (repr(rec.steps), repr(rec.phases))
        assert (back.meta, back.samples, back.events, back.windows) == (rec.meta, rec.samples, rec.events, rec.windows)
        assert repr(summarize_columns(cols, now=0.0)) == repr(summarize(rec, now=0.0)), run.name
        for bars in (400, 50, 7, 1):
            want = build_timeline(rec, max_bars=bars)
            assert repr(timeline_of_columns(cols, max_bars=bars)) == repr(want), (run.name, bars)
        plan = lambda n: trace_plan(n) if len(n) < 1000 else ([(n[5], n[300]), (n[700], n[-1])], [(n[301], n[699])])  # noqa: E731
        a, b = load_sparse_of(run, cols, plan), load_sparse(run, plan)
        assert (repr(a[0].steps), repr(a[0].phases), a[1:]) == (repr(b[0].steps), repr(b[0].phases), b[1:])
