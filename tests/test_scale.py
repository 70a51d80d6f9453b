"""Scale: what the commands that read a store make of a long run stays bounded, whatever the run's length.

Structural checks, not timings (benchmarks/soak.py times them): a 20,000-step store with 12,000 sampler ticks,
written through the store API, gives a trace whose event count is capped (every step still accounted for,
drawn or summarised), HTML plots with capped points per line, and a ``report`` that never imports torch (which
alone took seconds and ~600 MiB, most of a command's time and memory). A Session keeps no row per step in
memory (its memory does not grow with the run), and ``compare`` reads a finished run's own summary.json
instead of loading its store, but only when that file is the store's.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import sqlite3
import subprocess
import sys
import tracemalloc
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from profiler import Session
from profiler.analysis import summarize
from profiler.analysis.timeline import MAX_BARS, MAX_POINTS, Series, build_timeline, thin_series
from profiler.cli.report import stored_summary
from profiler.core.session import HANDOFF_STEPS
from profiler.core.store import PhaseRow, RunRecord, RunStore, StepRow, load_run, read_head
from profiler.render.html import render_html
from profiler.render.trace import (
    DETAIL_WINDOWS,
    MAX_COUNTER_TICKS,
    MAX_DETAILED_STEPS,
    TID_TRAINING,
    trace_events,
)
from profiler.runs.read import load_for_trace
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20_000
TICKS = 12_000  # 10 Hz for 20 minutes: more than a counter family or a plotted line may hold
METRICS = ("proc.main.cpu_pct", "sys.cpu_pct", "gpu0.util_pct")
RUNS = ROOT / "tests" / "data" / "runs"


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete 20,000-step store (1 ms steps: 0.2 ms data wait, h2d, compute) with 12,000 sampler ticks."""
    run = tmp_path_factory.mktemp("long") / "run"
    store = RunStore(run, flush_s=1.0, meta={"run_id": "long", "scenario": "long", "status": "running", "pid": 1})
    for i in range(STEPS):
        t = i * 1e-3
        store.put_step(
            StepRow(i, t, t + 1e-3, 2e-4, 8, i < 5),
            [PhaseRow(i, "h2d", 0, t + 2e-4, t + 3e-4), PhaseRow(i, "compute", 0, t + 3e-4, t + 9e-4)],
        )
    dt = STEPS * 1e-3 / TICKS
    for k in range(TICKS):
        value = None if 1000 <= k < 1100 else 50.0 + 40.0 * math.sin(k / 50)  # a gap of 100 unreadable ticks
        store.put_samples([(k * dt, "host", m, value) for m in METRICS])
    store.put_meta(status="complete")
    store.close()
    return run


@pytest.fixture(scope="module")
def record(long_run: Path) -> RunRecord:
    return load_run(long_run)


@pytest.fixture(scope="module")
def trace(record: RunRecord) -> dict[str, Any]:
    return trace_events(record)


def test_trace_events_are_capped_and_every_step_is_drawn_or_summarised(trace: dict[str, Any]) -> None:
    doc = trace
    events = doc["traceEvents"]
    steps = [e for e in events if e["ph"] == "X" and e["cat"].startswith("step")]
    summaries = [e for e in events if e["ph"] == "X" and e["cat"] == "summary"]
    assert len(steps) == MAX_DETAILED_STEPS
    assert len(summaries) == DETAIL_WINDOWS - 1
    assert steps[0]["args"]["step"] == 0 and steps[-1]["args"]["step"] == STEPS - 1  # the run's both ends in full
    # every step appears once: drawn, or inside exactly one summary
    covered = sorted(
        [e["args"]["step"] for e in steps]
        + [i for s in summaries for i in range(s["args"]["first_step"], s["args"]["last_step"] + 1)]
    )
    assert covered == list(range(STEPS))
    assert sum(s["args"]["steps"] for s in summaries) == STEPS - MAX_DETAILED_STEPS
    assert doc["metadata"]["decimation"]["steps_drawn"] == MAX_DETAILED_STEPS
    drawn = {e["args"]["step"] for e in steps}
    phases = [e for e in events if e["ph"] == "X" and e["cat"] == "phase"]
    assert {e["args"]["step"] for e in phases} == drawn and len(phases) == 2 * MAX_DETAILED_STEPS
    per_family: dict[str, int] = defaultdict(int)
    for e in events:
        if e["ph"] == "C":
            per_family[e["name"]] += 1
    assert per_family and max(per_family.values()) <= MAX_COUNTER_TICKS
    # the cap, not the run's length, bounds the file: 4 slices per drawn step, the counters, a few others
    assert len(events) <= 4 * MAX_DETAILED_STEPS + DETAIL_WINDOWS + len(per_family) * MAX_COUNTER_TICKS + 50
    json.dumps(doc, allow_nan=False)


