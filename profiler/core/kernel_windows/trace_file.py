"""A kernel window handed over as a file: kineto writes the window's trace in C++, another thread or process reads it.

Reading kineto's events in the training process costs its thread about 8 us an event in Python
(benchmarks/window_cost.py: 280 ms for 35,000), on top of kineto's own stop. Where a sampler process records the
run, the CUDA recorder instead has kineto write the window (``_ProfilerResult.save``: its JSON trace, in C++, about
1.3 us an event) to ``RUN_DIR/kernel-windows/window-N.json`` with the clock pairs beside it (``window-N.clock.json``),
and the sampler process reads the activities from there when the window's ``GWIN`` event reaches it
(:func:`fill`). The trace stays in the run directory for the first window (a kineto trace: Holistic Trace Analysis
and ``stallscope kernels`` read it); later windows' files are removed once read.

Kineto's trace: ``baseTimeNanoseconds`` and, per event, ``ts``/``dur`` in microseconds from it (older layouts: ``ts``
since the epoch, no base). Activities are the ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events (``args.stream``;
``nccl`` kernels are collectives); launches are ``cuda_runtime``/``cuda_driver`` events linked by
``args.correlation``. On the CPU twin (``activity="cpu"``, benchmarks only) each ``cpu_op`` is one activity.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from profiler.core.rows import KernelWindow

FOLDER = "kernel-windows"
KEEP = 1  # the first window's trace stays in the run directory
_ACTIVITY = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2}
_LAUNCH = ("cuda_runtime", "cuda_driver")
_MAX_STREAM = 1 << 20  # as profiler.core.kernel_windows.windows.MAX_STREAMS


def trace_path(run_dir: Path, window: int) -> Path:
    return run_dir / FOLDER / f"window-{window}.json"


def clock_path(trace: Path) -> Path:
    return trace.with_suffix(".clock.json")


def write_clock(trace: Path, ref_ns: int, offset_s: float, cpu: bool) -> None:
    """Beside the trace: how its wall-clock ns map onto the Session's clock
    (profiler.core.kernel_windows.windows.clock_map)."""
    clock_path(trace).write_text(json.dumps({"ref_ns": ref_ns, "offset_s": offset_s, "cpu": cpu}))


def fill(window: KernelWindow, run_dir: Path, t0: float) -> KernelWindow:
    """``window`` with its activities read from its handed-over trace, on the run's clock (``t0``: the run's zero
    on the Session's clock); as it is when it has activities or no trace was handed over. A trace that cannot be
    read leaves the window without activities (it then measures no step's device)."""
    path = trace_path(run_dir, window.window)
    if window.activities or not path.exists():
        return window
    try:
        clock = json.loads(clock_path(path).read_text())
        to_clock = _to_clock(int(clock["ref_ns"]), float(clock["offset_s"]), t0)
        acts = activities(json.loads(path.read_bytes()), to_clock, cpu=bool(clock.get("cpu")))
        if not math.isnan(window.recorded_end):  # the stop ran on after the boundary: its steps are not the window's
            acts = recorded(acts, window.recorded_end)
    except (OSError, ValueError, KeyError, TypeError):
        acts = []
    if window.window >= KEEP:
        for p in (path, clock_path(path)):
            p.unlink(missing_ok=True)
    return replace(window, activities=acts)


# (stream, kind, start, end, launch): profiler.core.kernel_windows.windows.Activity
Act = tuple[int, int, float, float, float]


def recorded(acts: list[Act], end: float) -> list[Act]:
    """The activities of the steps recorded before ``end`` (the window's boundary): those launched after it, or
    starting after it where their launch is not known, belong to the steps the window thread's stop overlapped."""
    return [a for a in acts if (a[4] <= end if a[4] == a[4] else a[2] <= end)]


def _to_clock(ref_ns: int, offset_s: float, t0: float) -> Callable[[int], float]:
    return lambda wall_ns: (wall_ns - ref_ns) / 1e9 - offset_s - t0


def activities(
    trace: dict[str, Any], to_clock: Callable[[int], float], *, cpu: bool = False
) -> list[tuple[int, int, float, float, float]]:
    """A kineto trace's kernels, copies and sets (or, ``cpu``, its CPU operators), with their launches' times:
    ``(stream, kind, start, end, launch)`` on the clock ``to_clock`` maps wall-clock ns to (launch NaN: unknown)."""
    base = int(trace.get("baseTimeNanoseconds") or 0)

    def ns(us: float) -> int:
        return base + round(us * 1000)

    events = [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    launches: dict[int, int] = {}
    for e in events:
        if e.get("cat") in _LAUNCH and isinstance(corr := (e.get("args") or {}).get("correlation"), int):
            launches[corr] = ns(e["ts"])
    out = []
    for e in events:
        cat, args = e.get("cat"), e.get("args") or {}
        stream = 0 if cpu and cat == "cpu_op" else args.get("stream")
        kind = 0 if cpu and cat == "cpu_op" else _ACTIVITY.get(cat, -1)
        if kind < 0 or not isinstance(stream, int) or not 0 <= stream < _MAX_STREAM:
            continue
        if kind == 0 and "nccl" in str(e.get("name", "")).lower():
            kind = 3  # a collective (communication) kernel
        start = ns(e["ts"])
        launch = launches.get(args.get("correlation", -1))
        out.append((stream, kind, to_clock(start), to_clock(start + round(float(e.get("dur", 0)) * 1000)),
                    to_clock(launch) if launch is not None else math.nan))  # fmt: skip
    out.sort(key=lambda a: a[2])
    return out
