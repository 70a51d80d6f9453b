"""A run's figures as experiment-tracker records: points ``(name, step, value)`` of one step series and the run's
summary figures, under one prefix, ``stall/``, with the unit in each name (docs/integrations.md, "Experiment
trackers").

Pure: every value is computed here once, from the run's rows (:class:`~profiler.core.rows.StepRow`,
:class:`~profiler.core.rows.PhaseRow`, the sampler's readings) and its Summary; the adapters only write them.

Invariants:
- A point covers the steps since the previous point (one step each where the series is short enough); its
  ``stall/step`` is the index of the last step it covers. Its values are means over those steps, so a series of
  one-step points has the Summary's host-clock means (step time, data wait, h2d, compute).
- The steps a kernel window held (:mod:`profiler.analysis.apart`) and the warm-up steps are never in the series:
  the held steps are points of their own under ``stall/held/``.
- A figure that was not measured (NaN, batch sizes not known, no NVML reading) is left out, never written as 0.
- Names keep clear of MLflow's ``system/`` and W&B's ``system.``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from profiler.analysis.apart import spans
from profiler.analysis.summary import Summary
from profiler.analysis.verdict import MODERATE
from profiler.core.rows import TAIL_KEY, KernelWindow, PhaseRow, RunRecord, StepRow, held_steps

PREFIX = "stall/"
STEP = "stall/step"  # the step axis: W&B's define_metric("stall/*", step_metric=STEP)
SERIES = (
    "step_ms",
    "data_wait_ms",
    "h2d_ms",
    "compute_ms",
    "data_wait_frac",
    "gpu_util_pct",
    "throughput_samples_per_s",
    "input_bound",
)
MAX_POINTS = 2000  # per series of an exported run: a longer run's points each cover several steps
GPU_UTIL = re.compile(r"gpu\d+\.util_pct")  # the NVML source's utilisation readings (profiler.core.sources.nvml)
NVML = "nvml"  # a simulated device's readings come from "nvml-sim" and are not a GPU's utilisation

Samples = Sequence[tuple[float, str, str, float | None]]


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    step: int
    value: float


@dataclass(frozen=True, slots=True)
class Records:
    """What a tracker is given: the step series, the run's summary figures (name -> value) and its verdict and
    recommendations in words (markdown)."""

    points: tuple[Point, ...]
    summary: dict[str, float]
    text: str


@dataclass(slots=True)
class StepFold:
    """The steps since the last point, folded: sums of their seconds (state only; no clock)."""

    n: int = 0
    last: int = -1
    t_first: float = math.nan
    t_last: float = math.nan
    step_s: float = 0.0
    wait_s: float = 0.0
    h2d_s: float = 0.0
    compute_s: float = 0.0
    samples: int | None = 0
    util: list[float] = field(default_factory=list)

    def add(self, row: StepRow, phases: Iterable[PhaseRow]) -> None:
        if self.n == 0:
            self.t_first = row.t_start
        self.n += 1
        self.last, self.t_last = row.step, row.t_end
        self.step_s += row.t_end - row.t_start
        self.wait_s += row.data_wait_s
        for p in phases:
            if p.depth == 0 and p.name == "h2d":
                self.h2d_s += p.t_end - p.t_start
            elif p.depth == 0 and p.name == "compute":
                self.compute_s += p.t_end - p.t_start
        self.samples = None if self.samples is None or row.samples is None else self.samples + row.samples

    def add_util(self, samples: Samples) -> None:
        """The NVML utilisation readings taken while the folded steps ran."""
        self.util.extend(
            v
            for t, source, metric, v in samples
            if source == NVML and v is not None and not math.isnan(v) and GPU_UTIL.fullmatch(metric)
            if self.t_first <= t <= self.t_last
        )

    def points(self, prefix: str = PREFIX) -> list[Point]:
        """The folded steps' point (none when nothing was folded)."""
        if self.n == 0:
            return []
        n, s = self.n, self.step_s
        values = {
            "step_ms": s / n * 1e3,
            "data_wait_ms": self.wait_s / n * 1e3,
            "h2d_ms": self.h2d_s / n * 1e3,
            "compute_ms": self.compute_s / n * 1e3,
            "data_wait_frac": self.wait_s / s if s > 0 else math.nan,
            "gpu_util_pct": math.fsum(self.util) / len(self.util) if self.util else math.nan,
            "throughput_samples_per_s": self.samples / s if self.samples is not None and s > 0 else math.nan,
            # the run's verdict rule (analysis.verdict) on these steps: data wait and copy over step time
            "input_bound": float((self.wait_s + self.h2d_s) / s >= MODERATE) if s > 0 else math.nan,
        }
        return [Point(prefix + k, self.last, v) for k, v in values.items() if not math.isnan(v)]