def test_the_trace_reads_only_the_rows_it_draws_and_is_the_same(long_run: Path, trace: dict[str, Any]) -> None:
    """``report --trace`` reads the steps drawn in full and their phases as rows, and summarises the others in SQL:
    the same trace as from every row, but for the summaries' means (SQLite's sums against math.fsum)."""
    got = load_for_trace(long_run)
    assert len(got.record.steps) == MAX_DETAILED_STEPS and len(got.record.phases) == 2 * MAX_DETAILED_STEPS
    assert got.steps == STEPS and sum(s.steps for s in got.summarised) == STEPS - MAX_DETAILED_STEPS
    sparse = trace_events(got.record, got.summarised, got.steps)
    means = ("mean_step_ms", "mean_data_wait_ms")

    def apart(doc: dict[str, Any]) -> tuple[list[Any], list[tuple[float, float]]]:
        events, got_means = [], []
        for e in doc["traceEvents"]:
            if e.get("cat") == "summary":
                got_means.append(tuple(e["args"][k] for k in means))
            events.append({**e, "args": {k: v for k, v in e["args"].items() if k not in means}} if "args" in e else e)
        return events, got_means

    (events, sums), (want_events, want_sums) = apart(sparse), apart(trace)
    assert events == want_events and sparse["metadata"] == trace["metadata"]
    assert len(sums) == DETAIL_WINDOWS - 1 and sums == [pytest.approx(w, rel=1e-9) for w in want_sums]


def test_trace_training_track_nests_and_runs_forward(trace: dict[str, Any]) -> None:
    track = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == TID_TRAINING]
    assert [e["ts"] for e in track] == sorted(e["ts"] for e in track)
    level0 = [e for e in track if e["cat"] in ("step", "step,warmup", "summary")]
    for a, b in itertools.pairwise(level0):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)  # steps and summaries never overlap


def test_html_plots_are_capped(record: RunRecord) -> None:
    tl = build_timeline(record)
    assert len(tl.bars) <= MAX_BARS
    assert tl.series and all(len(s.t) <= MAX_POINTS for s in tl.series.values())
    doc = render_html(summarize(record), tl)
    points = [len(m.group(1).split()) for m in re.finditer(r'<polyline points="([^"]*)"', doc)]
    assert points and max(points) <= MAX_POINTS
    assert len(doc) < 1_000_000  # ~1.4 MB of polylines before the cap; the bars and figures are small


def test_thin_series_keeps_extremes_and_gaps() -> None:
    n = 10_000
    values = [50.0 + 40.0 * math.sin(i / 30) for i in range(n)]
    values[1234] = 0.0  # one dip, as a stall shows in GPU utilisation
    values[7777] = 100.0
    values[3000:3400] = [math.nan] * 400  # a stretch the source could not read
    s = Series("gpu0.util_pct", "gpu0", "nvml", "%", tuple(i * 0.1 for i in range(n)), tuple(values))
    thin = thin_series(s, 1000)
    assert len(thin.t) <= 1000
    assert list(thin.t) == sorted(thin.t)
    finite = [v for v in thin.values if math.isfinite(v)]
    assert min(finite) == 0.0 and max(finite) == 100.0
    assert any(math.isnan(v) for v in thin.values)  # the gap is still a gap
    assert thin_series(thin, 1000) is thin  # already within the cap: unchanged


