"""``stallscope kernels TRACE``: each stream's busy time and idle split from a torch.profiler trace, exact on
made-up traces, and equal to Holistic Trace Analysis's idle-time breakdown on real ones."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profiler.kernels.analysis import analyze, union_us
from profiler.kernels.read import read_trace

DATA = Path(__file__).parent / "data" / "hta"


def _launch(corr: int, ts: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 3,
            "args": {"correlation": corr}}  # fmt: skip


def _kernel(corr: int, stream: int, ts: float, dur: float, cat: str = "kernel") -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": f"k{corr}",
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": corr},
    }


def _trace(*pairs: tuple[float, int, float, float], extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """(launch ts, stream, kernel ts, dur) per kernel, in microseconds."""
    events: list[dict[str, Any]] = []
    for corr, (launch, stream, ts, dur) in enumerate(pairs, start=1):
        events += [_launch(corr, launch), _kernel(corr, stream, ts, dur)]
    return {"traceEvents": events + (extra or [])}


def test_host_late_launches_are_host_wait_to_the_microsecond() -> None:
    # k2 launched at 150, after k1 ended at 110: the 60 us before it started (170) are the host's
    tk = analyze(_trace((0, 7, 10, 100), (150, 7, 170, 50)))
    (s,) = tk.streams
    assert (s.host_wait_us, s.kernel_wait_us, s.other_us, s.busy_us, s.span_us) == (60, 0, 0, 150, 210)
    assert tk.busy_fraction == pytest.approx(150 / 210)


def test_queued_kernels_hide_the_hosts_pauses_and_short_gaps_are_kernel_wait() -> None:
    # all launched up front: whatever the host did later, the stream never waited for it; gaps of 5 and 29 us are
    # the cost of starting back-to-back work, one of 30 us or more is something else (a wait on an event)
    tk = analyze(_trace((0, 7, 10, 100), (1, 7, 115, 100), (2, 7, 244, 100), (3, 7, 374, 10)))
    (s,) = tk.streams
    assert (s.host_wait_us, s.kernel_wait_us, s.other_us) == (0, 5 + 29, 30)


def test_two_streams_are_split_each_on_its_own_and_busy_is_their_union() -> None:
    tk = analyze(_trace((0, 7, 10, 100), (1, 20, 50, 100), (200, 7, 300, 10), (2, 20, 160, 5)))
    s7, s20 = tk.streams
    assert (s7.stream, s7.host_wait_us, s7.busy_us) == (7, 190, 110)
    assert (s20.stream, s20.host_wait_us, s20.kernel_wait_us, s20.busy_us) == (20, 0, 10, 105)
    assert tk.busy_us == union_us([(10, 110), (50, 150), (160, 165), (300, 310)]) == 100 + 40 + 5 + 10


def test_a_device_sync_record_counts_as_activity_only_when_asked() -> None:
    sync = {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "ts": 120, "dur": 10,
            "args": {"stream": 7, "correlation": 9}}  # fmt: skip
    trace = _trace((0, 7, 10, 100), (1, 7, 200, 10), extra=[sync, _launch(9, 115)])
    assert analyze(trace).streams[0].other_us == 90
    with_syncs = analyze(trace, syncs_as_activity=True).streams[0]
    assert (with_syncs.host_wait_us, with_syncs.other_us, with_syncs.activities) == (10, 70, 3)


def test_a_steps_busy_time_is_all_the_work_over_its_span() -> None:
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 1000 * i, "dur": 1000}
             for i in (1, 2)]  # fmt: skip
    tk = analyze(_trace((1100, 7, 1200, 300), (1900, 7, 1950, 200), (2100, 7, 2200, 100), extra=steps))
    # step 2 launched one kernel, and the GPU also ran the last 150 us of step 1's second one in its span
    assert [(st.step, st.activities, st.busy_us) for st in tk.steps] == [(1, 2, 300 + 50), (2, 1, 150 + 100)]
    assert tk.steps[0].busy_fraction == pytest.approx(0.35)


def _step(i: int, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": ts, "dur": dur}


def _next(ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "ts": ts, "dur": dur}  # fmt: skip


def _split(st: Any) -> tuple[float, ...]:
    return (st.busy_us, st.input_us, st.host_us, st.sync_us, st.short_us)


def test_a_steps_idle_time_is_split_by_why_to_the_microsecond() -> None:
    """Step 0..1000: the host waits 300 us for data (the loader's next()), launches at 300 (starts 305, 200 us);
    then it is busy in Python until 700 and launches (starts 704, 100 us); a third kernel, launched at 750 and
    queued behind an event, starts at 900 (50 us); nothing more is launched in the step."""
    tk = analyze(_trace((300, 7, 305, 200), (700, 7, 704, 100), (750, 7, 900, 50),
                        extra=[_step(0, 0, 1000), _next(0, 300)]))  # fmt: skip
    (st,) = tk.steps
    # busy 350; input: 0-300 (the first kernel's late launch while in next()); host: 505-700; short: 300-305 and
    # 700-704 (launch to start); sync: 804-900 (queued since 750, waiting); host: 950-1000 (nothing more launched)
    assert _split(st) == (350, 300, 195 + 50, 96, 5 + 4)
    assert sum(_split(st)) == st.dur


def test_input_waits_hidden_under_queued_kernels_are_not_idle() -> None:
    """The host waits for data from 100 to 600 while a long kernel it launched before runs to 700: the device never
    idles for it; the kernel after it was queued at 90, so the 10 us between them are short, not input."""
    tk = analyze(_trace((5, 7, 10, 690), (90, 7, 710, 290), extra=[_step(3, 0, 1000), _next(100, 500)]))
    (st,) = tk.steps
    # 0-10: the first kernel's launch at 5 came late (host 0-5, short 5-10); 700-710: short
    assert _split(st) == (980, 0, 5, 0, 5 + 10)


def test_two_streams_are_one_device_for_the_steps_split() -> None:
    """Stream 20's copy covers stream 7's gap: the device is busy; the step is idle only where neither runs."""
    tk = analyze(_trace((0, 7, 0, 400), (1, 20, 300, 400), (650, 7, 800, 200), extra=[_step(1, 0, 1000)]))
    (st,) = tk.steps
    # busy 0-700 and 800-1000; 700-800: the kernel ending it was launched at 650, before the gap: queued, waiting
    assert _split(st) == (900, 0, 0, 100, 0)


# Holistic Trace Analysis 0.5.0 (pip install holistictraceanalysis==0.5.0), TraceAnalysis(trace_dir=...)
# .get_idle_time_breakdown(visualize=False) on its own tests/data traces, in microseconds: (host_wait, kernel_wait,
# other) per stream. alexnet_a100.json.gz is HTA's tests/data/critical_path/alexnet/benchmark_result_2869224_
# 1695835535_trace.json.gz (an A100, MIT licence: tests/data/hta/README.md).
HTA_IDLE = {7: (12855007.0, 104.0, 0.0), 20: (12011718.0, 3.0, 0.0)}
# sampled_rank-0.json.gz is HTA's tests/data/trace_filter/sampled_rank-0.json.gz: two ProfilerSteps, five streams;
# HTA analyses the work launched in every step but the last (hta_window)
HTA_IDLE_SAMPLED = {
    7: (213825.0, 1985.0, 261740.0),
    23: (596037.0, 70.0, 34.0),
    25: (0.0, 9.0, 47865.0),
    84: (148934.0, 6.0, 0.0),
    203: (0.0, 0.0, 0.0),
}


def test_the_idle_split_equals_holistic_trace_analysis_on_real_traces() -> None:
    tk = analyze(read_trace(DATA / "alexnet_a100.json.gz"))
    assert tk.device == "NVIDIA A100-PG509-200" and tk.activities == 98 and tk.steps == []
    assert {s.stream: (s.host_wait_us, s.kernel_wait_us, s.other_us) for s in tk.streams} == HTA_IDLE
    sampled = read_trace(DATA / "sampled_rank-0.json.gz")
    tk = analyze(sampled, hta_window=True)
    assert {s.stream: (s.host_wait_us, s.kernel_wait_us, s.other_us) for s in tk.streams} == HTA_IDLE_SAMPLED
    # its steps: the five parts add up to each step's span, whatever window the streams take
    assert [st.step for st in tk.steps] == [551, 552] and tk.steps == analyze(sampled).steps
    for st in tk.steps:
        assert sum(_split(st)) == pytest.approx(st.dur, abs=1e-6)


def test_the_command_prints_the_split_and_bad_input_is_one_line(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "profiler", "kernels", *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    res = cli(str(DATA / "alexnet_a100.json.gz"))
    assert res.returncode == 0, res.stderr
    assert "NVIDIA A100-PG509-200" in res.stdout and "12,855.007" in res.stdout and "0.104" in res.stdout
    res = cli(str(DATA / "alexnet_a100.json.gz"), "--json")
    got = json.loads(res.stdout)
    assert [s["host_wait_us"] for s in got["streams"]] == [12855007.0, 12011718.0]
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps(_trace((0, 7, 10, 100), (150, 7, 170, 50))))
    assert "host wait" in cli(str(plain)).stdout
    for bad, why in (("nope.json", "no such file"), ("x.json", "not a JSON trace"), ("y.json", "no traceEvents")):
        if bad != "nope.json":
            (tmp_path / bad).write_text("{" if bad == "x.json" else "{}")
        res = cli(str(tmp_path / bad))
        assert res.returncode == 2 and why in res.stderr and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    res = cli(str(plain), "--kernel-wait-us", "-1")
    assert res.returncode == 2 and "--kernel-wait-us -1" in res.stderr
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert cli(str(gz)).stdout.split("\n", 1)[1] == cli(str(plain)).stdout.split("\n", 1)[1]


# Holistic Trace Analysis 0.5.0 on the H200's torch 2.11 trace (../shared/measured/h200-2026-11-28.md): compute
# 50,124 us and non-compute 4,383 us, idle 593,320 us of which host wait 589,905 and kernel wait 3,380; kernel time
# 647,827 us (re-run here, TraceAnalysis(trace_dir=...).get_temporal_breakdown / get_idle_time_breakdown)
H200_TRACE = Path(__file__).parent / "data" / "traces" / "rn18-input-w0.json.gz"
HTA_H200_BUSY_US = 50_124 + 4_383


def test_a_torch_2_11_trace_has_one_step_per_profiler_step_and_the_window_busy_of_hta() -> None:
    # kineto now writes a gpu_user_annotation "ProfilerStep#N" beside each host user_annotation: it is the step's
    # span on the device, not another step (issue #57: 10 rows for 5 steps, and the window then held the last step)
    trace = read_trace(H200_TRACE)
    assert sum(1 for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")) == 10
    tk = analyze(trace, hta_window=True)
    assert [s.step for s in tk.steps] == [3, 4, 5, 6, 7] and tk.device == "NVIDIA H200"
    assert all(s.activities == 408 for s in tk.steps)
    # --hta-window: HTA's own figures to the microsecond (its temporal breakdown: compute + non-compute, kernel time
    # first to last; its idle breakdown: host and kernel wait). Its parser rounds a ns trace's starts up and ends
    # down, and it keeps the work launched before the latest ProfilerStep event, which on torch 2.11 is the last
    # step's device span: one copy of step 7, launched before the device began it, is in (and the 150 ms before it)
    (stream,) = tk.streams
    assert (tk.busy_us, tk.span_us, stream.activities) == (HTA_H200_BUSY_US, 647_827, 4 * 408 + 1)
    assert (stream.host_wait_us, stream.kernel_wait_us, stream.other_us) == (589_905, 3_380, 0)


def test_the_hta_window_gives_the_devices_union_busy_and_span_of_hta_s_temporal_breakdown() -> None:
    # HTA 0.5.0's temporal breakdown of tests/data/hta/sampled_rank-0.json.gz (five streams, two steps): compute
    # 106,252 us + non-compute 172,428 us, kernel time (first to last) 600,058 us; before (issue #57) the window's
    # top-level busy was the whole trace's union, 547,656 us
    tk = analyze(read_trace(DATA / "sampled_rank-0.json.gz"), hta_window=True)
    assert (tk.busy_us, tk.span_us) == (106_252 + 172_428, 600_058)
    assert sum(s.busy_us for s in tk.streams) > tk.busy_us  # the streams overlap: the union is not their sum


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback() -> None:
    # `stallscope kernels TRACE | head -1`: the pipe closes before the output is written
    cmd = [sys.executable, "-m", "profiler", "kernels", str(H200_TRACE)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[1])
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the command has imported anything and written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and "Traceback" not in err, err


HTA_TRACES = {
    "alexnet_a100": DATA / "alexnet_a100.json.gz",  # microsecond times, no ProfilerStep: the whole trace
    "sampled_rank-0": DATA / "sampled_rank-0.json.gz",  # two steps, five streams
    "v100_ns_rank-0": DATA / "v100_ns_rank-0.json.gz",  # nanosecond times: HTA rounds them
    "rn18-input-w0": H200_TRACE,  # torch 2.11: a device ProfilerStep beside each host one
}


@pytest.mark.parametrize("name", sorted(HTA_TRACES))
def test_the_hta_window_equals_holistic_trace_analysis_run_beside_it(tmp_path: Path, name: str) -> None:
    """HTA 0.5.0 itself (installed by `make install` for this test) on each trace: its temporal breakdown (compute
    + non-compute, kernel time) and its idle-time breakdown per stream equal `kernels --hta-window`'s to the
    microsecond."""
    import logging
    import shutil

    pytest.importorskip("hta", reason="Holistic Trace Analysis is installed by `make install`")
    from hta.trace_analysis import TraceAnalysis

    shutil.copy(HTA_TRACES[name], tmp_path / "rank-0.json.gz")
    logging.disable(logging.WARNING)  # HTA's notes on rounding and on its window
    try:
        hta = TraceAnalysis(trace_dir=str(tmp_path))
        temporal = hta.get_temporal_breakdown(visualize=False).iloc[0]
        idle, _ = hta.get_idle_time_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    want: dict[int, dict[str, float]] = {}
    for _, row in idle.iterrows():
        want.setdefault(int(row["stream"]), {})[str(row["idle_category"])] = float(row["idle_time"])
    tk = analyze(read_trace(HTA_TRACES[name]), hta_window=True)
    busy = float(temporal["compute_time(us)"] + temporal["non_compute_time(us)"])
    assert (tk.busy_us, tk.span_us) == (busy, float(temporal["kernel_time(us)"]))
    got = {s.stream: {"host_wait": s.host_wait_us, "kernel_wait": s.kernel_wait_us, "other": s.other_us}
           for s in tk.streams}  # fmt: skip
    assert got == {st: {k: parts.get(k, 0.0) for k in ("host_wait", "kernel_wait", "other")}
                   for st, parts in want.items()}  # fmt: skip


def test_the_v100_trace_of_nanoseconds_matches_hta_s_recorded_figures() -> None:
    # HTA 0.5.0 on tests/data/hta/v100_ns_rank-0.json.gz (and on the original it was cut from): compute 372,150 us,
    # non-compute 2,371, kernel time 384,634; stream 7 host wait 1,709, kernel wait 8,404 (before its rounding was
    # copied, issue #57: host wait 1,259 and kernel wait 5,186 here)
    tk = analyze(read_trace(DATA / "v100_ns_rank-0.json.gz"), hta_window=True)
    (stream,) = tk.streams
    assert (tk.busy_us, tk.span_us, tk.device) == (372_150 + 2_371, 384_634, "Tesla V100-SXM2-32GB")
    assert (stream.host_wait_us, stream.kernel_wait_us, stream.other_us) == (1_709, 8_404, 0)
