"""A stand-in for the ``pynvml`` module (nvidia-ml-py) that replays a scripted sequence of readings.

No machine of this project has a GPU, so the NVML source is tested against this fake. It mirrors the
parts of pynvml that :mod:`profiler.core.sources.nvml` uses, with pynvml's names: ``nvmlInit``,
``nvmlShutdown``, ``nvmlDeviceGet*``, the ``NVML_*`` constants and the ``NVMLError`` hierarchy
(``NVMLError(code)`` builds the matching subclass, as in pynvml).

Script (a dict, or the JSON in ``tests/data/nvml_script_h100.json``)::

    {
      "device_count": 1,
      "names": ["NVIDIA H100 80GB HBM3"],
      "samples": [                       # one entry per reading; a list entry gives one dict per device
        {"util": 95, "mem_util": 41, "mem_used": <bytes>, "mem_total": <bytes>,
         "pcie_tx": <KB/s>, "pcie_rx": <KB/s>, "power": <mW>, "sm_clock": <MHz>},
        ...
      ],
      "init_error": "LibraryNotFound",   # optional: nvmlInit raises NVMLError_<this>
      "lost_after": 3,                   # optional: the 4th and later query of any feature -> GpuIsLost
      "fail_after": 3, "fail_with": "Unknown",  # optional: the same, raising NVMLError_<fail_with>
      "hang_after": 3,                   # optional: the 4th query of any feature blocks until released
      "not_supported": ["pcie"],         # optional: features raising NVMLError_NotSupported
      "gpm": [{"graphics": 40, "sm": 30, "occupancy": 20, "tensor": 10, "dram": 50}, ...],
                                         # optional: the devices have GPM; entry n is each one's n-th interval
                                         # (false: the API is there, the devices do not support it)
      "gpm_error": "NoPermission",       # optional: nvmlGpmQueryDeviceSupport raises NVMLError_<this>
      "util_samples": [[ts_us, pct], ...]  # optional: the driver's utilisation samples (nvmlDeviceGetSamples)
    }

Invariant: each (device, feature) has its own cursor, advanced by each query of that feature, so the
n-th utilisation query of a device returns ``samples[n]["util"]`` whichever other features were skipped.
Samples wrap around when exhausted. Calls made before ``nvmlInit`` or after the last ``nvmlShutdown``
raise ``NVMLError_Uninitialized``, as the real library does. ``module.calls`` counts calls by name.
A hanging query sets ``module.hanging`` and blocks until the test sets ``module.release`` (a call into a
driver that never answers); every later query blocks too, as a stuck driver lock would.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from types import ModuleType, SimpleNamespace
from typing import Any, NoReturn

NVML_SUCCESS = 0
_ERROR_CODES = {
    "Uninitialized": 1,
    "InvalidArgument": 2,
    "NotSupported": 3,
    "NoPermission": 4,
    "AlreadyInitialized": 5,
    "NotFound": 6,
    "DriverNotLoaded": 9,
    "Timeout": 10,
    "LibraryNotFound": 12,
    "GpuIsLost": 15,
    "ResetRequired": 16,
    "LibRmVersionMismatch": 18,
    "Unknown": 999,
}
_ERROR_TEXT = {
    "Uninitialized": "Uninitialized",
    "NotSupported": "Not Supported",
    "NoPermission": "Insufficient Permissions",
    "DriverNotLoaded": "Driver Not Loaded",
    "Timeout": "Timeout",
    "LibraryNotFound": "NVML Shared Library Not Found",
    "GpuIsLost": "GPU is lost",
    "Unknown": "Unknown Error",
}
_CONSTANTS = {
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_PCIE_UTIL_COUNT": 2,
    "NVML_CLOCK_GRAPHICS": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_CLOCK_VIDEO": 3,
    "NVML_GPM_METRIC_GRAPHICS_UTIL": 1,
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
    "NVML_GPM_METRICS_GET_VERSION": 1,
    "NVML_GPU_UTILIZATION_SAMPLES": 1,
}
_GPM_KEYS = {1: "graphics", 2: "sm", 3: "occupancy", 5: "tensor", 10: "dram"}
FEATURES = ("util", "mem", "pcie", "power", "sm_clock")


class NVMLError(Exception):
    """pynvml's base error: ``NVMLError(code)`` returns the subclass for ``code``."""

    _by_code: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - filled once below, like pynvml's
    value: int

    def __new__(cls, value: int) -> NVMLError:
        target = NVMLError._by_code.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        for name, code in _ERROR_CODES.items():
            if code == self.value:
                return _ERROR_TEXT.get(name, name)
        return f"NVML Error with code {self.value}"


