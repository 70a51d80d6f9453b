"""Run record -> Summary: the step breakdown, stall and busy fractions, host and NVML figures, sampler health.

Pure: takes a :class:`profiler.core.store.RunRecord`, returns a :class:`Summary`; reads no clock and no file,
so ``stallscope report`` on a stored run prints exactly what the run printed. Definitions are those of
docs/metrics.md; every figure carries the name of the instrument it came from (``sources``).

Invariants:
- A Summary is built once, from typed parts (:mod:`profiler.analysis.parts`), with its recommendations:
  the rules (:func:`~profiler.analysis.verdict.recommend`) read the parts before it exists.
- ``Summary.to_dict()`` is summary.json: every key it has ever had stays, with the same value
  (tests/test_summary_contract.py holds golden files); new keys may be added.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict

from profiler.analysis.apart import WindowsApart, measured_steps, startup_held, windows_apart
from profiler.analysis.attribution import unattributed_workers
from profiler.analysis.contention import Contention, contention_of
from profiler.analysis.gpu import (
    CoarseSplit,
    GpuSplit,
    coarse_split,
    gpu_busy_source,
    gpu_of,
)
from profiler.analysis.loader_time import LoaderTime, loader_time
from profiler.analysis.memory import LoaderMemory, loader_memory, shm_need
from profiler.analysis.meta import AUTO_INSTRUMENTED, JSON
from profiler.analysis.mfu import Mfu, mfu_of
from profiler.analysis.parts import (
    CORE_PHASES,
    EVENT_TIMERS,
    NESTED_SYNC,
    SIMULATED,
    SYNC_PHASE,
    BadSamples,
    Breakdown,
    Cost,
    DeviceTimes,
    HostFigures,
    InputStall,
    Lateness,
    LoaderAttribution,
    NvmlFigures,
    RunDevice,
    SamplerHealth,
    Sources,
    StackEstimate,
    StepTimes,
    event_timer,
    figure_sources,
    is_peak,
    nvml_source,
)
from profiler.analysis.phasesums import PhaseTotals, phase_sums, phase_totals
from profiler.analysis.ray_view import RayView, ray_view
from profiler.analysis.sampled import MIN_SAMPLES, sampling_notes, stack_estimates
from profiler.analysis.spread import StepSpread, step_spread
from profiler.analysis.stages import Headspace, LoaderStages, dali_stages, headspace, loader_stages, per_item_of
from profiler.analysis.stats import Interval, clip, json_safe, mean, quantile, subtract, total, union
from profiler.analysis.taken import missing_notes, steps_taken
from profiler.analysis.verdict import Figures, Recommendation, at_site, recommend, run_verdict
from profiler.core.store import PhaseRow, RunRecord, StepRow, run_status


@dataclass(frozen=True, slots=True)
class Summary:
    """One run's figures, verdict and recommendations; ``to_dict()`` is summary.json."""

    run_id: str | None
    scenario: str | None
    pipeline: str | None
    device: RunDevice
    batch_size: int | None
    workers: int | None
    steps: int
    warmup_steps: int
    throughput_samples_per_s: float
    step_time_ms: StepTimes
    breakdown_ms_per_step: Breakdown
    stall_fraction: float
    device_busy_fraction: float
    verdict: str
    recommendations: tuple[Recommendation, ...]
    sampler: SamplerHealth
    status: str
    sources: Sources
    error: str | None = None
    measured_s: float = math.nan
    samples_measured: int = 0
    pin_memory: bool | None = None
    device_ms_per_step: DeviceTimes | None = None  # CUDA event timing only
    stall_ms_per_step: InputStall = field(default_factory=lambda: InputStall(math.nan, math.nan))
    mode: str = "instrumented"  # or "zero-code": no steps, figures estimated from stack samples
    command_exit_code: int | None = None
    loader: JSON | None = None  # auto-instrumented: the training DataLoader's site and knobs (meta training_loader)
    stack_estimate: StackEstimate | None = None  # main-thread phase fractions from py-spy samples
    loader_attribution: LoaderAttribution | None = None  # where the loader workers' CPU goes
    host: HostFigures = field(default_factory=HostFigures)
    nvml: NvmlFigures = field(default_factory=NvmlFigures)
    notes: tuple[str, ...] = ()
    model: str | None = None
    loader_only: bool = False  # no model ran: throughput is the loader's prep rate
    synthetic_input: bool = False  # one batch on the device every step: the input pipeline was not measured
    augment: str | None = None  # the augmentation spec the pipeline realised, in words
    bad_samples: BadSamples | None = None
    cost: Cost | None = None
    contention: Contention | None = None  # run-queue wait of the training thread and workers (schedstat)
    loader_time: LoaderTime | None = None  # where the loader processes' time goes (on a CPU, blocked on what)
    memory: LoaderMemory | None = None  # the loader processes' USS / PSS, shared memory, copy-on-read growth
    stages: LoaderStages | None = None  # the loader's stages (fetch, decode, augment, collate): capacity vs demand
    headspace: Headspace | None = None  # run --headspace: the loader alone before training against the demand
    ray: RayView | None = None  # --pipeline ray: Ray Data's own stats beside the loop's data wait (ray_view)
    device_span_fraction: float = math.nan  # the union of the phases' device-event spans / wall (the old "busy")
    gpu: GpuSplit | None = None  # the kernel windows' split of the device's time (analysis.gpu)
    mfu: Mfu | None = None  # model FLOPs utilisation (analysis.mfu)
    gpu_coarse: CoarseSplit | None = None  # without kernel windows: the split over the sampler's intervals
    kernel_windows: WindowsApart | None = None  # the steps the kernel windows held, recorded apart (analysis.apart)
    precision: JSON | None = None  # what a real device's training computed in (run --precision; meta precision)
    step_spread: StepSpread | None = None  # the standard errors of the per-step means (analysis.spread)
    # the steps the training process took (the ring's count, meta steps_taken), and those of them the store lacks
    steps_taken: int | None = None
    steps_lost: int | None = None

    def to_dict(self) -> JSON:
        """The summary.json object (today's keys in today's order): NaN becomes null (JSON has no NaN)."""
        out: JSON = {
            "run_id": self.run_id,
            "scenario": self.scenario,
            "pipeline": self.pipeline,
            "device": self.device.to_dict(),
            "batch_size": self.batch_size,
            "workers": self.workers,
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "step_time_ms": self.step_time_ms.to_dict(),
            "breakdown_ms_per_step": self.breakdown_ms_per_step.to_dict(),
            "stall_fraction": self.stall_fraction,
            "device_busy_fraction": self.device_busy_fraction,
            "verdict": self.verdict,
            "recommendations": [{"code": r.code, "text": r.text} for r in self.recommendations],
            "sampler": self.sampler.to_dict(),
            "status": self.status,
            "error": self.error,
            "measured_s": self.measured_s,
            "samples_measured": self.samples_measured,
            "pin_memory": self.pin_memory,
            "device_ms_per_step": self.device_ms_per_step.to_dict() if self.device_ms_per_step else {},
            "stall_ms_per_step": self.stall_ms_per_step.to_dict(),
            "mode": self.mode,
            "command_exit_code": self.command_exit_code,
            "loader": self.loader,
            "stack_estimate": self.stack_estimate.to_dict() if self.stack_estimate else None,
            "loader_attribution": self.loader_attribution.to_dict() if self.loader_attribution else None,
            "host": self.host.to_dict(),
            "nvml": self.nvml.to_dict(),
            "sources": self.sources.to_dict(),
            "notes": list(self.notes),
            "model": self.model,
            "loader_only": self.loader_only,
            "synthetic_input": self.synthetic_input,
            "augment": self.augment,
            "bad_samples": self.bad_samples.to_dict() if self.bad_samples else None,
            "cost": self.cost.to_dict() if self.cost else None,
            "contention": self.contention.to_dict() if self.contention else None,
            "loader_time": self.loader_time.to_dict() if self.loader_time else None,
            "memory": self.memory.to_dict() if self.memory else None,
            "stages": self.stages.to_dict() if self.stages else None,
            "headspace": self.headspace.to_dict() if self.headspace else None,
            "ray": self.ray.to_dict() if self.ray else None,
            "device_span_fraction": self.device_span_fraction,
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "mfu": self.mfu.to_dict() if self.mfu else None,
            "gpu_coarse": self.gpu_coarse.to_dict() if self.gpu_coarse else None,
            "kernel_windows": self.kernel_windows.to_dict() if self.kernel_windows else None,
            "precision": self.precision,
            "step_spread": self.step_spread.to_dict() if self.step_spread else None,
            "steps_taken": self.steps_taken,
            "steps_lost": self.steps_lost,
        }
        return json_safe(out)


