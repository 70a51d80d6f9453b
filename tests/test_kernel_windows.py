"""Kernel windows (profiler.core.kernel_windows.windows) and the GPU's split of each step (profiler.analysis.gpu).

The truth: fake kernel activity with known intervals against steps with known spans and data waits. Each case's
split is worked out by hand (in the comments) and must come out to the nanosecond: host-late launches, input waits
hidden under queued kernels, synchronisation (and a collective kernel), two streams. Then the same activity goes
through a Session (its ring, the sampler process, the store) on a hand-driven clock, and the summary must carry
the same figures; and the simulated device's launches, held by the GIL beside a loading thread, must read as the
host's fault where a loop that loads in its own thread reads as input's.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
from conftest import ROOT, stallscope

from profiler import Session
from profiler.analysis.gpu import GpuStep, gpu_split, window_steps
from profiler.core.kernel_windows.windows import (
    KernelWindowError,
    KernelWindows,
    TorchKernelRecorder,
    WindowPlan,
    kineto_activities,
    parse_plan,
)
from profiler.core.rows import KernelWindow, StepRow
from profiler.core.steps.events import GPU, GWIN, ListLog
from profiler.core.store import RunStore, load_run

MS = 1e-3
NS = 1e-9


def _step(index: int, start_ms: float, end_ms: float, wait_ms: float = 0.0) -> StepRow:
    return StepRow(index, start_ms * MS, end_ms * MS, wait_ms * MS, 8, False)


def _act(start_ms: float, end_ms: float, launch_ms: float, stream: int = 7, kind: int = 0) -> tuple:
    return (stream, kind, start_ms * MS, end_ms * MS, launch_ms * MS)


def _window(*acts: tuple, t0: float = -1.0, t1: float = 100.0) -> KernelWindow:
    return KernelWindow(0, t0 * MS, t1 * MS, 0.0, list(acts))


def _ms(got: GpuStep) -> dict[str, float]:
    """The step's five parts in milliseconds."""
    return {k: getattr(got, f"{k}_s") / MS for k in ("busy", "input", "host", "sync", "short")}


def _split(*, busy: float, input: float = 0.0, host: float = 0.0, sync: float = 0.0, short: float = 0.0) -> object:
    """The parts worked out by hand (ms), to the nanosecond."""
    return pytest.approx({"busy": busy, "input": input, "host": host, "sync": sync, "short": short}, abs=NS / MS)


def _tiles(got: GpuStep) -> bool:
    """The five parts add up to the step's span, to the nanosecond."""
    return abs(sum(_ms(got).values()) * MS - got.span_s) <= NS


def test_host_late_launches() -> None:
    # step [0, 10] ms, data wait [0, 1]. K1 launched at 1 runs 1-3; K2 launched at 5 (after K1 ended) runs 5-6;
    # K3 launched at 6.5 runs 6.6-9; nothing after. Gaps: [0, 1] input (the host waited for the batch, then
    # launched); [3, 5] host; [6, 6.5] host and [6.5, 6.6] short (launch to start); [9, 10] host (nothing launched)
    w = _window(_act(1, 3, 1), _act(5, 6, 5), _act(6.6, 9, 6.5))
    (got,) = window_steps(w, [_step(0, 0, 10, wait_ms=1)])
    assert _ms(got) == _split(busy=5.4, input=1.0, host=3.5, short=0.1) and _tiles(got)
    assert got.launched == 3


def test_input_waits_hidden_under_queued_kernels() -> None:
    # step 0 [0, 10] launches K (at 2), which runs 2-13: into step 1 [10, 20], whose data wait is [10, 14]. The
    # device ran step 0's kernel for 3 ms of that wait: only [13, 14] is input. K' launched at 14 runs 14-19
    w = _window(_act(2, 13, 2), _act(14, 19, 14))
    s0, s1 = window_steps(w, [_step(0, 0, 10), _step(1, 10, 20, wait_ms=4)])
    assert _ms(s0) == _split(busy=8.0, host=2.0) and _tiles(s0)
    assert _ms(s1) == _split(busy=8.0, input=1.0, host=1.0) and _tiles(s1)


@pytest.mark.parametrize("collective", [False, True])
def test_syncs_and_collectives(collective: bool) -> None:
    # step [0, 10]: K1 launched at 0 runs 0-3; K2 was queued at 1 but runs only at 5-8 (it waited on an event):
    # [3, 5] is sync; K3 queued at 2 runs 8.01-10: a 10 us gap, short. With a collective kernel (an all-reduce)
    # running over [3, 5] instead, the gap is no gap but still sync: communication, not work
    acts = [_act(0, 3, 0), _act(5, 8, 1), _act(8.01, 10, 2)]
    if collective:
        acts.append(_act(3, 5, 1, stream=9, kind=3))
    (got,) = window_steps(_window(*acts), [_step(0, 0, 10)])
    assert _ms(got) == _split(busy=7.99, sync=2.0, short=0.01) and _tiles(got)


