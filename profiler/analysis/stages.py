"""The loader's stages: each item's time in fetch, decode, augment and collate, what the loader can deliver at
those times (its capacity), what the training consumes (its demand), and the stage that holds it back.

Pure: the ``stages`` source's cumulative readings (:mod:`profiler.core.sources.stages`) in, a
:class:`LoaderStages` out. The times are measured where the stages run (the built-in data sets and the
collate time themselves: :mod:`pipelines.stages`); capacity and demand are derived from them and the run's
step times. docs/metrics.md, "Loader stages", defines the figures.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict

from profiler.analysis.loader_time import LoaderTime, busy_pct
from profiler.analysis.meta import JSON
from profiler.analysis.stats import Interval, json_safe

METHOD = (
    "each stage timed with perf_counter where it runs (the data set's fetch, decode and augment, the collate of "
    "each batch), summed over the loader processes; capacity = loader processes / the stages' time per item"
)
CAPACITY_DERIVED = (
    "derived from the measured stage times: an upper bound, the loader's work outside the stages, moving each "
    "batch between processes, is not in it"
)
CAPACITY_HANDOFF = (
    "derived from the measured stage times and each batch's measured hand-off to the training process: an upper "
    "bound, what the workers do outside both is not in it"
)
HANDOFF = "handoff"  # the workers' counter of each batch's hand-off (pipelines.stages.HANDOFF): no stage
DALI_METHOD = (
    "DALI gives no per-operator times: the graph's prefixes (the reader; the reader and the decoder; the whole "
    "graph) each run alone before training with the run's threads, in turn, {rounds} rounds of {batches} batches "
    "of {batch} each, every batch of a round queued and collected inside its clock, the median round of each "
    "(perf_counter); a stage's time per item is "
    "what adding it cost (the difference of two "
    "prefixes), times its threads: the time in the thread that ran it"
)
KEEPS_UP = 1.1  # capacity at least this multiple of the demand: the loader keeps up
COVERED = 0.8  # the timed stages' share of the measured loader time per item below which no capacity is given
LOADER_TIME_IN_PROCESS = (
    "the loader's time per item measured as the data wait per item: with 0 workers the loader runs inside the "
    "training's wait for each batch"
)
LOADER_TIME_WORKERS = (
    "the loader's time per item measured as the workers' busy time per item they loaded: their wall time less their "
    "wait for work, from the loader processes' time table, over the items the stages counted in the same window"
)
STORE_SATURATED = 0.9  # an emulated store busy this share of the time or more is the loader's limit
_METRIC = re.compile(r"stage\.([a-z]+)\.(s|n)")
FIXES = {
    "fetch": "the bytes come slowly: cache the data set (page cache, local disk), use a faster store or larger "
    "sequential reads (shards); more workers help where the fetch waits rather than computes",
    "store": "the store serves reads one after another and is saturated: more workers would only queue more reads "
    "behind it; cache the data set, use a faster store, or store fewer bytes an item (smaller images, compression)",
    "decode": "a faster decoder (DALI, a SIMD JPEG library), or smaller stored images",
    "augment": "cheaper augmentation, or augmentation on the accelerator (DALI, torchvision v2 on device tensors)",
    "collate": "fewer, larger tensors per item (the collate copies each into the batch)",
}


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    ms_per_item: float
    share: float  # of an item's time in the stages, 0..1
    capacity_samples_per_s: float  # this stage alone: the loader processes / its time per item


@dataclass(frozen=True, slots=True)
class LoaderStages:
    method: str
    stages: tuple[Stage, ...]
    processes: int  # the loader processes that run the stages: the workers, or 1 (the training process)
    capacity_samples_per_s: float  # DERIVED from MEASURED times: processes / (the stages' ms per item); an upper
    # bound: moving each batch between processes is outside the stages (imagenet here: 648 derived, 482 measured)
    demand_samples_per_s: float  # batch / (step time - data wait): what the training consumes at its own pace
    headroom: float  # capacity / demand (NaN without a demand)
    bottleneck: str | None  # the slowest stage, when the loader cannot keep up
    headline: str
    # an emulated store (run --store-mbps): its throughput, and per item read the wait for it (inside fetch) and
    # the bytes; MEASURED by the store's own pacing (pipelines/store.py), None without one
    store_mbps: float | None = None
    store_wait_ms_per_item: float | None = None
    bytes_per_item: float | None = None
    store_busy: float | None = None  # DERIVED: items read per second x bytes per item / the store's rate, 0..1
    capacity_basis: str = CAPACITY_DERIVED  # how the capacity was had: derived, or measured (DALI's whole graph)
    runners: str | None = None  # what runs the stages, where not loader processes ("DALI's 2 threads")
    where: str | None = None  # where the stages ran, as the headline says it ("in 2 worker processes")
    # MEASURED apart from the stages: the loader's time per item (loader_ms_per_item) and how (loader_basis); the
    # timed stages' share of it (coverage, DERIVED). Below COVERED the capacity, headroom and bottleneck are NaN /
    # None: a capacity that leaves untimed work out is too high by what it leaves out. None: not checked.
    loader_ms_per_item: float | None = None
    loader_basis: str | None = None
    coverage: float | None = None
    coverage_line: str | None = None  # the check in words, for the caption
    # of loader_ms_per_item, the workers' wait for a CPU (schedstat): said, not taken out, since the stages' and the
    # hand-off's wall clocks hold the waits that fell inside them as the busy time does
    loader_runq_ms_per_item: float | None = None
    # MEASURED with workers: each batch's hand-off to the training process per item (the workers' wall time from a
    # collate's end to their next stage, less their wait for the next indices, sampled); in the capacity and the
    # coverage beside the stages. None: not measured (0 workers: the training process hands nothing over)
    handoff_ms_per_item: float | None = None

    @property
    def uncovered(self) -> bool:
        """The timed stages hold less than :data:`COVERED` of the measured loader time (or it was not measured):
        no capacity is given."""
        return self.loader_ms_per_item is not None and not (self.coverage or 0.0) >= COVERED

    @property
    def untimed_ms_per_item(self) -> float:
        """The measured loader time per item that no stage holds (NaN where not checked, 0 where fully timed)."""
        if self.loader_ms_per_item is None or self.coverage is None:
            return math.nan
        work_ms = self.loader_ms_per_item
        timed_ms = math.fsum(st.ms_per_item for st in self.stages) + (self.handoff_ms_per_item or 0.0)
        return max(0.0, work_ms - timed_ms)

    @property
    def store_saturated(self) -> bool:
        """The emulated store served reads nearly all the time: more readers only queue behind it."""
        return self.store_busy is not None and self.store_busy >= STORE_SATURATED

    def to_dict(self) -> JSON:
        out: JSON = asdict(self)
        return json_safe(out)


def demand_of(batch_size: float, step_ms: float, data_wait_ms: float) -> float:
    """What the training consumes at its own pace, samples/s: the batch / (step time - data wait); NaN unknown."""
    compute_ms = step_ms - data_wait_ms
    return batch_size / (compute_ms / 1e3) if compute_ms > 0 else math.nan


def loader_stages(
    samples: Sequence[tuple[float, str, str, float | None]],
    window: Interval | None,
    *,
    workers: int,
    batch_size: float,
    step_ms: float,
    data_wait_ms: float,
    store_mbps: float | None = None,
    loader_ms_per_item: float | None = None,
    loader_runq_ms_per_item: float | None = None,
    loader_queue_ms_per_item: float | None = None,
    loader_samples_per_s: float | None = None,
) -> LoaderStages | None:
    """The stages over ``window`` (their first and last readings in it); None without two readings of a stage.
    ``loader_ms_per_item``, ``loader_runq_ms_per_item``: the check against the loader's own time (:func:`checked`);
    ``loader_queue_ms_per_item``: the workers' wait for the next indices, taken out of their hand-off's gaps; with
    ``loader_samples_per_s`` (the rate those were had at) they are put per item the workers loaded (:func:`loaded`)."""
    scale = loaded(samples, window, loader_samples_per_s) if loader_samples_per_s is not None and workers > 0 else 1.0
    loader_ms_per_item, loader_runq_ms_per_item, loader_queue_ms_per_item = (
        None if v is None else v * scale
        for v in (loader_ms_per_item, loader_runq_ms_per_item, loader_queue_ms_per_item)
    )
    times = per_item(samples, window, with_handoff=True)
    gap_s = times.pop(HANDOFF, None)
    if not times:
        return None
    total, processes = math.fsum(times.values()), max(1, workers)
    handoff_ms = handoff_of(gap_s, loader_queue_ms_per_item, workers)
    work = total + (handoff_ms or 0.0) / 1e3  # the loader's timed seconds per item: the stages, the hand-off
    check = checked(1e3 * work, loader_ms_per_item, loader_runq_ms_per_item, workers, handoff=handoff_ms is not None)
    # at any worker count: a capacity that leaves untimed work out is too high by it (with workers, their busy time
    # holds each batch's hand-off too: without it a CI run's truth case, its stages right, read 60-72% covered)
    short = check["coverage"] is not None and not check["coverage"] >= COVERED
    stages = _rows(times, processes, short=short)
    capacity = math.nan if short else processes / work if work > 0 else math.inf
    demand = demand_of(batch_size, step_ms, data_wait_ms)
    headroom = capacity / demand if demand > 0 else math.nan
    slowest = max(stages, key=lambda st: st.ms_per_item)
    bottleneck = slowest.name if headroom < KEEPS_UP else None
    store = store_per_item(samples, window)
    busy = store["reads_per_s"] * store["bytes"] / (store_mbps * 1e6) if store_mbps is not None and store else None
    where = where_ran(workers)
    headline = (
        _short_headline(slowest, 1e3 * work, loader_ms_per_item, where, handoff_ms=handoff_ms)
        if short and loader_ms_per_item is not None
        else _headline(slowest, capacity, demand, headroom, where, saturated=(busy or 0.0) >= STORE_SATURATED)
    ) + _store_words(store, store_mbps, busy)
    return LoaderStages(
        METHOD, stages, processes, capacity, demand, headroom, bottleneck, headline, store_mbps if store else None,
        store["wait_s"] * 1e3 if store else None, store["bytes"] if store else None, busy,
        capacity_basis=CAPACITY_HANDOFF if handoff_ms is not None else CAPACITY_DERIVED, where=where,
        handoff_ms_per_item=handoff_ms, **check,
    )  # fmt: skip


def loaded(samples: Sequence[tuple[float, str, str, float | None]], window: Interval | None, per_s: float) -> float:
    """``per_s`` over the items the loader processes loaded a second in ``window`` (the stages' counts between their
    first and last readings): a figure per sample trained times this is per item loaded, over the same items as the
    stages' times. The training's rate and the workers' part ways over a short window as the prefetched batches fill
    or drain; 1 where the counts give no rate."""
    first: dict[str, tuple[float, float]] = {}
    last: dict[str, tuple[float, float]] = {}
    for t, _source, metric, value in samples:
        m = _METRIC.fullmatch(metric)
        if m is None or m.group(2) != "n" or m.group(1) == HANDOFF or value is None or math.isnan(value):
            continue
        if window is None or window[0] <= t <= window[1]:
            first.setdefault(m.group(1), (t, value))
            last[m.group(1)] = (t, value)
    order = ("fetch", "decode", "augment", "collate")  # the first stage an item meets counts it first
    ranked = sorted((k for k in first if last[k][0] > first[k][0]), key=lambda k: order.index(k) if k in order else 4)
    rate = (last[k][1] - first[k][1]) / (last[k][0] - first[k][0]) if (k := next(iter(ranked), None)) else math.nan
    return per_s / rate if rate > 0 and per_s > 0 else 1.0


def _rows(times: dict[str, float], processes: int, *, short: bool) -> tuple[Stage, ...]:
    """The stages in the order they run, each with its share and its capacity alone (NaN where ``short``)."""
    order = ("fetch", "decode", "augment", "collate")
    total = math.fsum(times.values())
    return tuple(
        Stage(name, 1e3 * s, s / total if total > 0 else math.nan,
              math.nan if short else processes / s if s > 0 else math.inf)
        for name, s in sorted(times.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    )  # fmt: skip


def handoff_of(gap_s: float | None, queue_ms: float | None, workers: int) -> float | None:
    """The hand-off per item, ms: the workers' gaps from a collate's end to their next stage (``gap_s`` a item,
    MEASURED) less their wait for the next indices in them (``queue_ms``, from the loader time table: sampled), never
    below 0; None with 0 workers, or where either was not measured."""
    if workers <= 0 or gap_s is None or queue_ms is None or math.isnan(gap_s) or math.isnan(queue_ms):
        return None
    return max(0.0, 1e3 * gap_s - queue_ms)


def _store_words(store: dict[str, float], store_mbps: float | None, busy: float | None) -> str:
    if busy is None or store_mbps is None:
        return ""
    return (
        f" (an emulated store of {store_mbps:g} MB/s: {store['wait_s'] * 1e3:.1f} ms of each item's fetch "
        f"waited for it, {store['bytes'] / 1e3:.0f} kB an item, the store busy {busy:.0%} of the time"
        + (": saturated" if busy >= STORE_SATURATED else "")
        + ")"
    )


class Check(TypedDict):
    """The timed stages against the loader's own time: :class:`LoaderStages`' fields of it."""

    loader_ms_per_item: float | None
    loader_basis: str | None
    coverage: float | None
    coverage_line: str | None
    loader_runq_ms_per_item: float | None


def checked(
    timed_ms: float, loader_ms: float | None, runq_ms: float | None, workers: int, *, handoff: bool = False
) -> Check:
    """The timed stages (``timed_ms`` an item, with each batch's hand-off where ``handoff``) against ``loader_ms``,
    the loader's time per item MEASURED apart from them (:func:`loader_ms_per_item`): where they hold less than
    :data:`COVERED` of it (or it is NaN: not measured), no capacity is given. None leaves the check out (a caller
    with no such measure). ``runq_ms``: the part of it the workers spent waiting for a CPU, said (the timed parts'
    wall clocks hold it too: it is no untimed work, and taking it out of one side only read 936% covered)."""
    if loader_ms is None:
        return {"loader_ms_per_item": None, "loader_basis": None, "coverage": None, "coverage_line": None,
                "loader_runq_ms_per_item": runq_ms}  # fmt: skip
    basis = LOADER_TIME_WORKERS if workers > 0 else LOADER_TIME_IN_PROCESS
    # the workers' wait for a CPU is no work a stage left out (the cores were taken): the stages are checked against
    # the loader's time less that wait (a stage's own clock holds the wait that fell inside it, so this errs high)
    work_ms = loader_ms
    if runq_ms is not None and runq_ms > 0:
        basis = f"{basis}; {runq_ms:.2f} ms an item of it the workers' wait for a CPU, in the timed parts' clocks too"
    return {"loader_ms_per_item": loader_ms, "loader_basis": basis, "coverage": _coverage(timed_ms, work_ms),
            "coverage_line": coverage_text(timed_ms, work_ms, basis, handoff=handoff),
            "loader_runq_ms_per_item": runq_ms}  # fmt: skip


def loader_ms_per_item(
    workers: int, *, batch_size: float, data_wait_ms: float, worker_busy_pct: float, samples_per_s: float
) -> float:
    """The loader's time per item, ms, MEASURED apart from the stages: with 0 workers the data wait per item (the
    loader runs inside the training's wait for each batch); with workers, their busy time (``worker_busy_pct``: the
    sum over the workers of their wall time less their wait for work, %, from
    :func:`profiler.analysis.loader_time.busy_pct`) per sample trained. NaN where a figure is missing."""
    if workers <= 0:
        return data_wait_ms / batch_size if batch_size > 0 else math.nan
    return 10.0 * worker_busy_pct / samples_per_s if samples_per_s > 0 else math.nan


class PerItem(TypedDict):
    """The loader's time per item measured apart from the stages, and the workers' wait for a CPU in it (None with
    0 workers): :func:`loader_stages`' keywords."""

    loader_ms_per_item: float
    loader_runq_ms_per_item: float | None
    loader_queue_ms_per_item: float | None
    loader_samples_per_s: float


