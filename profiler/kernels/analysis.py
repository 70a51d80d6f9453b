"""The GPU's own view of a torch.profiler (kineto) trace: what ran on each stream, and why each stream idled.

Pure: it takes the trace's events (``traceEvents`` of the JSON the profiler writes) and returns figures.

- **Activity**: the device's kernels, copies and sets (kineto categories ``kernel``, ``gpu_memcpy``,
  ``gpu_memset``), each with its stream and the correlation id of the host call that launched it
  (``cuda_runtime`` / ``cuda_driver`` events). Busy time is the union of their intervals.
- **Idle split per stream** (the gaps between one activity's end and the next one's start on the same stream):
  ``host_wait`` when the next one was launched after the previous one ended (the device waited for the host);
  else ``kernel_wait`` when the gap is under ``kernel_wait_us`` (the cost of starting back-to-back work); else
  ``other`` (the stream waited on something else: an event, another stream, a synchronisation). This is Holistic
  Trace Analysis's rule for its idle-time breakdown; ``syncs_as_activity=True`` also counts the device-side
  ``cuda_sync`` records as activity, as HTA 0.5 does, so that its figures can be compared one for one.
- **Steps**: where the trace has ``ProfilerStep#N`` spans (``torch.profiler``'s ``step()``), a step's busy time is
  the union of all activity over its span (work launched by the step before included), and it counts the
  activities launched in its span. Its idle time (no stream running anything) is split by why
  (:func:`split_idle`): **input** (the work that ended the gap was launched late, while the host was in a
  DataLoader's ``__next__``), **host** (launched late otherwise), **sync** (the work was queued but waited: an
  event, another stream) and **short** (a gap under ``kernel_wait_us`` with work queued, and the microseconds from
  a late launch to its start). The five add up to the step's span.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ACTIVITY = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH = frozenset({"cuda_runtime", "cuda_driver"})
SYNC = "cuda_sync"
KERNEL_WAIT_US = 30.0  # HTA's default threshold (30,000 ns) for a gap between back-to-back kernels
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_INPUT = re.compile(r"DataLoader.*__next__")


@dataclass(frozen=True, slots=True)
class Activity:
    """One kernel, copy or set (or, for HTA's comparison, a device-side sync record): microseconds."""

    stream: int
    ts: float
    dur: float
    launch_ts: float | None  # the host call that launched it (None: not in the trace)
    kind: str

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True, slots=True)
class StreamIdle:
    """One stream's activity and idle split, microseconds."""

    stream: int
    activities: int
    busy_us: float
    span_us: float  # first start to last end
    host_wait_us: float
    kernel_wait_us: float
    other_us: float

    @property
    def idle_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us


@dataclass(frozen=True, slots=True)
class StepKernels:
    """One ``ProfilerStep#N``: its host span and the kernels launched in it, microseconds."""

    step: int
    ts: float
    dur: float
    activities: int  # launched in its span
    busy_us: float  # union of all activity over its span
    input_us: float = 0.0
    host_us: float = 0.0
    sync_us: float = 0.0
    short_us: float = 0.0

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.dur if self.dur > 0 else math.nan


@dataclass(frozen=True, slots=True)
class TraceKernels:
    """What :func:`analyze` finds in a trace."""

    device: str | None
    activities: int
    busy_us: float  # union over every stream
    span_us: float
    streams: list[StreamIdle]
    steps: list[StepKernels]

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.span_us if self.span_us > 0 else math.nan


def activities(events: Iterable[Mapping[str, Any]], *, syncs_as_activity: bool = False) -> list[Activity]:
    """The device's activities of a trace's events, each with its launch time where the trace links it."""
    evs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    launches: dict[int, float] = {}
    for e in evs:
        if str(e.get("cat", "")).lower() in LAUNCH and (corr := _arg(e, "correlation")) is not None:
            launches[corr] = float(e["ts"])
    kinds = ACTIVITY | ({SYNC} if syncs_as_activity else set())
    out = []
    for e in evs:
        kind = str(e.get("cat", "")).lower()
        stream = _arg(e, "stream")
        if kind not in kinds or stream is None or stream < 0 or stream >= 2**32 - 1:
            continue
        corr = _arg(e, "correlation")
        out.append(Activity(stream, float(e["ts"]), float(e.get("dur", 0.0)), launches.get(corr) if corr else None,
                            kind))  # fmt: skip
    out.sort(key=lambda a: (a.ts, a.end))
    return out


