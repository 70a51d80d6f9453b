"""summary.json is a contract (docs: DESIGN.md): keys may be added, never removed, renamed or re-valued.

Each case summarises a fixed run record (the recorded stores under tests/data/runs/ and synthetic records
that reach every branch: CUDA events, zero-code, cost, bad samples, loader-only, warm-up only, empty) and
compares ``Summary.to_dict()`` with golden JSON in tests/data/summary_golden/: every golden key must still be
there with the same value (floats exactly: the figures are computed the same way), new keys may appear.
After a deliberate change of a figure, regenerate with ``STALLSCOPE_REGEN_GOLDEN=1`` and say why in the commit.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from profiler.analysis import summarize
from profiler.core.store import PhaseRow, RunRecord, StepRow, load_run

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "summary_golden"
REGEN = os.environ.get("STALLSCOPE_REGEN_GOLDEN") == "1"
CPU = {"kind": "cpu", "torch_device": "cpu", "name": "Test CPU (2 cores)", "index": None}
CUDA = {"kind": "cuda", "torch_device": "cuda:0", "name": "Fake GPU", "index": 0}


def known(n: int = 11, warmup: int = 1, wait: float = 0.03, h2d: float = 0.01, **meta: Any) -> RunRecord:
    """``n`` steps of 100 ms: ``wait`` data wait, ``h2d``, 50 ms compute (a 30 ms nested forward), 5 ms log."""
    steps, phases, samples = [], [], []
    for i in range(n):
        t = i * 0.1
        c = t + wait + h2d
        steps.append(StepRow(i, t, t + 0.1, wait, 8, i < warmup))
        phases.append(PhaseRow(i, "h2d", 0, t + wait, c))
        phases.append(PhaseRow(i, "compute", 0, c, c + 0.05))
        phases.append(PhaseRow(i, "compute/forward", 1, c, c + 0.03))
        phases.append(PhaseRow(i, "log", 0, c + 0.05, c + 0.055))
    for k in range(n):
        t = k * 0.1 + 0.05
        samples += [
            (t, "sampler", "sampler.lateness_ms", 0.5 + k / 10),
            (t, "sampler", "sampler.read_ms", 0.4),
            (t, "host", "proc.main.cpu_pct", 95.0 - k),
            (t, "host", "proc.w0.cpu_pct", 40.0),
            (t, "host", "proc.w1.cpu_pct", 30.0 + k),
            (t, "host", "proc.children.cpu_pct", 70.0 + k),
            (t, "host", "proc.total.cpu_pct", 165.0),
            (t, "host", "proc.main.rss_mb", 512.0 + k),
            (t, "host", "proc.total.rss_mb", 640.0 + k),
            (t, "host", "sys.cpu_pct", 60.0),
            (t, "host", "sys.mem_used_mb", 4096.0),
        ]
    base = {
        "schema_version": 1,
        "run_id": "abc123def456",
        "scenario": "known",
        "pipeline": "naive",
        "batch_size": 8,
        "workers": 0,
        "pin_memory": False,
        "warmup_steps": warmup,
        "sample_hz": 10.0,
        "cpu_count": 4,
        "device": CPU,
        "status": "complete",
        "error": None,
    }
    events = [
        (0.0, "source", "host", "available"),
        (0.0, "source", "nvml", "unavailable: NVML unavailable: NVMLError_LibraryNotFound (no NVIDIA driver)"),
        (0.2, "warning", None, "something odd"),
    ]
    return RunRecord({**base, **meta}, steps, phases, samples, events)


def with_gpu(rec: RunRecord, events: bool) -> RunRecord:
    """``rec`` on a CUDA device with NVML samples; with ``events``, device times a side stream would give."""
    phases = []
    for p in rec.phases:
        if not events:
            phases.append(p)
        elif p.name == "h2d":
            phases.append(dataclasses.replace(p, dev_start=p.t_start, dev_end=p.t_start + 0.005))
        else:
            phases.append(dataclasses.replace(p, dev_start=p.t_start - 0.006, dev_end=p.t_start + 0.054))
    nvml = []
    for k, (t, *_rest) in enumerate(s for s in rec.samples if s[2] == "sys.cpu_pct"):
        nvml += [
            (t, "nvml", "gpu0.util_pct", None if k == 2 else 50.0 + k),
            (t, "nvml", "gpu0.mem_util_pct", 12.0),
            (t, "nvml", "gpu0.mem_used_mb", 1024.0 + k),
            (t, "nvml", "gpu0.mem_total_mb", 81559.0),
            (t, "nvml", "gpu0.pcie_rx_mbps", 10.0),
        ]
    ev = [e for e in rec.events if e[2] != "nvml"] + [(0.0, "source", "nvml", "available")]
    ev += [(0.3, "source_error", "nvml", "NVMLError_Unknown"), (0.4, "source_error", "nvml", "NVMLError_Timeout")]
    return dataclasses.replace(
        rec,
        meta={**rec.meta, "device": CUDA, "sampler_stats": {"missed_deadlines": 2, "sources": {"nvml": {"errors": 5}}}},
        phases=phases,
        samples=sorted(rec.samples + nvml, key=lambda s: s[0]),
        events=ev,
    )


def sim_device() -> dict[str, Any]:
    """The device object a ``--device sim:h100`` run records (profiler.core.steps.device_timers.DeviceInfo.to_dict),
    written out so that a recalibrated spec table does not move the golden file."""
    return {
        "kind": "sim",
        "torch_device": "cpu",
        "name": "NVIDIA H100-SXM5-80GB (simulated)",
        "index": None,
        "sim": {
            "device": "sim:h100,precision=tf32,efficiency=0.13",
            "accelerator": "h100",
            "full_name": "NVIDIA H100-SXM5-80GB",
            "precision": "tf32",
            "efficiency": 0.13,
            "efficiency_source": "default for the precision (docs/sim.md)",
            "peak_tflops": 494.7,
            "memory_gib": 80.0,
            "h2d_pinned_gbps": 50.0,
            "h2d_pageable_gbps": 15.0,
            "tdp_w": 700.0,
        },
    }


def with_sim(rec: RunRecord) -> RunRecord:
    """``rec`` on a simulated H100: the CUDA-event record's device times, as the simulated device's events, and
    its NVML samples from the simulated source (``nvml-sim``: no memory-controller figure, an estimated power)."""
    gpu = with_gpu(rec, events=True)
    samples = [
        (t, "nvml-sim" if src == "nvml" else src, m, v) for t, src, m, v in gpu.samples if m != "gpu0.mem_util_pct"
    ]
    samples += [
        (t, "nvml-sim", "gpu0.power_w", 15.0 + 6.85 * v)
        for t, src, m, v in samples
        if m == "gpu0.util_pct" and v is not None
    ]
    events = [(t, k, "nvml-sim" if src == "nvml" else src, msg) for t, k, src, msg in gpu.events]
    return dataclasses.replace(
        gpu,
        meta={**gpu.meta, "device": sim_device(), "sampler_stats": {"missed_deadlines": 0, "sources": {}}},
        samples=sorted(samples, key=lambda s: s[0]),
        events=events,
    )


def unknown_batches() -> RunRecord:
    rec = known()
    steps = [dataclasses.replace(s, samples=None) if s.step == 5 else s for s in rec.steps]
    return dataclasses.replace(rec, steps=steps)


def store(name: str) -> Callable[[Path], RunRecord]:
    def load(tmp: Path) -> RunRecord:
        shutil.copytree(DATA / "runs" / name, tmp / name)  # loading may replay a WAL: never in place
        return load_run(tmp / name)

    return load


BAD = {"policy": "skip", "skipped": 7, "files": [{"path": "/d/cat/1.jpg", "reason": "truncated JPEG"}]}
CASES: dict[str, Callable[[Path], RunRecord]] = {
    "store-cpu-workers": store("cpu-workers"),
    "store-nvml-fake": store("nvml-fake"),
    "store-interrupted": store("interrupted"),
    "store-zero-code-workers": store("zero-code-workers"),
    "known": lambda _: known(),
    "known-workers": lambda _: known(workers=4),
    "known-workers-saturated": lambda _: dataclasses.replace(
        known(workers=2), samples=[(t, s, m, 95.0 if m == "sys.cpu_pct" else v) for t, s, m, v in known().samples]
    ),
    "compute-bound-loop-overhead": lambda _: known(wait=0.001, h2d=0.001, workers=2),
    "known-sampler-slow": lambda _: known(sample_hz=50.0),
    "known-cuda-pageable": lambda _: with_gpu(known(), events=False),
    "known-cuda-events": lambda _: with_gpu(known(pin_memory=True, workers=2), events=True),
    "known-sim-events": lambda _: with_sim(known(workers=2)),
    "known-loader-only": lambda _: known(loader_only=True, model="resnet18", augment="flip, crop 32"),
    "known-cost": lambda _: known(price_per_hour=2.5, epoch_samples=50_000, bad_samples=BAD),
    "known-cost-no-epoch": lambda _: known(price_per_hour=3, model="default"),
    "known-failed": lambda _: known(status="failed", error="RuntimeError: boom at step 7"),
    "unknown-batches": lambda _: unknown_batches(),
    "warmup-only": lambda _: known(n=3, warmup=3),
    "empty": lambda _: RunRecord({"schema_version": 1, "status": "complete"}, [], [], [], []),
}


def contained(golden: Any, now: Any, where: str = "") -> list[str]:
    """Where ``now`` lost or changed something ``golden`` has (dicts may have gained keys)."""
    if isinstance(golden, dict):
        if not isinstance(now, dict):
            return [f"{where}: was an object"]
        out = [f"{where}.{k}: missing" for k in golden if k not in now]
        return out + [e for k in golden if k in now for e in contained(golden[k], now[k], f"{where}.{k}")]
    if isinstance(golden, list):
        if not isinstance(now, list) or len(now) != len(golden):
            return [f"{where}: was {golden!r}, now {now!r}"]
        return [e for i, (g, n) in enumerate(zip(golden, now, strict=True)) for e in contained(g, n, f"{where}[{i}]")]
    return [] if golden == now and type(golden) is type(now) else [f"{where}: was {golden!r}, now {now!r}"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_json_keeps_every_key_and_value(case: str, tmp_path: Path) -> None:
    rec = CASES[case](tmp_path)
    # a fixed "now" an hour past the last heartbeat: a run left "running" reads as interrupted every time
    now = float(rec.meta.get("heartbeat") or rec.meta.get("started_at") or 0.0) + 3600
    doc = json.loads(json.dumps(summarize(rec, now=now).to_dict()))
    path = GOLDEN / f"{case}.json"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    golden = json.loads(path.read_text())
    assert contained(golden, doc) == []


def test_typed_parts_read_what_the_json_says(tmp_path: Path) -> None:
    """The accessors renderers and rules use name the same figures as the summary.json keys."""
    s = summarize(with_gpu(known(workers=2), events=True))
    doc = s.to_dict()
    host, nvml = doc["host"], doc["nvml"]
    assert s.host.sys_cpu_pct == host["sys_cpu_pct_mean"] and s.host.main_cpu_pct == host["proc_main_cpu_pct_mean"]
    assert s.host.children_cpu_pct == host["proc_children_cpu_pct_mean"]
    assert s.host.total_rss_mb_max == host["proc_total_rss_mb_max"]
    assert s.host.worker_cpu_pct == {"w0": host["proc_w0_cpu_pct_mean"], "w1": host["proc_w1_cpu_pct_mean"]}
    assert s.nvml.util_pct == {"gpu0": nvml["gpu0_util_pct_mean"]}  # not gpu0_mem_util_pct_mean
    b = s.breakdown_ms_per_step
    # summary.json always has sync (0.0 without a sync phase); the reports' rows list it only when recorded
    assert [k for k, _ in b.parts()] == list(doc["breakdown_ms_per_step"])
    assert list(doc["breakdown_ms_per_step"]) == ["data_wait", "h2d", "compute", "sync", "log", "other"]
    assert [k for k, _ in b.items()] == ["data_wait", "h2d", "compute", "log", "other"]
    assert b["sync"] == doc["breakdown_ms_per_step"]["sync"] == 0.0 and not b.sync_recorded
    assert b["log"] == b.get("log") == doc["breakdown_ms_per_step"]["log"] and "compute/forward" not in b
    assert s.device.nvml == doc["device"]["nvml"] == s.sampler.source("nvml") == "available"
    assert s.device.where == "cuda:0" and s.device_ms_per_step is not None
    assert isinstance(s.recommendations, tuple) and s.notes == ()


def test_verdict_and_parts_do_not_import_the_summary() -> None:
    """The rules read typed parts, not the Summary, so summary -> verdict is the only edge (no circle)."""
    root = Path(__file__).parents[1] / "profiler" / "analysis"
    for name in ("verdict.py", "parts.py"):
        tree = ast.parse((root / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {"profiler.analysis", "profiler.analysis.summary"} & imported, (name, imported)
