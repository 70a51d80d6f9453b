"""Loader memory: each process's private and proportional memory over the measured window, the job's total,
shared memory, and a worker whose private memory grows with the items it reads (copy-on-read).

Pure: the ``memory`` source's readings (:mod:`profiler.core.sources.memory`) in, a :class:`LoaderMemory` out.
docs/metrics.md, "Loader memory", defines the figures and the growth rule.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from profiler.analysis.meta import JSON
from profiler.analysis.stats import Interval, json_safe

GROWTH_MIN_MB = 8.0  # a worker's private memory must grow at least this much over the window ...
GROWTH_MIN_SHARE = 0.05  # ... and this share of where it started ...
GROWTH_MIN_R2 = 0.8  # ... and steadily (a straight line explains this share of its variance)
MIN_READINGS = 4
# a process's reading this soon after the window's last step counts as the window's: the reading a loop's end takes of
# its workers before dropping their iterator stops them (profiler.core.sampling.worker_memory_asks), made after its last
# step ended (15 ms for two workers here), and the close's last round where the workers outlive the loop
# (persistent_workers)
END_GRACE_S = 1.0
# the source of that loop's end reading (profiler.core.sources.memory.LOOP_END): a worker's reading within END_GRACE_S
# after it was made while its loader stopped it, its memory being freed (one then read 0 MiB of USS); left out
LOOP_END = "memory-loop-end"
SHM_NEAR = 0.9  # the need, or the segment's use, within this share of what there is: said
TORCH_PREFETCH_FACTOR = 2  # DataLoader's default with workers
_MIB = 1024 * 1024
SHM_FIX = (
    "Give the job a larger segment (docker run --shm-size, or a larger /dev/shm), or hold fewer batches in flight "
    "(fewer num_workers, a lower prefetch_factor, a smaller batch)"
)
METHOD = (
    "psutil memory_full_info (/proc/PID/smaps_rollup) of the training process and each worker, as often as 0.5% "
    "of one core allows, and of the workers five times more in the first epoch and where the loop ends: "
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
    readings: int  # USS readings in the window (growth needs MIN_READINGS)


@dataclass(frozen=True, slots=True)
class ShmNeed:
    """PREDICTED: the ``/dev/shm`` the loader's batches in flight need, from the run's batch size in bytes and
    its loader's knobs (:func:`shm_need`)."""

    batch_mb: float
    batches: int  # in flight at most: in the workers and their queue, and held by the training process
    need_mb: float
    rule: str  # how ``batches`` was counted, in words


@dataclass(frozen=True, slots=True)
class LoaderMemory:
    method: str
    processes: tuple[ProcessMemory, ...]  # main first, then the workers by label
    total_pss_peak_mb: float  # the job's memory: the peak of the sum of PSS
    shm_used_peak_mb: float  # /dev/shm, the whole segment (every process's)
    shm_size_mb: float
    shm_free_start_mb: float  # the segment's free space at the run's first reading, before the loader started
    shm_job_peak_mb: float  # the /dev/shm files the job's own processes mapped (its batches in flight), peak
    shm_need: ShmNeed | None  # predicted; None where the loader puts no batch in shared memory
    pin_cpu_pct: float  # the pin-memory thread(s): mean CPU over the window, 100 = one core (NaN: no pin thread)
    pinned_peak_mb: float  # torch's pinned host allocator at its peak (NaN: nothing pinned, or no CUDA)
    host_available_mb: float  # at the window's last reading
    growing: tuple[str, ...]  # the workers whose private memory grew
    out_of_memory_in_s: float  # host available / the growing workers' summed slope (NaN: none grows)
    headline: str | None
    shm_headline: str | None  # the loader needs more /dev/shm than the segment had free, or came close to it

    def to_dict(self) -> JSON:
        out: JSON = asdict(self)
        return json_safe(out)


def shm_need(meta: Mapping[str, object]) -> ShmNeed | None:
    """PREDICTED ``/dev/shm`` for a run's loader from its meta (``batch_bytes``, ``loader``, ``device``): a
    DataLoader worker collates each batch into a shared-memory file and the training process maps it, so up to
    workers x prefetch_factor batches are in flight, and the training loop holds two: the step's, still alive
    while ``next()`` takes the next one (``for x, y in loader`` rebinds x, y only after it returns); the
    ``prefetch`` pipeline's queue holds ``depth`` more where it keeps them as received (no pinning, CPU device).
    None without worker processes (batches built in the training process), or a run that did not record its batch
    size in bytes."""
    loader, batch_bytes = meta.get("loader"), meta.get("batch_bytes")
    if not isinstance(loader, Mapping) or not isinstance(batch_bytes, int) or meta.get("synthetic_input"):
        return None
    workers = loader.get("worker_processes", loader.get("workers"))
    if not isinstance(workers, int) or workers <= 0:
        return None
    prefetch = loader.get("prefetch_factor")
    prefetch = prefetch if isinstance(prefetch, int) and prefetch > 0 else TORCH_PREFETCH_FACTOR
    device = meta.get("device")
    kind = device.get("kind") if isinstance(device, Mapping) else None
    depth = loader.get("depth") if loader.get("pipeline") == "prefetch" else None
    queued = depth if isinstance(depth, int) and not loader.get("pin_memory") and kind == "cpu" else 0
    batches = workers * prefetch + 2 + queued
    rule = f"{workers} worker{'s' if workers != 1 else ''} x prefetch_factor {prefetch} + 2 held by the loop"
    if queued:
        rule += f" + {queued} queued by the prefetch thread"
    batch_mb = batch_bytes / _MIB
    return ShmNeed(batch_mb, batches, batches * batch_mb, rule)


