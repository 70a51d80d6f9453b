"""The GPU's own view of the run's steps: what the kernel windows (profiler.core.kernel_windows.windows) recorded, split
by why.

Pure. For each measured step that lies wholly inside a kernel window, its span (from the loop asking for its batch
to the loop asking for the next) is split into:

- **busy**: the device ran a kernel, copy or set (the union over every stream; collective kernels excepted);
- **input**: no work ran, and the work that ended the gap was launched late while the training thread waited for
  its batch (the step's data wait: the same span stallscope's data-wait figure times);
- **host**: launched late otherwise: the host was slow to launch (Python and launch overhead, the GIL held by
  another thread, a CPU busy with other work);
- **sync**: the work was queued but waited (an event, another stream), or only a collective kernel ran
  (communication: an all-reduce waiting for its peers);
- **short**: a gap under ``kernel_wait_us`` with work queued, and the time from a late launch to its start.

The five add up to the step's span (:func:`profiler.kernels.analysis.split_idle`: the same rule as for a trace).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from profiler.analysis.apart import measured_steps
from profiler.core.rows import KernelWindow, RunRecord, StepRow
from profiler.kernels.analysis import KERNEL_WAIT_US, Activity, merge, split_idle

COLLECTIVE = 3  # the kind code of a collective (communication) kernel
PARTS = ("busy", "input", "host", "sync", "short")


@dataclass(frozen=True, slots=True)
class GpuStep:
    """One step's span split by what the device did (seconds), and the activities launched in it."""

    step: int
    span_s: float
    busy_s: float
    input_s: float
    host_s: float
    sync_s: float
    short_s: float
    launched: int


@dataclass(frozen=True, slots=True)
class GpuSplit:
    """The window steps' split, summed, and what the windows cost."""

    source: str  # "cupti" | "sim" (SIMULATED)
    windows: int
    steps: tuple[GpuStep, ...]
    window_cost_s: float  # the training thread's time opening and closing the windows
    window_step_ms: float  # median step time inside the windows
    other_step_ms: float  # median measured step time outside them (NaN: none)

    @property
    def span_s(self) -> float:
        return math.fsum(s.span_s for s in self.steps)

    def part_s(self, part: str) -> float:
        return math.fsum(getattr(s, f"{part}_s") for s in self.steps)

    def fraction(self, part: str) -> float:
        span = self.span_s
        return self.part_s(part) / span if span > 0 else math.nan

    @property
    def busy_fraction(self) -> float:
        return self.fraction("busy")

    @property
    def kernels_per_step(self) -> float:
        return statistics.fmean(s.launched for s in self.steps) if self.steps else math.nan

    @property
    def simulated(self) -> bool:
        return self.source == "sim"

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "source": self.source,
            "windows": self.windows,
            "steps": len(self.steps),
            "fractions": {p: num(self.fraction(p)) for p in PARTS},
            "ms_per_step": {p: self.part_s(p) * 1e3 / len(self.steps) for p in PARTS} if self.steps else {},
            "launched_per_step": num(self.kernels_per_step),
            "window_cost_ms": self.window_cost_s * 1e3,
            "window_step_ms": num(self.window_step_ms),
            "other_step_ms": num(self.other_step_ms),
        }


def window_steps(
    window: KernelWindow, steps: Sequence[StepRow], kernel_wait_us: float = KERNEL_WAIT_US
) -> list[GpuStep]:
    """The split of each measured step wholly inside ``window`` (microsecond arithmetic, as for a trace)."""
    end = window.t_recorded  # a stop that ran on after the boundary recorded no later step
    inside = [s for s in steps if not s.warmup and s.t_start >= window.t_start and s.t_end <= end]
    if not inside or not window.activities:  # a window that recorded nothing measured no step's device
        return []
    us = 1e6
    acts = sorted(
        (Activity(stream, a * us, (b - a) * us, None if c != c else c * us, str(kind))  # noqa: PLR0124
         for stream, kind, a, b, c in window.activities),
        key=lambda x: (x.ts, x.end),
    )  # fmt: skip
    every = merge((x.ts, x.end) for x in acts)
    work = merge((x.ts, x.end) for x in acts if x.kind != str(COLLECTIVE))
    inputs = [(s.t_start * us, (s.t_start + s.data_wait_s) * us) for s in inside if s.data_wait_s > 0]
    out = []
    for s in inside:
        a, b = s.t_start * us, s.t_end * us
        covered, wait, host, sync, short = split_idle(a, b, every, acts, inputs=inputs, kernel_wait_us=kernel_wait_us)
        busy = math.fsum(min(e, b) - max(x, a) for x, e in work if e > a and x < b)
        launched = sum(1 for x in acts if x.launch_ts is not None and a <= x.launch_ts < b)
        out.append(GpuStep(s.step, (b - a) / us, busy / us, wait / us, host / us, (sync + covered - busy) / us,
                           short / us, launched))  # fmt: skip
    return out


