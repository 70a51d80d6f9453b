"""Run record -> time series for plots: per-step breakdown rows, rolling stall, sampled metrics.

Pure: a :class:`profiler.core.store.RunRecord` in, frozen dataclasses of plain floats out; no clock, no file, so
a renderer only maps numbers to pixels. docs/html-report.md ("The plots", "Where the numbers come from") gives
the definitions. Invariants:
- Step rows and stall follow docs/metrics.md: the mean of the measured rows is the Summary's breakdown, except
  ``other``, clamped per step here (so never smaller). Times are seconds since the run started.
- Warm-up steps are kept and flagged (``warmup=True``), never dropped; a bucket no step covers, and a reading
  that could not be taken, are NaN, never 0 and never filled in.
- Bounded whatever the run's length: at most ``max_bars`` bars, ``MAX_BUCKETS`` buckets and ``max_points``
  points per series (each run of readings keeps its lowest and highest, so dips and peaks stay visible).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from profiler.analysis.parts import NESTED_SYNC, SYNC_PHASE, event_timer
from profiler.analysis.stats import Interval, quantile, subtract, total, union
from profiler.core.store import PhaseRow, RunRecord, StepRow

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from profiler.core.store.columns import PhaseColumns, RunColumns

    Floats = NDArray[np.float64]

CORE_PARTS = ("data_wait", "h2d", "compute")
# Rolling-stall buckets hold at least this many median steps, so one step does not make a bucket 0% or 100%.
STEPS_PER_BUCKET = 5
MAX_BUCKETS = 200
MAX_BARS = 400
MAX_POINTS = 2000  # per sampled series: two per pixel of a ~1,000-pixel plot

_UNITS = (
    ("_pct", "%"),
    ("_mb", "MiB"),
    ("_mbps", "MB/s"),
    ("_mhz", "MHz"),
    ("_ms", "ms"),
    ("_w", "W"),
)


@dataclass(frozen=True, slots=True)
class Series:
    """One sampled metric over time, as stored: ``values[i]`` was read at ``t[i]``; NaN where the read failed."""

    metric: str  # store name, e.g. "gpu0.util_pct", "proc.w1.cpu_pct", "sys.cpu_pct"
    label: str  # short name for a legend: "gpu0", "w1", "sys"
    source: str  # the metric source that produced it: "host", "nvml", "sampler"
    unit: str  # "%", "MiB", "W", ... ("" when the name carries no known unit)
    t: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class StepBar:
    """One step, or a group of consecutive steps of the same kind (all warm-up or all measured), as means."""

    first_step: int
    last_step: int
    count: int  # steps in the group (1 at full resolution)
    warmup: bool
    t_start: float  # s since run start
    t_end: float
    step_ms: float  # mean step time of the group
    parts_ms: dict[str, float]  # mean ms per step of each part, keys in Timeline.parts order, "other" last
    stall_ms: float  # mean stall ms per step (see stall_intervals)
    stall_fraction: float  # stall time / step time, of the group's summed times


@dataclass(frozen=True, slots=True)
class StallBucket:
    t_start: float
    t_end: float
    step_s: float  # step time inside the bucket
    stall_s: float  # stall time inside the bucket (see stall_intervals)
    stall_fraction: float  # stall_s / step_s; NaN when no step covers the bucket


@dataclass(frozen=True, slots=True)
class Timeline:
    duration_s: float  # last timestamp of any step or sample (0.0 for an empty run)
    warmup_end_s: float | None  # t_end of the last warm-up step; None when there was none
    on_cuda: bool  # CUDA-event (or simulated sim-event) intervals entered the breakdown and the stall
    parts: tuple[str, ...]  # breakdown parts in order: data_wait, h2d, compute, user phases (sorted), other
    bars: tuple[StepBar, ...]  # ``steps`` grouped ``bar_group`` at a time: at most ``max_bars`` (2 if it is 1)
    bar_group: int
    bucket_s: float
    stall: tuple[StallBucket, ...]
    series: dict[str, Series]  # every sampled metric, by store name, sorted by name
    gpu_util: tuple[Series, ...]  # NVML utilization.gpu per GPU ("gpuN.util_pct"), by GPU index
    host_cpu: Series | None  # system-wide CPU % (psutil, 100% = all cores busy)
    process_cpu: tuple[Series, ...]  # per-process CPU % (100% = one core): main, then w0, w1, ..., then others
    record: RunRecord = field(repr=False, compare=False)  # what ``steps`` is built from

    @property
    def steps(self) -> tuple[StepBar, ...]:
        """One StepBar per recorded step, warm-up included: built when asked for (the plots draw ``bars``; a
        long run's 100,000 StepBars would be most of the time the HTML report takes)."""
        return tuple(step_rows(self.record))


def build_timeline(
    rec: RunRecord, *, bucket_s: float | None = None, max_bars: int = MAX_BARS, max_points: int = MAX_POINTS
) -> Timeline:
    """Everything the HTML plots draw. ``bucket_s`` None picks one (see :func:`auto_bucket_s`)."""
    if max_bars < 1:
        raise ValueError(f"max_bars must be >= 1, got {max_bars}")
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2, got {max_points}")
    if bucket_s is not None and not (bucket_s > 0 and math.isfinite(bucket_s)):
        raise ValueError(f"bucket_s must be a positive number of seconds, got {bucket_s}")
    on_cuda = _on_cuda(rec)
    stalled = stall_intervals(rec)  # once: the union of every step's waits is most of a long run's cost here
    figures = _step_figures(rec, stalled)
    group = max(1, math.ceil(len(figures) / max_bars))
    bars = _group_figures(figures, group)
    # groups never straddle the warm-up boundary, which can cost a bar or two more than len / group
    while len(bars) > max_bars and group < len(figures):
        group += 1
        bars = _group_figures(figures, group)
    series = {m: thin_series(s, max_points) for m, s in sample_series(rec).items()}
    ends = [s.t_end for s in rec.steps] + [t for t, *_ in rec.samples]
    warm = [s.t_end for s in rec.steps if s.warmup]
    width = auto_bucket_s(rec) if bucket_s is None else bucket_s
    return Timeline(
        duration_s=max(ends, default=0.0),
        warmup_end_s=max(warm) if warm else None,
        on_cuda=on_cuda,
        parts=_parts(rec),
        bars=tuple(bars),
        bar_group=group,
        bucket_s=width,
        stall=tuple(rolling_stall(rec, width, stalled=stalled)),
        series=series,
        gpu_util=gpu_util_series(series),
        host_cpu=series.get("sys.cpu_pct"),
        process_cpu=process_cpu_series(series),
        record=rec,
    )


def _on_cuda(rec: RunRecord) -> bool:
    """Same rule as the Summary: a CUDA or simulated device whose phases carry event times."""
    device = rec.meta.get("device") or {}
    return event_timer(device.get("kind")) is not None and any(p.dev_start is not None for p in rec.phases)


def _parts(rec: RunRecord) -> tuple[str, ...]:
    """data_wait, h2d, compute, the top-level phases (sorted; ``sync`` among them also when it is only nested in
    compute), other."""
    names = {p.name for p in rec.phases if p.depth == 0}
    if NESTED_SYNC in {p.name for p in rec.phases if p.depth}:  # a set, not any(): no generator step per phase
        names.add(SYNC_PHASE)
    return (*CORE_PARTS, *sorted(names - set(CORE_PARTS)), "other")


def _device_work(phases: list[PhaseRow]) -> list[Interval]:
    """When the device was working: compute phases and sync phases (an all-reduce runs on the compute stream)."""
    return union(_dev(phases, "compute") + _dev(phases, SYNC_PHASE))


def _dev(phases: list[PhaseRow], name: str) -> list[Interval]:
    return [
        (p.dev_start, p.dev_end) for p in phases if p.name == name and p.dev_start is not None and p.dev_end is not None
    ]


def _host_h2d(phases: list[PhaseRow]) -> list[Interval]:
    return [(p.t_start, p.t_end) for p in phases if p.depth == 0 and p.name == "h2d"]


def stall_intervals(rec: RunRecord) -> list[Interval]:
    """When the device waited for input: sorted, disjoint intervals (see the module invariants)."""
    waits = [(s.t_start, s.t_start + s.data_wait_s) for s in rec.steps]
    if not _on_cuda(rec):
        return union(waits + _host_h2d(rec.phases))
    busy = _device_work(rec.phases)
    return subtract(union(waits + _host_h2d(rec.phases) + _dev(rec.phases, "h2d")), busy)


def _per_step_totals(intervals: list[Interval], steps: list[StepRow]) -> list[float]:
    """Seconds of the (sorted, disjoint) ``intervals`` inside each step's ``[t_start, t_end]``."""
    out = []
    j = 0
    n = len(intervals)
    for s in steps:
        lo, hi = s.t_start, s.t_end
        # steps come in order and do not overlap, so intervals ending before this step never matter again
        while j < n and intervals[j][1] <= lo:
            j += 1
        k = j
        acc = 0.0
        while k < n:
            a, b = intervals[k]
            if a >= hi:
                break
            # max(0, min(b, hi) - max(a, lo)), spelled out: this runs once per step of a long run
            d = (b if b < hi else hi) - (a if a > lo else lo)
            acc += d if d > 0.0 else 0.0
            k += 1
        out.append(acc)
    return out


def step_rows(rec: RunRecord, *, stalled: list[Interval] | None = None) -> list[StepBar]:
    """One :class:`StepBar` per recorded step (warm-up included), in step order; ``stalled`` is
    ``stall_intervals(rec)`` when the caller has it already."""
    figures = _step_figures(rec, stall_intervals(rec) if stalled is None else stalled)
    return [_single(f) for f in figures]


def _single(f: _Figures) -> StepBar:
    s, step_ms, ms, stall_ms, frac = f
    return StepBar(s.step, s.step, 1, s.warmup, s.t_start, s.t_end, step_ms, ms, stall_ms, frac)


# a step's row, step ms, parts ms (Timeline.parts order), stall ms, stall fraction
_Figures = tuple[StepRow, float, dict[str, float], float, float]


def _step_figures(rec: RunRecord, stalled: list[Interval]) -> list[_Figures]:
    """What a StepBar holds of each step, in step order, without building one per step."""
    parts = _parts(rec)
    on_cuda = _on_cuda(rec)
    busy = _device_work(rec.phases) if on_cuda else []
    by_step: dict[int, list[PhaseRow]] = defaultdict(list)
    for p in rec.phases:
        by_step[p.step].append(p)
    steps = sorted(rec.steps, key=lambda s: s.t_start)
    stall_s = _per_step_totals(stalled, steps)
    zero = dict.fromkeys(parts, 0.0)
    summed = [k for k in parts if k != "other"]
    fsum, nan, none = math.fsum, math.nan, ()
    out: list[_Figures] = []
    # once per step of a long run: no StepBar, names hoisted, max/min spelled out where it counts
    for s, stall in zip(steps, stall_s, strict=True):
        phases = by_step.get(s.step, none)
        ms = zero.copy()
        ms["data_wait"] = s.data_wait_s * 1e3
        for p in phases:
            if p.depth == 0:
                ms[p.name] += (p.t_end - p.t_start) * 1e3
            elif p.name == NESTED_SYNC:  # as in the Summary: compute excludes the sync nested in it
                ms["compute"] -= (p.t_end - p.t_start) * 1e3
                ms[SYNC_PHASE] += (p.t_end - p.t_start) * 1e3
        if on_cuda:
            host = union(_host_h2d(list(phases)))
            drained = (total(host) - total(subtract(host, busy))) * 1e3
            ms["h2d"] -= drained
            ms["compute"] += drained
        step_ms = (s.t_end - s.t_start) * 1e3
        ms["other"] = max(0.0, step_ms - fsum([ms[k] for k in summed]))
        stall_ms = stall * 1e3
        frac = stall_ms / step_ms if step_ms > 0 else nan
        out.append((s, step_ms, ms, stall_ms, frac))
    return out


def group_steps(steps: list[StepBar], size: int) -> list[StepBar]:
    """Means over runs of ``size`` consecutive steps; a group never mixes warm-up and measured steps."""
    if size < 1:
        raise ValueError(f"group size must be >= 1, got {size}")
    if size == 1:
        return list(steps)
    out: list[StepBar] = []
    chunk: list[StepBar] = []
    for s in steps:
        if chunk and (len(chunk) == size or chunk[0].warmup != s.warmup):
            out.append(_merge(chunk))
            chunk = []
        chunk.append(s)
    if chunk:
        out.append(_merge(chunk))
    return out


def _group_figures(figures: list[_Figures], size: int) -> list[StepBar]:
    """``group_steps(step_rows(...), size)`` from the steps' figures: no StepBar per step (same sums: fsum of the
    same floats)."""
    if size == 1:
        return [_single(f) for f in figures]
    out: list[StepBar] = []
    i = 0
    while i < len(figures):
        j = i + 1
        while j < len(figures) and j - i < size and figures[j][0].warmup == figures[i][0].warmup:
            j += 1
        chunk = figures[i:j]
        n = len(chunk)
        step_total = math.fsum([f[1] for f in chunk])
        parts = {k: math.fsum([f[2][k] for f in chunk]) / n for k in chunk[0][2]}
        stall_ms = math.fsum([f[3] for f in chunk]) / n
        first, last = chunk[0][0], chunk[-1][0]
        frac = stall_ms * n / step_total if step_total > 0 else math.nan
        bar = StepBar(
            first.step, last.step, n, first.warmup, first.t_start, last.t_end, step_total / n, parts, stall_ms, frac
        )
        out.append(bar)
        i = j
    return out


def _merge(chunk: list[StepBar]) -> StepBar:
    n = sum(s.count for s in chunk)
    if n == len(chunk):  # single steps (x * 1 is x): lists, not generators, for a long run's 100,000 steps
        step_total = math.fsum([s.step_ms for s in chunk])
        parts = {k: math.fsum([s.parts_ms[k] for s in chunk]) / n for k in chunk[0].parts_ms}
        stall_ms = math.fsum([s.stall_ms for s in chunk]) / n
    else:
        step_total = math.fsum(s.step_ms * s.count for s in chunk)
        parts = {k: math.fsum(s.parts_ms[k] * s.count for s in chunk) / n for k in chunk[0].parts_ms}
        stall_ms = math.fsum(s.stall_ms * s.count for s in chunk) / n
    return StepBar(
        first_step=chunk[0].first_step,
        last_step=chunk[-1].last_step,
        count=n,
        warmup=chunk[0].warmup,
        t_start=chunk[0].t_start,
        t_end=chunk[-1].t_end,
        step_ms=step_total / n,
        parts_ms=parts,
        stall_ms=stall_ms,
        stall_fraction=stall_ms * n / step_total if step_total > 0 else math.nan,
    )


def auto_bucket_s(rec: RunRecord) -> float:
    """A 1-2-5 bucket width holding >= ``STEPS_PER_BUCKET`` median steps and giving <= ``MAX_BUCKETS`` buckets."""
    if not rec.steps:
        return 1.0
    median = quantile([s.t_end - s.t_start for s in rec.steps], 0.5)
    span = rec.steps[-1].t_end - min(s.t_start for s in rec.steps)
    return nice_ceil(max(median * STEPS_PER_BUCKET, span / MAX_BUCKETS, 1e-3))


def nice_ceil(x: float) -> float:
    """The smallest of 1, 2, 5 x 10**k that is >= x (x > 0)."""
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"nice_ceil needs a positive finite number, got {x}")
    exp = math.floor(math.log10(x))
    for m in (1.0, 2.0, 5.0, 10.0):
        v = m * 10.0**exp
        # log10 rounding can leave v a hair under x for exact powers and multiples
        if v >= x * (1 - 1e-12):
            return v
    return 10.0 ** (exp + 1)  # pragma: no cover - the loop always returns at m = 10


