"""Trace export: the JSON obeys the Trace Event Format, and its slices are the recorded times, exactly.

Ground truth is a hand-built RunRecord with known times; the recorded stores (copied first: opening a WAL
store can checkpoint it) must all export, the SIGKILLed one included.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from profiler.core.store import PhaseRow, RunRecord, StepRow, load_run
from profiler.render.trace import DEVICE_THREAD, TID_DEVICE, TID_TRAINING, TRAINING_THREAD, trace_events, write_trace

RUNS = Path(__file__).parent / "data" / "runs"
PID = 4242


def _ns(us: float) -> int:
    """What Perfetto's JSON importer makes of a microsecond value: ``int64(us * 1000.0)``."""
    return int(us * 1000.0)


def validate(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Check the Trace Event Format rules the viewers rely on; returns the events."""
    assert set(doc) == {"traceEvents", "displayTimeUnit", "metadata"}
    assert doc["displayTimeUnit"] == "ms"
    assert isinstance(doc["metadata"], dict)
    text = json.dumps(doc, allow_nan=False)  # no NaN/inf anywhere
    assert json.loads(text) == doc
    events = doc["traceEvents"]
    last_ts: dict[tuple[int, int], float] = {}
    for ev in events:
        assert ev["ph"] in {"X", "C", "M", "i"}, ev
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        assert isinstance(ev["ts"], float) and math.isfinite(ev["ts"]), ev
        key = (ev["pid"], ev["tid"])
        assert ev["ts"] >= last_ts.get(key, -math.inf), f"ts goes back on {key}: {ev}"
        last_ts[key] = ev["ts"]
        if ev["ph"] == "X":
            assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(ev)
            assert isinstance(ev["dur"], float) and ev["dur"] >= 0, ev
        elif ev["ph"] == "C":
            assert ev["args"], ev
            for v in ev["args"].values():
                assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), ev
        elif ev["ph"] == "M":
            assert ev["name"] in {"process_name", "thread_name", "thread_sort_index"}
        else:
            assert ev["s"] == "p"
    # metadata before everything else, so viewers name the tracks before filling them
    kinds = [ev["ph"] for ev in events]
    assert kinds[: kinds.count("M")] == ["M"] * kinds.count("M")
    assert_nested(events)
    return events


def assert_nested(events: list[dict[str, Any]]) -> None:
    """On every track, slices are nested or disjoint, as Perfetto reads them (integer ns, truncated)."""
    tracks: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for ev in events:
        if ev["ph"] == "X":
            start = _ns(ev["ts"])
            tracks[(ev["pid"], ev["tid"])].append((start, start + _ns(ev["dur"]), ev["name"]))
    for key, slices in tracks.items():
        stack: list[tuple[int, int, str]] = []
        for s in sorted(slices, key=lambda s: (s[0], -(s[1] - s[0]))):
            while stack and stack[-1][1] <= s[0]:
                stack.pop()
            assert not stack or s[1] <= stack[-1][1], f"{s} crosses {stack[-1]} on {key}"
            stack.append(s)


def named(events: list[dict[str, Any]], kind: str) -> dict[int, str]:
    return {ev["tid"]: ev["args"]["name"] for ev in events if ev["ph"] == "M" and ev["name"] == kind}


def known_record(*, cuda: bool = False) -> RunRecord:
    """4 steps of 100 ms: 30 ms data wait, 10 ms h2d, 50 ms compute (forward 30 ms inside), 5 ms log.

    On ``cuda`` every phase also carries device times; copies start early on a side stream, so the
    device h2d of step i+1 overlaps the device compute of step i.
    """
    steps, phases, samples = [], [], []
    for i in range(4):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, 0.03, 8, i == 0))
        dev = {
            "h2d": (t + 0.005, t + 0.04),
            "compute": (t + 0.04, t + 0.11),
            "compute/forward": (t + 0.045, t + 0.08),
            "log": (t + 0.11, t + 0.111),
        }
        for name, depth, a, b in [
            ("h2d", 0, t + 0.03, t + 0.04),
            ("compute", 0, t + 0.04, t + 0.09),
            ("compute/forward", 1, t + 0.04, t + 0.07),
            ("log", 0, t + 0.09, t + 0.095),
        ]:
            d0, d1 = dev[name] if cuda else (None, None)
            phases.append(PhaseRow(i, name, depth, a, b, d0, d1))
    for k in range(4):
        t = k * 0.1 + 0.05
        samples += [
            (t, "sampler", "sampler.lateness_ms", 0.5),
            (t, "host", "proc.main.cpu_pct", 95.0),
            (t, "host", "proc.w0.cpu_pct", 40.0),
            (t, "host", "proc.children.cpu_pct", 40.0),
            (t, "host", "proc.total.cpu_pct", 135.0),
            (t, "host", "sys.cpu_pct", 60.0),
            (t, "host", "proc.main.rss_mb", 512.0),
            (t, "host", "proc.total.rss_mb", 640.0),
            (t, "nvml", "gpu0.util_pct", None if k == 2 else 50.0 + k),
            (t, "nvml", "gpu0.mem_used_mb", 1024.0),
            (t, "nvml", "gpu0.mem_total_mb", 81559.0),
            (t, "nvml", "gpu0.pcie_rx_mbps", 10.0),
            (t, "nvml", "gpu0.pcie_tx_mbps", 20.0),
        ]
    kind = "cuda" if cuda else "cpu"
    meta = {
        "schema_version": 1, "run_id": "abc", "scenario": "known", "pipeline": "naive", "batch_size": 8,
        "workers": 1, "pid": PID, "status": "complete", "device": {"kind": kind, "name": "test device"},
    }  # fmt: skip
    events = [(0.0, "source", "host", "available"), (0.2, "warning", None, "something odd")]
    return RunRecord(meta, steps, phases, samples, events)


def x_events(events: list[dict[str, Any]], tid: int = TID_TRAINING) -> list[dict[str, Any]]:
    return [ev for ev in events if ev["ph"] == "X" and ev["tid"] == tid]


def test_known_record_is_a_valid_trace_with_named_tracks() -> None:
    events = validate(trace_events(known_record()))
    assert named(events, "process_name") == {TID_TRAINING: "stallscope: known"}
    assert named(events, "thread_name") == {TID_TRAINING: TRAINING_THREAD}
    assert {ev["pid"] for ev in events} == {PID}
    # CPU record: nothing on a device track
    assert {ev["tid"] for ev in events if ev["ph"] == "X"} == {TID_TRAINING}


def test_step_and_phase_slices_are_the_recorded_times_in_exact_microseconds() -> None:
    record = known_record()
    events = validate(trace_events(record))
    xs = x_events(events)
    steps = [ev for ev in xs if ev["cat"].startswith("step")]
    assert [ev["name"] for ev in steps] == ["step 0", "step 1", "step 2", "step 3"]
    for ev, row in zip(steps, record.steps, strict=True):
        assert _ns(ev["ts"]) == round(row.t_start * 1e9)
        assert round(ev["dur"], 3) == 100_000.0 and _ns(ev["dur"]) == 100_000_000
        assert ev["args"] == {"step": row.step, "samples": 8, "warmup": row.step == 0}
    waits = [ev for ev in xs if ev["name"] == "data_wait"]
    assert [round(ev["dur"], 3) for ev in waits] == [30_000.0] * 4
    assert [_ns(w["ts"]) for w in waits] == [_ns(s["ts"]) for s in steps]

    by_phase = {(ev["args"]["step"], ev["args"]["phase"]): ev for ev in xs if ev["cat"] == "phase"}
    assert len(by_phase) == len(record.phases)
    expected_us = {"h2d": 10_000.0, "compute": 50_000.0, "compute/forward": 30_000.0, "log": 5_000.0}
    for p in record.phases:
        ev = by_phase[(p.step, p.name)]
        assert round(ev["dur"], 3) == expected_us[p.name]
        assert _ns(ev["ts"]) == round(p.t_start * 1e9)
        assert _ns(ev["dur"]) == round(p.t_end * 1e9) - round(p.t_start * 1e9)
        assert ev["args"]["depth"] == p.depth
        assert "trimmed_us" not in ev["args"]


def test_nested_phase_is_a_slice_inside_its_parent() -> None:
    events = validate(trace_events(known_record()))
    xs = x_events(events)
    forward = next(ev for ev in xs if ev["args"].get("phase") == "compute/forward" and ev["args"]["step"] == 1)
    compute = next(ev for ev in xs if ev["args"].get("phase") == "compute" and ev["args"]["step"] == 1)
    assert forward["name"] == "forward" and forward["args"]["depth"] == 1
    assert compute["ts"] <= forward["ts"] and forward["ts"] + forward["dur"] <= compute["ts"] + compute["dur"]
    # the parent comes first at the shared start, so a viewer opens it before its child
    assert xs.index(compute) < xs.index(forward)


def test_counters_one_track_per_family_missing_readings_left_out() -> None:
    events = validate(trace_events(known_record()))
    counters = [ev for ev in events if ev["ph"] == "C"]
    families = {ev["name"] for ev in counters}
    assert families == {
        "host CPU %",
        "host RSS MiB",
        "gpu0 utilization.gpu %",
        "gpu0 memory used MiB",
        "gpu0 PCIe MB/s",
    }
    cpu = [ev for ev in counters if ev["name"] == "host CPU %"]
    assert len(cpu) == 4
    assert list(cpu[0]["args"]) == ["main", "w0", "total", "system"]
    assert cpu[0]["args"] == {"main": 95.0, "w0": 40.0, "total": 135.0, "system": 60.0}
    assert cpu[0]["ts"] == 50_000.0
    pcie = next(ev for ev in counters if ev["name"] == "gpu0 PCIe MB/s")
    assert pcie["args"] == {"tx": 20.0, "rx": 10.0}
    util = [ev["args"]["util"] for ev in counters if ev["name"] == "gpu0 utilization.gpu %"]
    assert util == [50.0, 51.0, 53.0]  # the unreadable sample (None) is not a zero
    doc = trace_events(known_record())
    assert doc["metadata"]["gpu_memory_total_mib"] == {"gpu0.mem_total_mb": 81559.0}


def test_store_events_are_process_instants() -> None:
    events = validate(trace_events(known_record()))
    instants = [ev for ev in events if ev["ph"] == "i"]
    assert [(ev["name"], ev["ts"], ev["args"]["message"]) for ev in instants] == [
        ("source: host", 0.0, "available"),
        ("warning", 200_000.0, "something odd"),
    ]


def test_fake_cuda_record_puts_device_slices_on_their_own_tracks() -> None:
    record = known_record(cuda=True)
    events = validate(trace_events(record))
    names = named(events, "thread_name")
    assert names[TID_TRAINING] == TRAINING_THREAD
    assert names[TID_DEVICE] == DEVICE_THREAD
    device_tids = sorted(t for t in names if t != TID_TRAINING)
    assert device_tids[0] == TID_DEVICE
    # device compute of step i overlaps device h2d of step i+1: they cannot share one track
    assert len(device_tids) >= 2
    dev = [ev for ev in events if ev["ph"] == "X" and ev["tid"] in device_tids]
    assert all(ev["cat"] == "device" for ev in dev)
    assert not [ev for ev in x_events(events) if ev["cat"] == "device"]
    assert len(dev) == len(record.phases)
    for p in record.phases:
        assert p.dev_start is not None and p.dev_end is not None
        ev = next(e for e in dev if e["args"]["step"] == p.step and e["args"]["phase"] == p.name)
        assert _ns(ev["ts"]) == round(p.dev_start * 1e9)
        assert _ns(ev["dur"]) == round(p.dev_end * 1e9) - round(p.dev_start * 1e9)
        assert round(ev["args"]["host_us"], 3) == round((p.t_end - p.t_start) * 1e6, 3)
    # a device slice drawn inside another is inside its own parent phase, never another step's work
    for tid in device_tids:
        stack: list[dict[str, Any]] = []
        for ev in sorted((e for e in dev if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= ev["ts"]:
                stack.pop()
            if stack:
                parent = stack[-1]["args"]
                assert parent["step"] == ev["args"]["step"]
                assert ev["args"]["phase"].startswith(parent["phase"] + "/")
            stack.append(ev)
    # host slices stay where they were, and say how long the device took
    compute = next(e for e in x_events(events) if e["args"].get("phase") == "compute" and e["args"]["step"] == 2)
    assert compute["args"]["device_us"] == 70_000.0
    assert trace_events(record)["metadata"]["device_lanes"] == len(device_tids)


def test_crossing_phases_are_trimmed_never_extended() -> None:
    base = known_record()
    bad = [
        *base.phases,
        PhaseRow(3, "late", 0, 0.39, 0.45),  # runs past the end of step 3 (0.4)
        PhaseRow(2, "cross", 0, 0.285, 0.292),  # starts inside compute (ends 0.29), ends after it
    ]
    record = RunRecord(base.meta, base.steps, bad, base.samples, base.events)
    events = validate(trace_events(record))
    late = next(ev for ev in events if ev["name"] == "late")
    assert round(late["dur"], 3) == 10_000.0 and round(late["args"]["trimmed_us"], 3) == 50_000.0
    cross = next(ev for ev in events if ev["name"] == "cross")
    assert round(cross["ts"], 3) == 290_000.0 and round(cross["args"]["trimmed_us"], 3) == 5_000.0


def test_non_finite_times_are_left_out_not_fatal() -> None:
    base = known_record(cuda=True)
    steps = [*base.steps, StepRow(9, math.nan, math.nan, math.nan, 8, False)]
    phases = [*base.phases, PhaseRow(9, "compute", 0, math.inf, math.nan, math.nan, 1.0)]
    events = validate(trace_events(RunRecord(base.meta, steps, phases, base.samples, base.events)))
    assert not [ev for ev in events if ev.get("args", {}).get("step") == 9]


def test_pid_falls_back_to_1_and_empty_record_exports() -> None:
    record = RunRecord({"schema_version": 1}, [], [], [], [])
    doc = trace_events(record)
    events = validate(doc)
    assert {ev["pid"] for ev in events} == {1}
    assert named(events, "process_name") == {TID_TRAINING: "stallscope: run"}
    assert [ev["ph"] for ev in events] == ["M", "M", "M"]


@pytest.mark.parametrize("name", ["cpu-workers", "nvml-fake", "interrupted"])
def test_recorded_runs_export(tmp_path: Path, name: str) -> None:
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    path = write_trace(load_run(run), tmp_path / "trace.json")
    assert path == tmp_path / "trace.json"
    doc = json.loads(path.read_text())
    events = validate(doc)
    record = load_run(run)
    assert doc == trace_events(record)
    steps = [ev for ev in events if ev["ph"] == "X" and ev["cat"].startswith("step")]
    assert len(steps) == len(record.steps)
    assert len([ev for ev in events if ev["ph"] == "X" and ev["cat"] == "phase"]) == len(record.phases)
    assert doc["metadata"]["run_id"] == record.meta["run_id"]
    assert named(events, "process_name") == {TID_TRAINING: f"stallscope: {record.meta['scenario']}"}
    for ev in events:
        if ev["ph"] == "X":
            assert "trimmed_us" not in ev["args"], ev  # real records nest as recorded
    families = {ev["name"] for ev in events if ev["ph"] == "C"}
    assert {"host CPU %", "host RSS MiB"} <= families
    if name == "nvml-fake":
        assert {"gpu0 utilization.gpu %", "gpu0 memory used MiB", "gpu0 PCIe MB/s"} <= families
    if name == "cpu-workers":
        series = set().union(*(ev["args"] for ev in events if ev["name"] == "host CPU %"))
        assert {"main", "w0", "w1", "total", "system"} <= series
    if name == "interrupted":
        assert doc["metadata"]["status"] == "interrupted"


def test_the_written_file_is_the_trace_events_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """write_trace writes its "X" events as text, without their dicts: read back, the file is trace_events' object,
    for host and device slices, trimmed ones, names to escape, and a decimated run's summary slices."""
    from profiler.render import trace

    base = known_record(cuda=True)
    odd = [
        *base.phases,
        PhaseRow(3, 'late "quoted"\\ä→😀', 0, 0.39, 0.45),  # escaped, non-ASCII, and trimmed at its step's end
        PhaseRow(2, "cross\n\ttab", 0, 0.285, 0.292),
    ]
    records = [RunRecord(base.meta, base.steps, odd, base.samples, base.events), known_record()]
    for i, record in enumerate(records):
        path = write_trace(record, tmp_path / f"t{i}.json")
        assert json.loads(path.read_text()) == trace_events(record)
    monkeypatch.setattr(trace, "MAX_DETAILED_STEPS", 20)  # 60 steps: 20 windows of 1 step, and summaries between
    monkeypatch.setattr(trace, "DETAIL_WINDOWS", 20)
    steps = [StepRow(i, i * 0.01, i * 0.01 + 0.009, 0.001, 8, i < 2) for i in range(60)]
    many = RunRecord(base.meta, steps, [PhaseRow(i, "compute", 0, i * 0.01 + 0.002, i * 0.01 + 0.008) for i in
                                        range(60)], base.samples, base.events)  # fmt: skip
    doc = trace_events(many)
    assert doc["metadata"]["decimation"]["summary_slices"] > 0
    assert json.loads(write_trace(many, tmp_path / "many.json").read_text()) == doc
    validate(doc)


def test_write_trace_into_a_directory_and_bad_input(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUNS / "nvml-fake", run)
    out = tmp_path / "out"
    out.mkdir()
    path = write_trace(load_run(run), out)
    assert path == out / "trace.json"
    validate(json.loads(path.read_text()))
    assert sorted(p.name for p in out.iterdir()) == ["trace.json"]
    with pytest.raises(OSError):
        write_trace(load_run(run), tmp_path / "no" / "such" / "t.json")
    assert not (tmp_path / "no").exists()