def phases_by_step(phases: Iterable[PhaseRow]) -> dict[int, list[PhaseRow]]:
    out: dict[int, list[PhaseRow]] = {}
    for p in phases:
        out.setdefault(p.step, []).append(p)
    return out


def series(
    steps: Sequence[StepRow],
    phases: Mapping[int, Sequence[PhaseRow]],
    samples: Samples = (),
    *,
    max_points: int = MAX_POINTS,
    prefix: str = PREFIX,
) -> list[Point]:
    """``steps``' points, each over ``ceil(len(steps) / max_points)`` consecutive steps."""
    per = max(1, math.ceil(len(steps) / max_points)) if max_points > 0 else 1
    out: list[Point] = []
    for i in range(0, len(steps), per):
        fold = StepFold()
        for row in steps[i : i + per]:
            fold.add(row, phases.get(row.step, ()))
        fold.add_util(samples)
        out.extend(fold.points(prefix))
    return out


def summary_figures(summary: Summary, prefix: str = PREFIX) -> dict[str, float]:
    """The run's own figures (summary.json's), under ``stall/run/`` (NaN left out)."""
    step = summary.step_time_ms.mean
    b = summary.breakdown_ms_per_step
    gpu = summary.device_busy_fraction * 100 if summary.device.kind == "cuda" else math.nan
    stall = summary.stall_fraction
    values = {
        "steps": float(summary.steps),
        "step_ms": step,
        "data_wait_ms": b.data_wait,
        "h2d_ms": b.h2d,
        "compute_ms": b.compute,
        "data_wait_frac": b.data_wait / step if step > 0 else math.nan,
        "stall_frac": summary.stall_fraction,
        "gpu_util_pct": gpu,
        "throughput_samples_per_s": summary.throughput_samples_per_s,
        # the verdict's rule (analysis.verdict): moderately or highly input-bound
        "input_bound": math.nan if math.isnan(stall) else float(stall >= MODERATE),
    }
    held = summary.kernel_windows
    if held is not None:
        values["held/steps"] = float(held.steps)
        values["held/step_ms"] = held.step_ms
    return {f"{prefix}run/{k}": v for k, v in values.items() if not math.isnan(v)}


def verdict_text(summary: Summary, title: str = "stallscope") -> str:
    """The verdict and recommendations in words (markdown), as a tracker's text entry."""
    lines = [f"## {title}: {summary.verdict}", ""]
    if summary.device.kind == "sim":
        lines += ["(simulated device: its figures are simulated)", ""]
    lines += [f"- {r.text} ({r.code})" for r in summary.recommendations] or ["- no recommendation"]
    return "\n".join(lines) + "\n"


def run_records(rec: RunRecord, summary: Summary, *, max_points: int = MAX_POINTS, prefix: str = PREFIX) -> Records:
    """One run's records: its measured steps' series, its held steps' apart, its summary figures and words."""
    held_ids = held_steps(spans(rec.windows), rec.steps, rec.meta.get(TAIL_KEY))
    measured = [s for s in rec.steps if not s.warmup and s.step not in held_ids]
    held = [s for s in rec.steps if not s.warmup and s.step in held_ids]
    by_step = phases_by_step(rec.phases)
    points = series(measured, by_step, rec.samples, max_points=max_points, prefix=prefix)
    points += series(held, by_step, rec.samples, max_points=max_points, prefix=prefix + "held/")
    return Records(tuple(points), summary_figures(summary, prefix), verdict_text(summary))


def rank_points(ranks: Mapping[int, Sequence[Point]]) -> list[Point]:
    """Each rank's points under ``stall/rankR/``."""
    return [
        Point(f"{PREFIX}rank{r}/{p.name.removeprefix(PREFIX)}", p.step, p.value) for r, ps in ranks.items() for p in ps
    ]


