"""Chrome / Perfetto trace export of a stored run: every step, phase and sampled metric on one timeline.

docs/trace-and-compare.md ("Exporting a trace") describes the tracks, long runs and exactness. Invariants
(tests/test_trace.py checks them):
- ``ts``/``dur`` are microseconds on the run timeline, rounded to the nanosecond; nothing is added to a phase.
- Every X event has name, cat, ph, ts, dur, pid, tid and args, with ``dur >= 0``; slices on one track nest
  strictly (a half-overlapping later slice is trimmed, never extended, and ``args.trimmed_us`` says by how much).
- ``traceEvents`` is sorted by ts (metadata first); no NaN or infinity anywhere; an interrupted run exports the
  steps it recorded.
- Bounded whatever the run's length: past ``MAX_DETAILED_STEPS`` steps only ``DETAIL_WINDOWS`` windows are drawn
  in full, and past ``MAX_COUNTER_TICKS`` ticks a counter family is averaged (``metadata.decimation``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler.analysis.parts import device_where
from profiler.analysis.stages import stage_series
from profiler.core.store import PhaseRow, RunRecord, StepRow, run_status
from profiler.core.store.reader import StepSpan
from profiler.jobs.analysis import JobInput

SIM_SOURCE = "nvml-sim"  # the simulated accelerator's NVML source (profiler.sim.nvml)
TID_TRAINING = 1
TID_DEVICE = 2  # first device lane; further lanes take 3, 4, ...
TRAINING_THREAD = "training loop"
DEVICE_THREAD = "device (CUDA events)"
SIM_DEVICE_THREAD = "device (SIMULATED, sim-events)"
TID_KERNELS = 100  # the kernel windows' span, then one track per stream: 101, 102, ...
KINDS = ("kernel", "memcpy", "memset", "collective")

# Sort rank of each event kind at one timestamp: names first, then slices, then instants and counters.
_RANK = {"M": 0, "X": 1, "i": 2, "C": 3}
# Data volume caps (see the module docstring): at most this many steps drawn in full, in this many windows, and
# this many points per counter family. Python's work per drawn event is the trace's floor (about 10 us for each of
# a step's four events): 4,000 steps keep `report --trace` of a 100,000-step run under 1 s (docs/benchmarks.md).
MAX_DETAILED_STEPS = 4_000
DETAIL_WINDOWS = 20
MAX_COUNTER_TICKS = 5_000


@dataclass(slots=True)
class _Slice:
    start: int  # ns on the run timeline
    end: int
    name: str
    cat: str
    level: int  # 0 step, 1 data wait and top-level phases, 2+ nested phases: parents sort first
    args: dict[str, object] = field(default_factory=dict)


def _ns(t: float) -> int:
    return round(t * 1e9)


def _us(ns: int) -> float:
    """Microseconds that a reader converting with ``int(us * 1000.0)`` (Perfetto's JSON importer truncates
    so) turns back into exactly ``ns``: for about 1% of values the nearest double to ns/1000 is a hair
    below it, which would end a slice 1 ns early or late and break the nesting of slices that end together.
    """
    us = ns / 1000
    while int(us * 1000.0) < ns:
        us = math.nextafter(us, math.inf)
    while int(us * 1000.0) > ns:  # negative times truncate toward zero, the other way
        us = math.nextafter(us, -math.inf)
    return us


# -- counters ------------------------------------------------------------------------------------

# metric -> (family track, series), in the order series appear in a family's args.
_COUNTER_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[str, str]]]] = [
    (re.compile(r"gpu(\d+)\.util_pct"), lambda m: (f"gpu{m[1]} utilization.gpu %", "util")),
    (re.compile(r"gpu(\d+)\.mem_used_mb"), lambda m: (f"gpu{m[1]} memory used MiB", "used")),
    (re.compile(r"gpu(\d+)\.pcie_(tx|rx)_mbps"), lambda m: (f"gpu{m[1]} PCIe MB/s", m[2])),
    (re.compile(r"proc\.(main|w\d+|total)\.cpu_pct"), lambda m: ("host CPU %", m[1])),
    (re.compile(r"sys\.cpu_pct"), lambda m: ("host CPU %", "system")),
    (re.compile(r"proc\.(main|w\d+|total)\.rss_mb"), lambda m: ("host RSS MiB", m[1])),
    (re.compile(r"rank(\d+)\.cpu_pct"), lambda m: ("rank CPU %", f"rank{m[1]}")),  # a job's node sampler
    (re.compile(r"gpu(\d+)\.gpm_(\w+)_pct"), lambda m: (f"gpu{m[1]} GPM activity %", m[2])),
    (re.compile(r"gpu(\d+)\.util_samples_pct"), lambda m: (f"gpu{m[1]} utilization.gpu %", "driver samples")),
]


STAGE_FAMILY = "loader stage ms/item"  # each stage's time per item since the sampler's previous reading


def _series_order(series: str) -> tuple[int, int, str]:
    """main, w0, w1, ..., total, system; tx before rx (alphabetical would put rx first)."""
    fixed = {"main": (0, 0), "total": (2, 0), "system": (3, 0), "tx": (0, 0), "rx": (0, 1)}
    if series in fixed:
        a, b = fixed[series]
        return a, b, series
    if series[:1] == "w" and series[1:].isdigit():
        return 1, int(series[1:]), series
    return 4, 0, series


def _counter_family(metric: str) -> tuple[str, str] | None:
    for pattern, name in _COUNTER_RULES:
        m = pattern.fullmatch(metric)
        if m:
            return name(m)
    return None


def _counters(record: RunRecord) -> dict[tuple[int, str], dict[str, float]]:
    """(ns, family) -> {series: value}: the readings one sampler tick took, grouped by family."""
    out: dict[tuple[int, str], dict[str, float]] = {}
    for t, source, metric, value in record.samples:
        if value is None or not math.isfinite(value) or not math.isfinite(t):
            continue
        fam = _counter_family(metric)
        if fam is not None:
            family = f"{fam[0]} (simulated)" if source == SIM_SOURCE else fam[0]
            out.setdefault((_ns(t), family), {})[fam[1]] = float(value)
    for t, stage, ms in stage_series(record.samples):
        out.setdefault((_ns(t), STAGE_FAMILY), {})[stage] = ms
    return out


# -- slices --------------------------------------------------------------------------------------


def _finite(*xs: float) -> bool:
    """Whether every one of ``xs`` is finite: their sum is (a NaN or an infinity carries through it; times on a
    run's timeline are nowhere near overflowing it). One C call, not one a value: a 100,000-step trace calls this
    120,000 times (0.42 s as ``all()`` over a generator)."""
    return math.isfinite(sum(xs))


def _host_slices(steps: list[StepRow], phases: list[PhaseRow]) -> list[_Slice]:
    out: list[_Slice] = []
    isfinite = math.isfinite
    for s in steps:
        if not isfinite(s.t_start + s.t_end + s.data_wait_s):  # no place on a timeline; the store never writes one
            continue
        a = _ns(s.t_start)
        out.append(
            _Slice(
                a,
                max(a, _ns(s.t_end)),
                f"step {s.step}",
                "step,warmup" if s.warmup else "step",
                0,
                {"step": s.step, "samples": s.samples, "warmup": s.warmup},
            )
        )
        # data_wait_s was measured as its own difference; adding it to t_start keeps its exact length
        out.append(_Slice(a, a + max(0, _ns(s.data_wait_s)), "data_wait", "input", 1, {"step": s.step}))
    for p in phases:
        if not isfinite(p.t_start + p.t_end):
            continue
        a = _ns(p.t_start)
        args: dict[str, object] = {"step": p.step, "phase": p.name, "depth": p.depth}
        if p.dev_start is not None and p.dev_end is not None and _finite(p.dev_start, p.dev_end):
            args["device_us"] = _us(_ns(p.dev_end) - _ns(p.dev_start))
        out.append(_Slice(a, max(a, _ns(p.t_end)), p.name.rsplit("/", 1)[-1], "phase", 1 + p.depth, args))
    return out


def _sort_key(s: _Slice) -> tuple[int, int, int]:
    return s.start, -(s.end - s.start), s.level


def _nest(slices: list[_Slice]) -> list[_Slice]:
    """Make the slices of one track nest strictly, trimming (never extending) the ones that cross.

    A slice that runs past an enclosing one of a lower level (a phase past its step's end) loses its end;
    a slice that starts inside a sibling or deeper slice it does not fit in loses its start.
    """
    stack: list[_Slice] = []
    for s in sorted(slices, key=_sort_key):
        while stack:
            top = stack[-1]
            if top.end <= s.start:
                stack.pop()
            elif s.end <= top.end:
                break
            elif top.level < s.level:
                _trim(s, s.start, top.end)
                break
            else:
                _trim(s, top.end, s.end)
                stack.pop()
        stack.append(s)
    return slices


def _trim(s: _Slice, start: int, end: int) -> None:
    end = max(start, end)
    cut = (s.end - s.start) - (end - start)
    if cut > 0:
        before = s.args.get("trimmed_us")
        s.args["trimmed_us"] = (before if isinstance(before, float) else 0.0) + _us(cut)
    s.start, s.end = start, end


def _encloses(outer: _Slice, inner: _Slice) -> bool:
    """Whether ``inner`` is a phase opened inside ``outer`` (same step, name ``outer/...``)."""
    return bool(
        outer.args["step"] == inner.args["step"] and str(inner.args["phase"]).startswith(f"{outer.args['phase']}/")
    )


def _device_lanes(phases: list[PhaseRow], *, simulated: bool = False) -> list[list[_Slice]]:
    """Device intervals, each in the first lane that is free at its start or open on its own parent phase.

    A slice drawn inside another reads as its child, so only a phase's own nested phases go inside it: the
    next step's copy that runs during this step's compute gets a lane of its own instead.
    """
    slices = []
    for p in phases:
        if p.dev_start is None or p.dev_end is None:
            continue
        if not _finite(p.dev_start, p.dev_end, p.t_start, p.t_end):
            continue
        a = _ns(p.dev_start)
        args: dict[str, object] = {
            "step": p.step,
            "phase": p.name,
            "depth": p.depth,
            "host_us": _us(_ns(p.t_end) - _ns(p.t_start)),
        }
        if simulated:
            args["simulated"] = True
        slices.append(_Slice(a, max(a, _ns(p.dev_end)), p.name.rsplit("/", 1)[-1], "device", p.depth, args))
    lanes: list[list[_Slice]] = []
    stacks: list[list[_Slice]] = []
    for s in sorted(slices, key=_sort_key):
        for lane, stack in zip(lanes, stacks, strict=True):
            while stack and stack[-1].end <= s.start:
                stack.pop()
            if not stack or (s.end <= stack[-1].end and _encloses(stack[-1], s)):
                lane.append(s)
                stack.append(s)
                break
        else:
            lanes.append([s])
            stacks.append([s])
    return lanes


# -- data volume ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Detail:
    """What the trace draws of a run's steps: those in full, their phases, and a summary slice per gap."""

    steps: list[StepRow]
    phases: list[PhaseRow]
    summaries: list[_Slice]


def _detail(steps: list[StepRow], phases: list[PhaseRow]) -> _Detail:
    """All steps up to MAX_DETAILED_STEPS; past that, DETAIL_WINDOWS evenly spaced windows of consecutive steps
    (the first and the last steps included) and one summary slice for each run of steps between two windows."""
    windows = _windows(len(steps))
    if windows is None:
        return _Detail(steps, phases, [])
    ordered = sorted(steps, key=lambda s: s.step)
    kept: list[StepRow] = []
    summaries: list[_Slice] = []
    done = 0  # steps [0, done) are drawn or summarised
    for start, end in windows:
        if start > done and (gap := _summary(span_of(ordered[done:start]))) is not None:
            summaries.append(gap)
        kept.extend(ordered[start:end])
        done = end
    drawn = {s.step for s in kept}
    return _Detail(kept, [p for p in phases if p.step in drawn], summaries)


def trace_plan(numbers: Sequence[int]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The step numbers (in order) the trace draws in full and those it summarises, as (first, last) ranges: what
    a long run's trace reads of its store (``runs.read.load_for_trace``, ``store.load_sparse``)."""
    windows = _windows(len(numbers))
    if not numbers:
        return [], []
    if windows is None:
        return [(numbers[0], numbers[-1])], []
    drawn, gaps, done = [], [], 0
    for start, end in windows:
        if start > done:
            gaps.append((numbers[done], numbers[start - 1]))
        drawn.append((numbers[start], numbers[min(end, len(numbers)) - 1]))
        done = end
    return drawn, gaps


def _windows(n: int) -> list[tuple[int, int]] | None:
    """The detail windows of ``n`` steps, as [start, end) positions in step order; None: every step is drawn."""
    if n <= MAX_DETAILED_STEPS:
        return None
    length = MAX_DETAILED_STEPS // DETAIL_WINDOWS
    out, done = [], 0
    for i in range(DETAIL_WINDOWS):
        start = max(done, round(i * (n - length) / (DETAIL_WINDOWS - 1)))
        out.append((start, start + length))
        done = start + length
    return out


def span_of(run: Sequence[StepRow]) -> StepSpan:
    """What a summary slice shows of a run of consecutive steps (as ``store.load_sparse`` reads it in SQL)."""
    timed = [s for s in run if _finite(s.t_start, s.t_end, s.data_wait_s)]
    return StepSpan(
        len(run), run[0].step, run[-1].step, len(timed),
        min((s.t_start for s in timed), default=None), max((s.t_end for s in timed), default=None),
        math.fsum(s.t_end - s.t_start for s in timed), math.fsum(s.data_wait_s for s in timed),
    )  # fmt: skip


def _summary(span: StepSpan) -> _Slice | None:
    """One slice over a run of consecutive steps not drawn in full (None when none has a place on the timeline)."""
    if not span.timed or span.t_start is None or span.t_end is None:
        return None
    a, b = _ns(span.t_start), _ns(span.t_end)
    args = {
        "steps": span.steps,
        "first_step": span.first,
        "last_step": span.last,
        "mean_step_ms": (span.step_s or 0.0) / span.timed * 1e3,
        "mean_data_wait_ms": (span.data_wait_s or 0.0) / span.timed * 1e3,
        "note": "steps not drawn one by one, to keep the trace loadable; `stallscope report` covers every step",
    }
    return _Slice(a, max(a, b), f"steps {span.first}-{span.last} (summarised)", "summary", 0, args)


def _decimate(counters: dict[tuple[int, str], dict[str, float]]) -> tuple[dict[tuple[int, str], dict[str, float]], int]:
    """Each counter family cut to at most MAX_COUNTER_TICKS points, each the mean of each series over that many
    consecutive ticks (at the first tick's time); also returns the most ticks averaged into one point."""
    by_family: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for (t_ns, family), values in counters.items():
        by_family.setdefault(family, []).append((t_ns, values))
    if all(len(ticks) <= MAX_COUNTER_TICKS for ticks in by_family.values()):
        return counters, 1
    out: dict[tuple[int, str], dict[str, float]] = {}
    widest = 1
    for family, ticks in by_family.items():
        ticks.sort(key=lambda tv: tv[0])
        k = -(-len(ticks) // MAX_COUNTER_TICKS)
        widest = max(widest, k)
        for i in range(0, len(ticks), k):
            chunk = ticks[i : i + k]
            series: dict[str, list[float]] = {}
            for _t, values in chunk:
                for name, v in values.items():
                    series.setdefault(name, []).append(v)
            out[(chunk[0][0], family)] = {name: math.fsum(vs) / len(vs) for name, vs in series.items()}
    return out, widest


# -- assembly ------------------------------------------------------------------------------------


def _json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _pid(meta: dict[str, object]) -> int:
    pid = meta.get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else 1


# (sort key: ts in ns, phase rank, -duration, nesting level; the event)
_Keyed = tuple[tuple[int, int, int, int], dict[str, object]]


def trace_events(
    record: RunRecord, summarised: Sequence[StepSpan] | None = None, steps: int | None = None
) -> dict[str, Any]:
    """The run as a Trace Event Format JSON object (see the module docstring for tracks and invariants).
    ``summarised`` (with ``steps``, the run's number of steps): the record holds only the steps drawn in full, and
    these summarise each run of steps between them (``trace_plan``; read so by ``store.load_sparse``)."""
    meta = record.meta
    pid = _pid(meta)
    recorded = meta.get("device")
    device: dict[str, object] = recorded if isinstance(recorded, dict) else {}
    simulated = device.get("kind") == "sim"
    if summarised is None:
        detail, steps = _detail(record.steps, record.phases), len(record.steps)
    else:
        gaps = [g for g in map(_summary, summarised) if g is not None]
        detail, steps = _Detail(record.steps, record.phases, gaps), steps if steps is not None else len(record.steps)
    lanes = _device_lanes(detail.phases, simulated=simulated)
    tracks = [(TID_TRAINING, _nest(_host_slices(detail.steps, detail.phases) + detail.summaries))]
    tracks += [(TID_DEVICE + k, lane) for k, lane in enumerate(lanes)]
    gpu_tracks = _kernel_tracks(record)
    tracks += [(tid, slices) for tid, _name, slices in gpu_tracks]
    keyed = [_x_event(s, pid, tid) for tid, slices in tracks for s in slices]
    counters, widest = _counter_events(record, pid)
    keyed += counters + _instant_events(record, pid)
    keyed.sort(key=lambda kv: kv[0])
    origin = min(0, keyed[0][0][0]) if keyed else 0
    names = _name_events(meta, device, pid, origin, len(lanes))
    names += [ev for tid, name, _ in gpu_tracks for ev in _track_names(pid, tid, origin, name)]
    metadata = _metadata(record, pid, len(lanes), steps)
    metadata["decimation"] = {
        "steps_drawn": len(detail.steps),
        "steps_summarised": steps - len(detail.steps),
        "summary_slices": len(detail.summaries),
        "counter_ticks_per_point": widest,
    }
    return {"traceEvents": [*names, *(ev for _, ev in keyed)], "displayTimeUnit": "ms", "metadata": metadata}


def _x_event(s: _Slice, pid: int, tid: int) -> _Keyed:
    start, dur = s.start, s.end - s.start
    ts, d = start / 1000, dur / 1000  # _us's value where the nearest double already reads back exactly (~99%)
    ev: dict[str, object] = {
        "name": s.name,
        "cat": s.cat,
        "ph": "X",
        "ts": ts if int(ts * 1000.0) == start else _us(start),
        "dur": d if int(d * 1000.0) == dur else _us(dur),
        "pid": pid,
        "tid": tid,
        "args": s.args,
    }
    return (s.start, _RANK["X"], -(s.end - s.start), s.level), ev


def _counter_events(record: RunRecord, pid: int) -> tuple[list[_Keyed], int]:
    """One "C" event per (tick, metric family), decimated; and how many ticks the widest point averages."""
    counters, widest = _decimate(_counters(record))
    out: list[_Keyed] = []
    for (t_ns, family), values in counters.items():
        series = {k: values[k] for k in sorted(values, key=_series_order)}
        counter = {"name": family, "cat": "sampler", "ph": "C", "ts": _us(t_ns), "pid": pid, "tid": TID_TRAINING}
        out.append(((t_ns, _RANK["C"], 0, 0), {**counter, "args": series}))
    return out, widest


def _instant_events(record: RunRecord, pid: int) -> list[_Keyed]:
    out: list[_Keyed] = []
    for t, kind, source, message in record.events:
        if not math.isfinite(t):
            continue
        instant = {
            "name": f"{kind}: {source}" if source else kind,
            "cat": "event",
            "ph": "i",
            "s": "p",  # process scope: a line across all of the run's tracks
            "ts": _us(_ns(t)),
            "pid": pid,
            "tid": TID_TRAINING,
            "args": {"message": message},
        }
        out.append(((_ns(t), _RANK["i"], 0, 0), instant))
    return out


def _name_events(
    meta: dict[str, object], device: dict[str, object], pid: int, origin: int, lanes: int
) -> list[dict[str, object]]:
    """The process's and the tracks' names and order ("M" events), labelled simulated on a simulated device."""
    simulated = device.get("kind") == "sim"
    scenario = meta.get("scenario") or meta.get("run_id") or "run"
    dev_thread = SIM_DEVICE_THREAD if simulated else DEVICE_THREAD
    threads = [(TID_TRAINING, TRAINING_THREAD)] + [
        (TID_DEVICE + k, dev_thread if k == 0 else f"{dev_thread} lane {k + 1}") for k in range(lanes)
    ]
    process = f"stallscope: {scenario}"
    if simulated:
        sim = device.get("sim")
        process += f" [SIMULATED {(sim.get('device') if isinstance(sim, dict) else None) or device_where(device)}]"
    names = [_meta_event("process_name", pid, TID_TRAINING, origin, {"name": process})]
    for tid, thread in threads:
        names.append(_meta_event("thread_name", pid, tid, origin, {"name": thread}))
        names.append(_meta_event("thread_sort_index", pid, tid, origin, {"sort_index": tid}))
    return names


def _kernel_tracks(record: RunRecord) -> list[tuple[int, str, list[_Slice]]]:
    """The kernel windows (one track of their spans) and their activities, one track per stream, as recorded."""
    if not record.windows:
        return []
    how = "SIMULATED" if str(record.meta.get("kernel_windows", "")).startswith("sim") else "CUPTI"
    spans = [_Slice(_ns(w.t_start), _ns(w.t_end), f"kernel window {w.window}", "kernel_window", 0,
                    {"activities": len(w.activities), "cost_ms": w.cost_s * 1e3}) for w in record.windows]  # fmt: skip
    streams: dict[int, list[_Slice]] = {}
    for w in record.windows:
        for stream, kind, a, b, launch in w.activities:
            if _finite(a, b) and b >= a:
                args: dict[str, object] = {"launch_us": _us(_ns(launch))} if math.isfinite(launch) else {}
                streams.setdefault(stream, []).append(_Slice(_ns(a), _ns(b), KINDS[kind], "gpu", 0, args))
    out = [(TID_KERNELS, f"kernel windows ({how})", spans)]
    for k, stream in enumerate(sorted(streams)):
        out.append((TID_KERNELS + 1 + k, f"GPU stream {stream} ({how} kernel activity)", _nest(streams[stream])))
    return out


def _track_names(pid: int, tid: int, origin: int, name: str) -> list[dict[str, object]]:
    return [
        _meta_event("thread_name", pid, tid, origin, {"name": name}),
        _meta_event("thread_sort_index", pid, tid, origin, {"sort_index": tid}),
    ]


def _meta_event(kind: str, pid: int, tid: int, origin: int, args: dict[str, object]) -> dict[str, object]:
    return {"name": kind, "ph": "M", "ts": _us(origin), "pid": pid, "tid": tid, "args": args}


def _metadata(record: RunRecord, pid: int, device_lanes: int, steps: int) -> dict[str, object]:
    meta = record.meta
    totals = {
        metric: value
        for _t, _src, metric, value in record.samples
        if metric.endswith(".mem_total_mb") and value is not None
    }
    out = {
        "producer": "stallscope",
        "run_id": meta.get("run_id"),
        "scenario": meta.get("scenario"),
        "pipeline": meta.get("pipeline"),
        "status": run_status(meta),
        "error": meta.get("error"),
        "device": meta.get("device"),
        "batch_size": meta.get("batch_size"),
        "workers": meta.get("workers"),
        "warmup_steps": meta.get("warmup_steps"),
        "pid": pid,
        "started_at_unix_s": meta.get("started_at"),
        "steps_recorded": steps,
        "gpu_memory_total_mib": totals,
        "timeline": "ts/dur in microseconds since the run started (host perf_counter); device slices are CUDA "
        "event times on the same timeline",
        "device_lanes": device_lanes,
    }
    if (meta.get("device") or {}).get("kind") == "sim":
        out["simulated"] = True
        out["timeline"] = (
            "ts/dur in microseconds since the run started (host perf_counter); device slices are SIMULATED device "
            "times (sim-events, the model of docs/sim.md) on the same timeline; gpu counters are simulated NVML"
        )
    safe: dict[str, object] = _json_safe(out)
    return safe


def write_trace(
    rec: RunRecord,
    path: str | os.PathLike[str],
    summarised: Sequence[StepSpan] | None = None,
    steps: int | None = None,
) -> Path:
    """Export the run record ``rec`` to ``path`` (a directory gets ``trace.json``); returns the file written.
    ``summarised``, ``steps``: as :func:`trace_events`'s.

    Raises ``OSError`` when ``path`` cannot be written. The file appears whole or not at all (written beside it,
    then renamed).
    """
    out = Path(path)
    if out.is_dir():
        out = out / "trace.json"
    doc = trace_events(rec, summarised, steps)
    text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


# -- a multi-rank job --------------------------------------------------------------------------------


def job_trace_events(job: JobInput) -> dict[str, Any]:
    """One trace of a job: each rank's trace (as :func:`trace_events` makes it) as its own process, pid
    ``rank + 1``, named ``rank R (node K): ...`` and sorted by rank, then each node sampler's counters as a process
    after them. Every store's times move onto one timeline by its meta ``started_at`` (unix seconds): ts 0 is the
    earliest store's start. A rank without a store has no process; the metadata lists it."""
    parts: list[tuple[int, str, RunRecord]] = [
        (r.rank + 1, f"rank {r.rank}" + (f" (node {r.node_rank})" if r.node_rank is not None else ""), r.record)
        for r in job.ranks
        if r.record is not None
    ]
    base = len(job.ranks) + 1
    parts += [
        (base + i, f"node sampler {n.job.get('node_rank', i)}", n.record) for i, n in enumerate(job.nodes) if n.record
    ]
    starts = [
        float(rec.meta["started_at"]) for _, _, rec in parts if isinstance(rec.meta.get("started_at"), (int, float))
    ]
    t0 = min(starts, default=0.0)
    events: list[dict[str, Any]] = []  # read back from trace_events' documents: their fields are known there
    for sort_index, (pid, label, rec) in enumerate(parts):
        started = rec.meta.get("started_at")
        shift_ns = _ns(float(started) - t0) if isinstance(started, (int, float)) else 0
        doc = trace_events(rec)
        for ev in doc["traceEvents"]:
            ev["pid"] = pid
            ev["ts"] = _us(round(ev["ts"] * 1000) + shift_ns)
            if ev["ph"] == "M" and ev["name"] == "process_name":
                ev["args"] = {"name": f"{label}: {ev['args']['name']}"}
            events.append(ev)
        events.append(_meta_event("process_sort_index", pid, TID_TRAINING, 0, {"sort_index": sort_index}))
    named = [e for e in events if e["ph"] == "M"]
    timed = sorted((e for e in events if e["ph"] != "M"), key=lambda e: (e["ts"], _RANK[e["ph"]], -e.get("dur", 0)))
    missing = [r.rank for r in job.ranks if r.record is None]
    metadata = {
        "producer": "stallscope",
        "job_id": next((n.job.get("job_id") for n in job.nodes if n.job.get("job_id")), None),
        "ranks": [r.rank for r in job.ranks],
        "ranks_without_store": missing,
        "started_at_unix_s": t0,
        "timeline": "ts/dur in microseconds since the earliest store started; each rank is a process (pid rank + 1), "
        "aligned by its store's started_at",
    }
    return {"traceEvents": [*named, *timed], "displayTimeUnit": "ms", "metadata": _json_safe(metadata)}


def write_job_trace(job: JobInput, path: str | os.PathLike[str]) -> Path:
    """Export the job to ``path`` (a directory gets ``trace.json``) as :func:`write_trace` does for one run."""
    out = Path(path)
    if out.is_dir():
        out = out / "trace.json"
    text = json.dumps(job_trace_events(job), allow_nan=False, separators=(",", ":"))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
