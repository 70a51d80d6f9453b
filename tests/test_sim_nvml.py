"""The simulated NVML source against the simulator's own intervals, and the "simulated" label on every device
and NVML figure of a simulated run in every output (report, HTML, trace, live view, recommendations, compare,
sweep) while a CUDA or CPU run's outputs never say it."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re

import pytest
from rich.console import Console
from test_summary_contract import CUDA, known, sim_device, with_gpu, with_sim

from profiler.analysis import Summary, summarize
from profiler.analysis.compare import compare
from profiler.analysis.timeline import build_timeline
from profiler.core.sources.base import Source
from profiler.core.store import PhaseRow, RunRecord, StepRow
from profiler.live.analysis import LiveAggregator
from profiler.live.render import frame, status_line
from profiler.render.html import render_html
from profiler.render.report import render_report
from profiler.render.trace import SIM_DEVICE_THREAD, trace_events
from profiler.sim.cost import StepCost
from profiler.sim.device import CONTEXT_BYTES, SimDevice
from profiler.sim.nvml import SimNvmlSource
from profiler.sim.specs import parse
from profiler.sweep.analysis import analyse_sweep
from profiler.sweep.render import render_sweep

MIB = float(1 << 20)
W = 1 / 6


class FakeClock:
    """The simulated device's clock: moves only when set or when the device sleeps (a blocking copy)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


def device(step_s: float = 0.05) -> tuple[SimDevice, FakeClock]:
    """A simulated H100 at fp32 and efficiency 1 (67 TFLOPS) whose step takes ``step_s``; no launch cost."""
    clock = FakeClock()
    dev = SimDevice(
        parse("sim:h100,precision=fp32,efficiency=1"), clock=clock, sleep=clock.sleep, launch_s=0.0, framework_s=0.0
    )
    flops = step_s * dev.config.achieved_flops
    dev.load(StepCost(8, flops, 1, 100 << 20, 100 << 20, 200 << 20, 300 << 20, "fp32"))
    return dev, clock


def overlap(intervals: list[tuple[float, float]], t0: float, t1: float) -> float:
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)


def test_is_a_source_and_reads_before_any_step() -> None:
    dev, clock = device()
    src = SimNvmlSource(dev)
    assert isinstance(src, Source) and src.name == "nvml-sim" and src.open() is None
    clock.t = 0.01  # inside the first period: no completed period yet
    first = src.read()
    clock.t = 5.0
    later = src.read()
    for m in (first, later):
        assert m["gpu0.util_pct"] == 0.0 and m["gpu0.pcie_rx_mbps"] == 0.0
        assert m["gpu0.power_w"] == dev.config.spec.idle_w
        assert m["gpu0.mem_total_mb"] == 80 * 1024
        assert m["gpu0.mem_used_mb"] == pytest.approx((CONTEXT_BYTES + dev.cost.memory_bytes) / MIB)  # type: ignore[union-attr]
    src.close()


def test_utilisation_is_the_kernel_busy_share_of_the_last_completed_period() -> None:
    """Steps of 50 ms queued at a known irregular pattern (idle gaps as a starved loop has, and back-to-back
    runs that queue behind each other); every reading within 2 pp of the busy share computed from the intervals
    scheduled here, over the last completed 1/6 s period aligned to multiples of 1/6 s."""
    dev, clock = device(0.05)
    src = SimNvmlSource(dev, window_s=W)
    starts = [0.02, 0.03, 0.31, 0.62, 0.64, 0.66, 0.68, 1.4, 1.9, 1.95, 2.6]
    scheduled: list[tuple[float, float]] = []
    tail = -math.inf
    for t in starts:
        clock.t = t
        dev.step()
        start = max(t, tail)
        tail = start + 0.05
        scheduled.append((start, tail))
    readings = [0.1, 0.2, 0.34, 0.5, 0.7, 0.85, 0.99, 1.2, 1.5, 2.0, 2.1, 2.9, 3.3]
    seen = []
    for t in readings:
        clock.t = t
        k = math.floor(t / W)
        truth = 100 * overlap(scheduled, (k - 1) * W, k * W) / W
        got = src.read()["gpu0.util_pct"]
        assert abs(got - truth) <= 2.0, (t, got, truth)
        seen.append(got)
    assert max(seen) > 90 and min(seen) == 0.0  # the pattern has saturated and idle periods
    assert seen[0] == 0.0  # at 0.1 s no period has completed since the first step: NVML reports the last one
    spec = dev.config.spec
    clock.t = 0.7
    m = src.read()
    assert m["gpu0.power_w"] == pytest.approx(spec.idle_w + (spec.tdp_w - spec.idle_w) * m["gpu0.util_pct"] / 100)


