"""The GPU's activity counters beside NVML's polled figures (profiler.core.sources.gpm), against the fake NVML:
GPM's metrics over each interval of at least 100 ms, the driver's timestamped utilisation samples where the device
has no GPM, and one line saying why and what is read instead."""

from __future__ import annotations

import math
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from conftest import ROOT, stallscope

from profiler.core.sampling.sampler import Sampler
from profiler.core.sources.gpm import GPM_METRICS
from profiler.core.sources.nvml import NvmlSource
from tests.fake_nvml import make_fake_nvml

SAMPLE = {"util": 50, "mem_util": 20, "mem_used": 1 << 30, "mem_total": 8 << 30, "pcie_tx": 0, "pcie_rx": 0,
          "power": 100_000, "sm_clock": 1500}  # fmt: skip
GPM = [
    {"graphics": 40.0, "sm": 30.0, "occupancy": 20.0, "tensor": 10.0, "dram": 50.0},
    {"graphics": 90.0, "sm": 85.0, "occupancy": 60.0, "tensor": 70.0, "dram": 25.0},
]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _source(clock: Clock, **script: Any) -> tuple[NvmlSource, Any]:
    nv = make_fake_nvml({"device_count": 1, "samples": [SAMPLE], **script})
    src = NvmlSource(nv, pcie_interval_s=0.0, clock=clock)
    assert src.open() is None  # its probe read took the first GPM sample
    return src, nv


def _gpm(reading: dict[str, float]) -> dict[str, float]:
    return {k: reading[f"gpu0.{k}"] for k in GPM_METRICS}


def test_gpm_metrics_over_each_interval_of_100_ms_or_more() -> None:
    clock = Clock()
    src, nv = _source(clock, gpm=GPM)
    assert src.notes() == []  # GPM read: nothing to say
    clock.t = 0.05  # under 100 ms since the first sample: no interval has ended, no sample is taken
    assert all(math.isnan(v) for v in _gpm(src.read()).values())
    assert nv.calls["nvmlGpmSampleGet"] == 1
    clock.t = 0.15
    assert _gpm(src.read()) == {"gpm_graphics_pct": 40.0, "gpm_sm_active_pct": 30.0, "gpm_sm_occupancy_pct": 20.0,
                                "gpm_tensor_pct": 10.0, "gpm_dram_bw_pct": 50.0}  # fmt: skip
    clock.t = 0.30
    assert _gpm(src.read())["gpm_tensor_pct"] == 70.0
    src.close()
    # every sample taken was freed: two by the metrics reads, the last one at close
    assert nv.calls["nvmlGpmSampleAlloc"] == nv.calls["nvmlGpmSampleFree"] == 3


def test_without_gpm_the_drivers_samples_and_one_line_why() -> None:
    clock = Clock()
    src, nv = _source(clock, gpm=False, util_samples=[[1_000, 10], [2_000, 30], [3_000, 50]])
    assert src.notes() == [
        "gpu0: GPM unavailable (not supported by this GPU: GPM needs Hopper or later): the driver's utilisation "
        "samples and utilization.gpu instead"
    ]
    # the probe read took the three samples (mean 30); none since: NaN, and no error is kept for it
    assert math.isnan(src.read()["gpu0.util_samples_pct"])
    assert "gpu0.util_samples_pct" not in src.missing_reasons()
    assert nv.calls["nvmlDeviceGetSamples"] == 2
    src.close()


def test_no_permission_in_a_container_says_so() -> None:
    src, _ = _source(Clock(), gpm_error="NoPermission")
    assert src.notes() == ["gpu0: GPM unavailable (no permission (NVML_ERROR_NO_PERMISSION)): utilization.gpu instead"]
    assert not any(k.startswith("gpu0.gpm_") or k.endswith("util_samples_pct") for k in src.read())
    src.close()


def test_the_sampler_records_the_line_as_a_warning() -> None:
    events: list[tuple[Any, ...]] = []
    nv = make_fake_nvml({"device_count": 1, "samples": [SAMPLE], "gpm_error": "NoPermission"})
    sampler = Sampler([NvmlSource(nv)], 20.0, sink=lambda rows: None, on_event=lambda *e: events.append(e))
    sampler.start()
    sampler.stop()
    warnings = [e for e in events if "warning" in e]
    assert len(warnings) == 1 and "GPM unavailable (no permission" in str(warnings[0]), events


def test_the_report_shows_the_gpm_means_over_the_measured_window(tmp_path: Path) -> None:
    # a recorded run with a fake NVML source, with GPM readings added over its window: 40 and 60 -> a mean of 50
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "runs" / "nvml-fake", run)
    (run / "summary.json").unlink()
    con = sqlite3.connect(run / "run.sqlite")
    with con:
        for t, v in ((1.0, 40.0), (2.0, 60.0)):
            con.executemany(
                "INSERT INTO samples VALUES (?, 'nvml', ?, ?)",
                [(t, f"gpu0.{k}", v) for k in GPM_METRICS],
            )
    con.close()
    res = stallscope("report", str(run))
    assert res.returncode == 0, res.stderr
    text = re.sub(r"[│\s]+", " ", res.stdout)  # the report's panel wraps its lines
    assert (
        "GPU gpu0 graphics 50% SM active 50% SM occupancy 50% tensor 50% DRAM bandwidth 50% (NVML GPM, over "
        "intervals of 100 ms or more, read from outside the process)"
    ) in text
