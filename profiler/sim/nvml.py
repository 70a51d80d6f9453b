"""The simulated accelerator seen through NVML's eyes: the real NVML source's metrics (``gpu<i>.util_pct``,
``mem_used_mb`` / ``mem_total_mb``, ``pcie_rx_mbps``, ``power_w``), computed from the
:class:`~profiler.sim.device.SimDevice`'s own record of what it executed, with NVML's definitions
(docs/sim.md, "Simulated NVML").

Everything it reports is simulated: the source is named ``nvml-sim`` and every renderer labels its figures
so. ``read()`` never raises: a failure gives NaN for every metric, logged once with its reason.
"""

from __future__ import annotations

import logging
import math
import threading

from profiler.sim.device import SimDevice

_log = logging.getLogger(__name__)
_MIB = float(1 << 20)
NAME = "nvml-sim"
# NVML's utilisation sample period is 1/6 s to 1 s depending on the product; the shortest is the default.
WINDOW_S = 1 / 6


class SimNvmlSource:
    """:class:`~profiler.core.sources.base.Source` of simulated NVML metrics for :class:`SimDevice` (``gpu<index>``)."""

    name = NAME

    def __init__(self, device: SimDevice, *, window_s: float = WINDOW_S, index: int = 0) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
        self.device = device
        self.window_s = window_s
        self._prefix = f"gpu{index}."
        self._lock = threading.Lock()
        self._reason: str | None = None

    def open(self) -> str | None:
        return None

    def close(self) -> None:
        return None

    def device_names(self) -> list[str]:
        return [f"{self.device.config.spec.full_name} (simulated)"]

    def missing_reasons(self) -> dict[str, str]:
        """``{metric: reason}`` once a read has failed (every metric fails together)."""
        with self._lock:
            reason = self._reason
        return {} if reason is None else {self._prefix + m: reason for m in _METRICS}

    def period(self) -> tuple[float, float]:
        """The last completed sample period ``[t0, t1)`` on the device's clock."""
        w = self.window_s
        t1 = math.floor(self.device.clock() / w) * w
        return t1 - w, t1

    def read(self) -> dict[str, float]:
        try:
            return self._read()
        except Exception as exc:  # noqa: BLE001 - read() never raises: NaN for this reading, the reason kept
            reason = f"{type(exc).__name__}: {exc}"
            with self._lock:
                first, self._reason = self._reason is None, reason
            if first:
                _log.warning("nvml-sim: reads as NaN: %s", reason)
            return {self._prefix + m: math.nan for m in _METRICS}

    def _read(self) -> dict[str, float]:
        dev, w, p = self.device, self.window_s, self._prefix
        t0, t1 = self.period()
        util = min(1.0, max(0.0, dev.busy_s(t0, t1) / w))
        spec = dev.config.spec
        return {
            p + "util_pct": 100.0 * util,
            p + "mem_used_mb": dev.memory_bytes() / _MIB,
            p + "mem_total_mb": dev.memory_total_bytes / _MIB,
            p + "pcie_rx_mbps": dev.copied_bytes(t0, t1) / w / _MIB,
            p + "power_w": spec.idle_w + (spec.tdp_w - spec.idle_w) * util,
        }


_METRICS = ("util_pct", "mem_used_mb", "mem_total_mb", "pcie_rx_mbps", "power_w")