def test_pcie_rx_is_the_host_to_device_bytes_of_the_last_period() -> None:
    dev, clock = device()
    src = SimNvmlSource(dev, window_s=W)
    clock.t = 0.2  # inside [1/6, 2/6)
    dev.h2d(50_000_000, pinned=True, side_stream=True)  # a few ms: returns at once
    assert clock.t == 0.2
    clock.t = 0.25
    dev.h2d(15_000_000)  # pageable: the host blocks until it is done
    assert clock.t == pytest.approx(0.25 + dev.h2d_s(15_000_000, pinned=False))
    assert clock.t < 2 / 6
    clock.t = 0.4  # the last completed period is [1/6, 2/6)
    m = src.read()
    assert m["gpu0.pcie_rx_mbps"] == pytest.approx(65_000_000 / W / MIB)
    assert m["gpu0.util_pct"] == 0.0  # copies run on the copy engines: no kernel
    clock.t = 0.6
    assert src.read()["gpu0.pcie_rx_mbps"] == 0.0


def test_read_never_raises() -> None:
    dev, _ = device()

    def broken() -> float:
        raise RuntimeError("clock gone")

    src = SimNvmlSource(dev)
    dev.clock = broken
    m = src.read()
    assert set(m) == {f"gpu0.{k}" for k in ("util_pct", "mem_used_mb", "mem_total_mb", "pcie_rx_mbps", "power_w")}
    assert all(math.isnan(v) for v in m.values())
    assert src.missing_reasons()["gpu0.util_pct"] == "RuntimeError: clock gone"
    with pytest.raises(ValueError, match="window_s"):
        SimNvmlSource(dev, window_s=0)
    assert SimNvmlSource(dev, index=3).read().keys() == {k.replace("gpu0", "gpu3") for k in m}


# -- labels ------------------------------------------------------------------------------------------


def starved_sim() -> RunRecord:
    """10 steps of 100 ms on a simulated H100: 60 ms data wait, 8 ms pageable copy, 20 ms simulated compute;
    the simulated NVML source saw 20% utilisation."""
    steps, phases, samples = [], [], []
    for i in range(11):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, 0.06, 8, i == 0))
        phases.append(PhaseRow(i, "h2d", 0, t + 0.06, t + 0.068, t + 0.06, t + 0.068))
        phases.append(PhaseRow(i, "compute", 0, t + 0.068, t + 0.088, t + 0.068, t + 0.088))
        samples += [
            (t + 0.05, "sampler", "sampler.lateness_ms", 0.5),
            (t + 0.05, "host", "sys.cpu_pct", 40.0),
            (t + 0.05, "host", "proc.main.cpu_pct", 50.0),
            (t + 0.05, "nvml-sim", "gpu0.util_pct", 20.0),
            (t + 0.05, "nvml-sim", "gpu0.mem_used_mb", 1200.0),
            (t + 0.05, "nvml-sim", "gpu0.mem_total_mb", 81920.0),
            (t + 0.05, "nvml-sim", "gpu0.pcie_rx_mbps", 300.0),
            (t + 0.05, "nvml-sim", "gpu0.power_w", 152.0),
        ]
    meta = {
        "run_id": "sim1",
        "scenario": "imagenet",
        "pipeline": "naive",
        "batch_size": 8,
        "workers": 2,
        "pin_memory": False,
        "warmup_steps": 1,
        "sample_hz": 10.0,
        "cpu_count": 2,
        "device": sim_device(),
        "device_timer": "sim-events",
        "status": "complete",
    }
    events = [(0.0, "source", "host", "available"), (0.0, "source", "nvml-sim", "available")]
    return RunRecord(meta, steps, phases, samples, events)


def cuda_run() -> RunRecord:
    return with_gpu(known(workers=2), events=True)


