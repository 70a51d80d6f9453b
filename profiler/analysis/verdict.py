"""Verdict bands and recommendations: rules over a run's measured figures.

Every recommendation quotes the measured figure that triggered it, so a reader can check the reasoning
against the breakdown. Bands are TensorFlow input-pipeline analyzer's: >= 20% highly, >= 5% moderately.
On a simulated accelerator (device kind ``sim``) every device figure a recommendation quotes says
"simulated", and the input-bound ones quote how long the simulated device sat idle.

The rules read :class:`Figures`, gathered from the Summary's parts before the Summary is built, so the
Summary is built once with its recommendations and this module never imports it (no import circle).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from profiler.analysis.contention import Contention, contention_advice
from profiler.analysis.gpu import HOST_VERDICT, GpuSplit, host_finding, waits_for_host
from profiler.analysis.loader_time import LoaderTime
from profiler.analysis.memory import LoaderMemory
from profiler.analysis.parts import (
    EVENT_TIMERS,
    Breakdown,
    HostFigures,
    LoaderAttribution,
    NvmlFigures,
    RunDevice,
    SamplerHealth,
    StackEstimate,
    StepTimes,
)
from profiler.analysis.sampled import MAX_PYSPY_RATE, MIN_SAMPLES
from profiler.analysis.stages import Headspace, LoaderStages, stage_advice

HIGH = 0.20
MODERATE = 0.05
OTHER_SHARE = 0.10
OTHER_MIN_MS = 1.0
PIN_SHARE = 0.05
SATURATED_PCT = 85.0  # mean host CPU use (%) at which the cores count as saturated


@dataclass(frozen=True, slots=True)
class Recommendation:
    code: str
    text: str


@dataclass(frozen=True, slots=True)
class Figures:
    """What the recommendation rules read: the run's measured parts, before the Summary exists."""

    step_time_ms: StepTimes
    breakdown: Breakdown
    stall_fraction: float
    workers: int | None
    device_kind: str | None
    pin_memory: bool | None
    host: HostFigures
    sampler: SamplerHealth
    mode: str = "instrumented"
    stack_estimate: StackEstimate | None = None
    loader_attribution: LoaderAttribution | None = None
    cpu_count: int | None = None  # the host's cores, when the run recorded them
    contention: Contention | None = None  # run-queue wait of the training thread and workers (schedstat)
    device: RunDevice | None = None
    device_busy_fraction: float = math.nan
    nvml: NvmlFigures | None = None
    loader_time: LoaderTime | None = None  # where the loader processes' time goes (the ``loader`` source)
    memory: LoaderMemory | None = None  # the loader processes' memory (the ``memory`` source)
    stages: LoaderStages | None = None  # the loader's stages: time per item, capacity against demand
    headspace: Headspace | None = None  # run --headspace: the loader alone against the training's demand
    gpu: GpuSplit | None = None  # the kernel windows' split of the device's time
    pipeline: str | None = None

    @property
    def simulated(self) -> bool:
        return self.device is not None and self.device.simulated


def verdict_for(stall_fraction: float) -> str:
    if stall_fraction >= HIGH:
        return "highly input-bound"
    if stall_fraction >= MODERATE:
        return "moderately input-bound"
    return "not input-bound"


LOADER_CODES = frozenset(
    {"RAISE_WORKERS", "LOADER_TOO_SLOW", "PIN_MEMORY", "LOADER_HOTSPOT", "SHM_TOO_SMALL", "LOADER_STAGE", "RAY_CPUS"}
)


def at_site(recs: list[Recommendation], site: str | None) -> list[Recommendation]:
    """Advice on the loader's knobs prefixed with where the script builds it (``train.py:57: ...``)."""
    if not site:
        return recs
    return [Recommendation(r.code, f"{site}: {r.text}") if r.code in LOADER_CODES else r for r in recs]


def recommend(s: Figures) -> list[Recommendation]:
    out = _from_stacks(s)
    if s.memory is not None and s.memory.headline:  # whatever the stall: a growing worker ends the job
        out.append(Recommendation("WORKER_MEMORY_GROWTH", s.memory.headline + "."))
    if s.memory is not None and s.memory.shm_headline:  # whatever the stall: a worker out of /dev/shm ends the job
        out.append(Recommendation("SHM_TOO_SMALL", s.memory.shm_headline + "."))
    b = s.breakdown
    step = s.step_time_ms.mean
    if not step or math.isnan(step):
        return out
    input_bound = s.stall_fraction >= MODERATE
    advice = stage_advice(s.stages) if input_bound and s.stages is not None else None
    if advice:
        out.append(Recommendation("LOADER_STAGE", advice))
    # a simulated device's compute phase is the host launching kernels it does not run: its wait for a CPU is
    # no loss of the model's compute, which the simulator times (docs/sim.md)
    contended = None if s.simulated else contention_advice(s.contention)
    if contended:
        out.append(Recommendation("CPU_CONTENTION", contended))
    host_bound = waits_for_host(s.gpu)
    if host_bound and s.gpu is not None:
        runq = s.contention.step_runq_fraction if s.contention is not None else math.nan
        found = host_finding(
            s.gpu, workers=s.workers, pipeline=s.pipeline, runq_share=0.0 if math.isnan(runq) else runq
        )
        out.append(Recommendation("GPU_WAITS_FOR_HOST", found))
    elif input_bound:
        out.extend(_loader(s, b.data_wait, step))
    out.extend(_pin_memory(s, b.h2d, step))
    out.extend(_loop_overhead(b.other, step))
    if not input_bound and not host_bound:
        out.append(_not_input_bound(s, contended))
    _sampler_slow(s, out)
    return out