def _bucket_totals(intervals: list[Interval], start: float, width: float, n: int) -> list[float]:
    """Seconds of the (disjoint) ``intervals`` inside each of ``n`` buckets ``[start + k*width, ...)``."""
    out = [0.0] * n
    for a, b in intervals:
        k = max(0, int((a - start) // width))
        while k < n:
            lo = start + k * width
            hi = lo + width
            if lo >= b:
                break
            d = (b if b < hi else hi) - (a if a > lo else lo)  # max(0, min(b, hi) - max(a, lo)), spelled out
            if d > 0.0:
                out[k] += d
            k += 1
    return out


def rolling_stall(rec: RunRecord, bucket_s: float, *, stalled: list[Interval] | None = None) -> list[StallBucket]:
    """Time-weighted stall fraction per bucket of ``bucket_s`` s, over the span of the recorded steps; ``stalled``
    is ``stall_intervals(rec)`` when the caller has it already."""
    if not rec.steps:
        return []
    first = min(s.t_start for s in rec.steps)
    last = max(s.t_end for s in rec.steps)
    start = math.floor(first / bucket_s) * bucket_s
    n = max(1, math.ceil((last - start) / bucket_s - 1e-9))
    covered = _bucket_totals(union((s.t_start, s.t_end) for s in rec.steps), start, bucket_s, n)
    in_stall = _bucket_totals(stall_intervals(rec) if stalled is None else stalled, start, bucket_s, n)
    return _stall_buckets(covered, in_stall, start, bucket_s)


def _stall_buckets(covered: list[float], in_stall: list[float], start: float, bucket_s: float) -> list[StallBucket]:
    return [
        StallBucket(
            t_start=start + k * bucket_s,
            t_end=start + (k + 1) * bucket_s,
            step_s=covered[k],
            stall_s=min(in_stall[k], covered[k]),
            stall_fraction=min(in_stall[k], covered[k]) / covered[k] if covered[k] > 0 else math.nan,
        )
        for k in range(len(covered))
    ]


def _unit(metric: str) -> str:
    # longest suffix first: "_mbps" must not be taken for "_mb"
    for suffix, unit in sorted(_UNITS, key=lambda su: -len(su[0])):
        if metric.endswith(suffix):
            return unit
    return ""


def _label(metric: str) -> str:
    head = metric.rsplit(".", 1)[0]
    return head.removeprefix("proc.")


def sample_series(rec: RunRecord) -> dict[str, Series]:
    """Every sampled metric as a :class:`Series`, keyed by store name, sorted by name."""
    times: dict[str, list[float]] = defaultdict(list)
    values: dict[str, list[float]] = defaultdict(list)
    sources: dict[str, str] = {}
    for t, source, metric, value in sorted(rec.samples, key=lambda r: r[0]):
        times[metric].append(t)
        values[metric].append(math.nan if value is None else float(value))
        sources.setdefault(metric, source)
    return {
        m: Series(
            metric=m, label=_label(m), source=sources[m], unit=_unit(m), t=tuple(times[m]), values=tuple(values[m])
        )
        for m in sorted(times)
    }


def thin_series(s: Series, max_points: int = MAX_POINTS) -> Series:
    """``s`` with at most ``max_points`` points: each of ``max_points // 2`` runs of consecutive readings gives its
    lowest and highest reading (time order); a run with no finite value gives one NaN at its first time (a gap)."""
    n = len(s.t)
    if n <= max_points:
        return s
    runs = max_points // 2
    t_out: list[float] = []
    v_out: list[float] = []
    for k in range(runs):
        a, b = k * n // runs, (k + 1) * n // runs
        finite = [i for i in range(a, b) if math.isfinite(s.values[i])]
        if not finite:
            t_out.append(s.t[a])
            v_out.append(math.nan)
            continue
        lo = min(finite, key=lambda i: s.values[i])
        hi = max(finite, key=lambda i: s.values[i])
        for i in sorted({lo, hi}):
            t_out.append(s.t[i])
            v_out.append(s.values[i])
    return Series(metric=s.metric, label=s.label, source=s.source, unit=s.unit, t=tuple(t_out), values=tuple(v_out))


def _index(s: str) -> int:
    return int(s) if s.isdigit() else 1 << 30


def gpu_util_series(series: dict[str, Series]) -> tuple[Series, ...]:
    """Each GPU's utilisation series, in the GPUs' order."""
    util = (s for m, s in series.items() if m.startswith("gpu") and m.endswith(".util_pct"))
    return tuple(sorted(util, key=lambda s: _index(s.label[3:])))


def process_cpu_series(series: dict[str, Series]) -> tuple[Series, ...]:
    """Per-process CPU %: ``main`` first, then workers by index (w0, w1, ... w10), then any other process.

    The aggregates ``children`` and ``total`` are left out: they are sums of the processes shown.
    """
    procs = [
        s
        for m, s in series.items()
        if m.startswith("proc.") and m.endswith(".cpu_pct") and s.label not in ("children", "total")
    ]

    def order(s: Series) -> tuple[int, int, str]:
        if s.label == "main":
            return (0, 0, "")
        if s.label[:1] == "w" and s.label[1:].isdigit():
            return (1, int(s.label[1:]), "")
        return (2, 0, s.label)

    return tuple(sorted(procs, key=order))


# -- from a store read in bulk ----------------------------------------------------------------------------
# build_timeline of a long run without a row object per step or phase: the same Timeline, to the last bit (each
# per-step figure by the same float operations; every sum in the rows' order: np.bincount adds in order from 0.0;
# every fsum of the same floats), except that its ``record`` is empty (as the report cache's: no report draws
# ``steps``). tests/test_report_cache.py checks the two are equal.


def timeline_of_columns(cols: RunColumns, *, max_bars: int = MAX_BARS, max_points: int = MAX_POINTS) -> Timeline:
    """``build_timeline(cols.record())`` with an empty ``record``; from the rows where the bars are the steps
    themselves (a short run), the phases carry device times, or a phase is named ``other``."""
    import numpy as np

    st, ph = cols.steps, cols.phases
    light = RunRecord(cols.meta, [], [], cols.samples, cols.events, cols.stacks_text, cols.windows)
    kind = (cols.meta.get("device") or {}).get("kind")
    device_events = event_timer(kind) is not None and not np.isnan(ph.dev_start).all()
    if len(st) <= max_bars or device_events or "other" in ph.names:
        rows = build_timeline(cols.record(), max_bars=max_bars, max_points=max_points)
        return Timeline(**{f: getattr(rows, f) for f in Timeline.__slots__ if f != "record"}, record=light)
    h2d = _named(ph, "h2d", depth0=True)
    stalled = _union_arrays(np.concatenate([st.t_start, ph.t_start[h2d]]), np.concatenate([st.t_start + st.data_wait_s,
                            ph.t_end[h2d]]))  # fmt: skip
    parts = _parts_of(cols)
    bars, group = _bars_of_columns(cols, parts, stalled, max_bars)
    series = {m: thin_series(s, max_points) for m, s in sample_series(light).items()}
    ends = [float(st.t_end.max()), *(t for t, *_ in cols.samples)]
    width = nice_ceil(
        max(
            quantile((st.t_end - st.t_start).tolist(), 0.5) * STEPS_PER_BUCKET,
            (float(st.t_end[-1]) - float(st.t_start.min())) / MAX_BUCKETS,
            1e-3,
        )
    )
    return Timeline(
        duration_s=max(ends),
        warmup_end_s=float(st.t_end[st.warmup].max()) if st.warmup.any() else None,
        on_cuda=False,
        parts=parts,
        bars=tuple(bars),
        bar_group=group,
        bucket_s=width,
        stall=tuple(_stall_of_columns(cols, width, stalled)),
        series=series,
        gpu_util=gpu_util_series(series),
        host_cpu=series.get("sys.cpu_pct"),
        process_cpu=process_cpu_series(series),
        record=light,
    )


def _named(ph: PhaseColumns, name: str, *, depth0: bool = False) -> NDArray[np.bool_]:
    """The phases called ``name`` (at the top level only, where asked)."""
    import numpy as np

    if name not in ph.names:
        return np.zeros(len(ph), bool)
    hit: NDArray[np.bool_] = ph.name == ph.names.index(name)
    return hit & (ph.depth == 0) if depth0 else hit


def _parts_of(cols: RunColumns) -> tuple[str, ...]:
    """:func:`_parts` of the columns."""
    import numpy as np

    ph = cols.phases
    names = {ph.names[k] for k in np.unique(ph.name[ph.depth == 0]).tolist()}
    if NESTED_SYNC in {ph.names[k] for k in np.unique(ph.name[ph.depth != 0]).tolist()}:
        names.add(SYNC_PHASE)
    return (*CORE_PARTS, *sorted(names - set(CORE_PARTS)), "other")


def _union_arrays(a: Floats, b: Floats) -> tuple[Floats, Floats]:
    """:func:`union` of the intervals ``(a[i], b[i])``: the same starts and ends, as two sorted arrays."""
    import numpy as np

    keep = b > a
    a, b = a[keep], b[keep]
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    if not len(a):
        return a, b
    reach = np.maximum.accumulate(b)  # within a merged interval, its end so far
    first = np.flatnonzero(np.concatenate([[True], a[1:] > reach[:-1]]))
    last = np.concatenate([first[1:], [len(a)]]) - 1
    return a[first], reach[last]


def _overlaps(lo: Floats, hi: Floats, ua: Floats, ub: Floats, first: NDArray[np.int64]) -> Floats:
    """For each span ``[lo[i], hi[i])`` the seconds of the sorted, disjoint intervals ``(ua, ub)`` inside it, added
    in the intervals' order from ``first[i]`` (the first that may overlap it) as the loops of
    :func:`_per_step_totals` and :func:`_bucket_totals` add them."""
    import numpy as np

    stop = np.maximum(first, np.searchsorted(ua, hi, side="left"))
    count = np.maximum(stop - first, 0)
    span = np.repeat(np.arange(len(lo)), count)
    k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
    d = np.minimum(ub[k], hi[span]) - np.maximum(ua[k], lo[span])
    return np.asarray(np.bincount(span, weights=np.where(d > 0.0, d, 0.0), minlength=len(lo)), np.float64)


def _bars_of_columns(
    cols: RunColumns, parts: tuple[str, ...], stalled: tuple[Floats, Floats], max_bars: int
) -> tuple[list[StepBar], int]:
    """:func:`_step_figures` then :func:`_group_figures` (groups of two steps or more) of the columns."""
    import numpy as np

    st, ph = cols.steps, cols.phases
    order = np.argsort(st.t_start, kind="stable")  # the steps by start, as _step_figures sorts them
    n_steps, n_parts = len(order), len(parts)
    place = np.empty(n_steps, np.int64)
    place[order] = np.arange(n_steps)
    # each phase's step, by its place in that order; a phase of no recorded step adds to no step
    at = np.searchsorted(st.step, ph.step).clip(0, max(n_steps - 1, 0))
    known = st.step[at] == ph.step if n_steps else np.zeros(len(ph), bool)
    part_of = np.array([parts.index(n) if n in parts else -1 for n in ph.names], np.int64)
    top = known & (ph.depth == 0)
    nested = known & (ph.depth != 0) & _named(ph, NESTED_SYNC)
    ms = (ph.t_end - ph.t_start) * 1e3
    # what each phase adds, in the phases' order; a step's data wait first (the loop starts from it)
    i_top, i_nest = np.flatnonzero(top), np.flatnonzero(nested)
    compute, sync = parts.index("compute"), parts.index(SYNC_PHASE) if SYNC_PHASE in parts else 0
    seq = np.concatenate([np.full(n_steps, -1), i_top, i_nest, i_nest])
    cell = np.concatenate([
        np.arange(n_steps) * n_parts + parts.index("data_wait"),
        place[at[i_top]] * n_parts + part_of[ph.name[i_top]],
        place[at[i_nest]] * n_parts + compute,
        place[at[i_nest]] * n_parts + sync,
    ])  # fmt: skip
    value = np.concatenate([st.data_wait_s[order] * 1e3, ms[i_top], -ms[i_nest], ms[i_nest]])
    by = np.argsort(seq, kind="stable")
    table = np.bincount(cell[by], weights=value[by], minlength=n_steps * n_parts).reshape(n_steps, n_parts)
    step_ms = (st.t_end[order] - st.t_start[order]) * 1e3
    summed = [table[:, k].tolist() for k, name in enumerate(parts) if name != "other"]
    left = step_ms - np.array(list(map(math.fsum, zip(*summed, strict=True))))
    table[:, parts.index("other")] = np.where(left > 0.0, left, 0.0)
    lo, hi = st.t_start[order], st.t_end[order]
    ua, ub = stalled
    stall_ms = _overlaps(lo, hi, ua, ub, np.searchsorted(ub, lo, side="right")) * 1e3
    warm = st.warmup[order]
    group = max(1, math.ceil(n_steps / max_bars))
    while _chunk_count(warm, group) > max_bars and group < n_steps:
        group += 1
    columns = [table[:, k].tolist() for k in range(n_parts)]
    step_l, stall_l = step_ms.tolist(), stall_ms.tolist()
    steps_l, warm_l, lo_l, hi_l = st.step[order].tolist(), warm.tolist(), lo.tolist(), hi.tolist()
    bars = []
    for i, j in _chunks(warm, group):
        n = j - i
        step_total = math.fsum(step_l[i:j])
        chunk_ms = {name: math.fsum(columns[k][i:j]) / n for k, name in enumerate(parts)}
        mean_stall = math.fsum(stall_l[i:j]) / n
        frac = mean_stall * n / step_total if step_total > 0 else math.nan
        bars.append(StepBar(steps_l[i], steps_l[j - 1], n, warm_l[i], lo_l[i], hi_l[j - 1], step_total / n, chunk_ms,
                            mean_stall, frac))  # fmt: skip
    return bars, group


def _runs(warm: NDArray[np.bool_]) -> list[tuple[int, int]]:
    """The runs of consecutive steps all warm-up or all measured: (first, end) indices."""
    import numpy as np

    cuts = [0, *(np.flatnonzero(warm[1:] != warm[:-1]) + 1).tolist(), len(warm)]
    return list(itertools.pairwise(cuts))


def _chunk_count(warm: NDArray[np.bool_], size: int) -> int:
    return sum(-(-(b - a) // size) for a, b in _runs(warm))


def _chunks(warm: NDArray[np.bool_], size: int) -> list[tuple[int, int]]:
    """:func:`_group_figures`' groups: ``size`` consecutive steps, a group never mixing warm-up and measured."""
    return [(i, min(i + size, b)) for a, b in _runs(warm) for i in range(a, b, size)]


def _stall_of_columns(cols: RunColumns, bucket_s: float, stalled: tuple[Floats, Floats]) -> list[StallBucket]:
    """:func:`rolling_stall` of the columns."""
    import numpy as np

    st = cols.steps
    first, last = float(st.t_start.min()), float(st.t_end.max())
    start = math.floor(first / bucket_s) * bucket_s
    n = max(1, math.ceil((last - start) / bucket_s - 1e-9))
    lo = start + np.arange(n, dtype=np.float64) * bucket_s
    hi = lo + bucket_s

    def totals(ua: Floats, ub: Floats) -> list[float]:
        # _bucket_totals adds interval by interval, each into the buckets from (a - start) // width on
        k0 = np.maximum(np.floor_divide(ua - start, bucket_s), 0).astype(np.int64)
        return _bucket_sums((lo, hi), (ua, ub), k0)

    covered = totals(*_union_arrays(st.t_start, st.t_end))
    return _stall_buckets(covered, totals(*stalled), start, bucket_s)


def _bucket_sums(
    buckets: tuple[Floats, Floats], intervals: tuple[Floats, Floats], k0: NDArray[np.int64]
) -> list[float]:
    """Interval-major: bucket k gets each interval's part in it, in the intervals' order (``k0``: each interval's
    first bucket)."""
    import numpy as np

    (lo, hi), (ua, ub), n = buckets, intervals, len(buckets[0])
    stop = np.minimum(np.maximum(k0, np.searchsorted(lo, ub, side="left")), n)
    count = np.maximum(stop - k0, 0)
    which = np.repeat(np.arange(len(ua)), count)
    k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(k0, count)
    d = np.minimum(ub[which], hi[k]) - np.maximum(ua[which], lo[k])
    return list(np.bincount(k, weights=np.where(d > 0.0, d, 0.0), minlength=n).tolist())


__all__ = [
    "CORE_PARTS",
    "Series",
    "StallBucket",
    "StepBar",
    "Timeline",
    "auto_bucket_s",
    "build_timeline",
    "group_steps",
    "nice_ceil",
    "process_cpu_series",
    "rolling_stall",
    "sample_series",
    "stall_intervals",
    "step_rows",
    "timeline_of_columns",
]