def _make_error_class(name: str, code: int) -> type[NVMLError]:
    def new(cls: type[NVMLError], *_args: Any) -> NVMLError:
        obj = Exception.__new__(cls)
        obj.value = code
        return obj

    def init(self: NVMLError, *_args: Any) -> None:
        Exception.__init__(self, code)

    cls = type(f"NVMLError_{name}", (NVMLError,), {"__new__": new, "__init__": init, "__module__": __name__})
    NVMLError._by_code[code] = cls
    return cls


_ERROR_CLASSES = {name: _make_error_class(name, code) for name, code in _ERROR_CODES.items()}
for _name, _cls in _ERROR_CLASSES.items():
    setattr(sys.modules[__name__], f"NVMLError_{_name}", _cls)


def _fail(name: str) -> NoReturn:
    raise _ERROR_CLASSES[name](_ERROR_CODES[name])


def make_fake_nvml(script: dict[str, Any]) -> ModuleType:  # noqa: PLR0915 - one closure per NVML call faked
    """Build a fresh pynvml-like module replaying ``script`` (see the module docstring)."""
    count = int(script.get("device_count", 1))
    names = list(script.get("names") or [f"Fake GPU {i}" for i in range(count)])
    samples = list(script.get("samples") or [])
    init_error = script.get("init_error")
    lost_after = script.get("lost_after")
    fail_with = "GpuIsLost"
    if script.get("fail_after") is not None:
        lost_after, fail_with = script["fail_after"], str(script.get("fail_with", "Unknown"))
    hang_after = script.get("hang_after")
    not_supported = set(script.get("not_supported") or ())
    unknown = not_supported - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features in not_supported: {sorted(unknown)}; known: {FEATURES}")
    for what, name in (("init_error", init_error), ("fail_with", fail_with)):
        if name is not None and name not in _ERROR_CLASSES:
            raise ValueError(f"unknown {what} {name!r}; known: {sorted(_ERROR_CLASSES)}")

    mod = ModuleType("fake_pynvml")
    mod.__dict__.update(_CONSTANTS)
    mod.NVML_SUCCESS = NVML_SUCCESS  # type: ignore[attr-defined]
    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    for name, cls in _ERROR_CLASSES.items():
        setattr(mod, f"NVMLError_{name}", cls)
    for name, code in _ERROR_CODES.items():
        setattr(mod, "NVML_ERROR_" + _snake(name).upper(), code)

    calls: Counter[str] = Counter()
    cursors: Counter[tuple[int, str]] = Counter()
    state = {"inits": 0}
    hanging, release = threading.Event(), threading.Event()
    mod.calls = calls  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    mod.hanging = hanging  # type: ignore[attr-defined]
    mod.release = release  # type: ignore[attr-defined]

    def need_init(fn: str) -> None:
        calls[fn] += 1
        if state["inits"] <= 0:
            _fail("Uninitialized")

    def handle_index(handle: Any) -> int:
        if not isinstance(handle, SimpleNamespace) or not 0 <= handle.index < count:
            _fail("InvalidArgument")
        return int(handle.index)

    def sample(handle: Any, feature: str, fn: str) -> dict[str, Any]:
        need_init(fn)
        index = handle_index(handle)
        if feature in not_supported:
            _fail("NotSupported")
        n = cursors[(index, fn)]
        if hang_after is not None and n >= hang_after:
            state.setdefault("hung_at", time.perf_counter())  # when the first read hung (perf_counter)
            hanging.set()
            release.wait(timeout=60)
        if lost_after is not None and n >= lost_after:
            _fail(fail_with)
        cursors[(index, fn)] += 1
        if not samples:
            raise ValueError("fake NVML script has no samples")
        entry = samples[n % len(samples)]
        return dict(entry[index] if isinstance(entry, list) else entry)

    def nvmlInit() -> None:
        calls["nvmlInit"] += 1
        if init_error is not None:
            _fail(init_error)
        state["inits"] += 1

    def nvmlShutdown() -> None:
        need_init("nvmlShutdown")
        state["inits"] -= 1

    def nvmlDeviceGetCount() -> int:
        need_init("nvmlDeviceGetCount")
        return count

    def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
        need_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < count:
            _fail("InvalidArgument")
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(handle: Any) -> str:
        need_init("nvmlDeviceGetName")
        return str(names[handle_index(handle)])

    def nvmlDeviceGetUtilizationRates(handle: Any) -> SimpleNamespace:
        s = sample(handle, "util", "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=int(s["util"]), memory=int(s["mem_util"]))

    def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> SimpleNamespace:
        s = sample(handle, "mem", "nvmlDeviceGetMemoryInfo")
        used, total = int(s["mem_used"]), int(s["mem_total"])
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPcieThroughput(handle: Any, counter: int) -> int:
        if counter == _CONSTANTS["NVML_PCIE_UTIL_TX_BYTES"]:
            return int(sample(handle, "pcie", "nvmlDeviceGetPcieThroughput.tx")["pcie_tx"])
        if counter == _CONSTANTS["NVML_PCIE_UTIL_RX_BYTES"]:
            return int(sample(handle, "pcie", "nvmlDeviceGetPcieThroughput.rx")["pcie_rx"])
        _fail("InvalidArgument")

    def nvmlDeviceGetPowerUsage(handle: Any) -> int:
        return int(sample(handle, "power", "nvmlDeviceGetPowerUsage")["power"])

    def nvmlDeviceGetClockInfo(handle: Any, clock_type: int) -> int:
        if clock_type != _CONSTANTS["NVML_CLOCK_SM"]:
            # The script records only the SM clock; asking for another is a test bug, not a GPU fault.
            raise ValueError(f"fake NVML records only NVML_CLOCK_SM, got clock type {clock_type}")
        return int(sample(handle, "sm_clock", "nvmlDeviceGetClockInfo")["sm_clock"])

    _add_activity(mod, script, need_init)
    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetName,
        nvmlDeviceGetUtilizationRates,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetPcieThroughput,
        nvmlDeviceGetPowerUsage,
        nvmlDeviceGetClockInfo,
    ):
        setattr(mod, fn.__name__, fn)
    return mod