def gpu_split(
    windows: Sequence[KernelWindow], steps: Sequence[StepRow], source: str, measured: Sequence[StepRow] | None = None
) -> GpuSplit | None:
    """The split over every window's steps (None: no window holds a step with activity); ``measured``: the steps
    outside the windows (default: every other non-warm-up step)."""
    per: list[GpuStep] = []
    for w in windows:
        per.extend(window_steps(w, steps))
    if not per:
        return None
    held = {g.step for g in per}
    inside = [(s.t_end - s.t_start) * 1e3 for s in steps if s.step in held]
    others = measured if measured is not None else [s for s in steps if not s.warmup and s.step not in held]
    outside = [(s.t_end - s.t_start) * 1e3 for s in others]
    return GpuSplit(
        source,
        len(windows),
        tuple(per),
        math.fsum(w.cost_s for w in windows),
        statistics.median(inside),
        statistics.median(outside) if outside else math.nan,
    )


HOST_BOUND = 0.25  # the host's share of the window steps' time from which the GPU is said to wait for the host
TINY_KERNEL_US = 20.0  # kernels this short on average: the launches, not the arithmetic, set the pace
HOST_VERDICT = "host-bound: the GPU waits for the host"


def waits_for_host(g: GpuSplit | None) -> bool:
    """The GPU idled more for late launches than for input: at least HOST_BOUND of the window steps' time, and
    more than the input share."""
    return g is not None and g.fraction("host") >= HOST_BOUND and g.fraction("host") > g.fraction("input")


def mean_kernel_us(g: GpuSplit) -> float:
    launched = sum(s.launched for s in g.steps)
    return g.part_s("busy") * 1e6 / launched if launched else math.nan


def host_finding(g: GpuSplit, *, workers: int | None, pipeline: str | None, runq_share: float) -> str:
    """Why the GPU waited for the host, with its figures, and the change that fits (see docs/metrics.md)."""
    how = "SIMULATED kernels of the simulated device" if g.simulated else "CUPTI kernel activity"
    head = (
        f"The GPU waits for the host, not for data: over {len(g.steps)} steps in {g.windows} kernel window(s) "
        f"({how}) it ran kernels {g.fraction('busy'):.0%} of the time and sat idle {g.fraction('host'):.0%} "
        f"waiting for kernels the host launched late, against {g.fraction('input'):.0%} waiting for input."
    )
    fixes = []
    if workers == 0 and pipeline in ("prefetch", "dali", None):
        fixes.append(
            "the loader works inside the training process (num_workers=0) and holds the GIL while the training "
            "thread should launch kernels: move it to worker processes (num_workers >= 1)"
        )
    tiny = mean_kernel_us(g)
    if tiny < TINY_KERNEL_US:
        fixes.append(
            f"{g.kernels_per_step:.0f} launches a step averaging {tiny:.2g} us of device time each: fewer, larger "
            "kernels (CUDA graphs, torch.compile, or a larger batch)"
        )
    if runq_share >= 0.05:
        fixes.append(
            f"the training thread waited for a CPU {runq_share:.0%} of its step (run queue): other work takes the "
            "host's cores"
        )
    if not fixes:
        fixes.append("the host's own per-step work (Python, the optimizer's loop over parameters): profile it")
    return head + " Likely: " + "; ".join(fixes) + "."