def report_text(s: Summary) -> str:
    buf = io.StringIO()
    render_report(s, Console(file=buf, width=200, color_system=None, legacy_windows=False))
    return buf.getvalue()


DEVICE_ROWS = ("device busy", "device time", "NVML util", "NVML gpu0")


def test_summary_of_a_sim_run_uses_the_event_path_and_marks_nvml_simulated() -> None:
    s = summarize(starved_sim())
    assert s.device.kind == "sim" and s.device.simulated and s.device.where == "sim:h100"
    assert s.device.nvml == "available" and s.nvml.simulated
    assert s.device_busy_fraction == pytest.approx(0.28)  # copy 8 ms + compute 20 ms of 100 ms
    assert s.sources.device_busy_fraction.startswith("SIMULATED")
    assert s.device_ms_per_step is not None and s.device_ms_per_step.compute == pytest.approx(20.0)
    assert s.stall_fraction == pytest.approx(0.68)
    doc = s.to_dict()
    assert doc["device"]["kind"] == "sim" and doc["device"]["sim"]["accelerator"] == "h100"
    assert "SIMULATED" in doc["sources"]["nvml"] and "sim-events" in doc["sources"]["h2d"]
    cuda = summarize(cuda_run())
    assert not cuda.nvml.simulated and not cuda.device.simulated


def test_starved_sim_recommendation_quotes_the_simulated_utilisation() -> None:
    s = summarize(starved_sim())
    texts = {r.code: r.text for r in s.recommendations}
    assert s.verdict == "highly input-bound"
    assert texts["LOADER_TOO_SLOW"].endswith(
        "The simulated H100 sat idle 72% of the time (simulated device busy 28%, sim-events; "
        "simulated NVML utilisation 20%)."
    )
    assert texts["PIN_MEMORY"].startswith("Simulated host-to-device copies to the simulated H100 block 8.0 ms")
    for rec in (cuda_run(), known(workers=2)):
        assert not any("simulated" in r.text.lower() for r in summarize(rec).recommendations)
    busy = summarize(with_sim(known(wait=0.001, h2d=0.001, workers=2)))
    (nib,) = [r.text for r in busy.recommendations if r.code == "NOT_INPUT_BOUND"]
    assert "The simulated H100 was busy" in nib and "simulated, sim-events" in nib


def test_report_labels_every_device_figure_simulated() -> None:
    s = summarize(starved_sim())
    text = report_text(s)
    lines = text.splitlines()
    assert "Device: NVIDIA H100-SXM5-80GB (SIMULATED: sim:h100,precision=tf32,efficiency=0.13 — device times are " in (
        "\n".join(lines[:4])
    )
    assert "device=sim:h100 (NVIDIA H100-SXM5-80GB (simulated))" in lines[1]
    for label in DEVICE_ROWS:
        (row,) = [ln for ln in lines if re.match(rf"│ {re.escape(label)}\s", ln)]
        assert "simulated" in row, row
    assert re.search(r"│ device busy +28\.0%  \(simulated, sim-events\)  SIMULATED: union", text)
    assert re.search(r"│ device time +h2d 8\.00 ms  compute 20\.00 ms  \(simulated, sim-events\)", text)
    assert re.search(r"│ NVML util +gpu0 20%  \(simulated; utilization\.gpu as NVML defines it", text)
    assert re.search(
        r"│ NVML gpu0 +memory max 1200 of 81920 MiB  power mean 152 W  \(simulated; power is an estimate", text
    )
    assert "compute (simulated)" in text and "compute runs on the SIMULATED device" in text
    assert "sat idle 72% of the time (simulated device busy 28%" in text


@pytest.mark.parametrize("rec", [cuda_run, known], ids=["cuda", "cpu"])
def test_real_device_outputs_never_say_simulated(rec: object) -> None:
    record = rec()  # type: ignore[operator]
    s = summarize(record)
    assert "simulat" not in report_text(s).lower()
    assert "simulat" not in render_html(s, build_timeline(record)).lower()
    assert "simulat" not in json.dumps(trace_events(record)).lower()
    assert "simulat" not in json.dumps(s.to_dict()).lower()


