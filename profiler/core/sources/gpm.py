"""The GPU's own activity counters, read beside NVML's polled figures (:mod:`profiler.core.sources.nvml`).

- **GPM** (GPU Performance Monitoring, Hopper and later; ``nvmlGpmQueryDeviceSupport``): two samples taken at
  least ``GPM_MIN_S`` apart give the device's graphics activity, SM activity, SM occupancy, tensor activity and
  DRAM bandwidth over the interval between them (``nvmlGpmMetricsGet``), from outside the process: what DCGM's
  profiling fields read on Hopper.
- **The driver's samples** elsewhere: ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` returns the
  utilisation samples the driver took since a timestamp, each with its own time; their mean over the interval
  since the last read is ``util_samples_pct``, rather than one polled figure.

An unavailable counter (an older GPU, an nvidia-ml-py without the API, ``NVML_ERROR_NO_PERMISSION`` in a
container) costs one line, :attr:`DeviceActivity.how`, that says why and what is read instead.

Invariant: every call after open goes through the NVML source's ``query`` (its error rules: unsupported is NaN
and never asked again, a lost GPU is ``SourceLost``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

GPM_MIN_S = 0.1  # GPM's shortest meaningful interval
# summary metric -> pynvml's constant for it
GPM_METRICS = {
    "gpm_graphics_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "gpm_sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
    "gpm_sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "gpm_tensor_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "gpm_dram_bw_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
SAMPLES_METRIC = "util_samples_pct"
Query = Callable[..., Any]  # (feature, func, *args) -> the result, or None (NaN for this reading)


class DeviceActivity:
    """One GPU's activity counters: GPM where the device has it, else the driver's utilisation samples."""

    def __init__(self, nv: Any, handle: object, query: Query, clock: Callable[[], float] = time.monotonic) -> None:
        self._nv, self._handle, self._query, self._clock = nv, handle, query, clock
        self.gpm = False
        self.samples = False
        self.how = "not opened"
        self._prev: Any = None  # the last GPM sample and when it was taken
        self._prev_t = -math.inf
        self._last_ts = 0  # the driver's newest sample seen (us)

    def open(self) -> str:
        """Find what this device offers; :attr:`how` says what is read (and why not GPM)."""
        nv = self._nv
        self._prev, self._prev_t, self._last_ts = None, -math.inf, 0
        why = self._gpm_support()
        if why is None:
            self.gpm = True
            self.how = f"GPM every >= {GPM_MIN_S * 1e3:.0f} ms: graphics, SM activity, SM occupancy, tensor, DRAM"
            return self.how
        self.samples = callable(getattr(nv, "nvmlDeviceGetSamples", None)) and hasattr(
            nv, "NVML_GPU_UTILIZATION_SAMPLES"
        )
        instead = "the driver's utilisation samples and utilization.gpu" if self.samples else "utilization.gpu"
        self.how = f"GPM unavailable ({why}): {instead} instead"
        return self.how

    def _gpm_support(self) -> str | None:
        nv = self._nv
        if not callable(getattr(nv, "nvmlGpmQueryDeviceSupport", None)) or not all(
            hasattr(nv, c) for c in GPM_METRICS.values()
        ):
            return "this nvidia-ml-py has no GPM API"
        try:
            support = nv.nvmlGpmQueryDeviceSupport(self._handle)
        except nv.NVMLError as exc:
            name = type(exc).__name__
            return "no permission (NVML_ERROR_NO_PERMISSION)" if "NoPermission" in name else f"{name} ({exc})"
        if not getattr(support, "isSupportedDevice", 0):
            return "not supported by this GPU: GPM needs Hopper or later"
        return None

    def read(self) -> dict[str, float]:
        """The counters since the last read (NaN where no interval has ended yet)."""
        if self.gpm:
            return self._read_gpm()
        if self.samples:
            return {SAMPLES_METRIC: self._read_samples()}
        return {}

    def _read_gpm(self) -> dict[str, float]:
        nv, now = self._nv, self._clock()
        out = dict.fromkeys(GPM_METRICS, math.nan)
        if self._prev is not None and now - self._prev_t < GPM_MIN_S:
            return out
        sample = self._query("gpm", nv.nvmlGpmSampleAlloc)
        if sample is None or self._query("gpm", nv.nvmlGpmSampleGet, self._handle, sample) is None:
            return out
        prev, self._prev, self._prev_t = self._prev, sample, now
        if prev is None:
            return out
        try:
            got = nv.c_nvmlGpmMetricsGet_t()
            got.version = nv.NVML_GPM_METRICS_GET_VERSION
            got.numMetrics = len(GPM_METRICS)
            got.sample1, got.sample2 = prev, sample
            for i, const in enumerate(GPM_METRICS.values()):
                got.metrics[i].metricId = getattr(nv, const)
            if self._query("gpm", nv.nvmlGpmMetricsGet, got) is None:
                return out
            for i, key in enumerate(GPM_METRICS):
                m = got.metrics[i]
                out[key] = float(m.value) if int(getattr(m, "nvmlReturn", 0)) == 0 else math.nan
        finally:
            self._query("gpm", nv.nvmlGpmSampleFree, prev)
        return out

    def _since(self, handle: object, kind: int, ts: int) -> Any:
        """The driver's samples since ``ts``; None when it took none since (NVML_ERROR_NOT_FOUND: no error)."""
        nv = self._nv
        try:
            return nv.nvmlDeviceGetSamples(handle, kind, ts)
        except nv.NVMLError as exc:
            if type(exc).__name__ == "NVMLError_NotFound":
                return None
            raise

    def _read_samples(self) -> float:
        got = self._query("util_samples", self._since, self._handle, self._nv.NVML_GPU_UTILIZATION_SAMPLES,
                          self._last_ts)  # fmt: skip
        if not got:
            return math.nan
        _kind, samples = got
        fresh = [s for s in samples if int(s.timeStamp) > self._last_ts]
        if not fresh:
            return math.nan
        self._last_ts = max(int(s.timeStamp) for s in fresh)
        return math.fsum(float(s.sampleValue.uiVal) for s in fresh) / len(fresh)

    def close(self) -> None:
        prev, self._prev = self._prev, None
        if prev is not None:
            self._query("gpm", self._nv.nvmlGpmSampleFree, prev)
