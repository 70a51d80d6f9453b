"""Pure analysis functions: interval arithmetic, recommendation triggers on known records."""

from __future__ import annotations

import dataclasses

import pytest
from test_render_report import known_record

from profiler.analysis import summarize
from profiler.analysis.stats import clip, quantile, subtract, total, union
from profiler.core.store import RunRecord


def test_interval_union_subtract_clip() -> None:
    u = union([(0, 2), (1, 3), (5, 6), (6, 7), (9, 8)])
    assert u == [(0, 3), (5, 7)]
    assert total(u) == 5
    assert subtract([(0, 10)], [(1, 2), (4, 6)]) == [(0, 1), (2, 4), (6, 10)]
    assert subtract([(0, 3), (5, 7)], [(2, 6)]) == [(0, 2), (6, 7)]
    assert clip([(0, 3), (5, 7)], 1, 6) == [(1, 3), (5, 6)]


def test_quantile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))


def _with(rec: RunRecord, **meta: object) -> RunRecord:
    return dataclasses.replace(rec, meta={**rec.meta, **meta})


def test_pin_memory_recommended_only_on_cuda_with_pageable_copies() -> None:
    cuda = {"kind": "cuda", "torch_device": "cuda:0", "name": "Fake GPU", "index": 0}
    codes = [r.code for r in summarize(_with(known_record(), device=cuda)).recommendations]
    assert "PIN_MEMORY" in codes  # h2d is 10 ms of a 100 ms step, pin_memory False
    codes = [r.code for r in summarize(_with(known_record(), device=cuda, pin_memory=True)).recommendations]
    assert "PIN_MEMORY" not in codes
    assert "PIN_MEMORY" not in [r.code for r in summarize(known_record()).recommendations]  # CPU device


def test_loader_too_slow_with_workers_cites_system_cpu() -> None:
    s = summarize(_with(known_record(), workers=4))
    rec = {r.code: r.text for r in s.recommendations}
    assert "RAISE_WORKERS" not in rec
    assert "num_workers=4" in rec["LOADER_TOO_SLOW"]
    assert "system CPU averaged 60%" in rec["LOADER_TOO_SLOW"]


def test_computing_workers_are_told_to_grow_only_into_idle_cores() -> None:
    # two workers on a CPU 75% of their time (waiting for one 5%): "cpu"-bound; the host's mean CPU use decides
    for sys_cpu, grow in ((60.0, True), (92.0, False)):
        rec = _with(known_record(), workers=2)
        extra = [
            (t, "loader", f"loader.{w}.{part}_pct", v)
            for t, *_ in rec.samples[::6]
            for w in ("w0", "w1")
            for part, v in (("cpu", 75.0), ("runq", 5.0), ("off", 20.0))
        ]
        samples = [(t, src, m, sys_cpu if m == "sys.cpu_pct" else v) for t, src, m, v in rec.samples]
        s = summarize(dataclasses.replace(rec, samples=samples + extra))
        assert s.loader_time is not None and s.loader_time.bottleneck == "cpu"
        text = {r.code: r.text for r in s.recommendations}["LOADER_TOO_SLOW"]
        assert f"the workers computed 75% of their time and the cores were {sys_cpu:.0f}% busy" in text, text
        assert ("add workers to use the idle cores" in text) is grow, text
        assert (f"more workers can add at most the idle {100 - sys_cpu:.0f}%" in text) is not grow, text


def test_sampler_slow_is_flagged() -> None:
    s = summarize(_with(known_record(), sample_hz=50.0))  # the record's samples are 10 Hz apart
    assert "SAMPLER_SLOW" in [r.code for r in s.recommendations]


def test_cuda_busy_fraction_is_the_union_of_event_intervals() -> None:
    rec = known_record()
    cuda = {"kind": "cuda", "torch_device": "cuda:0", "name": "Fake GPU", "index": 0}
    phases = []
    for p in rec.phases:
        # device copy 5 ms from the host's h2d start; device compute 60 ms overlapping the copy's last 1 ms
        if p.name == "h2d":
            phases.append(dataclasses.replace(p, dev_start=p.t_start, dev_end=p.t_start + 0.005))
        else:
            phases.append(dataclasses.replace(p, dev_start=p.t_start - 0.006, dev_end=p.t_start + 0.054))
    s = summarize(dataclasses.replace(rec, meta={**rec.meta, "device": cuda}, phases=phases))
    # per step: union of [0.030, 0.035] and [0.034, 0.094] = 64 ms of 100 ms
    assert s.device_busy_fraction == pytest.approx(0.64, abs=1e-6)
    assert s.device_ms_per_step is not None
    assert s.device_ms_per_step.compute == pytest.approx(60.0)
    # 6 ms of the host's 10 ms copy ran under device compute (draining the queue): that is compute
    assert s.breakdown_ms_per_step.h2d == pytest.approx(4.0)
    assert s.breakdown_ms_per_step.compute == pytest.approx(56.0)
    assert s.stall_ms_per_step.to_dict() == pytest.approx({"data_wait": 30.0, "h2d": 4.0})
    assert s.stall_fraction == pytest.approx(0.34)