def slowest_points(ranks: Mapping[int, Sequence[Point]], *, same_step: bool = True) -> list[Point]:
    """The slowest rank's points under ``stall/`` (as detectron2 logs the ranks' max): for each series (``stall/``,
    ``stall/held/``) the points of the rank whose ``step_ms`` is the longest, at each step (``same_step``: the
    ranks' points cover one step each, matched by index), or among the points given (each rank's one point of
    the same steps: a live interval's)."""
    slowest_at: dict[tuple[str, int], tuple[float, int]] = {}  # (series prefix, step or -1) -> (step_ms, rank)
    for r, ps in ranks.items():
        for p in ps:
            if p.name.endswith("/step_ms"):
                key = (p.name.removesuffix("step_ms"), p.step if same_step else -1)
                if key not in slowest_at or p.value > slowest_at[key][0]:
                    slowest_at[key] = (p.value, r)
    out = []
    for r, ps in ranks.items():
        for p in ps:
            at = slowest_at.get((p.name.rpartition("/")[0] + "/", p.step if same_step else -1))
            if at is not None and at[1] == r:
                out.append(p)
    return out


def job_records(ranks: Mapping[int, Records], summaries: Mapping[int, Summary]) -> Records:
    """A job's records: each rank's under ``stall/rankR/``, and the slowest rank's under ``stall/``: at each step
    the figures of the rank whose step took longest there (as detectron2 logs the ranks' max), and the run
    figures of the rank with the longest mean step."""
    by_rank = {r: rr.points for r, rr in ranks.items()}
    points = rank_points(by_rank) + slowest_points(by_rank)
    summary = {f"{PREFIX}rank{r}/{k.removeprefix(PREFIX)}": v for r, rr in ranks.items() for k, v in rr.summary.items()}
    if summaries:
        worst = max(summaries, key=lambda r: _or_low(summaries[r].step_time_ms.mean))
        summary.update(ranks[worst].summary)
        summary[f"{PREFIX}run/slowest_rank"] = float(worst)
        text = verdict_text(summaries[worst], f"stallscope (slowest rank, {worst})")
    else:
        text = "## stallscope: no rank's store could be read\n"
    return Records(tuple(sorted(points, key=lambda p: (p.step, p.name))), summary, text)


def _or_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x


class LiveFold:
    """A running run's steps folded as a live feed hands them over (again and again: each step is taken once, by
    its index), into the point since the last :meth:`take` and the run's figures so far (:meth:`run_figures`).

    Warm-up steps are left out; a step a kernel window held (a window the feed has handed over, or a tail
    window's step) is folded apart, under ``stall/held/``. ``gpu_util`` takes NVML utilisation readings (a CUDA
    run's: a simulated device's readings are not a GPU's)."""

    def __init__(self, *, gpu_util: bool = False, prefix: str = PREFIX) -> None:
        self.prefix, self.gpu_util = prefix, gpu_util
        self.last_step, self.last_sample = -1, -math.inf
        self.spans: list[tuple[float, float]] = []
        self.tail_from: object = None
        self.point, self.held, self.total = StepFold(), StepFold(), StepFold()

    def add_windows(self, windows: Iterable[KernelWindow]) -> None:
        for w in windows:
            if (w.t_start, w.t_end) not in self.spans:
                self.spans.append((w.t_start, w.t_end))

    def add(self, steps: Iterable[tuple[StepRow, Sequence[PhaseRow]]], meta: Mapping[str, object]) -> None:
        self.tail_from = meta.get(TAIL_KEY, self.tail_from)
        for row, phases in steps:
            if row.step <= self.last_step:
                continue
            self.last_step = row.step
            if row.warmup:
                continue
            if held_steps(self.spans, [row], self.tail_from):
                self.held.add(row, phases)
            else:
                self.point.add(row, phases)
                self.total.add(row, phases)

    def add_samples(self, samples: Iterable[tuple[float, Mapping[str, float]]]) -> None:
        """The sampler's readings (``(t, {metric: value})``), each taken once; NVML utilisation kept where asked."""
        for t, values in samples:
            if t <= self.last_sample:
                continue
            self.last_sample = t
            if not self.gpu_util:
                continue
            got = [(t, NVML, k, v) for k, v in values.items() if GPU_UTIL.search(k) and not math.isnan(v)]
            for fold in (self.point, self.total):
                fold.util.extend(v for *_, v in got if fold.n and fold.t_first <= t)

    def take(self) -> list[Point]:
        """The points of the steps folded since the last take (none: nothing new)."""
        out = self.point.points(self.prefix) + self.held.points(self.prefix + "held/")
        self.point, self.held = StepFold(), StepFold()
        return out

    def run_figures(self) -> dict[str, float]:
        """The measured steps' figures so far under ``stall/run/`` (the same means, over every step folded)."""
        figures = {
            f"{self.prefix}run/{p.name.removeprefix(self.prefix)}": p.value for p in self.total.points(self.prefix)
        }
        figures[f"{self.prefix}run/steps"] = float(self.total.n)
        return figures