def per_item_of(
    times: LoaderTime | None, workers: int, batch_size: float, data_wait_ms: float, samples_per_s: float
) -> PerItem:
    """The loader's time per item (:func:`loader_ms_per_item`) from the run's loader time figures (the workers'
    rows; NaN with workers and no row) and step figures; with workers, their waits for a CPU and for work per item."""
    rows = [p for p in times.processes if p.label != "main"] if times is not None else []

    def per_item(pct: float) -> float:
        return loader_ms_per_item(
            workers, batch_size=batch_size, data_wait_ms=data_wait_ms, worker_busy_pct=pct, samples_per_s=samples_per_s
        )

    busy = math.fsum(map(busy_pct, rows)) if rows else math.nan
    runq = per_item(math.fsum(p.runq for p in rows)) if rows and workers > 0 else None
    queue = per_item(math.fsum(p.queue for p in rows)) if rows and workers > 0 else None
    return {"loader_ms_per_item": per_item(busy), "loader_runq_ms_per_item": runq, "loader_queue_ms_per_item": queue,
            "loader_samples_per_s": samples_per_s}  # fmt: skip


def dali_stages(meta: JSON, *, step_ms: float, data_wait_ms: float) -> LoaderStages | None:
    """A DALI run's stages from its prefixes (``run --dali-stages``: the meta ``dali_stages``), where it timed them."""
    prefixes, batch = meta.get("dali_stages"), meta.get("batch_size")
    if not isinstance(prefixes, dict):
        return None
    batch_size = float(batch) if isinstance(batch, (int, float)) and not isinstance(batch, bool) and batch else math.nan
    return prefix_stages(prefixes, batch_size=batch_size, step_ms=step_ms, data_wait_ms=data_wait_ms)


