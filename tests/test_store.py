"""Run store: schema, batching, and surviving a SIGKILLed writer."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, stallscope, wait_until

from profiler.core.store import (
    SCHEMA_VERSION,
    PhaseRow,
    RunStore,
    StepRow,
    StoreError,
    integrity_ok,
    load_run,
    run_status,
)

CHILD = textwrap.dedent("""
    import sys, time
    from profiler import Session
    with Session(sys.argv[1], warmup=2, meta={"scenario": "killed-child"}) as s:
        for _ in s.wrap(iter(lambda: [0] * 4, None)):   # never ends: only SIGKILL stops it
            with s.phase("compute"):
                time.sleep(0.005)
""")


def _steps(run_dir: Path) -> int:
    try:
        return len(load_run(run_dir).steps)
    except StoreError:
        return 0


def test_sigkilled_run_leaves_a_sound_reportable_store(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run_dir)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: _steps(run_dir) >= 30, timeout=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert integrity_ok(run_dir)
    rec = load_run(run_dir)
    # the store's writer is the sampler process, which outlives the training process: it closed the store itself,
    # saying what happened (a store whose writer was killed too reads as interrupted: test_sampler_process.py)
    assert wait_until(lambda: load_run(run_dir).meta["status"] != "running", timeout=20)
    rec = load_run(run_dir)
    assert rec.meta["status"] == "interrupted" and "ended without closing the run" in rec.meta["error"]
    assert run_status(rec.meta) == "interrupted"
    res = stallscope("report", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["status"] == "interrupted"
    assert summary["steps"] >= 28
    # a 5 ms sleep: never shorter, and late by at most a few ms on a loaded machine (the killed child's own
    # clock is gone with it, so the requested duration is the truth here)
    assert 4.9 <= summary["breakdown_ms_per_step"]["compute"] <= 8.0, summary["breakdown_ms_per_step"]
    assert summary["sampler"]["samples"] > 0


def test_schema_version_and_rows_round_trip(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.put_meta(scenario="x", batch_size=8)
    store.put_step(StepRow(0, 0.0, 0.1, 0.02, 8, False), [PhaseRow(0, "compute", 0, 0.03, 0.09)])
    store.put_samples([(0.05, "host", "proc.main.cpu_pct", 50.0), (0.05, "host", "sys.cpu_pct", None)])
    store.put_event(0.0, "source", "available", "host")
    store.close()
    store.close()  # idempotent
    rec = load_run(tmp_path)
    assert rec.meta["schema_version"] == SCHEMA_VERSION
    assert rec.meta["scenario"] == "x" and rec.meta["batch_size"] == 8
    assert rec.steps == [StepRow(0, 0.0, 0.1, 0.02, 8, False)]
    assert rec.phases == [PhaseRow(0, "compute", 0, 0.03, 0.09, None, None)]
    assert rec.samples[1] == (0.05, "host", "sys.cpu_pct", None)
    assert rec.events == [(0.0, "source", "host", "available")]
    con = sqlite3.connect(tmp_path / "run.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_rows_are_committed_while_the_run_is_live(tmp_path: Path) -> None:
    store = RunStore(tmp_path, flush_s=0.2)
    store.put_step(StepRow(0, 0.0, 0.1, 0.0, 1, False))
    # another reader sees the row within the flush interval, without close()
    assert wait_until(lambda: len(load_run(tmp_path).steps) == 1, timeout=5)
    store.close()


def test_unreadable_stores_raise_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        load_run(tmp_path / "nope")
    with pytest.raises(StoreError, match=r"holds no run\.sqlite"):
        load_run(tmp_path)
    (tmp_path / "run.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a readable stallscope run store"):
        load_run(tmp_path)


def test_flush_interval_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_s"):
        RunStore(tmp_path, flush_s=5)


def test_stale_heartbeat_reads_as_interrupted() -> None:
    meta = {"status": "running", "pid": os.getpid(), "heartbeat": 1000.0}
    assert run_status(meta, now=1005.0) == "running"
    assert run_status(meta, now=1011.0) == "interrupted"
    assert run_status({"status": "complete"}) == "complete"


def test_a_read_of_a_store_being_written_sees_one_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that lands between a bulk read's queries (the writer is another process) is in none of them: the
    phases' main query and the query of their rare columns once disagreed, an IndexError in a live run's report in a
    fresh-clone CI. Here the commit is made exactly there, by another connection, before the rare columns' query."""
    from profiler.core.store import columns

    store = RunStore(tmp_path)
    store.put_step(StepRow(0, 0.0, 0.1, 0.02, 8, False), [PhaseRow(0, "compute", 0, 0.03, 0.09)])
    store.close()
    db = tmp_path / "run.sqlite"

    class Between(sqlite3.Connection):
        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
            if "FROM phases WHERE" in sql:  # the rare columns' query: another writer commits just before it
                other = sqlite3.connect(db)
                other.execute(
                    "INSERT INTO phases (step, name, depth, t_start, t_end) VALUES (1, 'compute', 1, 0.2, 0.3)"
                )
                other.commit()
                other.close()
            return super().execute(sql, *args)

    monkeypatch.setattr(columns, "open_read", lambda path: sqlite3.connect(path, factory=Between))
    cols = columns.load_columns(tmp_path)
    assert len(cols.phases.step) == 1 and cols.phases.depth.tolist() == [0]  # the snapshot before the commit
    assert len(columns.load_columns(tmp_path).phases.step) == 2  # and the next read sees it