def test_two_streams_are_one_device() -> None:
    # stream 7: A 0-4 (launched 0), C 7-9 (launched 7); stream 8: B 2-6 (launched 0). The device is busy where either
    # runs: [0, 6] and [7, 9]; [6, 7] and [9, 10] are the host's
    w = _window(_act(0, 4, 0), _act(2, 6, 0, stream=8), _act(7, 9, 7))
    (got,) = window_steps(w, [_step(0, 0, 10)])
    assert _ms(got) == _split(busy=8.0, host=2.0) and _tiles(got)


def test_only_measured_steps_wholly_inside_a_window_count() -> None:
    steps = [StepRow(0, 0.0, 0.01, 0.0, 8, True), _step(1, 10, 20), _step(2, 20, 30), _step(3, 30, 40)]
    w = _window(_act(10, 40, 10), t0=5, t1=35)  # step 0 is warm-up, step 3 ends after the window
    assert [g.step for g in window_steps(w, steps)] == [1, 2]
    split = gpu_split([w], steps, "cupti")
    assert split is not None and split.busy_fraction == pytest.approx(1.0)
    assert split.window_step_ms == pytest.approx(10.0) and split.other_step_ms == pytest.approx(10.0)


def test_window_plans_and_their_bad_input() -> None:
    assert parse_plan("off") is None
    assert parse_plan("auto") == WindowPlan(5, 20, 2000)
    assert parse_plan("0:4") == WindowPlan(0, 4, 0)
    assert parse_plan("3:4:10") == WindowPlan(3, 4, 10)
    for bad in ("x", "3", "3:1", "-1:4", "3:4:4", "1:2:3:4"):
        with pytest.raises(KernelWindowError, match="allowed off, auto, or AFTER:STEPS"):
            parse_plan(bad)


class FakeRecorder:
    """Returns, at each stop, the activities the test asked for, on the Session's clock."""

    source = "cupti"

    def __init__(self, acts: list[tuple] | None = None, why: str | None = None) -> None:
        self.acts, self.why = acts or [], why
        self.starts = self.stops = 0

    def usable(self) -> str | None:
        return self.why

    def start(self) -> None:
        self.starts += 1

    def stop(self) -> list[tuple]:
        self.stops += 1
        return list(self.acts)


def test_windows_open_and_close_at_their_steps_and_put_their_activity() -> None:
    t = [0.0]
    rec = FakeRecorder([_act(1, 2, 0.5, stream=3, kind=1)])
    kw = KernelWindows(WindowPlan(2, 3, 10), rec, warmup=1, clock=lambda: t[0])
    log = ListLog()
    opened = []
    for index in range(25):
        was_open = kw.open_at is not None
        kw.at(index, log.put)
        if kw.open_at is not None and not was_open:
            opened.append(index)
    # the first opens at step 3 (warm-up 1 + 2), closes at 6, then every 10 steps from the first: 13-16, 23-26
    assert opened == [3, 13, 23]
    assert rec.starts == 3 and rec.stops == 2  # the third is still open
    events = log.take()
    assert [e[0] for e in events] == [GPU, GWIN, GPU, GWIN]
    assert events[0] == (GPU, 3 * 4 + 1, 1 * MS, 2 * MS, 0.5 * MS)
    kw.close(log.put)
    assert rec.stops == 3 and log.take()[-1][:2] == (GWIN, 2)


def test_a_recorder_that_cannot_open_says_why_and_once_stops_trying() -> None:
    rec = FakeRecorder(why="once: TEARDOWN_CUPTI is not 1")
    kw = KernelWindows(WindowPlan(0, 2, 5), rec, warmup=0, clock=lambda: 0.0)
    for index in range(20):
        kw.at(index, ListLog().put)
    assert rec.starts == 0 and kw.skipped == ["step 0: once: TEARDOWN_CUPTI is not 1"]


class _Ev:
    """A kineto event as ``kineto_results.events()`` gives one."""

    def __init__(self, name: str, cuda: bool, start_ns: int, dur_ns: int, corr: int, *, stream: int = 7) -> None:
        self._v = (name, cuda, start_ns, dur_ns, corr, stream)

    def name(self) -> str:
        return self._v[0]

    def device_type(self) -> str:
        return "CUDA" if self._v[1] else "CPU"

    def start_ns(self) -> int:
        return self._v[2]

    def duration_ns(self) -> int:
        return self._v[3]

    def correlation_id(self) -> int:
        return self._v[4]

    def linked_correlation_id(self) -> int:
        return 0

    def device_resource_id(self) -> int:
        return self._v[5]