def _loader(s: Figures, wait: float, step: float) -> list[Recommendation]:
    """An input-bound run's advice on its loader: workers to add, or per-item work to make cheaper."""
    idle = _simulated_idle(s)
    if s.stages is not None and s.stages.store_saturated:
        return []  # the store is the limit: LOADER_STAGE says so; no advice here may add readers
    if s.workers == 0:
        cores = _cores(s.cpu_count)
        top = f"2-{cores}" if cores and cores > 2 else "2"
        return [
            Recommendation(
                "RAISE_WORKERS",
                f"Data wait is {wait:.1f} ms of a {step:.1f} ms step ({wait / step:.0%}) with num_workers=0: the "
                f"training process loads and augments every batch itself. Set num_workers={top}"
                + (f" (this machine has {cores} cores)" if cores else "")
                + " so batches are prepared in parallel."
                + idle,
            )
        ]
    if not (isinstance(s.workers, int) and s.workers > 0):
        return []
    sys_cpu = s.host.sys_cpu_pct
    busy = f" while system CPU averaged {sys_cpu:.0f}%" if math.isfinite(sys_cpu) else ""
    advice = _by_loader_time(s.loader_time, sys_cpu) or (
        "the cores are saturated: make per-item work cheaper (decode on the GPU with DALI, smaller images, "
        "cheaper augmentation)"
        if sys_cpu >= SATURATED_PCT
        else "add workers if cores are idle, or make per-item work cheaper (DALI decode, lighter augmentation)"
    )
    return [
        Recommendation(
            "LOADER_TOO_SLOW",
            f"Data wait is {wait:.1f} ms of a {step:.1f} ms step ({wait / step:.0%}) with num_workers={s.workers}"
            f"{busy}: {advice}." + idle,
        ),
        *_ray_cpus(s, wait, step),
    ]


def _ray_cpus(s: Figures, wait: float, step: float) -> list[Recommendation]:
    """Where the workers cannot keep up and this host's cores are spent: the CPUs the loader needs (its workers'
    measured CPU per batch over the step it would have with an instant loader), and the what-if that predicts
    them elsewhere (docs/whatif.md, "Ray Data on N CPUs")."""
    sys_cpu, lt = s.host.sys_cpu_pct, s.loader_time
    spent = sys_cpu >= SATURATED_PCT or (lt is not None and lt.bottleneck == "cores")
    cpu_ms = s.host.children_cpu_pct / 100 * step  # one batch a step
    target = step - wait
    if not spent or not cpu_ms > 0 or not target > 0:
        return []
    n = math.ceil(cpu_ms / target)
    return [
        Recommendation(
            "RAY_CPUS",
            f"The loader needs {n} CPU{'s' if n != 1 else ''}: its workers took {cpu_ms:.1f} ms of CPU per batch and "
            f"the step without the data wait is {target:.1f} ms, while this host's cores are spent; Ray Data tasks on "
            f"{n} CPUs of other machines would leave them to the trainer: `stallscope whatif RUN_DIR --ray-cpus {n}` "
            "predicts that.",
        )
    ]


