"""NvmlSource against the scripted fake NVML, and against the real pynvml of a machine with no driver."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from profiler.core.sources.base import Source, SourceLost
from profiler.core.sources.nvml import NvmlSource
from tests.fake_nvml import make_fake_nvml

DATA = Path(__file__).parent / "data" / "nvml_script_h100.json"
MiB = 1 << 20
GPU_METRICS = {
    "util_pct",
    "mem_util_pct",
    "mem_used_mb",
    "mem_total_mb",
    "pcie_tx_mbps",
    "pcie_rx_mbps",
    "power_w",
    "sm_clock_mhz",
}


def _sample(util: int, **over: int) -> dict[str, int]:
    s = {
        "util": util,
        "mem_util": util // 2,
        "mem_used": 3 * 1024 * MiB,
        "mem_total": 80 * 1024 * MiB,
        "pcie_tx": 2048,
        "pcie_rx": 10240,
        "power": 250_500,
        "sm_clock": 1980,
    }
    s.update(over)
    return s


def _script(**extra: Any) -> dict[str, Any]:
    script: dict[str, Any] = {
        "device_count": 2,
        "names": ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"],
        "samples": [_sample(10), _sample(95, pcie_rx=512_000, power=690_250), _sample(0, sm_clock=345)],
    }
    script.update(extra)
    return script


def _open(script: dict[str, Any], **kw: Any) -> tuple[NvmlSource, Any]:
    nv = make_fake_nvml(script)
    src = NvmlSource(nv, pcie_interval_s=kw.pop("pcie_interval_s", 0.0), **kw)
    assert src.open() is None
    return src, nv


def test_is_a_source() -> None:
    assert isinstance(NvmlSource(make_fake_nvml(_script())), Source)
    assert NvmlSource.name == "nvml"


def test_scripted_values_come_back_exactly_with_units_converted() -> None:
    src, _ = _open(_script())
    assert src.device_names() == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    # open()'s probe read consumed sample 0.
    got = src.read()
    assert set(got) == {f"gpu{i}.{m}" for i in (0, 1) for m in GPU_METRICS}
    for i in (0, 1):
        assert got[f"gpu{i}.util_pct"] == 95.0
        assert got[f"gpu{i}.mem_util_pct"] == 47.0
        assert got[f"gpu{i}.mem_used_mb"] == 3072.0
        assert got[f"gpu{i}.mem_total_mb"] == 81920.0
        assert got[f"gpu{i}.pcie_tx_mbps"] == 2.0
        assert got[f"gpu{i}.pcie_rx_mbps"] == 500.0
        assert got[f"gpu{i}.power_w"] == 690.25
        assert got[f"gpu{i}.sm_clock_mhz"] == 1980.0
    third = src.read()
    assert third["gpu0.util_pct"] == 0.0
    assert third["gpu1.sm_clock_mhz"] == 345.0
    assert third["gpu0.power_w"] == 250.5
    src.close()


def test_per_device_samples_and_device_selection() -> None:
    script = _script(samples=[[_sample(11), _sample(22)], [_sample(33), _sample(44)]])
    src, _ = _open(script, device_indices=[1])
    got = src.read()
    assert {k.split(".")[0] for k in got} == {"gpu1"}
    assert got["gpu1.util_pct"] == 44.0
    assert src.device_names() == ["NVIDIA A100-SXM4-40GB"]
    src.close()


def test_bad_device_index_is_a_reason() -> None:
    src = NvmlSource(make_fake_nvml(_script()), device_indices=[5])
    reason = src.open()
    assert reason is not None
    assert "5" in reason
    src.close()


def test_library_not_found_gives_a_reason_and_no_exception() -> None:
    nv = make_fake_nvml(_script(init_error="LibraryNotFound"))
    src = NvmlSource(nv)
    reason = src.open()
    assert reason is not None
    assert "NVMLError_LibraryNotFound" in reason
    assert "no NVIDIA driver" in reason
    assert "\n" not in reason
    src.close()
    assert nv.calls["nvmlShutdown"] == 0


def test_not_supported_metric_is_nan_and_queried_once() -> None:
    src, nv = _open(_script(not_supported=["pcie"]))
    for _ in range(5):
        got = src.read()
        assert math.isnan(got["gpu0.pcie_tx_mbps"])
        assert math.isnan(got["gpu1.pcie_rx_mbps"])
        assert got["gpu0.util_pct"] in {95.0, 0.0, 10.0}
    # Once per device and direction, during open()'s probe; never again.
    assert nv.calls["nvmlDeviceGetPcieThroughput.tx"] == 2
    assert nv.calls["nvmlDeviceGetPcieThroughput.rx"] == 2
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 2 * 6
    reasons = src.missing_reasons()
    assert reasons["gpu0.pcie_tx_mbps"] == "not supported by this GPU"
    assert "gpu0.util_pct" not in reasons
    src.close()


def test_pcie_is_rate_limited_because_each_query_blocks() -> None:
    src, nv = _open(_script(), pcie_interval_s=3600.0)
    got = src.read()
    assert "gpu0.pcie_rx_mbps" not in got
    assert got["gpu0.util_pct"] == 95.0
    assert nv.calls["nvmlDeviceGetPcieThroughput.rx"] == 2  # the probe's
    src.close()


def test_gpu_lost_raises_source_lost_and_stays_lost() -> None:
    src, _ = _open(_script(lost_after=2))
    src.read()
    with pytest.raises(SourceLost, match="GpuIsLost"):
        src.read()
    with pytest.raises(SourceLost):
        src.read()
    src.close()


def test_gpu_lost_during_probe_is_a_reason() -> None:
    nv = make_fake_nvml(_script(lost_after=0))
    src = NvmlSource(nv)
    reason = src.open()
    assert reason is not None
    assert "GpuIsLost" in reason
    assert nv.state["inits"] == 0


def test_unknown_error_is_lost_but_timeout_is_one_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    src, nv = _open(_script())

    def timeout(handle: object) -> int:
        raise nv.NVMLError_Timeout(nv.NVML_ERROR_TIMEOUT)

    def unknown(handle: object) -> object:
        raise nv.NVMLError(999)  # pynvml maps an error code to its subclass, here NVMLError_Unknown

    real_power = nv.nvmlDeviceGetPowerUsage
    monkeypatch.setattr(nv, "nvmlDeviceGetPowerUsage", timeout)
    got = src.read()
    assert math.isnan(got["gpu0.power_w"])
    assert "NVMLError_Timeout" in src.missing_reasons()["gpu0.power_w"]
    monkeypatch.setattr(nv, "nvmlDeviceGetPowerUsage", real_power)
    # Transient errors are retried; the fake's power cursor did not move while it was patched out.
    assert src.read()["gpu0.power_w"] == 690.25
    monkeypatch.setattr(nv, "nvmlDeviceGetUtilizationRates", unknown)
    with pytest.raises(SourceLost, match="NVMLError_Unknown"):
        src.read()
    src.close()


def test_close_is_idempotent_and_balances_init() -> None:
    src, nv = _open(_script())
    src.close()
    src.close()
    assert nv.calls["nvmlInit"] == 1
    assert nv.calls["nvmlShutdown"] == 1
    assert nv.state["inits"] == 0
    with pytest.raises(RuntimeError):
        src.read()


def test_recorded_h100_script_replays_the_starved_pattern() -> None:
    script = json.loads(DATA.read_text())
    assert "synthetic" in script["note"].lower()
    src, _ = _open(script)
    assert src.device_names() == ["NVIDIA H100 80GB HBM3"]
    # The probe took sample 0; read() returns samples 1.. in order.
    readings = [src.read() for _ in range(len(script["samples"]) - 1)]
    for got, want in zip(readings, script["samples"][1:], strict=True):
        assert got["gpu0.util_pct"] == want["util"]
        assert got["gpu0.mem_used_mb"] == want["mem_used"] / MiB
        assert got["gpu0.pcie_rx_mbps"] == want["pcie_rx"] / 1024
        assert got["gpu0.power_w"] == want["power"] / 1000
    utils = [r["gpu0.util_pct"] for r in readings]
    assert max(utils) >= 90 and min(utils) == 0
    assert all(u >= 90 or u == 0 for u in utils)
    assert readings[0]["gpu0.mem_total_mb"] == 81559.0
    src.close()


def test_real_pynvml_without_a_driver_reports_unavailable() -> None:
    pynvml = pytest.importorskip("pynvml")
    src = NvmlSource()
    reason = src.open()  # must not raise, driver or not
    try:
        if reason is None:
            # A machine with a working driver: a real read must work too.
            assert "gpu0.util_pct" in src.read()
            return
        assert reason.startswith("NVML unavailable: NVMLError_")
        assert "\n" not in reason
        if not Path("/dev/nvidiactl").exists():
            assert "LibraryNotFound" in reason or "DriverNotLoaded" in reason
        with pytest.raises(RuntimeError):
            src.read()
    finally:
        src.close()
        src.close()
    assert pynvml.NVMLError_LibraryNotFound.__mro__[1] is pynvml.NVMLError


def test_fake_mirrors_pynvml_names() -> None:
    pynvml = pytest.importorskip("pynvml")
    nv = make_fake_nvml(_script())
    for name in (
        "NVMLError",
        "NVMLError_LibraryNotFound",
        "NVMLError_GpuIsLost",
        "NVMLError_NotSupported",
        "NVMLError_Unknown",
        "NVMLError_DriverNotLoaded",
        "NVML_PCIE_UTIL_TX_BYTES",
        "NVML_PCIE_UTIL_RX_BYTES",
        "NVML_CLOCK_SM",
        "NVML_ERROR_GPU_IS_LOST",
        "NVML_ERROR_NOT_SUPPORTED",
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetClockInfo",
    ):
        assert hasattr(nv, name), name
        assert hasattr(pynvml, name), name
        if name.startswith("NVML_"):
            assert getattr(nv, name) == getattr(pynvml, name), name
    assert issubclass(nv.NVMLError_GpuIsLost, nv.NVMLError)
    assert type(nv.NVMLError(15)) is nv.NVMLError_GpuIsLost