def is_cuda(meta: Mapping[str, object]) -> bool:
    """Whether a run's meta names a CUDA device (its NVML readings are a GPU's utilisation)."""
    device = meta.get("device")
    return isinstance(device, dict) and device.get("kind") == "cuda"


class JobFold:
    """A running job's ranks folded as their feeds hand steps over: one :class:`LiveFold` per rank, each rank's
    steps folded only up to the last step every one of the ``ranks`` expected has handed over, so that the ranks'
    points of one :meth:`take` cover the same steps and the slowest rank's is the slowest over those steps (DDP
    keeps the ranks within a step or two; before every rank has handed a step, none is folded). A rank's sampler
    readings are folded with its steps, up to the last folded step's end."""

    def __init__(self, ranks: int, *, prefix: str = PREFIX) -> None:
        self.expected, self.prefix = ranks, prefix
        self.folds: dict[int, LiveFold] = {}
        self._steps: dict[int, list[tuple[StepRow, Sequence[PhaseRow]]]] = {}
        self._samples: dict[int, list[tuple[float, Mapping[str, float]]]] = {}
        self._meta: dict[int, Mapping[str, object]] = {}
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (newest step, newest sample's time) handed over

    def add(
        self,
        rank: int,
        steps: Iterable[tuple[StepRow, Sequence[PhaseRow]]],
        samples: Iterable[tuple[float, Mapping[str, float]]],
        windows: Iterable[KernelWindow],
        meta: Mapping[str, object],
    ) -> None:
        """What rank ``rank``'s feed handed over (again and again: each step and reading is taken once)."""
        fold = self.folds.setdefault(rank, LiveFold(prefix=self.prefix))
        fold.gpu_util = is_cuda(meta)
        fold.add_windows(windows)
        self._meta[rank] = meta
        step, t = self._seen.get(rank, (-1, -math.inf))
        pending, readings = self._steps.setdefault(rank, []), self._samples.setdefault(rank, [])
        for row, phases in steps:
            if row.step > step:
                pending.append((row, phases))
                step = row.step
        for at, values in samples:
            if at > t:
                readings.append((at, values))
                t = at
        self._seen[rank] = (step, t)

    def take(self, *, final: bool = False) -> list[Point]:
        """Each rank's point of the steps folded since the last take under ``stall/rankR/``, and the slowest rank's
        under ``stall/``; ``final``: every step handed over, aligned or not (the job has ended)."""
        ready = len(self._seen) >= self.expected and self._seen
        bound = math.inf if final else min(s for s, _ in self._seen.values()) if ready else -1
        per_rank: dict[int, list[Point]] = {}
        for r, fold in sorted(self.folds.items()):
            pending = self._steps[r]
            n = next((i for i, (row, _) in enumerate(pending) if row.step > bound), len(pending))
            fold.add(pending[:n], self._meta[r])
            end = math.inf if final else pending[n - 1][0].t_end if n else -math.inf
            readings = self._samples[r]
            k = next((i for i, (t, _) in enumerate(readings) if t > end), len(readings))
            fold.add_samples(readings[:k])
            self._steps[r], self._samples[r] = pending[n:], readings[k:]
            if points := fold.take():
                per_rank[r] = points
        return rank_points(per_rank) + slowest_points(per_rank, same_step=False)
