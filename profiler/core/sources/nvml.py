"""NVIDIA GPU metrics through NVML (the ``nvidia-ml-py`` distribution, module ``pynvml``; the metrics, units
and failure behaviour: docs/metrics.md).

Invariants:
- ``pynvml`` is imported in :meth:`NvmlSource.open` only; ``open()`` calls the source usable only when NVML
  initialises and one real read yields a number, else it returns the reason.
- Every NVML call after ``nvmlInit`` goes through :meth:`NvmlSource._query`: an unsupported query is NaN and
  never issued again, an error no later call survives (GPU lost, driver gone) is :class:`SourceLost`, any other
  is NaN for that reading, logged once per device and feature (reasons in :meth:`NvmlSource.missing_reasons`).
- ``nvmlInit``/``nvmlShutdown`` run under one process-wide lock (NVML's init count is per process).
- PCIe throughput blocks ~20 ms per query: read at most every ``pcie_interval_s``, absent (not repeated) between.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from profiler.core.sources.base import SourceLost
from profiler.core.sources.gpm import GPM_METRICS, SAMPLES_METRIC, DeviceActivity

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
_MIB = float(1 << 20)
_NAN = math.nan

# NVML's init/shutdown reference count is process-wide, so every source instance shares this lock.
_INIT_LOCK = threading.Lock()

# After these no later NVML call can succeed, so retrying every sample would only repeat the error.
_LOST_ERRORS = (
    "NVMLError_GpuIsLost",
    "NVMLError_Unknown",
    "NVMLError_DriverNotLoaded",
    "NVMLError_Uninitialized",
    "NVMLError_ResetRequired",
    "NVMLError_LibRmVersionMismatch",
)
_HINTS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver on this machine",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_NoPermission": "no permission to query the GPU",
    "NVMLError_GpuIsLost": "the GPU fell off the bus or stopped responding",
    "NVMLError_LibRmVersionMismatch": "NVML library and kernel driver differ; reboot after a driver update",
}
# feature -> the metrics one query of it fills, for missing_reasons().
_FEATURE_METRICS = {
    "util": ("util_pct", "mem_util_pct"),
    "mem": ("mem_used_mb", "mem_total_mb"),
    "pcie_tx": ("pcie_tx_mbps",),
    "pcie_rx": ("pcie_rx_mbps",),
    "power": ("power_w",),
    "sm_clock": ("sm_clock_mhz",),
    "gpm": tuple(GPM_METRICS),
    "util_samples": (SAMPLES_METRIC,),
}


class _Utilization(Protocol):
    gpu: int
    memory: int


class _Memory(Protocol):
    used: int
    total: int


class _Nvml(Protocol):
    """What this source calls of ``pynvml`` (which has no types), or of a stand-in module."""

    NVMLError: type[Exception]
    NVML_PCIE_UTIL_TX_BYTES: int
    NVML_PCIE_UTIL_RX_BYTES: int
    NVML_CLOCK_SM: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object, /) -> _Utilization: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> _Memory: ...
    def nvmlDeviceGetPcieThroughput(self, handle: object, counter: int, /) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: object, /) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: object, clock: int, /) -> int: ...


class NvmlSource:
    """:class:`~profiler.core.sources.base.Source` for NVIDIA GPUs, one ``gpu<i>.*`` group per NVML index."""

    name = "nvml"

    def __init__(
        self,
        module: _Nvml | None = None,
        device_indices: list[int] | None = None,
        *,
        pcie_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pcie_interval_s < 0:
            raise ValueError(f"pcie_interval_s must be >= 0, got {pcie_interval_s!r}")
        self._nv = module
        self._wanted = None if device_indices is None else list(device_indices)
        self._pcie_interval_s = pcie_interval_s
        self._indices: list[int] = []
        self._handles: list[object] = []
        self._names: list[str] = []
        self._initialised = False
        self._lost: str | None = None
        self._lost_types: tuple[type[BaseException], ...] = ()
        self._not_supported: type[BaseException] | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._reasons: dict[tuple[int, str], str] = {}
        self._last_pcie = -math.inf
        self._activity: list[DeviceActivity] = []
        self._clock = clock
        # read() runs on the sampler thread while close() may come from the training thread.
        self._lock = threading.Lock()

    def open(self) -> str | None:
        if self._nv is None:
            try:
                import pynvml
            except ImportError:
                return "nvidia-ml-py not installed"
            self._nv = pynvml
        nv = self._nv
        with self._lock:
            with _INIT_LOCK:
                if self._initialised:
                    return None
                try:
                    nv.nvmlInit()
                except nv.NVMLError as exc:
                    return f"NVML unavailable: {_describe(exc)}"
                self._initialised = True
            self._lost_types = tuple(getattr(nv, n) for n in _LOST_ERRORS if hasattr(nv, n))
            self._not_supported = getattr(nv, "NVMLError_NotSupported", None)
            self._lost = None
            reason = self._discover(nv)
            if reason is None:
                try:
                    probe = self._read_locked()
                except SourceLost as exc:
                    reason = f"NVML unavailable: {exc}"
                else:
                    if not any(math.isfinite(v) for v in probe.values()):
                        reason = "NVML unavailable: a probe read returned no metric for any GPU"
            if reason is not None:
                self._shutdown_locked()
            return reason

    def read(self) -> dict[str, float]:
        with self._lock:
            if self._lost is not None:
                raise SourceLost(self._lost)
            if not self._initialised:
                raise RuntimeError("NvmlSource.read() called before a successful open()")
            return self._read_locked()

    def close(self) -> None:
        with self._lock:
            self._shutdown_locked()

    def notes(self) -> list[str]:
        """One line per GPU whose activity counters are not GPM: why, and what is read instead."""
        return [f"gpu{i}: {a.how}" for i, a in zip(self._indices, self._activity, strict=True) if not a.gpm]

    def device_names(self) -> list[str]:
        """Names of the sampled GPUs, in the order of their ``gpu<i>`` groups."""
        return list(self._names)

    def missing_reasons(self) -> dict[str, str]:
        """``{metric: reason}`` for every metric that has read as NaN so far."""
        with self._lock:
            reasons = sorted(self._reasons.items())
        out: dict[str, str] = {}
        for (index, feature), reason in reasons:
            for metric in _FEATURE_METRICS[feature]:
                out[f"gpu{index}.{metric}"] = reason
        return out

    def _discover(self, nv: _Nvml) -> str | None:
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            return f"NVML unavailable: {_describe(exc)}"
        indices = list(range(count)) if self._wanted is None else self._wanted
        if not indices:
            return "NVML unavailable: no NVIDIA GPU found"
        missing = [i for i in indices if not 0 <= i < count]
        if missing:
            return f"NVML unavailable: no GPU with index {missing[0]} (NVML sees {count})"
        try:
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in indices]
            names = [_text(nv.nvmlDeviceGetName(h)) for h in handles]
        except nv.NVMLError as exc:
            return f"NVML unavailable: {_describe(exc)}"
        self._indices, self._handles, self._names = indices, handles, names
        self._activity = [
            DeviceActivity(nv, h, functools.partial(self._query, i), self._clock)
            for i, h in zip(indices, handles, strict=True)
        ]
        for a in self._activity:
            a.open()
        return None

    def _api(self) -> _Nvml:
        """The NVML module once :meth:`open` has it (what runs only on an initialised source calls it)."""
        if self._nv is None:
            raise RuntimeError("NvmlSource used before open()")
        return self._nv

    def _read_locked(self) -> dict[str, float]:
        nv = self._api()
        now = time.monotonic()
        with_pcie = now - self._last_pcie >= self._pcie_interval_s
        if with_pcie:
            self._last_pcie = now
        out: dict[str, float] = {}
        for index, handle in zip(self._indices, self._handles, strict=True):
            p = f"gpu{index}."
            util = self._query(index, "util", nv.nvmlDeviceGetUtilizationRates, handle)
            out[p + "util_pct"] = _NAN if util is None else float(util.gpu)
            out[p + "mem_util_pct"] = _NAN if util is None else float(util.memory)
            mem = self._query(index, "mem", nv.nvmlDeviceGetMemoryInfo, handle)
            out[p + "mem_used_mb"] = _NAN if mem is None else mem.used / _MIB
            out[p + "mem_total_mb"] = _NAN if mem is None else mem.total / _MIB
            if with_pcie:
                get_pcie = nv.nvmlDeviceGetPcieThroughput
                tx = self._query(index, "pcie_tx", get_pcie, handle, nv.NVML_PCIE_UTIL_TX_BYTES)
                rx = self._query(index, "pcie_rx", get_pcie, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
                out[p + "pcie_tx_mbps"] = _NAN if tx is None else tx / 1024.0
                out[p + "pcie_rx_mbps"] = _NAN if rx is None else rx / 1024.0
            power = self._query(index, "power", nv.nvmlDeviceGetPowerUsage, handle)
            out[p + "power_w"] = _NAN if power is None else power / 1000.0
            clock = self._query(index, "sm_clock", nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
            out[p + "sm_clock_mhz"] = _NAN if clock is None else float(clock)
        for index, activity in zip(self._indices, self._activity, strict=True):
            out.update((f"gpu{index}.{k}", v) for k, v in activity.read().items())
        return out

    def _query(self, index: int, feature: str, func: Callable[..., _T], *args: object) -> _T | None:
        """The one place NVML is called during sampling; ``None`` means NaN for this reading."""
        key = (index, feature)
        if key in self._unsupported:
            return None
        try:
            return func(*args)
        except self._api().NVMLError as exc:
            if self._not_supported is not None and isinstance(exc, self._not_supported):
                self._unsupported.add(key)
                self._remember(key, "not supported by this GPU")
                return None
            if isinstance(exc, self._lost_types):
                self._lost = f"GPU {index}: {_describe(exc)}"
                raise SourceLost(self._lost) from exc
            self._remember(key, _describe(exc))
            return None

    def _remember(self, key: tuple[int, str], reason: str) -> None:
        if key not in self._reasons:
            _log.warning("nvml: gpu%d %s reads as NaN: %s", key[0], key[1], reason)
        self._reasons[key] = reason

    def _shutdown_locked(self) -> None:
        with _INIT_LOCK:
            if not self._initialised:
                return
            self._initialised = False
            self._handles = []
            for activity in self._activity:
                with contextlib.suppress(Exception):  # a sample's free on a GPU that is gone
                    activity.close()
            self._activity = []
            nv = self._api()
            try:
                nv.nvmlShutdown()
            except nv.NVMLError as exc:
                # A lost GPU or unloaded driver can refuse shutdown; there is nothing left to release.
                _log.debug("nvml: nvmlShutdown failed: %s", _describe(exc))


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    return f"{name} ({_HINTS.get(name) or str(exc)})"


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str; older pynvml releases returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value