def _coverage(timed_ms: float, loader_ms: float) -> float:
    if loader_ms == 0 and timed_ms > 0:  # a loader busy for no measurable time: nothing left untimed
        return 1.0
    return timed_ms / loader_ms if loader_ms > 0 else math.nan


def coverage_text(timed_ms: float, loader_ms: float, basis: str, *, handoff: bool = False) -> str:
    """The check of the timed stages (and the hand-off, where ``handoff``) against the measured loader time per
    item, in words (the headline gives the shares where it failed)."""
    if math.isnan(loader_ms):
        return "the loader's time per item was not measured, so the stages' coverage cannot be checked"
    share = _coverage(timed_ms, loader_ms)
    if not share >= COVERED:
        return f"{basis}; a capacity needs {COVERED:.0%} or more of it timed"
    held = "the stages and the batches' hand-off hold" if handoff else "the stages hold"
    return f"checked: {held} {share:.0%} of the loader's {loader_ms:.2f} ms an item ({basis})"


def prefix_stages(prefixes: JSON, *, batch_size: float, step_ms: float, data_wait_ms: float) -> LoaderStages | None:
    """DALI's stages from its prefixes run alone (``pipelines.dali.time_stages``, the run's meta
    ``dali_stages``): each stage the difference of two prefixes' seconds per sample (never below 0), the capacity
    the whole graph's MEASURED rate; None when a prefix is missing."""
    raw = prefixes.get("prefix_s_per_sample")
    per = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float))} if isinstance(raw, dict) else {}
    order = ("fetch", "decode", "augment")
    if not all(per.get(k, 0.0) > 0 for k in order):
        return None
    threads = prefixes.get("threads")
    threads = threads if isinstance(threads, int) and threads > 0 else 1
    # a prefix's wall time per sample with its threads working side by side; a stage's time per item is in one
    # thread (x threads), as a worker's is in one process, so that the columns read alike for every pipeline
    times = {k: threads * max(0.0, per[k] - (per[order[i - 1]] if i else 0.0)) for i, k in enumerate(order)}
    total = math.fsum(times.values())
    stages = tuple(
        Stage(k, 1e3 * t, t / total if total > 0 else math.nan, threads / t if t > 0 else math.inf)
        for k, t in times.items()
    )
    capacity = 1 / per["augment"]
    demand = demand_of(batch_size, step_ms, data_wait_ms)
    headroom = capacity / demand if demand > 0 else math.nan
    slowest = max(stages, key=lambda st: st.ms_per_item)
    runners = f"DALI's {threads} thread{'s' if threads != 1 else ''}"
    method = DALI_METHOD.format(
        rounds=prefixes.get("rounds"), batches=prefixes.get("batches"), batch=prefixes.get("batch_size")
    )
    return LoaderStages(
        method,
        stages,
        threads,
        capacity,
        demand,
        headroom,
        slowest.name if headroom < KEEPS_UP else None,
        _headline(slowest, capacity, demand, headroom, f"on {runners}"),
        capacity_basis="measured: the whole graph run alone before training; the iterator's hand-over to torch "
        "and the training beside it are not in it",
        runners=runners,
        where=f"on {runners}",
    )


