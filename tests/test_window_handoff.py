"""A kernel window handed over as kineto's own trace file (profiler/core/kernel_windows/trace_file.py): what the sampler
process reads from it is what the training process would have read from kineto's events, and a real torch 2.11 trace
from an H200 reads as `stallscope kernels` reads it."""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from profiler import Session
from profiler.core.kernel_windows.trace_file import activities, fill, trace_path
from profiler.core.kernel_windows.windows import TorchKernelRecorder, clock_map
from profiler.core.rows import KernelWindow
from profiler.core.store import load_run
from profiler.kernels import analysis

H200_TRACE = ROOT / "tests" / "data" / "traces" / "rn18-input-w0.json.gz"


def test_the_handed_over_trace_reads_as_the_events_do(tmp_path: Path) -> None:
    """One CPU-operator window (the CUDA recorder's path without a GPU): read in-process from kineto's events, and
    from the trace kineto wrote, the same activities to the microsecond."""
    x = torch.ones(4)
    rec = TorchKernelRecorder(torch, time.perf_counter, activity="cpu")
    rec.start()
    for _ in range(300):
        x.add_(1)
    rec.stop_to(trace_path(tmp_path, 0))
    pairs = rec._pairs
    prof_path = trace_path(tmp_path, 0)
    clock = json.loads(prof_path.with_suffix(".clock.json").read_text())
    assert clock["cpu"] is True
    handed = fill(KernelWindow(0, 0.0, 1.0, 0.0, []), tmp_path, 0.0).activities
    # the in-process read of a second window of the same loop, for the events' count and kinds
    rec.start()
    for _ in range(300):
        x.add_(1)
    direct = rec.stop()
    assert len(handed) >= 300 and len(handed) == len(direct) == int(rec.parts["events"])
    spans = [b - a for _, _, a, b, _ in handed]
    assert all(s >= 0 for s in spans)
    # both reads put kineto's ns on the Session's clock the same way
    assert clock_map(pairs)(pairs[0][1]) == pytest.approx(pairs[0][0], abs=1e-6)
    first = handed[0][2]
    assert pairs[0][0] - 1e-3 < first < pairs[1][0] + 1e-3  # inside the window, on the Session's clock
    assert prof_path.exists()  # the first window's trace stays in the run directory


def test_later_windows_traces_are_removed_once_read(tmp_path: Path) -> None:
    rec = TorchKernelRecorder(torch, time.perf_counter, activity="cpu")
    for w in (0, 1):
        rec.start()
        torch.ones(4).add_(1)
        rec.stop_to(trace_path(tmp_path, w))
    for w in (0, 1):
        assert fill(KernelWindow(w, 0.0, 1.0, 0.0, []), tmp_path, 0.0).activities
    assert trace_path(tmp_path, 0).exists() and not trace_path(tmp_path, 1).exists()
    assert fill(KernelWindow(5, 0.0, 1.0, 0.0, []), tmp_path, 0.0).activities == []  # nothing handed over


def test_a_torch_2_11_trace_from_an_h200_reads_as_stallscope_kernels_does() -> None:
    trace = json.loads(gzip.decompress(H200_TRACE.read_bytes()))
    base = int(trace["baseTimeNanoseconds"])
    acts = activities(trace, lambda ns: (ns - base) / 1e9)  # seconds since the trace's base
    ref = analysis.activities(trace["traceEvents"])
    assert len(acts) == len(ref) == 1943 + 10 + 118  # kernels, copies, sets
    for mine, theirs in zip(acts, sorted(ref, key=lambda a: a.ts), strict=True):
        assert mine[0] == theirs.stream
        assert mine[2] * 1e6 == pytest.approx(theirs.ts, abs=1e-3)
        assert (mine[3] - mine[2]) * 1e6 == pytest.approx(theirs.dur, abs=1e-3)
        assert (math.isnan(mine[4]) and theirs.launch_ts is None) or mine[4] * 1e6 == pytest.approx(
            theirs.launch_ts, abs=1e-3
        )


def test_a_session_hands_its_windows_to_the_sampler_process(tmp_path: Path) -> None:
    """The Session's windows (the CUDA recorder's path over CPU operators) reach the store through the file: the
    training thread wrote kineto's trace, the sampler process read it."""
    x = torch.ones(4)
    rec = TorchKernelRecorder(torch, time.perf_counter, activity="cpu")
    with Session(tmp_path, kernel_recorder=rec, kernel_windows="2:6:0", sample_hz=5) as s:
        for _ in s.wrap(range(14)):
            with s.phase("compute"):
                for _ in range(50):
                    x.add_(1)
    run = load_run(tmp_path)
    assert len(run.windows) == 1
    w = run.windows[0]
    assert len(w.activities) >= 5 * 50  # the 5 steps wholly inside, at least
    assert all(w.t_start <= a[2] <= w.t_end for a in w.activities)
    assert trace_path(tmp_path, 0).exists()
    assert "events" not in rec.parts  # no event was read in the training process: kineto wrote them