@dataclass(frozen=True, slots=True)
class _Measured:
    """The measured (non-warm-up) steps and their phases: what every timed figure is computed over."""

    steps: list[StepRow]
    phases: list[PhaseRow]
    events: str | None  # "cuda-events" | "sim-events": a device whose phases carry event times; else None
    # device work still queued when the window opened (from warm-up) and when it closed: the host runs ahead
    queued_in: float = 0.0
    queued_out: float = 0.0
    # every phase of the run, warm-up included: queued warm-up compute also overlaps the measured data waits
    all_phases: list[PhaseRow] = field(default_factory=list)
    totals: PhaseTotals | None = None  # the phases' figures read in bulk (analysis.bulk): ``phases`` is then empty
    step_s: list[float] = field(init=False)  # each step's time, and their sum: made once (a long run's 100,000
    wall: float = field(init=False)  # were made seven times a summary)

    def __post_init__(self) -> None:
        step_s = [s.t_end - s.t_start for s in self.steps]
        object.__setattr__(self, "step_s", step_s)
        object.__setattr__(self, "wall", math.fsum(step_s))

    @property
    def on_device_events(self) -> bool:
        return self.events is not None

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def device_wall(self) -> float:
        """The measured steps' wall time as the device lived it: on an asynchronous device the host runs ahead,
        so the window's work ends when the device finishes it, not when the host queued it."""
        return self.wall + self.queued_out - self.queued_in

    @property
    def window(self) -> Interval:
        return (self.steps[0].t_start, self.steps[-1].t_end) if self.steps else (0.0, 0.0)