# a worker out of shared memory: torch's own error when it cannot size the file, a SIGBUS when a page of it cannot
# be had (torch's worker prints "Unexpected bus error ... insufficient shared memory (shm)"), in torch's words or ours
_SHM_OUT = re.compile(
    r"unable to allocate shared memory|unable to write to file </torch_|insufficient shared memory|"
    r"killed by SIGBUS|killed by signal: Bus error"
)


def shm_exhausted(error: str | None) -> bool:
    """Whether a loader's error says a worker ran out of shared memory."""
    return error is not None and _SHM_OUT.search(error) is not None


def loader_memory(
    samples: Sequence[tuple[float, str, str, float | None]],
    window: Interval | None,
    samples_per_s: float,
    workers: int,
    need: ShmNeed | None = None,
) -> LoaderMemory | None:
    """The loader's memory over ``window`` from the run's samples (shared memory over the whole run: it runs out
    whenever it runs out, warm-up included); None without ``memory`` readings."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    first_used = math.nan
    stopped = _loop_ends(samples)
    for t, source, metric, value in samples:
        if value is None or not metric.startswith(("mem.", "pin.")) or math.isnan(value):
            continue
        if source != LOOP_END and 0 < t - stopped.get(metric, -math.inf) <= END_GRACE_S:
            continue  # read as its loader stopped it
        if metric == "mem.shm.used_mb" and math.isnan(first_used):
            first_used = value  # the segment before the loader started: its free space is size - this
        in_window = window is None or window[0] <= t <= window[1]
        just_after = window is not None and window[1] < t <= window[1] + END_GRACE_S and _PROC.fullmatch(metric)
        if metric.startswith("mem.shm.") or in_window or just_after:
            series[metric].append((t, value))
    labels = sorted({m.group(1) for k in series if (m := _PROC.fullmatch(k))}, key=_order)
    if not labels and not series.get("mem.shm.job_mb") and not series.get("pin.cpu_pct"):
        return None
    per_worker = samples_per_s / workers if workers > 0 and samples_per_s > 0 else math.nan
    procs = tuple(_process(label, series, per_worker) for label in labels)
    growing = tuple(p.label for p in procs if p.grows)
    available = series["mem.host.available_mb"][-1][1] if series.get("mem.host.available_mb") else math.nan
    rate = math.fsum(p.growth_mb_per_s for p in procs if p.grows)
    eta = available / rate if growing and rate > 0 else math.nan
    size = _peak(series, "mem.shm.size_mb")
    free = size - first_used
    used_peak = _peak(series, "mem.shm.used_mb")
    return LoaderMemory(
        method=METHOD,
        processes=procs,
        total_pss_peak_mb=_peak(series, "mem.total.pss_mb"),
        shm_used_peak_mb=used_peak,
        shm_size_mb=size,
        shm_free_start_mb=free,
        shm_job_peak_mb=_peak(series, "mem.shm.job_mb"),
        shm_need=need,
        pin_cpu_pct=_mean(series.get("pin.cpu_pct", [])),
        pinned_peak_mb=_peak(series, "pin.pinned_mb"),
        host_available_mb=available,
        growing=growing,
        out_of_memory_in_s=eta,
        headline=_headline([p for p in procs if p.grows], eta),
        shm_headline=shm_headline(need, free, size, used_peak),
    )


def _loop_ends(samples: Sequence[tuple[float, str, str, float | None]]) -> dict[str, float]:
    """Each metric's time of the loop's end reading (the first, where a run broke out of several loops: LOOP_END)."""
    out: dict[str, float] = {}
    for t, source, metric, _value in samples:
        if source == LOOP_END:
            out.setdefault(metric, t)
    return out


def shm_headline(need: ShmNeed | None, free_mb: float, size_mb: float, used_peak_mb: float) -> str | None:
    """Said when the predicted need exceeds :data:`SHM_NEAR` of the free segment, or the segment's use came within
    1 - :data:`SHM_NEAR` of its size; None otherwise (or without the figures)."""
    short = need is not None and math.isfinite(free_mb) and need.need_mb > SHM_NEAR * free_mb
    full = math.isfinite(used_peak_mb) and size_mb > 0 and used_peak_mb >= SHM_NEAR * size_mb
    if not (short or full):
        return None
    what = (
        f"the loader needs about {need.need_mb:.0f} MiB of /dev/shm (predicted: {need.batches} batches of "
        f"{need.batch_mb:.1f} MiB, {need.rule}) and the segment had {free_mb:.0f} MiB free of {size_mb:.0f}"
        if short and need is not None
        else f"/dev/shm reached {used_peak_mb:.0f} of {size_mb:.0f} MiB"
    )
    return (
        f"Shared memory: {what}. When it runs out a worker dies of a bus error or 'No space left on device'. {SHM_FIX}"
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
        len(uss),
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
