"""A killed run's first report (issue #65 item 4): its sampler process, which outlives the training process it
watches, writes the report cache as it closes the store ``interrupted`` (profiler/core/sampler_process/process.py
calls the ``on_orphaned`` recipe, profiler.runs.read.cache_orphaned), so the user's first ``report`` reads one
small file; and the store read in bulk (no cache: the sampler process killed too) says the same figures.

Each path is checked against the slow path on the same killed store: every row read as objects and summarised
(``summarize(load_run(run))``), equal to the last bit."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until

from profiler.analysis import summarize
from profiler.analysis.bulk import summarize_columns
from profiler.analysis.timeline import build_timeline, timeline_of_columns
from profiler.cli import main
from profiler.core.store import load_run, read_head
from profiler.core.store.columns import load_columns
from profiler.runs.cache import CACHE_NAME, read_cache

ROOT = Path(__file__).resolve().parents[1]

# a fast loop of two phases (the bulk path's one-addition case) and a nested one, killed (SIGKILL) inside its
# Session once every step is stored; "both": its sampler process killed first (nothing closes the store)
KILLED = """
import os, signal, sys, time
from profiler import Session
from profiler.core.store import read_head
out, steps, both = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "both"
with Session(out, sample_hz=20, warmup=3, meta={"scenario": "killed", "batch_size": 8}) as s:
    for i in s.wrap(range(steps)):
        with s.phase("h2d"):
            sum(range(50))
        with s.phase("compute"):
            with s.phase("forward"):
                sum(range(200 + i % 7 * 30))
    deadline = time.monotonic() + 30
    while read_head(out)[1] < steps and time.monotonic() < deadline:
        time.sleep(0.05)
    if both:
        os.kill(read_head(out)[0]["sampler_pid"], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
"""
STEPS = 3000


def _killed(run: Path, *, both: bool = False) -> Path:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(run), str(STEPS), "both" if both else "one"],
        cwd=ROOT,
        timeout=180,
        check=False,
        capture_output=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    return run


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A killed run whose sampler process lived on: the store ``interrupted``, then its cache."""
    run = _killed(tmp_path_factory.mktemp("killed") / "run")
    assert wait_until(lambda: read_head(run)[0].get("status") == "interrupted", timeout=60)
    assert wait_until((run / CACHE_NAME).is_file, timeout=60)
    return run


def _report_json(run: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["report", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def test_the_sampler_process_writes_a_killed_runs_cache_with_the_rows_figures(killed: Path) -> None:
    rec = load_run(killed)
    assert rec.meta["status"] == "interrupted" and len(rec.steps) == STEPS
    got = read_cache(killed)
    assert got is not None  # the store's own: same status, steps and meta as the store now
    summary, timeline = got
    want = summarize(rec)
    assert summary.steps == STEPS - 3 and summary.status == "interrupted"
    # the slow path on the same store: every field, to the last bit ("now" aside: the cache has the time it ran)
    assert json.dumps(summary.to_dict(), sort_keys=True) == json.dumps(want.to_dict(), sort_keys=True)
    assert repr(timeline) == repr(build_timeline(rec))  # its record (no figure of the report's) is not kept


def test_the_bulk_read_of_a_killed_store_says_what_its_rows_say(killed: Path) -> None:
    """The fast path (columns, numpy) against the slow path (a row object per step and phase)."""
    cols, rec = load_columns(killed), load_run(killed)
    assert {name.count("/") for name in cols.phases.names} == {0, 1}  # a nested phase: depth read apart
    assert repr(summarize_columns(cols, now=0.0)) == repr(summarize(rec, now=0.0))
    assert repr(timeline_of_columns(cols)) == repr(build_timeline(rec))


def test_report_of_a_killed_run_is_the_same_from_the_cache_and_from_the_rows(
    killed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(killed, run)
    os.utime(run / CACHE_NAME)  # the copy keeps the cache newer than the store
    cached = _report_json(run, capsys)
    assert read_cache(run) is not None
    (run / CACHE_NAME).unlink()
    rows = _report_json(run, capsys)  # read in bulk; the cache written again
    assert cached == rows and (run / CACHE_NAME).is_file()
    assert json.dumps(rows, sort_keys=True) == json.dumps(summarize(load_run(run)).to_dict(), sort_keys=True)


def test_a_run_killed_with_its_sampler_process_is_read_from_its_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing closed the store (still ``running``, its writers gone): no cache until its heartbeat is stale
    (cache.settled), and the report reads the rows in bulk, saying what they say."""
    run = _killed(tmp_path / "run", both=True)
    meta, n = read_head(run)
    assert meta["status"] == "running" and n > 0 and not (run / CACHE_NAME).exists()
    doc = _report_json(run, capsys)
    assert json.dumps(doc, sort_keys=True) == json.dumps(summarize(load_run(run)).to_dict(), sort_keys=True)
    cols = load_columns(run)
    assert repr(summarize_columns(cols, now=0.0)) == repr(summarize(load_run(run), now=0.0))


def test_a_cache_that_cannot_be_written_is_named_and_the_sampler_process_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from profiler.core.sampler_process.process import after_orphaned

    caplog.set_level(logging.WARNING, logger="stallscope")
    after_orphaned({"factory": "profiler.runs.read:cache_orphaned", "kwargs": {}}, tmp_path / "no-store")
    assert "the report cache of" in caplog.text and "no-store" in caplog.text
    caplog.clear()
    after_orphaned(None, tmp_path)  # none asked for (a recorder made without one): nothing
    assert not caplog.text