def store_per_item(
    samples: Sequence[tuple[float, str, str, float | None]], window: Interval | None
) -> dict[str, float]:
    """The emulated store's seconds waited and bytes per read, and its reads per second, between its first and
    last readings in ``window``; empty without two readings that differ."""
    first: dict[str, tuple[float, float]] = {}
    last: dict[str, tuple[float, float]] = {}
    for t, _source, metric, value in samples:
        if not metric.startswith("store.") or value is None or (window and not window[0] <= t <= window[1]):
            continue
        first.setdefault(metric, (t, value))
        last[metric] = (t, value)
    if "store.reads" not in first:
        return {}
    (t0, r0), (t1, r1) = first["store.reads"], last["store.reads"]
    reads = r1 - r0
    if not reads > 0 or not t1 > t0:
        return {}
    out = {key: (last[f"store.{key}"][1] - first[f"store.{key}"][1]) / reads for key in ("wait_s", "bytes")}
    return {**out, "reads_per_s": reads / (t1 - t0)}


def per_item(
    samples: Sequence[tuple[float, str, str, float | None]], window: Interval | None, *, with_handoff: bool = False
) -> dict[str, float]:
    """Seconds per item of each stage between its first and last reading in ``window`` (and of the workers'
    hand-off, :data:`HANDOFF`, where ``with_handoff``: it is no stage)."""
    first: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], float] = {}
    for t, _source, metric, value in samples:
        m = _METRIC.fullmatch(metric)
        if m is None or value is None or math.isnan(value) or (window and not window[0] <= t <= window[1]):
            continue
        if m.group(1) == HANDOFF and not with_handoff:
            continue
        first.setdefault((m.group(1), m.group(2)), value)
        last[(m.group(1), m.group(2))] = value
    times: dict[str, float] = {}
    for (name, kind), end in last.items():
        items = last.get((name, "n"), math.nan) - first.get((name, "n"), math.nan)
        if kind == "s" and items > 0:
            times[name] = (end - first[(name, "s")]) / items
    return times