def _add_activity(mod: ModuleType, script: dict[str, Any], need_init: Any) -> None:
    """GPM (``gpm``: the n-th interval between two samples reads ``gpm[n]``) and the driver's utilisation samples
    (``util_samples``), each only where the script has them."""
    gpm, gpm_error, util = script.get("gpm"), script.get("gpm_error"), script.get("util_samples")
    taken: Counter[int] = Counter()  # GPM samples taken so far, per device

    def nvmlGpmQueryDeviceSupport(handle: Any) -> SimpleNamespace:
        need_init("nvmlGpmQueryDeviceSupport")
        if gpm_error is not None:
            _fail(gpm_error)
        return SimpleNamespace(isSupportedDevice=int(bool(gpm)))

    def nvmlGpmSampleAlloc() -> SimpleNamespace:
        need_init("nvmlGpmSampleAlloc")
        return SimpleNamespace(n=-1, freed=False)

    def nvmlGpmSampleGet(handle: Any, sample: SimpleNamespace) -> SimpleNamespace:
        need_init("nvmlGpmSampleGet")
        sample.n, sample.dev = taken[handle.index], handle.index
        taken[handle.index] += 1
        return sample

    def nvmlGpmSampleFree(sample: SimpleNamespace) -> None:
        need_init("nvmlGpmSampleFree")
        sample.freed = True

    def nvmlGpmMetricsGet(got: SimpleNamespace) -> SimpleNamespace:
        need_init("nvmlGpmMetricsGet")
        first, second = got.sample1, got.sample2
        assert gpm and first.dev == second.dev and second.n == first.n + 1 and not first.freed
        entry = gpm[first.n % len(gpm)]
        for m in got.metrics[: got.numMetrics]:
            m.value, m.nvmlReturn = float(entry[_GPM_KEYS[m.metricId]]), 0
        return got

    def c_nvmlGpmMetricsGet_t() -> SimpleNamespace:
        metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)

    def nvmlDeviceGetSamples(handle: Any, kind: int, since: int) -> tuple[int, list[SimpleNamespace]]:
        need_init("nvmlDeviceGetSamples")
        fresh = [(ts, v) for ts, v in util or () if ts > since]
        if not fresh:
            _fail("NotFound")
        return 1, [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v)) for ts, v in fresh]

    fns = [nvmlGpmQueryDeviceSupport] if "gpm" in script or gpm_error is not None else []
    if gpm:
        fns += [nvmlGpmSampleAlloc, nvmlGpmSampleGet, nvmlGpmSampleFree, nvmlGpmMetricsGet, c_nvmlGpmMetricsGet_t]
    if util is not None:
        fns.append(nvmlDeviceGetSamples)
    for fn in fns:
        setattr(mod, fn.__name__, fn)


def _snake(camel: str) -> str:
    return "".join("_" + c if c.isupper() and i else c for i, c in enumerate(camel))