def test_html_labels_every_device_figure_simulated() -> None:
    rec = starved_sim()
    s = summarize(rec)
    doc = render_html(s, build_timeline(rec))
    assert '<div id="simulated" class="banner sim" role="note">Device: NVIDIA H100-SXM5-80GB (SIMULATED: ' in doc
    for label in DEVICE_ROWS:
        (row,) = re.findall(rf'<tr data-figure="{label}"><th>[^<]*</th><td>([^<]*)</td>', doc)
        assert "simulated" in row, (label, row)
    assert "gpu0 utilization.gpu (simulated)" in doc and "SIMULATED NVML utilization.gpu" in doc
    assert "<th>compute (simulated)</th>" in doc


def test_trace_names_simulated_tracks_and_counters() -> None:
    doc = trace_events(starved_sim())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and "name" in e["args"]}
    assert "stallscope: imagenet [SIMULATED sim:h100,precision=tf32,efficiency=0.13]" in names
    assert SIM_DEVICE_THREAD in names and "device (CUDA events)" not in names
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    gpu = {c for c in counters if c.startswith("gpu")}
    assert gpu == {
        "gpu0 utilization.gpu % (simulated)",
        "gpu0 memory used MiB (simulated)",
        "gpu0 PCIe MB/s (simulated)",
    }
    device_slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "device"]
    assert device_slices and all(e["args"]["simulated"] is True for e in device_slices)
    assert doc["metadata"]["simulated"] is True and "SIMULATED" in doc["metadata"]["timeline"]


def test_live_view_says_simulated() -> None:
    rec = starved_sim()
    agg = LiveAggregator()
    by_step = {s.step: [p for p in rec.phases if p.step == s.step] for s in rec.steps}
    agg.add_steps((s, by_step[s.step]) for s in rec.steps)
    by_t: dict[float, dict[str, float]] = {}
    for t, _src, m, v in rec.samples:
        by_t.setdefault(t, {})[m] = v
    agg.add_samples(sorted(by_t.items()))
    snap = agg.snapshot()
    buf = io.StringIO()
    Console(file=buf, width=140, color_system=None).print(frame(snap, rec.meta, 20))
    text = buf.getvalue()
    assert "device=sim:h100  SIMULATED device" in text.splitlines()[0]
    (util,) = [ln for ln in text.splitlines() if ln.startswith("gpu0 util")]
    (mem,) = [ln for ln in text.splitlines() if ln.startswith("gpu0 mem")]
    assert util.rstrip().endswith("simulated") and mem.rstrip().endswith("MB/s  simulated")
    line = status_line(snap, 20, rec.meta)
    assert line is not None and line.endswith("gpu0 20% (simulated)")
    cuda_meta = {**rec.meta, "device": CUDA}
    buf = io.StringIO()
    Console(file=buf, width=140, color_system=None).print(frame(snap, cuda_meta, 20))
    assert "simulat" not in buf.getvalue().lower()
    assert "simulat" not in (status_line(snap, 20, cuda_meta) or "").lower()


def test_compare_and_sweep_name_the_simulated_device() -> None:
    sim, cpu = summarize(starved_sim()), summarize(known(workers=2))
    cmp = compare(cpu, sim)
    assert cmp.row("device").b == "sim:h100 (NVIDIA H100-SXM5-80GB (simulated))"
    assert cmp.row("device busy (simulated in B)").b == pytest.approx(28.0)
    assert cmp.row("compute / step (simulated in B)") is not None
    from_json = compare(cpu.to_dict(), sim.to_dict())
    assert from_json.row("device").b == "sim:h100 (NVIDIA H100-SXM5-80GB (simulated))"
    result = analyse_sweep(
        [], scenario="imagenet", device="sim:h100,precision=tf32,efficiency=0.13 (simulated)", planned=0
    )
    buf = io.StringIO()
    render_sweep(result, Console(file=buf, width=160, color_system=None))
    text = buf.getvalue()
    assert "Sweep of imagenet on sim:h100,precision=tf32,efficiency=0.13" in text
    assert "busy: SIMULATED device busy fraction (sim-events)" in text


def test_nvml_figures_simulated_flag_comes_from_the_source() -> None:
    rec = starved_sim()
    real = dataclasses.replace(rec, samples=[(t, "nvml" if s == "nvml-sim" else s, m, v) for t, s, m, v in rec.samples])
    assert summarize(rec).nvml.simulated and not summarize(real).nvml.simulated