def stream_idle(acts: Sequence[Activity], kernel_wait_us: float = KERNEL_WAIT_US) -> list[StreamIdle]:
    """Each stream's busy time and idle split (see the module), by stream id."""
    by_stream: dict[int, list[Activity]] = {}
    for a in acts:
        by_stream.setdefault(a.stream, []).append(a)
    out = []
    for stream in sorted(by_stream):
        seq = sorted(by_stream[stream], key=lambda a: a.ts)
        split = {"host": 0.0, "kernel": 0.0, "other": 0.0}
        for prev, cur in itertools.pairwise(seq):
            gap = cur.ts - prev.end
            if cur.launch_ts is not None and cur.launch_ts > prev.end:
                split["host"] += gap
            elif gap < kernel_wait_us:
                split["kernel"] += gap
            else:
                split["other"] += gap
        out.append(StreamIdle(stream, len(seq), union_us((a.ts, a.end) for a in seq), seq[-1].end - seq[0].ts,
                              split["host"], split["kernel"], split["other"]))  # fmt: skip
    return out


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def steps(
    events: Sequence[Mapping[str, Any]], acts: Sequence[Activity], kernel_wait_us: float = KERNEL_WAIT_US
) -> list[StepKernels]:
    """The ``ProfilerStep#N`` spans, the activities launched in each, and each one's busy and idle split. A step is
    the host's annotation: torch 2.11's kineto also writes a ``gpu_user_annotation`` of the same name (the step's
    span on the device, from its first kernel to its last), which is not another step (issue #57: 10 rows for 5)."""
    spans = []
    for e in events:
        m = _STEP.match(str(e.get("name", "")))
        on_host = not str(e.get("cat", "")).startswith("gpu")
        if m and on_host and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)):
            spans.append((int(m.group(1)), float(e["ts"]), float(e.get("dur", 0.0))))
    busy = merge((a.ts, a.end) for a in acts)
    inputs = merge(input_spans(events))
    out = []
    for index, ts, dur in sorted(set(spans), key=lambda s: s[1]):
        launched = sum(1 for a in acts if a.launch_ts is not None and ts <= a.launch_ts < ts + dur)
        split = split_idle(ts, ts + dur, busy, acts, inputs=inputs, kernel_wait_us=kernel_wait_us)
        out.append(StepKernels(index, ts, dur, launched, *split))
    return out


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the union of ``intervals``."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def input_spans(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """The host's spans inside a DataLoader's ``__next__`` (torch.profiler names them
    ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` and the like)."""
    return [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and _INPUT.search(str(e.get("name", "")))
    ]


def _overlap(a: float, b: float, spans: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans if s < b and e > a)


def split_idle(
    start: float, end: float, busy: Sequence[tuple[float, float]], acts: Sequence[Activity], *,
    inputs: Sequence[tuple[float, float]], kernel_wait_us: float,
) -> tuple[float, float, float, float, float]:  # fmt: skip
    """(busy, input, host, sync, short) microseconds of ``[start, end]`` (see the module): ``busy`` merged
    activity, ``acts`` sorted by start, ``inputs`` merged data-wait spans."""
    inside = [(max(s, start), min(e, end)) for s, e in busy if e > start and s < end]
    gaps, at = [], start
    for s, e in inside:
        if s > at:
            gaps.append((at, s))
        at = max(at, e)
    if at < end:
        gaps.append((at, end))
    starts = [a.ts for a in acts]
    got = {"input": 0.0, "host": 0.0, "sync": 0.0, "short": 0.0}
    for a, b in gaps:
        k = bisect.bisect_left(starts, b)
        launch = acts[k].launch_ts if k < len(acts) else math.inf  # nothing after it: the host never launched more
        if launch is None or launch <= a:  # queued before the gap: it waited on something, or only started late
            got["short" if b - a < kernel_wait_us else "sync"] += b - a
            continue
        late = min(launch, b)
        waiting = _overlap(a, late, inputs)
        got["input"] += waiting
        got["host"] += late - a - waiting
        got["short"] += b - late  # from its launch to its start
    return sum(e - s for s, e in inside), got["input"], got["host"], got["sync"], got["short"]


def analyze(
    trace: Mapping[str, Any], *, kernel_wait_us: float = KERNEL_WAIT_US, syncs_as_activity: bool = False,
    hta_window: bool = False,
) -> TraceKernels:  # fmt: skip
    """The figures of one kineto trace (its JSON object). ``hta_window``: the streams' and the device's figures over
    the work Holistic Trace Analysis 0.5 analyses, on its rounded times (:func:`hta_view`); the steps' figures are
    the same either way."""
    events = trace.get("traceEvents") or []
    acts = activities(events, syncs_as_activity=syncs_as_activity)
    props = trace.get("deviceProperties") or []
    device = str(props[0].get("name")) if props and isinstance(props[0], dict) and props[0].get("name") else None
    span = (max(a.end for a in acts) - acts[0].ts) if acts else 0.0
    per_step = steps(events, acts, kernel_wait_us)
    in_window = acts
    busy = union_us((a.ts, a.end) for a in acts)
    if hta_window:
        in_window = hta_view(events, acts)
        # the device's figures over the window too, as HTA's temporal breakdown takes them: the union of every
        # device-side event in it (compute + non-compute), and its span from the first start to the last end
        device_side = hta_device(events)
        busy = union_us(device_side)
        span = (max(b for _, b in device_side) - min(a for a, _ in device_side)) if device_side else 0.0
    return TraceKernels(device, len(in_window), busy, span, stream_idle(in_window, kernel_wait_us), per_step)


def hta_view(events: Sequence[Mapping[str, Any]], acts: Sequence[Activity]) -> list[Activity]:
    """The activities as Holistic Trace Analysis 0.5.0 sees them. A trace of nanosecond resolution (float times,
    torch 2.3 and later) has every event's start rounded up and its end rounded down to the microsecond (HTA's
    parser: ``round_down_time_stamps``), launches included. Where the trace has two or more ``ProfilerStep``
    names, only the work whose launch began before the latest ``ProfilerStep`` event's start is kept: the last
    step's work is left out, but for what was launched before the device began that step where kineto writes the
    step's device span as well (``gpu_user_annotation``, torch 2.11: HTA 0.5 counts it among the host's events).
    Work without a launch in the trace is left out there too."""
    ns, cut = hta_window_of(events)
    if ns:
        acts = [Activity(a.stream, float(math.ceil(a.ts)), float(math.floor(a.end) - math.ceil(a.ts)),
                         None if a.launch_ts is None else float(math.ceil(a.launch_ts)), a.kind)
                for a in acts]  # fmt: skip
    if cut == math.inf:
        return list(acts)
    return [a for a in acts if a.launch_ts is not None and a.launch_ts < cut]


def hta_window_of(events: Sequence[Mapping[str, Any]]) -> tuple[bool, float]:
    """(whether HTA rounds the trace's times: nanosecond resolution; the start, so rounded, of its latest
    ``ProfilerStep`` event, before which its window's work was launched: inf where it has fewer than two names)."""
    ns = any(isinstance(e.get("ts"), float) for e in events)
    marks = [e for e in events if e.get("ph") == "X" and "ProfilerStep" in str(e.get("name", ""))
             and isinstance(e.get("ts"), (int, float))]  # fmt: skip
    if len({e["name"] for e in marks}) < 2:
        return ns, math.inf
    return ns, float(max(math.ceil(e["ts"]) if ns else e["ts"] for e in marks))


def hta_device(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """The device-side events HTA 0.5.0's temporal breakdown takes, on its rounded microseconds: every event with a
    stream (kernels, copies, sets, synchronisations, the unknown stream's too), in its window (:func:`hta_view`:
    an event with a correlation id by its launch, one without by its own start)."""
    ns, cut = hta_window_of(events)
    windowed = cut != math.inf
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    launches = {c: e["ts"] for e in xs if str(e.get("cat", "")).lower() in LAUNCH and (c := _arg(e, "correlation"))}
    out = []
    for e in xs:
        stream = _arg(e, "stream")
        if stream is None or stream < 0:
            continue
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        if ns:
            ts, end = float(math.ceil(ts)), float(math.floor(end))
        corr = _arg(e, "correlation")
        at = launches.get(corr) if corr is not None and corr >= 0 else e["ts"]
        if not windowed or (at is not None and (math.ceil(at) if ns else at) < cut):
            out.append((ts, end))
    return out


def _arg(e: Mapping[str, Any], key: str) -> int | None:
    args = e.get("args")
    value = args.get(key) if isinstance(args, dict) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
