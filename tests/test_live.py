"""Live view: aggregation of known steps and samples, exact frame and status-line text, the feeds,
and `stallscope watch` following a run written by another process."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import warm
from conftest import ROOT, sleep_loader, stallscope, wait_until
from rich.console import Console

from profiler import Session
from profiler.core.store import PhaseRow, StepRow
from profiler.live.analysis import LiveAggregator
from profiler.live.feeds import SessionFeed, StoreFeed
from profiler.live.render import PlainLive, frame, sparkline, status_line

RUNS = Path(__file__).parent / "data" / "runs"


def _steps(n: int, step_s: float, wait_s: float, h2d_s: float = 0.0, start: float = 0.0):
    out = []
    for i in range(n):
        t = start + i * step_s
        phases = [PhaseRow(i, "h2d", 0, t + wait_s, t + wait_s + h2d_s)] if h2d_s else []
        out.append((StepRow(i, t, t + step_s, wait_s, 8, False), phases))
    return out


def test_aggregator_stall_per_second_and_window() -> None:
    agg = LiveAggregator(horizon_s=60, window_s=1.0)
    agg.add_steps(_steps(29, 0.1, 0.03, 0.01))  # 2.9 s of 100 ms steps: 40% stalled
    agg.add_steps(_steps(29, 0.1, 0.03, 0.01))  # the same steps again: taken once
    snap = agg.snapshot()
    assert snap.stall_history == pytest.approx([40.0, 40.0, 40.0], abs=1e-6)
    st = snap.stats
    assert st is not None
    assert st.steps_total == 29
    assert st.throughput_samples_per_s == pytest.approx(80.0)
    assert st.stall_fraction == pytest.approx(0.4)
    assert st.data_wait_ms == pytest.approx(30.0) and st.h2d_ms == pytest.approx(10.0)


def test_aggregator_gpu_util_history_and_horizon() -> None:
    agg = LiveAggregator(horizon_s=3)
    agg.add_samples([(t / 10, {"gpu0.util_pct": 100.0 if (t // 10) % 2 else 0.0}) for t in range(50)])
    snap = agg.snapshot()
    assert snap.util_history == {"gpu0": [0.0, 100.0, 0.0]}  # seconds 2..4 kept, per-second means
    assert snap.latest == {"gpu0.util_pct": 0.0}


def test_sparkline_scales_and_pads() -> None:
    assert sparkline([0, 50, 100], width=5) == "  ▁▅█"
    assert sparkline([float("nan"), 100], width=2) == " █"


def _snapshot_of(run: str, tmp_path: Path):
    d = tmp_path / run
    shutil.copytree(RUNS / run, d)
    feed = StoreFeed(d)
    agg = LiveAggregator()
    steps, samples = feed.poll()
    agg.add_steps(steps)
    agg.add_samples(samples)
    return agg.snapshot(), feed.meta()


def test_frame_text_from_a_recorded_run_with_gpu(tmp_path: Path) -> None:
    snap, meta = _snapshot_of("nvml-fake", tmp_path)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(frame(snap, meta, total_steps=100))
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("stallscope recorded-nvml  pipeline=naive  batch=8  workers=0  device=cpu  step 65/100")
    text = buf.getvalue()
    st = snap.stats
    assert st is not None
    assert f"throughput  {st.throughput_samples_per_s:.1f} samples/s" in text
    assert f"gpu0 util   {snap.util_history['gpu0'][-1]:.0f}%" in text
    assert "gpu0 mem" in text and "PCIe rx" in text
    assert "main " in text and "% of all cores" in text


def test_frame_without_nvml_says_so(tmp_path: Path) -> None:
    snap, meta = _snapshot_of("cpu-workers", tmp_path)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(frame(snap, meta))
    text = buf.getvalue()
    assert "gpu util    n/a" in text
    assert " w0 " in text and " w1 " in text  # loader workers listed by label


def test_the_memory_row_shows_the_newest_reading_of_each_figure() -> None:
    agg = LiveAggregator()
    agg.add_steps(_steps(10, 0.1, 0.03))
    agg.add_samples([(0.2, {"mem.total.pss_mb": 612.4, "mem.shm.job_mb": 40.1, "mem.shm.used_mb": 41.0})])
    agg.add_samples([(0.3, {"mem.shm.used_mb": 44.6, "mem.shm.size_mb": 64.0, "sys.cpu_pct": 10.0})])
    assert agg.snapshot().latest == {"mem.shm.used_mb": 44.6, "mem.shm.size_mb": 64.0, "sys.cpu_pct": 10.0}
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(frame(agg.snapshot(), {}))
    row = next(ln for ln in buf.getvalue().splitlines() if ln.startswith("memory"))
    assert " ".join(row.split()) == "memory PSS 612 MiB /dev/shm: the job's 40 MiB, segment 45/64 MiB (newest reading)"


def test_the_stages_row_is_the_recent_time_per_item_of_each_stage() -> None:
    # cumulative stage totals a second apart: in the 5 s window before the newest sample (t 3..8), fetch took
    # 5 x 0.44 s over 5 x 40 items = 11.0 ms an item, decode 1.5 ms; the readings before t 3 fell out of it
    agg = LiveAggregator(window_s=5.0)
    agg.add_samples([(float(t), {"stage.fetch.s": 0.5 * t if t < 3 else 1.5 + 0.44 * (t - 3),
                                 "stage.fetch.n": 40.0 * t, "stage.decode.s": 0.06 * t, "stage.decode.n": 40.0 * t})
                     for t in range(9)])  # fmt: skip
    snap = agg.snapshot()
    assert snap.stages == pytest.approx({"fetch": 0.011, "decode": 0.0015})
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(frame(snap, {}))
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("stages"))
    assert "slowest: fetch" in line and "fetch 11.0, decode 1.5 ms an item" in line, line
    # no stage timed (a scenario file's own data set, DALI): no row
    bare = LiveAggregator()
    bare.add_samples([(0.5, {"sys.cpu_pct": 10.0})])
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(frame(bare.snapshot(), {}))
    assert not any(x.startswith("stages") for x in buf.getvalue().splitlines())


def test_status_line_is_exact() -> None:
    agg = LiveAggregator(window_s=10)
    agg.add_steps(_steps(10, 0.1, 0.03, 0.01))
    agg.add_samples([(0.5, {"proc.total.cpu_pct": 150.0, "gpu0.util_pct": 40.0})])
    line = status_line(agg.snapshot(), total_steps=20)
    assert line == (
        "step 10/20  80.0 samples/s  stall 40%  wait 30.0 ms  h2d 10.0 ms  compute 0.0 ms  (last 10 steps)"
        "  cpu 150%  gpu0 40%"
    )


def test_plain_live_prints_lines_from_a_session(tmp_path: Path) -> None:
    out = io.StringIO()
    with Session(tmp_path, sources=[]) as s, PlainLive(SessionFeed(s), interval_s=0.1, stream=out):
        for _ in s.wrap(sleep_loader(30, 0.01)):
            with s.phase("compute"):
                time.sleep(0.01)
    lines = [ln for ln in out.getvalue().splitlines() if ln]
    assert lines and all(ln.startswith("step ") for ln in lines)
    assert "stall" in lines[-1]


CHILD = textwrap.dedent("""
    import os, sys, time
    from profiler import Session
    # trains until the test says stop (a file appears), at most 60 s: the watcher must start before the run ends
    with Session(sys.argv[1], sources=[], meta={"scenario": "watched", "batch_size": 4}) as s:
        end = time.perf_counter() + 60.0
        for _ in s.wrap(iter(lambda: [0] * 4, None)):
            with s.phase("compute"):
                time.sleep(0.01)
            if time.perf_counter() > end or os.path.exists(sys.argv[2]):
                break