@dataclass(frozen=True, slots=True)
class _Timing:
    """The figures timed from steps and phases (docs/metrics.md), each in ms per measured step unless named."""

    step_time: StepTimes
    breakdown: Breakdown
    stall_ms: InputStall  # the device's wait for input: data wait and copy not overlapped by device compute
    device_ms: DeviceTimes | None  # event-measured device time per phase; None without device events
    stall_fraction: float  # (stall_ms.data_wait + stall_ms.h2d) / mean step time
    busy_fraction: float
    busy_source: str  # "cuda-events" | "sim-events" | "host-compute-phase" | "none"
    spread: StepSpread | None = None  # how far the per-step means could move in a run made again


@dataclass(frozen=True, slots=True)
class _HostParts:
    """Mean host ms per measured step spent in each part of the step, as the host's clock saw it."""

    data_wait: float  # blocked in next() on the loader
    h2d: float  # blocked in the copy, less its wait for queued device compute (which is compute)
    compute: float  # in the compute phase, less the ranks' wait nested in it, plus the copy's wait for compute
    sync: float  # in a top-level sync phase, plus the ranks' wait nested in compute
    user: tuple[tuple[str, float], ...]  # the user's own top-level phases, in name order
    nested_sync: float  # the ranks' wait nested in compute ("compute/sync"): moved from compute to sync

    def other(self, step_ms: float) -> float:
        """The step's time in no part: the step less every part (never below 0)."""
        parts = [self.data_wait, self.h2d, self.compute, self.sync, *(ms for _, ms in self.user)]
        return max(0.0, step_ms - math.fsum(parts))


def summarize(rec: RunRecord, now: float | None = None, *, totals: PhaseTotals | None = None) -> Summary:
    """The run's Summary: measured steps -> timing -> sampled figures -> verdict (``totals``: see analysis.bulk)."""
    meta = rec.meta
    notes = stopped_notes(rec)
    notes.extend(missing_notes(rec))
    m = _measured(rec, notes, totals)
    timing = _timing(m)
    throughput, samples_total = _throughput(m, notes)
    host, nvml = sample_figures(rec, m.window if m.steps else None)
    sampler = sampler_health(rec)
    mode = str(meta.get("mode") or "instrumented")
    stack_est, attribution = stack_estimates(rec)
    if (unsampled := unattributed_workers(meta, attribution is not None)) is not None:
        notes.append(unsampled)  # py-spy sampled no worker: said, not an empty section
    if stack_est is not None and stack_est.overall is not None:
        notes.extend(sampling_notes(meta))  # said beside the figures estimated from py-spy's samples
    recorded = dict(meta.get("device") or {"kind": "cpu", "name": "unknown"})
    device = RunDevice.from_meta(recorded, sampler.source(nvml_source(recorded.get("kind"))))
    gpu = gpu_of(rec)
    sources = _sources(m, timing, device, gpu)
    stall, workers = timing.stall_fraction, meta.get("workers")
    if mode == "zero-code":
        stall, workers, sources = _zero_code_figures(stack_est, attribution, host, notes, sources, meta=meta)
    elif mode == AUTO_INSTRUMENTED:
        sources = _auto_sources(sources, meta, notes)
    figures = Figures(
        step_time_ms=timing.step_time,
        breakdown=timing.breakdown,
        stall_fraction=stall,
        workers=workers,
        device_kind=device.kind,
        pin_memory=meta.get("pin_memory"),
        device=device,
        device_busy_fraction=timing.busy_fraction if gpu is None else gpu.busy_fraction,
        gpu=gpu,
        pipeline=meta.get("pipeline"),
        nvml=nvml,
        host=host,
        sampler=sampler,
        mode=mode,
        stack_estimate=stack_est,
        loader_attribution=attribution,
        cpu_count=meta.get("cpu_count"),
        contention=contention_of(rec, host),
        loader_time=loader_time(host, throughput),
        **_loader_figures(rec, m, timing, throughput, loader_time(host, throughput)),
    )
    loader_only, synthetic = bool(meta.get("loader_only")), bool(meta.get("synthetic_input"))
    # the rules read the figures before the Summary exists; a run with no stall figure gets none
    recommendations = _recommendations(figures, meta, none=math.isnan(stall) or loader_only or synthetic)
    return _summary(
        rec, now, m=m, timing=timing, figures=figures, device=device, recommendations=recommendations,
        throughput=throughput, samples_total=samples_total, sources=sources, notes=notes,
    )  # fmt: skip


