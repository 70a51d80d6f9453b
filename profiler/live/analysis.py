"""Rolling figures for live views, from the newest steps and samples (of a Session or a store being written).

Same definitions as the run summary (docs/metrics.md), over the newest ``horizon_s`` of steps, so
a live line and the final report never disagree about what a figure means.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from profiler.analysis.gpu import GpuSplit, gpu_split
from profiler.analysis.loader_time import LoaderTime, loader_time
from profiler.analysis.parts import HostFigures
from profiler.analysis.stages import per_item
from profiler.core.rows import KernelWindow
from profiler.core.store import PhaseRow, StepRow


@dataclass(frozen=True, slots=True)
class LiveStats:
    steps_total: int  # steps resolved so far (warm-up included)
    window_steps: int
    throughput_samples_per_s: float
    step_ms: float
    data_wait_ms: float
    h2d_ms: float
    compute_ms: float
    stall_fraction: float
    warmup: bool  # the newest step is a warm-up step


def window_stats(recent: Sequence[tuple[StepRow, Sequence[PhaseRow]]], horizon_s: float = 5.0) -> LiveStats | None:
    if not recent:
        return None
    newest = recent[-1][0]
    window = [(r, ps) for r, ps in recent if r.t_end >= newest.t_end - horizon_s]
    n = len(window)
    span = math.fsum(r.t_end - r.t_start for r, _ in window)
    wait = math.fsum(r.data_wait_s for r, _ in window)
    h2d = math.fsum(p.t_end - p.t_start for _, ps in window for p in ps if p.depth == 0 and p.name == "h2d")
    comp = math.fsum(p.t_end - p.t_start for _, ps in window for p in ps if p.depth == 0 and p.name == "compute")
    counted = [r.samples for r, _ in window if r.samples is not None]
    thr = sum(counted) / span if span > 0 and len(counted) == n else math.nan
    return LiveStats(
        steps_total=newest.step + 1,
        window_steps=n,
        throughput_samples_per_s=thr,
        step_ms=span / n * 1e3,
        data_wait_ms=wait / n * 1e3,
        h2d_ms=h2d / n * 1e3,
        compute_ms=comp / n * 1e3,
        stall_fraction=(wait + h2d) / span if span > 0 else math.nan,
        warmup=newest.warmup,
    )


@dataclass(frozen=True, slots=True)
class LiveSnapshot:
    """What a live view shows at one instant; histories are per second of run time, oldest first."""

    stats: LiveStats | None
    stall_history: list[float]  # % of each second's step time spent in data wait + h2d
    util_history: dict[str, list[float]]  # "gpu0" -> mean NVML utilization.gpu % per second
    latest: dict[str, float]  # the newest sample's metrics
    latest_t: float  # run time of the newest step end or sample, s
    loader: LoaderTime | None = None  # the loader processes' time over the last window_s seconds of samples
    memory: dict[str, float] = field(default_factory=dict)  # the newest reading of each mem.* figure (a reading
    # of the memory source comes every second or more seldom: the newest sample may hold none)
    stages: dict[str, float] = field(default_factory=dict)  # seconds per item of each loader stage over the last
    # window_s of samples (the report's definition, docs/metrics.md "Loader stages"); empty where none is timed
    gpu: GpuSplit | None = None  # the newest kernel window's split of its steps (analysis.gpu)


def _means(samples: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per metric, the mean of its non-NaN values over the samples."""
    acc: dict[str, list[float]] = {}
    for metrics in samples:
        for k, v in metrics.items():
            if not math.isnan(v):
                acc.setdefault(k, []).append(v)
    return {k: math.fsum(vs) / len(vs) for k, vs in sorted(acc.items())}