def stage_series(samples: Sequence[tuple[float, str, str, float | None]]) -> list[tuple[float, str, float]]:
    """(t, stage, ms per item) over each span between two readings of a stage in which it handled items: the
    stages' times as they went, for a timeline (the trace's "loader stage ms/item" counter)."""
    readings: dict[str, dict[float, dict[str, float]]] = {}
    for t, _source, metric, value in samples:
        m = _METRIC.fullmatch(metric)
        if m is not None and value is not None and not math.isnan(value) and m.group(1) != HANDOFF:
            readings.setdefault(m.group(1), {}).setdefault(t, {})[m.group(2)] = value
    out: list[tuple[float, str, float]] = []
    for name, by_t in readings.items():
        pairs = [(t, r["s"], r["n"]) for t, r in sorted(by_t.items()) if "s" in r and "n" in r]
        for (_t0, s0, n0), (t1, s1, n1) in itertools.pairwise(pairs):
            if n1 > n0:
                out.append((t1, name, 1e3 * (s1 - s0) / (n1 - n0)))
    return sorted(out)


def _short_headline(slowest: Stage, timed_ms: float, loader_ms: float, where: str, *, handoff_ms: float | None) -> str:
    if math.isnan(loader_ms):
        return (
            f"The loader's stages {where}: {timed_ms:.2f} ms an item timed, against no measured loader time: no "
            f"capacity is given; the slowest timed stage is {slowest.name} ({slowest.ms_per_item:.2f} ms an item)"
        )
    handed = f", {handoff_ms:.2f} ms of it the batches' hand-off to the training process" if handoff_ms else ""
    return (
        f"The loader's stages {where} were timed for {_coverage(timed_ms, loader_ms):.0%} of its measured time per "
        f"item ({timed_ms:.2f} of {loader_ms:.2f} ms{handed}); the rest ({loader_ms - timed_ms:.2f} ms) is untimed, so "
        f"no capacity is given; the slowest timed stage is {slowest.name} ({slowest.ms_per_item:.2f} ms an item)"
    )


