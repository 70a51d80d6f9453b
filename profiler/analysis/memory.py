"""Loader memory: each process's private and proportional memory over the measured window, the job's total,
shared memory, and a worker whose private memory grows with the items it reads (copy-on-read).

Pure: the ``memory`` source's readings (:mod:`profiler.core.sources.memory`) in, a :class:`LoaderMemory` out.
docs/metrics.md, "Loader memory", defines the figures and the growth rule.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from profiler.analysis.meta import JSON
from profiler.analysis.stats import Interval, json_safe

GROWTH_MIN_MB = 8.0  # a worker's private memory must grow at least this much over the window ...
GROWTH_MIN_SHARE = 0.05  # ... and this share of where it started ...
GROWTH_MIN_R2 = 0.8  # ... and steadily (a straight line explains this share of its variance)
MIN_READINGS = 4
METHOD = (
    "psutil memory_full_info (/proc/PID/smaps_rollup) of the training process and each worker, as often as 0.5% "
    "of one core allows: "
    "USS (private), PSS (shared pages divided among the processes that map them), shared = RSS - USS"
)
_PROC = re.compile(r"mem\.(main|w\d+)\.(uss|pss|shared)_mb")


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    label: str  # "main" or a worker's label
    uss_start_mb: float
    uss_end_mb: float
    uss_peak_mb: float
    pss_mean_mb: float
    shared_mean_mb: float
    growth_mb_per_s: float  # least-squares slope of USS over the window
    growth_mb_per_1k_items: float  # the slope per 1,000 items this worker delivered (NaN for main)
    grows: bool  # the growth rule held (workers only)


@dataclass(frozen=True, slots=True)
class LoaderMemory:
    method: str
    processes: tuple[ProcessMemory, ...]  # main first, then the workers by label
    total_pss_peak_mb: float  # the job's memory: the peak of the sum of PSS
    shm_used_peak_mb: float  # /dev/shm
    shm_size_mb: float
    host_available_mb: float  # at the window's last reading
    growing: tuple[str, ...]  # the workers whose private memory grew
    out_of_memory_in_s: float  # host available / the growing workers' summed slope (NaN: none grows)
    headline: str | None

    def to_dict(self) -> JSON:
        out: JSON = asdict(self)
        return json_safe(out)


def loader_memory(
    samples: Sequence[tuple[float, str, str, float | None]], window: Interval | None, samples_per_s: float, workers: int
) -> LoaderMemory | None:
    """The loader's memory over ``window`` from the run's samples; None without ``memory`` readings in it."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, _source, metric, value in samples:
        if value is None or not metric.startswith("mem.") or math.isnan(value):
            continue
        if window is not None and not window[0] <= t <= window[1]:
            continue
        series[metric].append((t, value))
    labels = sorted({m.group(1) for k in series if (m := _PROC.fullmatch(k))}, key=_order)
    if not labels:
        return None
    per_worker = samples_per_s / workers if workers > 0 and samples_per_s > 0 else math.nan
    procs = tuple(_process(label, series, per_worker) for label in labels)
    growing = tuple(p.label for p in procs if p.grows)
    available = series["mem.host.available_mb"][-1][1] if series.get("mem.host.available_mb") else math.nan
    rate = math.fsum(p.growth_mb_per_s for p in procs if p.grows)
    eta = available / rate if growing and rate > 0 else math.nan
    return LoaderMemory(
        METHOD,
        procs,
        _peak(series, "mem.total.pss_mb"),
        _peak(series, "mem.shm.used_mb"),
        _peak(series, "mem.shm.size_mb"),
        available,
        growing,
        eta,
        _headline([p for p in procs if p.grows], eta),
    )


def _order(label: str) -> tuple[bool, int]:
    return label != "main", int(label[1:]) if label != "main" else 0


def _peak(series: dict[str, list[tuple[float, float]]], metric: str) -> float:
    return max((v for _t, v in series.get(metric, [])), default=math.nan)


def _mean(points: list[tuple[float, float]]) -> float:
    return math.fsum(v for _t, v in points) / len(points) if points else math.nan


def slope(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of value over time, and R² (NaN, NaN for fewer than 2 points or no spread in time)."""
    n = len(points)
    if n < 2:
        return math.nan, math.nan
    mt = math.fsum(t for t, _ in points) / n
    mv = math.fsum(v for _, v in points) / n
    stt = math.fsum((t - mt) ** 2 for t, _ in points)
    svv = math.fsum((v - mv) ** 2 for _, v in points)
    if stt <= 0:
        return math.nan, math.nan
    b = math.fsum((t - mt) * (v - mv) for t, v in points) / stt
    return b, (b * b * stt / svv if svv > 0 else 0.0)


def _process(label: str, series: dict[str, list[tuple[float, float]]], items_per_s: float) -> ProcessMemory:
    uss = series.get(f"mem.{label}.uss_mb", [])
    b, r2 = slope(uss)
    start, end = (uss[0][1], uss[-1][1]) if uss else (math.nan, math.nan)
    span = uss[-1][0] - uss[0][0] if len(uss) > 1 else 0.0
    grows = (
        label != "main"
        and len(uss) >= MIN_READINGS
        and b * span >= max(GROWTH_MIN_MB, GROWTH_MIN_SHARE * start)
        and r2 >= GROWTH_MIN_R2
    )
    per_1k = b / items_per_s * 1000 if label != "main" and items_per_s > 0 else math.nan
    return ProcessMemory(
        label,
        start,
        end,
        max((v for _t, v in uss), default=math.nan),
        _mean(series.get(f"mem.{label}.pss_mb", [])),
        _mean(series.get(f"mem.{label}.shared_mb", [])),
        b,
        per_1k,
        grows,
    )


def _headline(growing: list[ProcessMemory], eta_s: float) -> str | None:
    if not growing:
        return None
    names = ", ".join(p.label for p in growing)
    per_1k = math.fsum(p.growth_mb_per_1k_items for p in growing) / len(growing)
    grew = math.fsum(p.uss_end_mb - p.uss_start_mb for p in growing) / len(growing)
    when = f"; at this rate the host's available memory runs out in {_duration(eta_s)}" if math.isfinite(eta_s) else ""
    return (
        f"Worker(s) {names}: private memory grew {per_1k:.1f} MiB per 1,000 items ({grew:.0f} MiB each over the "
        f"window), as a data set held in Python objects is copied page by page when its reference counts are "
        f"touched (copy-on-read){when}. Hold the data in numpy arrays or Arrow / memory-mapped columns instead of "
        "lists of Python objects, or bound a per-worker cache with persistent_workers"
    )


def _duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"