class LiveAggregator:
    """Folds steps and samples, as they arrive, into per-second buckets and a short step window.

    Feeds may hand the same step or sample twice (they poll overlapping buffers): steps are taken once by
    index, samples once by time. Memory is bounded by ``horizon_s`` buckets and ``max_steps`` steps.
    """

    def __init__(self, horizon_s: int = 60, window_s: float = 5.0, max_steps: int = 4096) -> None:
        self._horizon = horizon_s
        self._window_s = window_s
        self._steps: deque[tuple[StepRow, Sequence[PhaseRow]]] = deque(maxlen=max_steps)
        self._last_step = -1
        self._last_sample_t = -math.inf
        self._stall: dict[int, list[float]] = {}  # second -> [stalled s, step s]
        self._util: dict[str, dict[int, list[float]]] = {}  # gpu -> second -> [sum, n]
        self._latest: dict[str, float] = {}
        self._latest_t = 0.0
        self._loader: deque[tuple[float, dict[str, float]]] = deque()  # recent samples' loader.* metrics
        self._memory: dict[str, float] = {}  # the newest value of each mem.* metric
        self._stages: deque[tuple[float, str, str, float | None]] = deque()  # recent samples' stage.* totals
        self._window: KernelWindow | None = None  # the newest kernel window
        self._gpu: GpuSplit | None = None  # its split, once its steps are here

    def add_steps(self, rows: Iterable[tuple[StepRow, Sequence[PhaseRow]]]) -> None:
        for row, phases in rows:
            if row.step <= self._last_step:
                continue
            self._last_step = row.step
            self._steps.append((row, phases))
            h2d = math.fsum(p.t_end - p.t_start for p in phases if p.depth == 0 and p.name == "h2d")
            bucket = self._stall.setdefault(int(row.t_end), [0.0, 0.0])
            bucket[0] += row.data_wait_s + h2d
            bucket[1] += row.t_end - row.t_start
            self._latest_t = max(self._latest_t, row.t_end)
        self._trim()

    def add_samples(self, rows: Iterable[tuple[float, dict[str, float]]]) -> None:
        for t, metrics in rows:
            if t <= self._last_sample_t:
                continue
            self._last_sample_t = t
            self._latest = metrics
            self._latest_t = max(self._latest_t, t)
            self._loader.append((t, {k: v for k, v in metrics.items() if k.startswith("loader.")}))
            self._memory.update((k, v) for k, v in metrics.items() if k.startswith("mem.") and not math.isnan(v))
            self._stages.extend((t, "stages", k, v) for k, v in metrics.items() if k.startswith("stage."))
            for metric, value in metrics.items():
                if metric.endswith(".util_pct") and metric.startswith("gpu") and not math.isnan(value):
                    acc = self._util.setdefault(metric.split(".")[0], {}).setdefault(int(t), [0.0, 0.0])
                    acc[0] += value
                    acc[1] += 1
        self._trim()

    def add_windows(self, windows: Iterable[KernelWindow], source: str) -> None:
        """Kernel windows as they complete (a feed may hand the same one again): the newest one's split, made once
        its steps have come."""
        for w in windows:
            if self._window is None or w.window > self._window.window:
                self._window, self._gpu = w, None
        if self._window is not None and self._gpu is None:
            self._gpu = gpu_split([self._window], [r for r, _ in self._steps], source)

    def _trim(self) -> None:
        while self._loader and self._loader[0][0] < self._last_sample_t - self._window_s:
            self._loader.popleft()
        while self._stages and self._stages[0][0] < self._last_sample_t - self._window_s:
            self._stages.popleft()
        oldest = int(self._latest_t) - self._horizon + 1
        for sec in [s for s in self._stall if s < oldest]:
            del self._stall[sec]
        for per in self._util.values():
            for sec in [s for s in per if s < oldest]:
                del per[sec]

    def snapshot(self) -> LiveSnapshot:
        stall = [100 * a / b if b > 0 else 0.0 for _, (a, b) in sorted(self._stall.items())]
        util = {gpu: [s / n for _, (s, n) in sorted(per.items())] for gpu, per in sorted(self._util.items())}
        return LiveSnapshot(
            stats=window_stats(list(self._steps), self._window_s),
            stall_history=stall,
            util_history=util,
            latest=dict(self._latest),
            latest_t=self._latest_t,
            loader=loader_time(HostFigures(_means(m for _t, m in self._loader))),
            memory=dict(self._memory),
            stages=per_item(list(self._stages), None),
            gpu=self._gpu,
        )


@dataclass(frozen=True, slots=True)
class RunTotals:
    """Sums over every step resolved so far, for counters (a Prometheus scrape): over the measured steps they are
    the run summary's own sums, so ``stall_s / step_s`` at the end is its ``stall_fraction`` (host-timed: on CUDA
    and simulated devices the summary resolves the stall from device events and may differ, docs/metrics.md)."""

    steps: int  # steps resolved, warm-up included
    warmup_steps: int
    measured_steps: int
    step_s: float  # the measured steps' summed step time
    data_wait_s: float
    h2d_s: float  # top-level h2d phases
    compute_s: float
    samples: int  # samples of the measured steps that counted them
    missed_steps: int  # steps the feed had dropped before they were folded (not in the sums)

    @property
    def stall_s(self) -> float:
        return self.data_wait_s + self.h2d_s

    @property
    def stall_fraction(self) -> float:
        return self.stall_s / self.step_s if self.step_s > 0 else math.nan


class TotalsFolder:
    """Folds steps into :class:`RunTotals`; a step handed twice is taken once (by index), as the aggregator."""

    def __init__(self) -> None:
        self._last = -1
        self._sums = [0.0, 0.0, 0.0, 0.0]  # step, wait, h2d, compute
        self._n = [0, 0, 0, 0, 0]  # steps, warm-up, measured, samples, missed

    def add_steps(self, rows: Iterable[tuple[StepRow, Sequence[PhaseRow]]]) -> None:
        sums, n = self._sums, self._n
        for row, phases in rows:
            if row.step <= self._last:
                continue
            n[4] += row.step - self._last - 1
            n[0] += row.step - self._last
            self._last = row.step
            if row.warmup:
                n[1] += 1
                continue
            n[2] += 1
            sums[0] += row.t_end - row.t_start
            sums[1] += row.data_wait_s
            sums[2] += math.fsum(p.t_end - p.t_start for p in phases if p.depth == 0 and p.name == "h2d")
            sums[3] += math.fsum(p.t_end - p.t_start for p in phases if p.depth == 0 and p.name == "compute")
            n[3] += row.samples or 0

    def totals(self) -> RunTotals:
        s, n = self._sums, self._n
        return RunTotals(n[0], n[1], n[2], s[0], s[1], s[2], s[3], n[3], n[4])