def where_ran(workers: int) -> str:
    """Where a DataLoader's stages ran, one phrase for every worker count: ``in the training process
    (num_workers=0)``, ``in 1 worker process``, ``in 2 worker processes``."""
    if workers <= 0:
        return "in the training process (num_workers=0)"
    return f"in {workers} worker process{'es' if workers != 1 else ''}"


def rate_text(v: float) -> str:
    """A rate with the precision a derived figure deserves: whole numbers below 1,000, else three significant
    digits with thousands separators (275,522 -> "276,000"); "n/a" for NaN, "unbounded" for infinity."""
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "unbounded"
    return f"{v:.0f}" if abs(v) < 1000 else f"{float(f'{v:.3g}'):,.0f}"


def times_text(x: float) -> str:
    """A ratio as "x3.4" (two significant digits), "x34", or "more than x100" (beyond that, the figure says only
    that one side is negligible: a stage time of microseconds makes any capacity)."""
    if math.isnan(x):
        return "n/a"
    if x >= 100:
        return "more than x100"
    return f"x{x:.0f}" if x >= 10 else f"x{x:.2g}"


def _headline(
    slowest: Stage, capacity: float, demand: float, headroom: float, where: str, *, saturated: bool = False
) -> str:
    at = f"{slowest.name} ({slowest.ms_per_item:.1f} ms an item, {slowest.share:.0%} of an item's time)"
    if math.isnan(headroom):
        return f"The loader's slowest stage is {at}; it can deliver {rate_text(capacity)} samples/s {where}"
    if headroom >= KEEPS_UP:
        return (
            f"The loader keeps up: it can deliver {rate_text(capacity)} samples/s {where} against the training's "
            f"{rate_text(demand)} (headroom {times_text(headroom)}); its slowest stage is {at}"
        )
    fix = FIXES.get("store" if saturated and slowest.name == "fetch" else slowest.name, "")
    return (
        f"Input-bound at the {slowest.name} stage: the loader can deliver {rate_text(capacity)} samples/s {where}, "
        f"the training would take {rate_text(demand)} ({times_text(headroom)}); {at}. {fix.capitalize()}"
    ).rstrip(". ")