def _by_loader_time(lt: LoaderTime | None, sys_cpu: float = math.nan) -> str | None:
    """The advice that fits what the workers' own time says (docs/metrics.md, "Loader time"), or None.
    ``sys_cpu``: the host's mean CPU use (%), which says whether computing workers have idle cores to grow into."""
    if lt is None or lt.workers is None or lt.bottleneck is None:
        return None
    w = lt.workers
    if lt.bottleneck == "cpu" and math.isfinite(sys_cpu):
        if sys_cpu >= SATURATED_PCT:
            return (
                f"the workers computed {w.cpu:.0f}% of their time and the cores were {sys_cpu:.0f}% busy: more "
                f"workers can add at most the idle {100 - sys_cpu:.0f}%, so make per-item work cheaper (DALI decode, "
                "smaller stored images, lighter augmentation)"
            )
        return (
            f"the workers computed {w.cpu:.0f}% of their time and the cores were {sys_cpu:.0f}% busy: add workers "
            "to use the idle cores, or make per-item work cheaper (DALI decode, lighter augmentation)"
        )
    return {
        "storage": f"the workers were blocked reading storage {w.storage:.0f}% of their time: cache the data set "
        "(page cache, local disk), use a faster store or larger sequential reads (sharded files); more workers "
        "help only while the store has bandwidth to spare",
        "network": f"the workers were blocked on the network {w.network:.0f}% of their time: more workers (more "
        "requests in flight) help while the server has bandwidth to spare; a local cache helps either way",
        "cores": f"the workers computed {w.cpu:.0f}% of their time and waited for a CPU {w.runq:.0f}%: the cores "
        "are saturated, so make per-item work cheaper (DALI decode, smaller stored images, lighter augmentation)",
        "cpu": f"the workers computed {w.cpu:.0f}% of their time: add workers while cores are idle, or make "
        "per-item work cheaper (DALI decode, lighter augmentation)",
        "ahead": f"yet the workers waited for work {w.queue:.0f}% of their time: batches were ready, and the wait "
        "is in the main process receiving them (unpickling, shared memory, pin memory); more workers will not help",
        "sleep": f"the workers slept {w.sleep:.0f}% of their time: find the time.sleep (or the retry back-off) in "
        "the data set",
        "lock": f"the workers waited on a lock or a thread {w.lock:.0f}% of their time: look for a lock shared "
        "between items (a logger, a file handle, a thread pool)",
    }.get(lt.bottleneck)


def _loop_overhead(other: float, step: float) -> list[Recommendation]:
    if not (other >= OTHER_MIN_MS and other >= OTHER_SHARE * step):
        return []
    return [
        Recommendation(
            "LOOP_OVERHEAD",
            f"{other:.1f} ms of a {step:.1f} ms step ({other / step:.0%}) is outside data wait, copy and compute: "
            "look for synchronisation (loss.item(), .cpu(), printing tensors) or logging in the loop, or wrap it "
            "in s.phase('name') to see it by name.",
        )
    ]


def _not_input_bound(s: Figures, contended: str | None) -> Recommendation:
    """A run under the moderate band: where its speed-ups must come from instead."""
    pct = s.stall_fraction * 100
    if contended and s.contention is not None:
        lost = s.contention.compute_runq_fraction
        return Recommendation(
            "NOT_INPUT_BOUND",
            f"Input stalls are {pct:.1f}% of step time (under 5%): batches arrive in time, but the training "
            f"thread lost {lost:.0%} of its compute time waiting for a CPU (CPU_CONTENTION): remove that "
            "contention first; beyond it, speed-ups must come from compute, not from the input pipeline.",
        )
    return Recommendation(
        "NOT_INPUT_BOUND",
        f"Input stalls are {pct:.1f}% of step time (under 5%): the loader keeps up. Speed-ups must come from "
        "compute (mixed precision, a larger batch, a faster model), not from the input pipeline." + _simulated_busy(s),
    )


def _pin_memory(s: Figures, h2d: float, step: float) -> list[Recommendation]:
    # a simulated device models pageable copies (blocking, staged) against pinned side-stream ones as CUDA has them
    if s.device_kind not in EVENT_TIMERS or s.pin_memory is not False or h2d < PIN_SHARE * step:
        return []
    copies = f"Simulated host-to-device copies to the {_sim_name(s)}" if s.simulated else "Host-to-device copies"
    return [
        Recommendation(
            "PIN_MEMORY",
            f"{copies} block {h2d:.1f} ms of a {step:.1f} ms step ({h2d / step:.0%}) from pageable "
            "memory: set pin_memory=True and copy with non_blocking=True (or prefetch on a side stream).",
        )
    ]


def _sim_name(s: Figures) -> str:
    return f"simulated {s.device.short_name}" if s.device is not None else "simulated device"


def _simulated_util(s: Figures) -> str:
    utils = [v for v in (s.nvml.util_pct.values() if s.nvml and s.nvml.simulated else ()) if math.isfinite(v)]
    return f"; simulated NVML utilisation {sum(utils) / len(utils):.0f}%" if utils else ""


def _simulated_idle(s: Figures) -> str:
    """For a simulated device: how long it sat idle, quoted from its simulated busy fraction and NVML figure."""
    busy = s.device_busy_fraction
    if not s.simulated or not math.isfinite(busy):
        return ""
    return (
        f" The {_sim_name(s)} sat idle {1 - busy:.0%} of the time (simulated device busy {busy:.0%}, sim-events"
        f"{_simulated_util(s)})."
    )