""")


def test_watch_follows_a_run_to_its_end(tmp_path: Path) -> None:
    run, stop, err = tmp_path / "run", tmp_path / "stop", tmp_path / "watch.err"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", CHILD, str(run), str(stop)], cwd=ROOT, env=env)
    try:
        assert wait_until((run / "run.sqlite").exists, timeout=30)
        with err.open("w") as err_file:
            watcher = subprocess.Popen(
                [*warm.argv(), "watch", str(run), "--json"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err_file, text=True,
            )  # fmt: skip
            assert wait_until(lambda: "watching" in err.read_text(), timeout=60)  # it follows the run in progress
            stop.touch()
            stdout, _ = watcher.communicate(timeout=60)
    finally:
        stop.touch()
        writer.wait(timeout=30)
    res = subprocess.CompletedProcess(watcher.args, watcher.returncode, stdout, err.read_text())
    assert res.returncode == 0, res.stderr
    import json

    summary = json.loads(res.stdout)
    assert summary["status"] == "complete" and summary["scenario"] == "watched"


def test_watch_of_a_finished_run_reports_at_once(tmp_path: Path) -> None:
    d = tmp_path / "done"
    shutil.copytree(RUNS / "cpu-workers", d)
    res = stallscope("watch", str(d))
    assert res.returncode == 0
    assert "Verdict:" in res.stdout and "watching" not in res.stderr