def stage_advice(st: LoaderStages) -> str | None:
    """LOADER_STAGE's words: the stage to speed up, what it holds the loader to, and the fix that fits it. The
    stages' headline states the finding; the advice leads with what to change, so a report never says it twice."""
    slowest = next((x for x in st.stages if x.name == st.bottleneck), None)
    if slowest is None:
        return None
    saturated = st.store_busy is not None and st.store_busy >= STORE_SATURATED
    fix = FIXES.get("store" if saturated and slowest.name == "fetch" else slowest.name, "")
    where = f" {st.where}" if st.where else ""
    return (
        f"Speed up the {slowest.name} stage ({slowest.ms_per_item:.1f} ms an item, {slowest.share:.0%} of an item's "
        f"time): it holds the loader to {rate_text(st.capacity_samples_per_s)} samples/s{where}, under the training's "
        f"{rate_text(st.demand_samples_per_s)}. {fix[:1].upper()}{fix[1:]}."
    )


HEADSPACE_METHOD = (
    "the run's own pipeline, data set and knobs built a second time and iterated alone before training (no model, "
    "no copy), its first batches not timed; samples over the timed batches / their seconds (perf_counter)"
)
DELIVERED_SHORT = 0.9  # the training got less than this share of its demand: the loader held it back


@dataclass(frozen=True, slots=True)
class Headspace:
    """``run --headspace``: the loader's rate alone (MEASURED before training) against the training's demand
    (DERIVED: batch / (step time - data wait)) and what it delivered beside the training (MEASURED: the run's
    throughput). ``headspace`` = alone / demand: above 1 the loader alone could feed the training."""

    alone_samples_per_s: float
    batches: int
    seconds: float
    demand_samples_per_s: float
    delivered_samples_per_s: float
    headspace: float
    headline: str
    method: str = HEADSPACE_METHOD

    def to_dict(self) -> JSON:
        out: JSON = asdict(self)
        return json_safe(out)