def test_report_html_trace_never_import_torch(tmp_path: Path) -> None:
    """Torch never; numpy only where the rows are read (in bulk: the store has no report cache of its own), not
    where the cache that read wrote is read."""
    from profiler.runs.cache import CACHE_NAME

    run = tmp_path / "run"
    # a copy (opening a WAL store can checkpoint it) without the cache an earlier report may have written
    shutil.copytree(RUNS / "cpu-workers", run, ignore=shutil.ignore_patterns(f"{CACHE_NAME}*"))
    code = (
        "import contextlib, io, sys\nfrom profiler.cli import main\n"
        "argv = sys.argv[1:]\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    assert main(argv) == 0\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    argv = ["report", str(run), "--html", str(tmp_path / "r.html"), "--trace", str(tmp_path / "t.json")]
    imported = [
        subprocess.run(
            [sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
        ).stdout.strip()
        for _ in range(2)
    ]
    assert imported == ["['numpy']", "[]"]  # the rows in bulk, then the cache the first wrote
    assert (run / CACHE_NAME).is_file()


def _traced_profiler_bytes() -> int:
    """Python memory allocated (and still held) by stallscope's own code: traces whose frame is under profiler/."""
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, str(ROOT / "profiler") + "/*")])
    return sum(s.size for s in snap.statistics("filename"))


def test_a_session_keeps_no_row_per_step_in_memory(tmp_path: Path) -> None:
    """The rows go to the store and are read back at close: 10,000 more steps (two phases each) leave
    stallscope's own memory where it was (a row per step in memory was ~620 bytes a step: ~6 MiB here)."""
    out = tmp_path / "run"
    committed = lambda n: lambda: read_head(out)[1] >= n  # noqa: E731 - the writer has flushed n steps
    tracemalloc.start(1)
    try:
        with Session(out, device="cpu", sample_hz=5, sources=[], meta={"scenario": "soak"}) as s:
            for i, _ in enumerate(s.wrap(range(12_000)), 1):
                with s.phase("h2d"):
                    pass
                with s.phase("compute"):
                    pass
                if i == 2_000:  # the steps before the last batch (HANDOFF_STEPS) are resolved and handed over
                    assert wait_until(committed(1_999 - HANDOFF_STEPS), timeout=30)
                    before = _traced_profiler_bytes()
            assert wait_until(committed(11_999), timeout=30)
            after = _traced_profiler_bytes()
    finally:
        tracemalloc.stop()
    assert after - before < 512 * 1024, (before, after)  # was ~6 MiB: a row per step kept
    summary = s.summary()
    assert summary is not None and summary.steps + summary.warmup_steps == 12_000  # every step, read back
    assert len(s.step_times()) == summary.steps


def test_compare_reads_a_finished_runs_own_summary_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with Session(run, device="cpu", sample_hz=5, sources=[], meta={"scenario": "short"}) as s:
        for _ in s.wrap(range(30)):
            pass
    doc = stored_summary(run)
    assert doc is not None and doc == json.loads((run / "summary.json").read_text())
    assert doc["steps"] + doc["warmup_steps"] == read_head(run)[1] == 30
    # not the store's own: another run's id, or a store still marked running (its writer killed)
    (run / "summary.json").write_text(json.dumps({**doc, "run_id": "another"}))
    assert stored_summary(run) is None
    (run / "summary.json").write_text(json.dumps(doc))
    con = sqlite3.connect(run / "run.sqlite")
    with con:
        con.execute("UPDATE meta SET value = ? WHERE key = 'status'", (json.dumps("running"),))
    con.close()
    assert stored_summary(run) is None