def window_source(meta: Mapping[str, object]) -> str:
    """What recorded a run's kernel windows (meta ``kernel_windows``: "SOURCE: plan"): "cupti" or "sim"."""
    return str(meta.get("kernel_windows") or "cupti").split(":", 1)[0]


def gpu_of(rec: RunRecord) -> GpuSplit | None:
    """The run's split, from its kernel windows."""
    if not rec.windows:
        return None
    return gpu_split(rec.windows, rec.steps, window_source(rec.meta), measured_steps(rec))


def gpu_busy_source(g: GpuSplit) -> str:
    """The device busy fraction's source, in words, when the kernel windows give it."""
    what = "SIMULATED: the simulated device's kernels" if g.simulated else "kernel time (CUPTI, torch.profiler)"
    return (
        f"{what}: union of kernels, copies and sets over {len(g.steps)} steps in {g.windows} kernel window(s) / "
        "those steps' time; device_span_fraction is the CUDA-event span"
    )


# -- the coarse split, where no kernel window measured a step ------------------------------------------------------
COARSE_METRICS = (  # the device's busy share, best first: GPM's graphics activity, the driver's samples, the poll
    ("gpm_graphics_pct", "NVML GPM graphics activity"),
    ("util_samples_pct", "the driver's utilisation samples"),
    ("util_pct", "NVML utilization.gpu (driver-averaged)"),
)


@dataclass(frozen=True, slots=True)
class CoarseSplit:
    """The device's time over the sampler's intervals, split busy / input / other idle (COARSER than the kernel
    windows' split: host, sync and short gaps are one part, and each interval is the sampler's, not a step)."""

    metric: str  # what gave the busy share, in words
    seconds: float  # the intervals' total
    busy_s: float
    input_s: float
    other_s: float

    def to_dict(self) -> dict[str, object]:
        s = self.seconds
        return {
            "source": f"coarser, over the sampler's intervals: {self.metric}",
            "seconds": s,
            "fractions": {"busy": self.busy_s / s, "input": self.input_s / s, "other_idle": self.other_s / s},
        }


def coarse_split(
    samples: Sequence[tuple[float, str, str, float | None]], steps: Sequence[StepRow], window: tuple[float, float]
) -> CoarseSplit | None:
    """Over each interval between two readings of the first GPU's busy share inside ``window``: busy = the share;
    input = the idle time, up to the time the training thread waited for data in that interval; the rest of the
    idle time is other (host, sync, short: not told apart at this grain). None without such readings."""
    found = _busy_series(samples, window)
    if found is None:
        return None
    words, series = found
    waits = [(s.t_start, s.t_start + s.data_wait_s) for s in steps if not s.warmup and s.data_wait_s > 0]
    total = busy = wait_in = other = 0.0
    for (a, _), (b, value) in itertools.pairwise(series):
        span = b - a
        share = min(max(value / 100.0, 0.0), 1.0)
        waited = math.fsum(max(0.0, min(b, e) - max(a, s)) for s, e in waits if e > a and s < b)
        idle = span * (1.0 - share)
        total, busy = total + span, busy + span * share
        wait_in += min(idle, waited)
        other += idle - min(idle, waited)
    return CoarseSplit(words, total, busy, wait_in, other) if total > 0 else None


def _busy_series(
    samples: Sequence[tuple[float, str, str, float | None]], window: tuple[float, float]
) -> tuple[str, list[tuple[float, float]]] | None:
    """The first GPU's busy share over ``window``, from the best metric with two readings or more: (its name in
    words, its (t, %) readings)."""
    for key, words in COARSE_METRICS:
        metric = f"gpu0.{key}"
        series = sorted(
            (t, v) for t, _src, m, v in samples if m == metric and v is not None and math.isfinite(v)
            and window[0] <= t <= window[1]
        )  # fmt: skip
        if len(series) >= 2:
            simulated = any(src == "nvml-sim" for _t, src, m, _v in samples if m == metric)
            return ("SIMULATED " + words if simulated else words), series
    return None