def headspace(
    alone: object, *, batch_size: float, step_ms: float, data_wait_ms: float, throughput: float
) -> Headspace | None:
    """The headspace from the meta record ``loader_alone`` (profiler.drivers.headspace) and the run's step
    figures; None where the run did not measure the loader alone (or it delivered nothing)."""
    if not isinstance(alone, dict) or not isinstance(alone.get("samples_per_s"), (int, float)):
        return None
    rate = float(alone["samples_per_s"])
    demand = demand_of(batch_size, step_ms, data_wait_ms)
    ratio = rate / demand if demand > 0 else math.nan
    alone_words = f"The loader alone delivered {rate:.0f} samples/s ({alone.get('batches')} batches before training)"
    if math.isnan(ratio):
        headline = f"{alone_words}; the training's demand is not known"
    elif ratio < 1:
        headline = (
            f"{alone_words}, less than the {demand:.0f} the training consumes at its own pace (headspace "
            f"{times_text(ratio)}): the loader cannot keep up even alone; its capacity is the limit "
            "(its stages say where)"
        )
    elif throughput < DELIVERED_SHORT * demand:
        headline = (
            f"{alone_words}, {times_text(ratio)} the {demand:.0f} the training consumes, but beside the training it "
            f"delivered {throughput:.0f}: the loader slows down when the training runs beside it (they compete for "
            "the CPU; the contention figures say how much): fewer workers, or fewer threads for the model"
        )
    else:
        headline = (
            f"{alone_words}, {times_text(ratio)} the {demand:.0f} the training consumes: the loader is not the limit"
        )
    return Headspace(rate, int(alone.get("batches") or 0), float(alone.get("seconds") or 0.0), demand, throughput,
                     ratio, headline)  # fmt: skip