def _sources(m: _Measured, timing: _Timing, device: RunDevice, gpu: GpuSplit | None) -> Sources:
    """The figures' sources; the device busy fraction's is the kernels' own time where a kernel window measured it
    (the events' span stays, as device_span_fraction)."""
    sources = figure_sources(m.events, timing.busy_source, device.nvml, simulated=device.simulated)
    return sources if gpu is None else dataclasses.replace(sources, device_busy_fraction=gpu_busy_source(gpu))


def _int_or_0(v: object) -> int:
    return v if isinstance(v, int) else 0


def _float_or_none(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _summary(
    rec: RunRecord, now: float | None, *, m: _Measured, timing: _Timing, figures: Figures, device: RunDevice,
    recommendations: tuple[Recommendation, ...], throughput: float, samples_total: int, sources: Sources,
    notes: list[str],
) -> Summary:  # fmt: skip
    """The Summary itself, from the figures the rules read and the rest of what summarize gathered."""
    meta = rec.meta
    return Summary(
        run_id=meta.get("run_id"),
        scenario=meta.get("scenario"),
        pipeline=meta.get("pipeline"),
        device=device,
        batch_size=meta.get("batch_size"),
        workers=figures.workers,
        steps=m.n,
        warmup_steps=sum(1 for s in rec.steps if s.warmup),
        throughput_samples_per_s=throughput,
        step_time_ms=timing.step_time,
        breakdown_ms_per_step=timing.breakdown,
        stall_fraction=figures.stall_fraction,
        device_busy_fraction=figures.device_busy_fraction,
        verdict=run_verdict(figures, meta, status := run_status(meta, now)),
        recommendations=recommendations,
        sampler=figures.sampler,
        status=status,
        sources=sources,
        error=meta.get("error"),
        measured_s=m.device_wall,
        samples_measured=samples_total,
        pin_memory=meta.get("pin_memory"),
        device_ms_per_step=timing.device_ms,
        stall_ms_per_step=timing.stall_ms,
        mode=figures.mode,
        command_exit_code=meta.get("command_exit_code"),
        loader=_loader(meta),
        stack_estimate=figures.stack_estimate,
        loader_attribution=figures.loader_attribution,
        host=figures.host,
        nvml=figures.nvml or NvmlFigures(),
        notes=tuple(notes),
        model=meta.get("model"),
        loader_only=bool(meta.get("loader_only")),
        synthetic_input=bool(meta.get("synthetic_input")),
        augment=meta.get("augment"),
        bad_samples=BadSamples.from_meta(meta["bad_samples"]) if meta.get("bad_samples") else None,
        cost=cost_figures(meta.get("price_per_hour"), throughput, meta.get("epoch_samples")),
        contention=figures.contention,
        loader_time=figures.loader_time,
        step_spread=timing.spread,
        ray=ray_view(
            meta.get("loader") or meta.get("training_loader"),  # run --pipeline ray, or run -- a Ray script
            data_wait_ms=timing.breakdown.data_wait,
            steps=m.n,
            step_waits_s=[st.data_wait_s for st in rec.steps],
            startup_held=startup_held(rec),
        ),
        **steps_taken(rec),
        **_loader_parts(figures),
        **_device_parts(rec, m, figures, timing),
    )


class _DeviceParts(TypedDict):
    device_span_fraction: float
    gpu: GpuSplit | None
    mfu: Mfu | None
    gpu_coarse: CoarseSplit | None
    precision: JSON | None
    kernel_windows: WindowsApart | None


def _device_parts(rec: RunRecord, m: _Measured, figures: Figures, timing: _Timing) -> _DeviceParts:
    """The device events' span (the busy fraction before kernel windows), the kernel windows' split (else the
    coarse one over the sampler's intervals) and the steps they held, and MFU."""
    mfu = mfu_of(rec.meta, timing.step_time.mean, figures.gpu)
    on_gpu = figures.device_kind in ("cuda", "sim") and figures.gpu is None and m.steps
    coarse = coarse_split(rec.samples, m.steps, m.window) if on_gpu else None
    precision = rec.meta.get("precision")  # what a real device's training computed in (run --precision)
    return {"device_span_fraction": timing.busy_fraction, "gpu": figures.gpu, "mfu": mfu, "gpu_coarse": coarse,
            "precision": precision if isinstance(precision, dict) else None,
            "kernel_windows": windows_apart(rec, m.steps)}  # fmt: skip


def _loader_parts(figures: Figures) -> _LoaderFigures:
    return {"memory": figures.memory, "stages": figures.stages, "headspace": figures.headspace}


def _loader_figures(
    rec: RunRecord, m: _Measured, timing: _Timing, throughput: float, lt: LoaderTime | None
) -> _LoaderFigures:
    """The loader's memory and stages over the measured window (the stages checked against the loader's time)."""
    meta, window = rec.meta, m.window if m.steps else None
    workers = _int_or_0(meta.get("workers"))
    return {
        "memory": loader_memory(rec.samples, window, throughput, workers, shm_need(meta)),
        "stages": loader_stages(
            rec.samples,
            window,
            workers=workers,
            batch_size=float(meta.get("batch_size") or math.nan),
            step_ms=timing.step_time.mean,
            data_wait_ms=timing.breakdown.data_wait,
            store_mbps=_float_or_none(meta.get("store_mbps")),
            **per_item_of(
                lt, workers, float(meta.get("batch_size") or math.nan), timing.breakdown.data_wait, throughput
            ),
        )
        or dali_stages(meta, step_ms=timing.step_time.mean, data_wait_ms=timing.breakdown.data_wait),
        "headspace": headspace(
            meta.get("loader_alone"),
            batch_size=float(meta.get("batch_size") or math.nan),
            step_ms=timing.step_time.mean,
            data_wait_ms=timing.breakdown.data_wait,
            throughput=throughput,
        ),
    }


class _LoaderFigures(TypedDict):
    memory: LoaderMemory | None
    stages: LoaderStages | None
    headspace: Headspace | None


def _measured(rec: RunRecord, notes: list[str], totals: PhaseTotals | None = None) -> _Measured:
    """The steps every timed figure is over: neither warm-up, the loader's start-up nor held by a kernel window
    (analysis.apart)."""
    measured = measured_steps(rec)
    if not measured and rec.steps:
        notes.append(f"all {len(rec.steps)} recorded steps were warm-up steps: figures are from no measured step")
    if totals is not None:
        return _Measured(measured, [], None, totals=totals)
    ids = {s.step for s in measured}
    phases = [p for p in rec.phases if p.step in ids]
    events = event_timer((rec.meta.get("device") or {}).get("kind"))
    if not (events and any(p.dev_start is not None for p in phases)):
        return _Measured(measured, phases, None)
    # each run of consecutive measured steps (a window's held steps split them) gains the device work still queued
    # at its end and loses what was queued from before its start
    dev_end: dict[int, float] = defaultdict(lambda: -math.inf)
    for p in rec.phases:
        if p.dev_end is not None:
            dev_end[p.step] = max(dev_end[p.step], p.dev_end)
    queued_in = queued_out = 0.0
    for i, s in enumerate(measured):
        if i == 0 or measured[i - 1].step != s.step - 1:
            queued_in += max(0.0, dev_end[s.step - 1] - s.t_start)
        if i == len(measured) - 1 or measured[i + 1].step != s.step + 1:
            queued_out += max(0.0, dev_end[s.step] - s.t_end)
    return _Measured(measured, phases, events, queued_in, queued_out, rec.phases)


def _timing(m: _Measured) -> _Timing:
    """Step times, the per-step breakdown, input stall and device busy fraction (docs/metrics.md)."""
    n, step_s = m.n, m.step_s
    step_mean = mean(step_s)
    ordered = sorted(step_s)  # once: quantile's own sort of a sorted list is one pass
    per_step = phase_sums(m.steps, m.phases) if m.totals is None else {}
    totals = m.totals or phase_totals(m.steps, m.phases, per_step)
    # on a device with events a pageable copy first waits for the compute already queued: that wait is compute
    stalls = _cuda_stalls(m.steps, m.phases, m.all_phases) if m.on_device_events and n else None
    host = _host_parts(m, totals, drained_s=stalls.drained_s if stalls else None)
    if stalls is None:  # no device clock: the device waits as long as the host does
        stall_ms = InputStall(host.data_wait, host.h2d)
    else:
        stall_ms = InputStall(stalls.data_wait_s / n * 1e3, stalls.h2d_s / n * 1e3)
    device_ms = (
        DeviceTimes(*(total(_dev(m.phases, name)) / n * 1e3 for name in CORE_PHASES)) if m.on_device_events else None
    )
    compute, sync = host.compute, host.sync
    if device_ms is not None and m.events == EVENT_TIMERS[SIMULATED]:
        compute, sync = _simulated_compute_sync(m, device_ms)
    busy, busy_source = _busy_fraction(m, totals, host.nested_sync * n / 1e3)
    return _Timing(
        step_time=StepTimes(step_mean * 1e3, quantile(ordered, 0.5) * 1e3, quantile(ordered, 0.9) * 1e3),
        breakdown=Breakdown(
            host.data_wait,
            host.h2d,
            compute,
            host.other(step_mean * 1e3) if n else math.nan,
            host.user,
            sync=sync if n else 0.0,
            sync_recorded=totals.sync_recorded,
        ),
        stall_ms=stall_ms,
        device_ms=device_ms,
        stall_fraction=(stall_ms.data_wait + stall_ms.h2d) / (step_mean * 1e3) if n and step_mean > 0 else math.nan,
        busy_fraction=busy,
        busy_source=busy_source,
        spread=totals.spread
        if m.totals is not None
        else step_spread(m.steps, per_step, busy_is_compute=busy_source == "host-compute-phase"),
    )


def _host_parts(m: _Measured, totals: PhaseTotals, drained_s: float | None) -> _HostParts:
    """The host-clock breakdown; ``drained_s``: host seconds the copies spent waiting for queued device compute
    (None without device events). h2d, compute and sync are there even when never entered (NaN with no steps)."""
    n = m.n

    def host_ms(name: str) -> float:
        return totals.host_s.get(name, 0.0) / n * 1e3 if n else math.nan

    user = sorted(set(totals.host_s) - {*CORE_PHASES, SYNC_PHASE})
    nested = total(totals.nested_sync) / n * 1e3 if n else 0.0
    h2d, compute = host_ms("h2d"), host_ms("compute") - nested
    if drained_s is not None:
        h2d, compute = h2d - drained_s / n * 1e3, compute + drained_s / n * 1e3
    return _HostParts(
        data_wait=mean([s.data_wait_s for s in m.steps]) * 1e3,
        h2d=h2d,
        compute=compute,
        sync=host_ms(SYNC_PHASE) + nested,
        user=tuple((name, host_ms(name)) for name in user),
        nested_sync=nested,
    )


def _simulated_compute_sync(m: _Measured, device_ms: DeviceTimes) -> tuple[float, float]:
    """A simulated device's compute and sync, ms per step: its compute is its device time (DESIGN), which runs
    while the host waits for the next batch; its sync is the device's idle time in the sync phases (they start
    when the queued compute ends), and the ranks' wait nested in compute moves from compute to sync."""
    nested = total(_dev(m.phases, NESTED_SYNC)) / m.n * 1e3
    return device_ms.compute - nested, total(_dev(m.phases, SYNC_PHASE)) / m.n * 1e3 + nested


def _throughput(m: _Measured, notes: list[str]) -> tuple[float, int]:
    """Samples per second over the measured steps, and the samples counted (NaN unless every step's is known)."""
    counted = [s.samples for s in m.steps if s.samples is not None]
    samples_total = sum(counted)
    wall = m.device_wall
    if m.n and len(counted) < m.n:
        notes.append("batch sizes were not known for every step: throughput is not reported")
    return (samples_total / wall if wall > 0 and len(counted) == m.n else math.nan), samples_total


def _loader(meta: JSON) -> JSON | None:
    """The training DataLoader the start-up module found: where the script builds it and its knobs."""
    lo = meta.get("training_loader")
    if not isinstance(lo, dict):
        return None
    keys = ("site", "file", "line", "kind", "args")
    return {k: lo.get(k) for k in keys}


def _recommendations(figures: Figures, meta: JSON, *, none: bool) -> tuple[Recommendation, ...]:
    """The rules' advice, advice on the loader naming where the script builds it; ``none``: no advice."""
    site = meta.get("loader_site")
    return () if none else tuple(at_site(recommend(figures), site if isinstance(site, str) else None))


def cost_figures(price_per_hour: object, throughput: float, epoch_samples: object) -> Cost | None:
    """Cost at the measured throughput: per 1,000 samples and per epoch (None when no price was given)."""
    if not isinstance(price_per_hour, (int, float)):
        return None
    per_sample = price_per_hour / 3600 / throughput if throughput and throughput > 0 else math.nan
    epoch = epoch_samples if isinstance(epoch_samples, int) and epoch_samples > 0 else None
    return Cost(
        price_per_hour=float(price_per_hour),
        per_1k_samples=per_sample * 1000,
        per_epoch=per_sample * epoch if epoch else math.nan,
        epoch_samples=epoch,
    )


def _auto_sources(sources: Sources, meta: JSON, notes: list[str]) -> Sources:
    """What the figures of a script timed by the start-up module are (profiler/zerocode/instrument.py)."""
    site = meta.get("loader_site") or "?"
    notes.append(
        f"auto-instrumented: steps are the script's own next() calls on the DataLoader built at {site}, timed "
        "by stallscope's start-up module; compute is the rest of each step"
    )
    if meta.get("instrument_note"):
        notes.append(str(meta["instrument_note"]))
    return dataclasses.replace(
        sources,
        h2d="not measured apart: host-to-device copies are inside compute (auto-instrumentation)",
        compute="host perf_counter: the step after its batch arrived, the script's whole step body "
        "(forward, backward, optimizer, copies, logging)",
    )


def _zero_code_figures(
    est: StackEstimate | None,
    attribution: LoaderAttribution | None,
    host: HostFigures,
    notes: list[str],
    sources: Sources,
    *,
    meta: JSON,
) -> tuple[float, int | None, Sources]:
    """Stall fraction, worker count and figure sources of a run observed from outside (no steps, no phases)."""
    if meta.get("instrument_note"):  # run -- CMD whose start-up module measured nothing: why
        notes.append(str(meta["instrument_note"]))
    notes.append(
        "zero-code run: step time, throughput and the per-step breakdown need instrumentation "
        "(stallscope run SCENARIO, or profiler.Session in the script) and are not measured"
    )
    workers = attribution.workers if attribution else len(host.worker_cpu_pct)
    sources = dataclasses.replace(
        sources, workers="worker processes seen by py-spy / psutil under the training process"
    )
    overall = est.overall if est else None
    if not overall or overall.samples < MIN_SAMPLES:
        notes.append(f"fewer than {MIN_SAMPLES} main-thread stack samples: no stall estimate")
        return math.nan, workers, sources
    stall = overall.data_wait.fraction + overall.h2d.fraction
    lo = overall.data_wait.low + overall.h2d.low
    hi = min(1.0, overall.data_wait.high + overall.h2d.high)
    how = (
        f"estimated: share of {overall.samples} py-spy samples of the main thread in the loader or a copy "
        f"(95% interval {lo:.0%}-{hi:.0%})"
    )
    return stall, workers, dataclasses.replace(sources, stall_fraction=how)


def _dev(phases: list[PhaseRow], name: str | None = None) -> list[Interval]:
    """Device (event) intervals of the phases called ``name`` (all phases when None)."""
    return [
        (p.dev_start, p.dev_end)
        for p in phases
        if p.dev_start is not None and p.dev_end is not None and (name is None or p.name == name)
    ]


class _DeviceStalls(NamedTuple):
    """Seconds over the measured steps of an asynchronous device's wait for input, and of the copies' wait."""

    data_wait_s: float  # data wait not overlapped by device compute
    h2d_s: float  # copy time (host-blocked or device) not under device compute nor already data wait
    drained_s: float  # host time in the copy spent waiting for queued device compute: compute, not input


def _cuda_stalls(
    steps: list[StepRow], phases: list[PhaseRow], all_phases: list[PhaseRow] | None = None
) -> _DeviceStalls:
    """Input stall seconds on an asynchronous device (data wait, h2d), and host h2d seconds spent draining
    queued compute.

    The device is stalled on input only while it is not computing (or running a sync phase's all-reduce). So:
    data wait counts where no device compute overlaps it; h2d counts where the host blocked in the copy or the
    device ran the copy, less the time under device compute or already counted as data wait.
    """
    # a sync phase's device time is the all-reduce on the compute stream: device work, as compute is
    compute = union(_dev(all_phases or phases, "compute") + _dev(all_phases or phases, SYNC_PHASE))
    waits = union((s.t_start, s.t_start + s.data_wait_s) for s in steps)
    host_h2d = union((p.t_start, p.t_end) for p in phases if p.name == "h2d" and p.depth == 0)
    copies = union(host_h2d + _dev(phases, "h2d"))
    wait_stall = total(subtract(waits, compute))
    h2d_stall = total(subtract(subtract(copies, compute), waits))
    drained = total(host_h2d) - total(subtract(host_h2d, compute))
    return _DeviceStalls(wait_stall, h2d_stall, drained)


def _busy_fraction(m: _Measured, totals: PhaseTotals, nested_sync_s: float) -> tuple[float, str]:
    """Busy share of the measured wall time. With device events, every phase's device interval counts, sync
    phases included: an all-reduce's kernel spins on the device while it waits for the other ranks, and NVML
    counts it busy too (the job report's sync column is what shows that wait). On a CPU device it is the
    compute share, and compute excludes the sync nested in it."""
    wall = m.wall
    if wall <= 0:
        return math.nan, "none"
    if m.events is not None:  # the window as the device lived it: the host may run ahead of the device
        lo, hi = m.window
        lived = m.device_wall
        if lived <= 0:
            return math.nan, "none"
        busy = total(clip(union(_dev(m.phases)), lo + m.queued_in, hi + m.queued_out)) / lived
        return min(1.0, busy), m.events  # a share: float sums of the same span may exceed 1 by an ulp
    compute = totals.host_s.get("compute", 0.0) - nested_sync_s
    return compute / wall, "host-compute-phase"


def sample_figures(rec: RunRecord, window: Interval | None) -> tuple[HostFigures, NvmlFigures]:
    """Means (and maxima for memory) of sampled metrics over the measured window."""
    series: dict[str, list[float]] = defaultdict(list)
    for t, source, metric, value in rec.samples:
        if source == "sampler" or value is None:
            continue
        if window is not None and not (window[0] <= t <= window[1]):
            continue
        series[metric].append(value)
    host: dict[str, float] = {}
    nvml: dict[str, float] = {}
    for metric, vals in sorted(series.items()):
        target = nvml if metric.startswith("gpu") else host
        target[metric] = max(vals) if is_peak(metric) else mean(vals)
    simulated = any(source == nvml_source("sim") for _t, source, _m, _v in rec.samples)
    return HostFigures(host), NvmlFigures(nvml, simulated=simulated)


def sampler_health(rec: RunRecord) -> SamplerHealth:
    """The sampler's achieved rate and lateness, and each source's status and read errors."""
    rows = [(t, v) for t, _src, m, v in rec.samples if m == "sampler.lateness_ms"]
    times = [t for t, _ in rows]
    lateness = [v for _, v in rows if v is not None]
    reads = [v for _, _src, m, v in rec.samples if m == "sampler.read_ms" and v is not None]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    sources: dict[str, str] = {}
    errors: dict[str, int] = defaultdict(int)
    last_error: dict[str, str] = {}
    stopped_at: dict[str, float] = {}
    for t, kind, src, message in rec.events:
        if src is None:
            continue
        if kind == "source":
            sources[src] = message
            if message.startswith(LOST):
                stopped_at[src] = t
        elif kind == "source_error":
            errors[src] += 1
            last_error[src] = message
    stored = rec.meta.get("sampler_stats") or {}
    for name, st in (stored.get("sources") or {}).items():
        errors[name] = max(errors[name], int(st.get("errors", 0)))
    return SamplerHealth(
        hz_requested=float(rec.meta.get("sample_hz") or math.nan),
        hz_achieved=(len(times) - 1) / span if span > 0 else math.nan,
        samples=len(times),
        lateness_ms=Lateness(mean(lateness), quantile(lateness, 0.95), max(lateness, default=math.nan)),
        read_ms_mean=mean(reads),
        missed_deadlines=stored.get("missed_deadlines"),
        sources=sources,
        errors=dict(errors),
        last_error=last_error,
        stopped_at=stopped_at,
    )


LOST = "lost: "  # the sampler's status for a source it retired: "lost: <reason>"


def stopped_notes(rec: RunRecord) -> list[str]:
    """One note per NVML source the sampler retired mid-run (GPU lost, driver gone, a hung call), and per other
    source whose call hung: when it stopped and why (a run's own process exiting is its end, not a fault); and
    why py-spy, when asked for, recorded no stacks or stopped mid-run."""
    notes = []
    problem = rec.meta.get("pyspy_problem")
    if problem:
        lost = "stall estimate or loader attribution" if rec.meta.get("mode") == "zero-code" else "loader attribution"
        notes.append(f"{problem}: no {lost} from py-spy's stacks; the run went on with the sampler alone")
    for t, kind, src, message in rec.events:
        if kind != "source" or src is None or not message.startswith(LOST):
            continue
        reason = message.removeprefix(LOST)
        if src in ("nvml", "nvml-sim"):
            notes.append(
                f"NVML stopped at {t:.1f} s: {reason}; GPU figures cover the run before that, the other sources went on"
            )
        elif "did not return" in reason:
            notes.append(f"source {src} stopped at {t:.1f} s: {reason}; the other sources went on")
    return notes