def test_kineto_events_become_activities_with_their_launches() -> None:
    base = 1_800_000_000_000_000_000  # kineto's times: ns on the wall clock
    events = [
        _Ev("cudaLaunchKernel", False, base + 1_000, 5_000, 11),
        _Ev("void gemm_kernel<...>", True, base + 8_000, 20_000, 11),
        _Ev("cudaMemcpyAsync", False, base + 30_000, 2_000, 12),
        _Ev("Memcpy HtoD (Pinned -> Device)", True, base + 31_000, 4_000, 12, stream=20),
        _Ev("ncclDevKernel_AllReduce_Sum_f32", True, base + 40_000, 9_000, 13),
        _Ev("Stream Wait Event", True, base + 50_000, 1_000, 14),  # a sync record: not an activity
        _Ev("Memset (Device)", True, base + 60_000, 1_000, 99),  # its launch is not in the window
    ]
    acts = kineto_activities(events, lambda ns: (ns - base) / 1e9, "CUDA")
    us = 1e-6
    near = {"abs": 1e-12}
    assert len(acts) == 4
    # the kernel with its launch; the copy on its own stream; the collective and the set, launches not known
    assert acts[0] == pytest.approx((7, 0, 8 * us, 28 * us, 1 * us), **near)
    assert acts[1] == pytest.approx((20, 1, 31 * us, 35 * us, 30 * us), **near)
    assert acts[2][:4] == pytest.approx((7, 3, 40 * us, 49 * us), **near) and math.isnan(acts[2][4])
    assert acts[3][:4] == pytest.approx((7, 2, 60 * us, 61 * us), **near) and math.isnan(acts[3][4])


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_sessions_windows_reach_the_store_and_the_summary(tmp_path: Path) -> None:
    # steps of 10 ms: the loop asks for a batch at T_k = 100 + 10 ms k, waits 2 ms for it, computes 8 ms. Each
    # step's kernel is launched at T_k + 2.5 and runs T_k + 3 to T_k + 7: per step busy 4 ms, input 2 (the data
    # wait, nothing queued), host 0.5 + 3 (launched late; nothing launched after it until the next step), short 0.5
    clock = Clock(100.0)
    acts = [_act(k * 10 + 3, k * 10 + 7, k * 10 + 2.5) for k in range(2, 7)]
    rec = FakeRecorder([(s, kind, a + 100.0, b + 100.0, c + 100.0) for s, kind, a, b, c in acts])

    def batches():
        for _ in range(8):
            clock.t += 0.002
            yield [0] * 8

    session = Session(tmp_path / "run", sources=[], clock=clock, device="cpu", warmup=1, kernel_windows="1:3:0",
                      kernel_recorder=rec)  # fmt: skip
    with session as s:
        for _ in s.wrap(batches()):
            with s.phase("compute"):
                clock.t += 0.008
    # the window opened at step 2's batch and closed at step 5's: steps 3 and 4 lie wholly inside it
    (window,) = load_run(tmp_path / "run").windows
    assert window.t_start == pytest.approx(0.022) and window.t_end == pytest.approx(0.052)
    assert len(window.activities) == 5
    summary = session.summary()
    assert summary is not None and summary.gpu is not None
    assert [g.step for g in summary.gpu.steps] == [3, 4]
    for g in summary.gpu.steps:
        assert _ms(g) == _split(busy=4.0, input=2.0, host=3.5, short=0.5) and _tiles(g)
    assert summary.device_busy_fraction == pytest.approx(0.4)
    assert summary.sources.device_busy_fraction.startswith("kernel time (CUPTI, torch.profiler)")
    # the host's share (35%) is over the input's (20%): the GPU waits for the host, and the report says so
    assert summary.verdict == "host-bound: the GPU waits for the host"
    (found,) = [r for r in summary.recommendations if r.code == "GPU_WAITS_FOR_HOST"]
    assert "ran kernels 40% of the time and sat idle 35% waiting for kernels the host launched late" in found.text
    d = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert d["gpu"]["fractions"] == pytest.approx({"busy": 0.4, "input": 0.2, "host": 0.35, "sync": 0.0, "short": 0.05})


def test_a_window_is_stored_once_though_its_events_are_read_twice(tmp_path: Path) -> None:
    store = RunStore(tmp_path, meta={"run_id": "x"})
    w = KernelWindow(0, 1.0, 2.0, 0.001, [(7, 0, 1.1, 1.2, 1.05), (20, 1, 1.3, 1.4, math.nan)])
    store.put_window(w)
    store.put_window(w)  # a sampler process that took over re-reads the ring from the oldest step not stored
    store.close()
    (back,) = load_run(tmp_path).windows
    assert (back.window, back.t_start, back.t_end, back.cost_s) == (0, 1.0, 2.0, 0.001)
    assert back.activities[0] == (7, 0, 1.1, 1.2, 1.05) and math.isnan(back.activities[1][4])
    assert math.isnan(back.recorded_end) and back.t_recorded == 2.0  # stopped where its steps ended