def _simulated_busy(s: Figures) -> str:
    busy = s.device_busy_fraction
    if not s.simulated or not math.isfinite(busy):
        return ""
    return f" The {_sim_name(s)} was busy {busy:.0%} of the time (simulated, sim-events{_simulated_util(s)})."


def _cores(cpu_count: object) -> int | None:
    return cpu_count if isinstance(cpu_count, int) and cpu_count > 0 else None


def _sampler_slow(s: Figures, out: list[Recommendation]) -> None:
    hz_req, hz_got = s.sampler.hz_requested, s.sampler.hz_achieved
    if hz_got < 0.9 * hz_req:  # False when either is NaN (not asked, or too few rounds to tell)
        out.append(
            Recommendation(
                "SAMPLER_SLOW",
                f"The sampler achieved {hz_got:.1f} Hz of the {hz_req:g} Hz asked (a busy host delays it): host and "
                "NVML time series are coarser than requested; step timings are unaffected.",
            )
        )


def _from_stacks(s: Figures) -> list[Recommendation]:
    """Recommendations that rest on py-spy samples: the worker hot spot (any run) and, for a zero-code run,
    the estimated stall (its figures carry their 95% interval)."""
    out: list[Recommendation] = []
    att = s.loader_attribution
    if att and att.headline:
        out.append(
            Recommendation(
                "LOADER_HOTSPOT",
                f"{att.headline} (from {att.active} busy py-spy samples of {att.workers} worker(s)).",
            )
        )
    est = s.stack_estimate.overall if s.stack_estimate else None
    if s.mode != "zero-code" or not est or math.isnan(s.stall_fraction):
        return out
    dw = est.data_wait
    share = f"{dw.fraction:.0%} (95% interval {dw.low:.0%}-{dw.high:.0%}, {est.samples} samples)"
    cores = _cores(s.cpu_count)
    if s.stall_fraction >= MODERATE and not s.workers:
        top = f"2-{cores}" if cores and cores > 2 else "2"
        out.append(
            Recommendation(
                "RAISE_WORKERS",
                f"An estimated {share} of the main thread's time is spent in the DataLoader with no worker "
                f"processes: set num_workers={top} so batches are prepared in parallel.",
            )
        )
    elif s.stall_fraction >= MODERATE:
        out.append(
            Recommendation(
                "LOADER_TOO_SLOW",
                f"An estimated {share} of the main thread's time is spent waiting for {s.workers} loader worker(s): "
                "add workers if cores are idle, or make per-item work cheaper (see the worker attribution).",
            )
        )
    else:
        out.append(
            Recommendation(
                "NOT_INPUT_BOUND",
                f"The main thread waits for data an estimated {share} of the time: the loader keeps up.",
            )
        )
    _sampler_slow(s, out)
    return out


def run_verdict(figures: Figures, meta: Mapping[str, object], status: str) -> str:
    """The run's verdict: what it measured (a loader alone, a synthetic input: ``meta``), the GPU waiting for the
    host, the stall band, or why it is unknown (a run whose ``status`` says it was interrupted or failed is not
    asked to sample faster: no rate fixes that)."""
    loader_only, synthetic = bool(meta.get("loader_only")), bool(meta.get("synthetic_input"))
    ended_early = status in ("interrupted", "failed")
    if loader_only:
        return "loader only (no model): throughput is the pipeline's prep rate"
    if synthetic:
        return "synthetic input (one batch reused): the input pipeline was not measured"
    stall = figures.stall_fraction
    if waits_for_host(figures.gpu):
        return HOST_VERDICT
    if not math.isnan(stall):
        return verdict_for(stall)
    if figures.mode == "zero-code":
        return too_few_samples(figures.stack_estimate, ended_early)
    return "unknown: no measured steps"


def too_few_samples(est: StackEstimate | None, ended_early: bool = False) -> str:
    """A zero-code run's verdict when its estimate has too few samples: how many, and what would give enough (for
    a run that ended early, interrupted or failed, nothing: a faster rate is no fix for that)."""
    o = est.overall if est is not None else None
    n, span = (o.samples, o.seconds) if o is not None else (0, 0.0)
    if ended_early:
        return (
            f"unknown: the run ended early, with {n} main-thread stack samples over {span:.1f} s of training "
            f"(an estimate needs {MIN_SAMPLES}) and no measured step"
        )
    fix = "run it longer"
    if span > 0 and (need := math.ceil(1.5 * MIN_SAMPLES / span)) <= MAX_PYSPY_RATE:
        fix += f", or sample faster: --pyspy-rate {need}"  # 1.5x: set-up and tear-down are cut from the span
    return (
        f"unknown: {n} main-thread stack samples over {span:.1f} s of training, fewer than the {MIN_SAMPLES} an "
        f"estimate needs: {fix}"
    )
