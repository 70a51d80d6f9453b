"""A whole Session with the NVML source on a fake driver: values reach the store and the summary;
no driver and a GPU lost mid-run are reported, and the training loop never notices."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import sleep_loader
from fake_nvml import make_fake_nvml

from profiler import Session
from profiler.core.sources.nvml import NvmlSource
from profiler.core.store import load_run

SCRIPT = json.loads((Path(__file__).parent / "data" / "nvml_script_h100.json").read_text())


def _train(tmp: Path, source: NvmlSource, seconds: float, hz: float = 50.0) -> Session:
    with Session(tmp, sources=[source], sample_hz=hz) as s:
        deadline = time.perf_counter() + seconds
        for _ in s.wrap(sleep_loader(10_000, 0.002)):
            with s.phase("compute"):
                time.sleep(0.003)
            if time.perf_counter() > deadline:
                break
    return s


def test_recorded_values_reach_the_store_and_summary(tmp_path: Path) -> None:
    s = _train(tmp_path, NvmlSource(module=make_fake_nvml(SCRIPT)), 0.6)
    rec = load_run(tmp_path)
    utils = [v for _, src, m, v in rec.samples if m == "gpu0.util_pct"]
    expected = [x["util"] for x in SCRIPT["samples"]]
    n = len(utils)
    assert n >= 10
    # the probe read in open() took sample 0; reads replay the script from sample 1, wrapping around
    assert utils == [expected[(i + 1) % len(expected)] for i in range(n)]
    summ = s.summary()
    assert summ.device.nvml == "available"
    assert summ.nvml.util_pct["gpu0"] == pytest.approx(sum(utils) / n, rel=0.35)  # window-clipped mean
    assert summ.sampler.sources["nvml"] == "available"


def test_no_driver_is_reported_and_the_run_completes(tmp_path: Path) -> None:
    s = _train(tmp_path, NvmlSource(module=make_fake_nvml({"init_error": "LibraryNotFound"})), 0.3)
    summ = s.summary()
    assert summ.status == "complete" and summ.steps > 10
    assert summ.device.nvml.startswith("unavailable:") and "LibraryNotFound" in summ.device.nvml
    assert "not measured" in summ.sources.nvml
    assert summ.nvml.to_dict() == {}


def test_gpu_lost_mid_run_is_retired_and_training_goes_on(tmp_path: Path) -> None:
    fake = make_fake_nvml({**SCRIPT, "lost_after": 5})
    s = _train(tmp_path, NvmlSource(module=fake), 0.8)
    summ = s.summary()
    assert summ.status == "complete"
    assert summ.sampler.sources["nvml"].startswith("lost:")
    rec = load_run(tmp_path)
    gpu_times = [t for t, _, m, _ in rec.samples if m == "gpu0.util_pct"]
    all_times = [t for t, _, m, _ in rec.samples if m == "sampler.lateness_ms"]
    assert 0 < len(gpu_times) < len(all_times)  # sampling went on after the loss
    assert summ.steps > 50  # the loop ran on, unaware