def test_where_a_windows_recorded_steps_ended_is_stored_and_an_older_store_reads_none(tmp_path: Path) -> None:
    import sqlite3

    store = RunStore(tmp_path / "new", meta={"run_id": "x"})
    store.put_window(KernelWindow(0, 1.0, 2.0, 0.001, [], 1.5))
    store.close()
    (back,) = load_run(tmp_path / "new").windows
    assert back.recorded_end == 1.5 and back.t_recorded == 1.5
    # a v3 store: kernel_windows without the column
    store = RunStore(tmp_path / "old", meta={"run_id": "y"})
    store.close()
    con = sqlite3.connect(tmp_path / "old" / "run.sqlite")
    con.executescript(
        "DROP TABLE kernel_windows; CREATE TABLE kernel_windows (window INTEGER PRIMARY KEY, t_start REAL NOT NULL, "
        "t_end REAL NOT NULL, cost_s REAL NOT NULL); INSERT INTO kernel_windows VALUES (0, 1.0, 2.0, 0.5);"
    )
    con.close()
    (old,) = load_run(tmp_path / "old").windows
    assert (old.t_start, old.t_end, old.cost_s) == (1.0, 2.0, 0.5) and math.isnan(old.recorded_end)
    # window_steps measures only the steps before the recorded end
    steps = [StepRow(i, 1.0 + i * 0.1, 1.1 + i * 0.1, 0.0, 1, False) for i in range(10)]
    cut = KernelWindow(0, 1.0, 2.0, 0.0, [(0, 0, 1.0, 2.0, 1.0)], 1.5)
    assert [g.step for g in window_steps(cut, steps)] == [0, 1, 2, 3, 4]
    assert len(window_steps(old.__class__(0, 1.0, 2.0, 0.0, [(0, 0, 1.0, 2.0, 1.0)]), steps)) == 10


SCENARIO = str(ROOT / "tests" / "data" / "scenarios" / "gil_loader.py")


# alone (tests/scheduling.py): its truth is how two threads of one process share the GIL and this host's cores.
# While the simulated launch released the GIL for a microsecond, the loader thread won that race or lost it by the
# scheduler's timing, and prefetch's split went either way (host 46-69% against input 50-28%, 6 runs on a quiet host,
# 2026-11-29). Since the launch's C++ dispatch runs with the GIL released (profiler/sim/device.py), 7 runs (3 beside
# two busy processes) read prefetch host 95.6-97.8% against input 0.1-0.2%, and naive input 58-60% against host 36-39%.
@pytest.mark.alone
def test_the_simulated_device_tells_the_hosts_wait_from_inputs(tmp_path: Path) -> None:
    # launch=gil: the simulated device's launches hold the GIL for their Python part and release it for their C++
    # dispatch, as torch's op bindings do. naive, 0 workers: the training thread loads each batch, then launches:
    # the device waits for input. prefetch, 0 workers: a thread beside it loads in Python, takes the GIL during a
    # dispatch and keeps it for the switch interval, and the launches crawl: the device waits for the host. The
    # same split names each.
    got = {}
    for pipeline in ("naive", "prefetch"):
        res = stallscope(
            "run", SCENARIO, "--device", "sim:h100,launch=gil", "--pipeline", pipeline, "--workers", "0",
            "--steps", "40", "--kernel-windows", "2:20", "--no-attribution", "--no-live", "--json",
            "--out", str(tmp_path / pipeline),
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        got[pipeline] = d = json.loads(res.stdout)
        assert d["gpu"]["source"] == "sim" and d["gpu"]["steps"] >= 15
        assert d["sources"]["device_busy_fraction"].startswith("SIMULATED")
    naive, prefetch = got["naive"]["gpu"]["fractions"], got["prefetch"]["gpu"]["fractions"]
    assert naive["input"] > naive["host"] and got["naive"]["verdict"].endswith("input-bound"), naive
    assert prefetch["host"] > max(0.5, prefetch["input"]) and prefetch["input"] < 0.1, prefetch
    assert got["prefetch"]["verdict"] == "host-bound: the GPU waits for the host"
    # the launches themselves: longer beside the loader thread than alone, on the same host in the same test (beside
    # two busy processes: 47-56 ms a step against 23-27)
    host_ms = {p: got[p]["gpu"]["ms_per_step"]["host"] for p in got}
    assert host_ms["prefetch"] > host_ms["naive"], host_ms
    codes = [r["code"] for r in got["prefetch"]["recommendations"]]
    assert "GPU_WAITS_FOR_HOST" in codes and "RAISE_WORKERS" not in codes


class BrokenRecorder(FakeRecorder):
    def start(self) -> None:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")


def test_a_recorder_that_fails_never_stops_the_training(tmp_path: Path) -> None:
    with Session(tmp_path, sources=[], device="cpu", kernel_windows="0:2:3", kernel_recorder=BrokenRecorder()) as s:
        for _ in s.wrap(range(12)):
            pass
    rec = load_run(tmp_path)
    assert len(rec.steps) == 12 and rec.windows == ()
    (warning,) = [e for e in rec.events if e[1] == "warning" and "kernel windows" in e[3]]
    assert warning[3] == (
        "kernel windows: step 0: once: the recorder failed to start (RuntimeError: CUPTI_ERROR_NOT_INITIALIZED)"
    )


def test_the_trace_has_a_track_per_stream_and_one_of_the_windows() -> None:
    from profiler.core.rows import RunRecord
    from profiler.render.trace import TID_KERNELS, trace_events

    w = _window(_act(1, 3, 0.5), _act(2, 4, 1, stream=20, kind=1), _act(5, 6, 4), t0=0, t1=10)
    rec = RunRecord({"kernel_windows": "cupti: 2 steps"}, [_step(0, 0, 10)], [], [], [], None, (w,))
    events = trace_events(rec)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[TID_KERNELS] == "kernel windows (CUPTI)"
    assert names[TID_KERNELS + 1] == "GPU stream 7 (CUPTI kernel activity)"
    assert names[TID_KERNELS + 2] == "GPU stream 20 (CUPTI kernel activity)"
    on_7 = [(e["ts"], e["dur"], e["name"]) for e in events if e["ph"] == "X" and e["tid"] == TID_KERNELS + 1]
    assert on_7 == [(pytest.approx(1000.0), pytest.approx(2000.0), "kernel"), (pytest.approx(5000.0),
                    pytest.approx(1000.0), "kernel")]  # fmt: skip
    (copy,) = [e for e in events if e["ph"] == "X" and e["tid"] == TID_KERNELS + 2]
    assert copy["name"] == "memcpy" and copy["args"]["launch_us"] == pytest.approx(1000.0)


def test_mfu_from_the_counted_flops_the_step_time_and_the_kernels() -> None:
    from profiler.analysis.mfu import mfu_of

    # 1 TFLOP a step in 100 ms steps: 10 TFLOP/s, 10% of a 100 TFLOP/s peak; the kernels ran 5 of each 10 ms step
    # in the window below (busy 50%), so over kernel time the device ran at 2x the step rate... of its own steps
    meta = {"device": {"kind": "sim", "sim": {"peak_tflops": 100.0, "full_name": "X", "precision": "tf32"}},
            "sim_cost": {"flops": 1e12}}  # fmt: skip
    split = gpu_split([_window(_act(0, 5, 0))], [_step(0, 0, 10)], "sim")
    m = mfu_of(meta, 100.0, split)
    assert m is not None and m.simulated
    assert m.tflops_step == pytest.approx(10.0) and m.mfu == pytest.approx(0.10)
    assert m.tflops_kernel == pytest.approx(1e12 / 0.005 / 1e12)  # 5 ms of kernels a step
    cuda = {"device": {"kind": "cuda"}, "step_flops": {"flops": 2e12, "source": "meta", "peak_tflops": 400.0,
                                                       "peak_of": "H100 tf32 datasheet"}}  # fmt: skip
    m = mfu_of(cuda, 50.0, None)
    assert m is not None and not m.simulated and m.mfu == pytest.approx(0.10) and math.isnan(m.tflops_kernel)
    assert mfu_of({"device": {"kind": "cuda"}, "step_flops": {"flops": None}}, 50.0, None) is None


def test_without_windows_the_coarse_split_over_the_samplers_intervals() -> None:
    from profiler.analysis.gpu import coarse_split

    # readings at 0, 1 and 2 s: 40% busy over (0, 1], 80% over (1, 2]. The training thread waited for data 0.5 s
    # of the first interval and none of the second: idle 0.6 s -> input 0.5, other 0.1; then idle 0.2 -> other
    samples = [(t, "nvml", "gpu0.util_pct", v) for t, v in ((0.0, 10.0), (1.0, 40.0), (2.0, 80.0))]
    steps = [StepRow(0, 0.2, 1.0, 0.5, 8, False), StepRow(1, 1.0, 2.0, 0.0, 8, False)]
    got = coarse_split([*samples, (1.5, "nvml", "gpu1.util_pct", 0.0)], steps, (0.0, 2.0))
    assert got is not None and got.metric == "NVML utilization.gpu (driver-averaged)"
    assert (got.seconds, got.busy_s, got.input_s, got.other_s) == pytest.approx((2.0, 1.2, 0.5, 0.3))
    d = got.to_dict()
    assert d["fractions"] == pytest.approx({"busy": 0.6, "input": 0.25, "other_idle": 0.15})
    # GPM's graphics activity, where read, is the better measure and is taken first
    gpm = [(t, "nvml", "gpu0.gpm_graphics_pct", 50.0) for t in (0.0, 1.0, 2.0)]
    assert coarse_split([*samples, *gpm], steps, (0.0, 2.0)).metric == "NVML GPM graphics activity"  # type: ignore[union-attr]
    assert coarse_split(samples[:1], steps, (0.0, 2.0)) is None


def test_the_live_view_and_prometheus_show_the_newest_windows_split(tmp_path: Path) -> None:
    from profiler.export.metrics import run_metrics
    from profiler.live.analysis import LiveAggregator, TotalsFolder
    from profiler.live.feeds import StoreFeed
    from profiler.live.render import frame

    # the host-late case above: busy 5.4, input 1.0, host 3.5, short 0.1 of a 10 ms step
    w = _window(_act(1, 3, 1), _act(5, 6, 5), _act(6.6, 9, 6.5))
    step = (_step(0, 0, 10, wait_ms=1), [])
    agg = LiveAggregator()
    agg.add_windows([w], "cupti")  # the window before its step: no split yet
    assert agg.snapshot().gpu is None
    agg.add_steps([step])
    agg.add_windows([], "cupti")  # the next poll: its step is in
    gpu = agg.snapshot().gpu
    assert gpu is not None and gpu.fraction("host") == pytest.approx(0.35)
    text = " ".join(str(line) for line in frame(agg.snapshot(), {}).renderables)
    assert "busy 54%" in text and "input 10%  host 35%  sync 0%  short 1%" in text
    got = {m.name: m for m in run_metrics(agg.snapshot(), TotalsFolder().totals(), {}, "running")}
    assert {lab["part"]: v for lab, v in got["stallscope_gpu_time_ratio"].samples} == pytest.approx(
        {"busy": 0.54, "input": 0.10, "host": 0.35, "sync": 0.0, "short": 0.01}
    )
    # watch RUN_DIR's feed hands each stored window once
    store = RunStore(tmp_path, meta={"run_id": "x"})
    store.put_window(w)
    store.close()
    feed = StoreFeed(tmp_path)
    assert [x.window for x in feed.windows()] == [0] and feed.windows() == []


def test_the_thread_sampler_stores_the_windows_too(tmp_path: Path) -> None:
    # sampling="thread": no sampler process; the Session's own rows and windows go to the ThreadRecorder's store
    rec = FakeRecorder([_act(1, 2, 0.5)])
    with Session(tmp_path, sources=[], device="cpu", sampling="thread", kernel_windows="0:2:0",
                 kernel_recorder=rec) as s:  # fmt: skip
        for _ in s.wrap(range(6)):
            pass
    (window,) = load_run(tmp_path).windows
    ((stream, kind, a, b, launch),) = window.activities  # on the run's clock: the Session's, less its zero
    assert (stream, kind) == (7, 0) and b - a == pytest.approx(0.001) and a - launch == pytest.approx(0.0005)
    assert rec.stops == 1


class _FakeProfile:
    """torch.profiler.profile with CUDA activity, as the start-up module uses it: its events come at fixed
    offsets from the wall clock of its start."""

    started: ClassVar[list[float]] = []  # perf_counter at each start (on whichever thread started it)

    def __init__(self, activities: list[object]) -> None:
        self.base = 0

    def start(self) -> None:
        self.base = time.time_ns()
        _FakeProfile.started.append(time.perf_counter())

    def stop(self) -> None:
        pass

    def export_chrome_trace(self, path: str) -> None:
        """Its trace as kineto writes it: microseconds from ``baseTimeNanoseconds``, launches linked by correlation
        (torch's public export: the fake has nothing else to write it with)."""
        base = self.base - 123_456_789  # kineto's base is not the window's start

        def x(cat: str, name: str, start_ns: int, dur_ns: int, **args: int) -> dict[str, object]:
            return {"ph": "X", "cat": cat, "name": name, "ts": (self.base + start_ns - base) / 1e3,
                    "dur": dur_ns / 1e3, "args": args}  # fmt: skip

        events = [
            x("cuda_runtime", "cudaLaunchKernel", 900_000, 5_000, correlation=3),
            x("kernel", "volta_sgemm", 1_000_000, 2_000_000, stream=7, correlation=3),
            x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 4_000_000, 500_000, stream=20, correlation=4),
            x("kernel", "late_kernel", 900_000_000, 1_000, stream=7, correlation=9),  # after the window's boundary
        ]
        Path(path).write_text(json.dumps({"baseTimeNanoseconds": base, "traceEvents": events}))  # fmt: skip


def test_the_start_up_module_records_kernel_windows_in_the_scripts_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from profiler.zerocode.boot.stallscope_instrument import KernelWindows, Writer
    from profiler.zerocode.instrument import InstrumentReader, Process, handed_over

    threads: set[str] = set()

    class Event:
        def record(self) -> None:
            threads.add("record:" + threading.current_thread().name)

        def synchronize(self) -> None:
            threads.add("synchronize:" + threading.current_thread().name)

    def set_device(device: int) -> None:
        threads.add(f"set_device {device}:" + threading.current_thread().name)

    fake_torch = SimpleNamespace(
        cuda=SimpleNamespace(
            is_initialized=lambda: True,
            synchronize=lambda: None,
            Event=Event,
            current_device=lambda: 3,
            set_device=set_device,
        ),
        profiler=SimpleNamespace(profile=_FakeProfile, ProfilerActivity=SimpleNamespace(CUDA="cuda")),
        autograd=SimpleNamespace(DeviceType=SimpleNamespace(CUDA="CUDA")),
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    writer = Writer(str(tmp_path))
    windows = KernelWindows(writer, KernelWindows.parse("2:3"))
    for call in range(1, 10):  # the script's next() calls (2 ms apart): a window from the 2nd to the 5th, then none
        time.sleep(0.002)
        if call >= windows.next_call:
            windows.at(call)
    windows.finish()  # as at the script's exit: the stop running on the window thread has written its record
    writer.flush()
    records = [json.loads(line) for line in (tmp_path / f"p{os.getpid()}.jsonl").read_text().splitlines()]
    (rec,) = records
    assert rec["k"] == "kwin" and rec["w"] == 0 and windows.next_call > 10**9
    # the boundary marked on the script's thread, waited for on the window thread, where the stop ran
    # the window thread on the script's device (3 here), where the profiler's stop synchronizes
    assert threads == {
        "record:MainThread",
        "synchronize:stallscope-kernel-window",
        "set_device 3:stallscope-kernel-window",
    }
    assert rec["t0"] < rec["r"] < rec["t1"]
    # kineto wrote the window's trace; stallscope's process reads it, not the script's thread
    assert rec["acts"] == [] and Path(rec["trace"]).parent == tmp_path
    (stream, kind, start, end, launch), copy, late = handed_over(rec)
    assert late[2] > rec["r"]  # started after the boundary (no launch known): the reader drops it
    # on perf_counter: the kernel 1 ms after the profiler started (the wall clock read beside it, within a ms; the
    # window thread starts it, a few ms after the opening began on a busy host), 2 ms long
    assert (stream, kind) == (7, 0) and end - start == pytest.approx(0.002, abs=1e-6)
    assert start - _FakeProfile.started[-1] == pytest.approx(0.001, abs=0.001)
    assert rec["t0"] <= _FakeProfile.started[-1] and start - launch == pytest.approx(0.0001, abs=1e-6)
    assert copy[:2] == (20, 1) and copy[4] == -1.0  # its launch is not in the window
    # the reader takes it into the run's clock, once, for the source process
    reader = InstrumentReader(tmp_path, t0=rec["t0"] - 1.0)
    proc = Process(os.getpid())
    proc.take(rec)
    reader.source = proc
    (w,) = reader.take_windows()
    assert w.t_start == pytest.approx(1.0) and len(w.activities) == 2 and math.isnan(w.activities[1][4])
    assert reader.take_windows() == []
    with pytest.raises(ValueError, match="allowed off, auto or AFTER:STEPS"):
        KernelWindows.parse("3:1")


def test_a_window_put_off_for_now_opens_at_a_later_step_and_says_so_once() -> None:
    rec = FakeRecorder(why="a CUDA graph is being captured")
    kw = KernelWindows(WindowPlan(0, 2, 0), rec, warmup=0, clock=lambda: 0.0)
    log = ListLog()
    for index in range(4):
        if index == 3:
            rec.why = None  # the capture ended
        kw.at(index, log.put)
    assert kw.skipped == ["step 0: a CUDA graph is being captured"] and rec.starts == 1 and kw.open_at is not None


class OffThreadRecorder(FakeRecorder):
    """CUDA's path: started and stopped on the windows' own thread (threads noted), the stop failing once."""

    off_thread = True

    def __init__(self, fail_stop: bool = False) -> None:
        super().__init__()
        self.fail_stop, self.threads, self.parts = fail_stop, set(), {"read": 0.0}

    def start(self) -> None:
        import threading

        self.threads.add(threading.current_thread().name)
        super().start()

    def mark(self) -> None:
        return None

    def stop(self, boundary: object = None) -> list[tuple]:
        import threading

        self.threads.add(threading.current_thread().name)
        if self.fail_stop:
            raise RuntimeError("CUPTI_ERROR_UNKNOWN")
        return super().stop()


@pytest.mark.parametrize("fail", [False, True])
def test_an_off_thread_recorder_starts_and_stops_on_its_own_thread_and_a_failed_stop_is_said(
    tmp_path: Path, fail: bool
) -> None:
    rec = OffThreadRecorder(fail_stop=fail)
    with Session(tmp_path, sources=[], device="cpu", kernel_windows="0:2:4", kernel_recorder=rec) as s:
        for _ in s.wrap(range(14)):
            pass
    run = load_run(tmp_path)
    assert len(run.steps) == 14 and rec.threads == {"stallscope-kernel-window"}
    warnings = [e[3] for e in run.events if e[1] == "warning" and "kernel windows" in e[3]]
    if fail:  # the first window is lost, and no other opens
        assert rec.starts == 1 and run.windows == ()
        assert warnings == [
            "kernel windows: step 0: once: the recorder failed to stop (RuntimeError: CUPTI_ERROR_UNKNOWN)"
        ]
    else:  # a window every 4 steps or more: the next opens 4 steps after the last, once its stop has ended there
        assert rec.starts == rec.stops == len(run.windows) >= 1 and not warnings
        assert all(not math.isnan(w.recorded_end) and w.t_start < w.recorded_end <= w.t_end for w in run.windows)
        opened = [next(st.step for st in run.steps if st.t_end > w.t_start) for w in run.windows]
        assert opened[0] == 0 and all(b - a >= 4 for a, b in itertools.pairwise(opened)), opened
        assert all(a.t_end <= b.t_start for a, b in itertools.pairwise(run.windows))


def test_the_cuda_recorder_starts_and_stops_on_the_window_thread_on_the_training_threads_device(tmp_path: Path) -> None:
    """TorchKernelRecorder over a fake torch (no GPU here): a Session's window starts the profiler on the window
    thread after making the training thread's device (3) that thread's, marks the boundary on the training thread,
    and waits for it, stops and hands the trace over there."""
    import threading

    calls: list[str] = []

    def on(what: str) -> None:
        calls.append(f"{what}:{threading.current_thread().name}")

    class Event:
        def record(self) -> None:
            on("record")

        def synchronize(self) -> None:
            on("event sync")

    class Profile:
        def __init__(self, activities: list[object]) -> None:
            pass

        def export_chrome_trace(self, path: str) -> None:
            on("export")
            Path(path).write_text("{}")

        def start(self) -> None:
            on("start")

        def stop(self) -> None:
            on("stop")

    cuda = SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, is_current_stream_capturing=lambda: False,
        current_device=lambda: 3, set_device=lambda d: on(f"set_device {d}"), Event=Event,
        synchronize=lambda: on("device sync"),
    )  # fmt: skip
    fake = SimpleNamespace(
        cuda=cuda, profiler=SimpleNamespace(profile=Profile, ProfilerActivity=SimpleNamespace(CUDA=1))
    )
    rec = TorchKernelRecorder(fake, time.perf_counter)  # type: ignore[arg-type]
    assert rec.off_thread
    with Session(tmp_path, sources=[], device="cpu", kernel_windows="0:3:0", kernel_recorder=rec) as s:
        for _ in s.wrap(range(8)):
            pass
    win = "stallscope-kernel-window"
    # the trace handed over through torch's public export, on the window thread too
    assert calls == [f"set_device 3:{win}", f"start:{win}", "record:MainThread", f"event sync:{win}", f"stop:{win}",
                     f"export:{win}"]  # fmt: skip
    (w,) = load_run(tmp_path).windows
    assert w.t_start < w.recorded_end <= w.t_end


@pytest.mark.gpu
def test_a_real_cuda_window_records_the_training_threads_kernels_from_its_own_thread(tmp_path: Path) -> None:
    """CUPTI started on the window thread records the kernels the training thread launches, with their launches:
    the off-thread design's premise, which only a GPU can check. 40 steps of 4 spin kernels each, a window of 10."""
    import torch

    with Session(tmp_path, device="cuda", sources=[], warmup=1, kernel_windows="2:10:0") as s:
        for _ in s.wrap(range(40)):
            with s.phase("compute"):
                for _ in range(4):
                    torch.cuda._sleep(200_000)
    (w,) = load_run(tmp_path).windows
    assert not math.isnan(w.recorded_end) and w.t_start < w.recorded_end <= w.t_end
    kernels = [a for a in w.activities if a[1] == 0]
    # 10 steps of 4 launches in the window (the boundary steps' may fall either side), each with its launch
    assert 36 <= len(kernels) <= 44 and all(not math.isnan(a[4]) for a in kernels), len(kernels)
    assert all(a[4] <= w.recorded_end for a in w.activities)
