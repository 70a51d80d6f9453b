"""Run record -> Summary: the step breakdown, stall and busy fractions, host and NVML figures, sampler health.

Pure: takes a :class:`profiler.store.RunRecord`, returns a :class:`Summary`; reads no clock and no file,
so ``stallscope report`` on a stored run prints exactly what the run printed. Definitions are those of
docs/metrics.md; every figure carries the name of the instrument it came from (``sources``).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from profiler.analysis.contention import Contention, contention_of
from profiler.analysis.sampled import MIN_SAMPLES, stack_estimates
from profiler.analysis.stats import Interval, clip, finite_or_none, mean, quantile, subtract, total, union
from profiler.analysis.verdict import Recommendation, recommend, verdict_for
from profiler.store import PhaseRow, RunRecord, StepRow, pid_alive

STALE_HEARTBEAT_S = 10.0
CORE_PHASES = ("h2d", "compute")


@dataclass(frozen=True, slots=True)
class Summary:
    run_id: str | None
    scenario: str | None
    pipeline: str | None
    device: dict[str, Any]
    batch_size: int | None
    workers: int | None
    steps: int
    warmup_steps: int
    throughput_samples_per_s: float
    step_time_ms: dict[str, float]
    breakdown_ms_per_step: dict[str, float]
    stall_fraction: float
    device_busy_fraction: float
    verdict: str
    recommendations: list[Recommendation]
    sampler: dict[str, Any]
    status: str
    error: str | None = None
    measured_s: float = math.nan
    samples_measured: int = 0
    pin_memory: bool | None = None
    device_ms_per_step: dict[str, float] = field(default_factory=dict)
    stall_ms_per_step: dict[str, float] = field(default_factory=dict)
    mode: str = "instrumented"  # or "zero-code": no steps, figures estimated from stack samples
    command_exit_code: int | None = None
    stack_estimate: dict[str, Any] | None = None  # main-thread phase fractions from py-spy samples
    loader_attribution: dict[str, Any] | None = None  # where the loader workers' CPU goes
    host: dict[str, Any] = field(default_factory=dict)
    nvml: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    model: str | None = None
    loader_only: bool = False  # no model ran: throughput is the loader's prep rate
    augment: str | None = None  # the augmentation spec the pipeline realised, in words
    bad_samples: dict[str, Any] | None = None  # {policy, skipped, files[{path, reason}]}
    cost: dict[str, Any] | None = None  # {price_per_hour, per_1k_samples, per_epoch, epoch_samples}
    contention: Contention | None = None  # run-queue wait of the training thread and workers (schedstat)

    def to_dict(self) -> dict[str, Any]:
        """The summary.json object: NaN becomes null (JSON has no NaN)."""
        out: dict[str, Any] = json_safe(asdict(self))
        return out


def json_safe(x: Any) -> Any:
    """``x`` with NaN/inf floats as None, recursively: JSON has no NaN."""
    if isinstance(x, float):
        return finite_or_none(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def run_status(meta: dict[str, Any], now: float | None = None) -> str:
    """The stored status; a run still marked ``running`` whose writer is gone was interrupted."""
    status = str(meta.get("status", "interrupted"))
    if status != "running":
        return status
    now = time.time() if now is None else now
    heartbeat = float(meta.get("heartbeat") or meta.get("started_at") or 0.0)
    pid = meta.get("pid")
    if now - heartbeat > STALE_HEARTBEAT_S or not (isinstance(pid, int) and pid_alive(pid)):
        return "interrupted"
    return "running"


def summarize(rec: RunRecord, now: float | None = None) -> Summary:
    meta = rec.meta
    measured = [s for s in rec.steps if not s.warmup]
    notes: list[str] = []
    if not measured and rec.steps:
        notes.append(f"all {len(rec.steps)} recorded steps were warm-up steps: figures are from no measured step")
    ids = {s.step for s in measured}
    phases = [p for p in rec.phases if p.step in ids]
    device = dict(meta.get("device") or {"kind": "cpu", "name": "unknown"})
    on_cuda = device.get("kind") == "cuda" and any(p.dev_start is not None for p in phases)

    step_s = [s.t_end - s.t_start for s in measured]
    wall = math.fsum(step_s)
    n = len(measured)
    per_step = _phase_sums(measured, phases)
    wait = mean([s.data_wait_s for s in measured])
    breakdown = {"data_wait": wait * 1e3}
    user = sorted({name for sums in per_step.values() for name in sums} - set(CORE_PHASES))
    for name in (*CORE_PHASES, *user):  # h2d and compute always present, even when never entered
        breakdown[name] = math.fsum(per_step[s.step].get(name, 0.0) for s in measured) / n * 1e3 if n else math.nan

    if on_cuda and n:
        stall_ms, drained = _cuda_stalls(measured, phases)
        # a pageable copy first waits for the compute already queued: that host time is compute, not input
        breakdown["h2d"] -= drained / n * 1e3
        breakdown["compute"] += drained / n * 1e3
        stall_ms = {k: v / n * 1e3 for k, v in stall_ms.items()}
    else:
        stall_ms = {"data_wait": breakdown["data_wait"], "h2d": breakdown["h2d"]}
    accounted = math.fsum(v for v in breakdown.values())
    breakdown["other"] = max(0.0, mean(step_s) * 1e3 - accounted) if n else math.nan

    step_mean = mean(step_s)
    stall = (stall_ms["data_wait"] + stall_ms["h2d"]) / (step_mean * 1e3) if n and step_mean > 0 else math.nan
    window = (measured[0].t_start, measured[-1].t_end) if measured else (0.0, 0.0)
    busy, busy_source = _busy_fraction(
        phases, per_step=per_step, steps=measured, wall=wall, window=window, on_cuda=on_cuda
    )

    counted = [s.samples for s in measured if s.samples is not None]
    samples_total = sum(counted)
    throughput = samples_total / wall if wall > 0 and len(counted) == n else math.nan
    if n and len(counted) < n:
        notes.append("batch sizes were not known for every step: throughput is not reported")

    host, nvml = _sample_figures(rec, window if measured else None)
    sampler = _sampler_health(rec)
    device["nvml"] = sampler["sources"].get("nvml", "not sampled")
    status = run_status(meta, now)
    workers = meta.get("workers")
    mode = str(meta.get("mode") or "instrumented")
    stack_est, attribution = stack_estimates(rec)
    sources = _figure_sources(on_cuda, busy_source, sampler)
    if mode == "zero-code":
        stall, workers = _zero_code_figures(stack_est, attribution, host, notes, sources)
    stall_ok = not math.isnan(stall)
    verdict = verdict_for(stall) if stall_ok else "unknown: no measured steps"
    loader_only = bool(meta.get("loader_only"))
    if loader_only:
        verdict = "loader only (no model): throughput is the pipeline's prep rate"
    device_ms = {}
    if on_cuda:
        for name in CORE_PHASES:
            device_ms[name] = total(_dev(phases, name)) / n * 1e3
    summary = Summary(
        run_id=meta.get("run_id"),
        scenario=meta.get("scenario"),
        pipeline=meta.get("pipeline"),
        device=device,
        batch_size=meta.get("batch_size"),
        workers=workers,
        steps=n,
        warmup_steps=len(rec.steps) - n,
        throughput_samples_per_s=throughput,
        step_time_ms={
            "mean": step_mean * 1e3,
            "p50": quantile(step_s, 0.5) * 1e3,
            "p90": quantile(step_s, 0.9) * 1e3,
        },
        breakdown_ms_per_step=breakdown,
        stall_fraction=stall,
        device_busy_fraction=busy,
        verdict=verdict,
        recommendations=[],
        sampler=sampler,
        status=status,
        error=meta.get("error"),
        measured_s=wall,
        samples_measured=samples_total,
        pin_memory=meta.get("pin_memory"),
        device_ms_per_step=device_ms,
        stall_ms_per_step=stall_ms,
        host=host,
        nvml=nvml,
        sources=sources,
        notes=notes,
        mode=mode,
        command_exit_code=meta.get("command_exit_code"),
        stack_estimate=stack_est,
        loader_attribution=attribution,
        model=meta.get("model"),
        loader_only=loader_only,
        augment=meta.get("augment"),
        bad_samples=meta.get("bad_samples"),
        cost=cost_figures(meta.get("price_per_hour"), throughput, meta.get("epoch_samples")),
        contention=contention_of(rec),
    )
    if stall_ok and not loader_only:
        # the list was created empty for this summary alone; recommend() reads the finished figures
        summary.recommendations.extend(recommend(summary, cpu_count=meta.get("cpu_count")))
    return summary


def cost_figures(price_per_hour: Any, throughput: float, epoch_samples: Any) -> dict[str, Any] | None:
    """Cost at the measured throughput: per 1,000 samples and per epoch (None when no price was given)."""
    if not isinstance(price_per_hour, (int, float)):
        return None
    per_sample = price_per_hour / 3600 / throughput if throughput and throughput > 0 else math.nan
    epoch = epoch_samples if isinstance(epoch_samples, int) and epoch_samples > 0 else None
    return {
        "price_per_hour": float(price_per_hour),
        "per_1k_samples": per_sample * 1000,
        "per_epoch": per_sample * epoch if epoch else math.nan,
        "epoch_samples": epoch,
    }


def _phase_sums(steps: list[StepRow], phases: list[PhaseRow]) -> dict[int, dict[str, float]]:
    """Per step, host seconds per top-level phase name (nested phases would double count)."""
    out: dict[int, dict[str, float]] = {s.step: defaultdict(float) for s in steps}
    for p in phases:
        if p.depth == 0:
            out[p.step][p.name] += p.t_end - p.t_start
    return out


def _zero_code_figures(
    est: dict[str, Any] | None,
    attribution: dict[str, Any] | None,
    host: dict[str, Any],
    notes: list[str],
    sources: dict[str, str],
) -> tuple[float, int | None]:
    """Stall fraction and worker count of a run observed from outside (no steps, no phases)."""
    notes.append(
        "zero-code run: step time, throughput and the per-step breakdown need instrumentation "
        "(stallscope run SCENARIO, or profiler.Session in the script) and are not measured"
    )
    workers = (
        attribution["workers"]
        if attribution
        else sum(1 for k in host if k.startswith("proc_w") and k.endswith("_cpu_pct_mean"))
    )
    sources["workers"] = "worker processes seen by py-spy / psutil under the training process"
    overall = (est or {}).get("overall")
    if not overall or overall["samples"] < MIN_SAMPLES:
        notes.append(f"fewer than {MIN_SAMPLES} main-thread stack samples: no stall estimate")
        return math.nan, workers
    stall = overall["data_wait"]["fraction"] + overall["h2d"]["fraction"]
    lo = overall["data_wait"]["low"] + overall["h2d"]["low"]
    hi = min(1.0, overall["data_wait"]["high"] + overall["h2d"]["high"])
    sources["stall_fraction"] = (
        f"estimated: share of {overall['samples']} py-spy samples of the main thread in the loader or a copy "
        f"(95% interval {lo:.0%}-{hi:.0%})"
    )
    return stall, workers


def _dev(phases: list[PhaseRow], name: str | None = None) -> list[Interval]:
    """Device (event) intervals of the phases called ``name`` (all phases when None)."""
    return [
        (p.dev_start, p.dev_end)
        for p in phases
        if p.dev_start is not None and p.dev_end is not None and (name is None or p.name == name)
    ]


def _cuda_stalls(steps: list[StepRow], phases: list[PhaseRow]) -> tuple[dict[str, float], float]:
    """Input stall seconds on an asynchronous device, and host h2d seconds spent draining queued compute.

    The device is stalled on input only while it is not computing. So: data wait counts where no device
    compute overlaps it; h2d counts where the host blocked in the copy or the device ran the copy, less the
    time under device compute or already counted as data wait.
    """
    compute = union(_dev(phases, "compute"))
    waits = union((s.t_start, s.t_start + s.data_wait_s) for s in steps)
    host_h2d = union((p.t_start, p.t_end) for p in phases if p.name == "h2d" and p.depth == 0)
    copies = union(host_h2d + _dev(phases, "h2d"))
    wait_stall = total(subtract(waits, compute))
    h2d_stall = total(subtract(subtract(copies, compute), waits))
    drained = total(host_h2d) - total(subtract(host_h2d, compute))
    return {"data_wait": wait_stall, "h2d": h2d_stall}, drained


def _busy_fraction(
    phases: list[PhaseRow],
    *,
    per_step: dict[int, dict[str, float]],
    steps: list[StepRow],
    wall: float,
    window: Interval,
    on_cuda: bool,
) -> tuple[float, str]:
    if wall <= 0:
        return math.nan, "none"
    if on_cuda:
        return total(clip(union(_dev(phases)), *window)) / wall, "cuda-events"
    compute = math.fsum(per_step[s.step].get("compute", 0.0) for s in steps)
    return compute / wall, "host-compute-phase"


def _sample_figures(rec: RunRecord, window: Interval | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Means (and maxima for memory) of sampled metrics over the measured window."""
    series: dict[str, list[float]] = defaultdict(list)
    for t, source, metric, value in rec.samples:
        if source == "sampler" or value is None:
            continue
        if window is not None and not (window[0] <= t <= window[1]):
            continue
        series[metric].append(value)
    host: dict[str, Any] = {}
    nvml: dict[str, Any] = {}
    for metric, vals in sorted(series.items()):
        target = nvml if metric.startswith("gpu") else host
        key = metric.replace(".", "_")
        if metric.endswith(("_mb", "_total_mb")):
            target[key + "_max"] = max(vals)
        else:
            target[key + "_mean"] = mean(vals)
    return host, nvml


def _sampler_health(rec: RunRecord) -> dict[str, Any]:
    rows = [(t, v) for t, _src, m, v in rec.samples if m == "sampler.lateness_ms"]
    times = [t for t, _ in rows]
    lateness = [v for _, v in rows if v is not None]
    reads = [v for _, _src, m, v in rec.samples if m == "sampler.read_ms" and v is not None]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    sources: dict[str, str] = {}
    errors: dict[str, int] = defaultdict(int)
    last_error: dict[str, str] = {}
    for _t, kind, src, message in rec.events:
        if src is None:
            continue
        if kind == "source":
            sources[src] = message
        elif kind == "source_error":
            errors[src] += 1
            last_error[src] = message
    stored = rec.meta.get("sampler_stats") or {}
    for name, st in (stored.get("sources") or {}).items():
        errors[name] = max(errors[name], int(st.get("errors", 0)))
    hz_req = float(rec.meta.get("sample_hz") or math.nan)
    return {
        "hz_requested": hz_req,
        "hz_achieved": (len(times) - 1) / span if span > 0 else math.nan,
        "samples": len(times),
        "lateness_ms": {
            "mean": mean(lateness),
            "p95": quantile(lateness, 0.95),
            "max": max(lateness, default=math.nan),
        },
        "read_ms_mean": mean(reads),
        "missed_deadlines": stored.get("missed_deadlines"),
        "sources": sources,
        "errors": dict(errors),
        "last_error": last_error,
    }


def _figure_sources(on_cuda: bool, busy_source: str, sampler: dict[str, Any]) -> dict[str, str]:
    return {
        "step_time": "host perf_counter, from one next() call on the loader to the next",
        "data_wait": "host perf_counter around next() on the loader",
        "h2d": "host perf_counter around the copy"
        + (", less the time it waited for queued device compute (CUDA events)" if on_cuda else ""),
        "compute": "host perf_counter around the compute phase"
        + (", plus the copy's wait for queued compute; device time: device_ms_per_step" if on_cuda else ""),
        "stall_fraction": "(data wait + h2d) / step time, host perf_counter"
        if not on_cuda
        else "(data wait + copy time, host-blocked or CUDA-event, not overlapped by device compute) / step time",
        "device_busy_fraction": {
            "cuda-events": "union of CUDA-event intervals of all phases / wall time",
            "host-compute-phase": "compute phase time / wall time (CPU device: no device clock)",
            "none": "not measured",
        }[busy_source],
        "host": "psutil, sampled by the background sampler",
        "nvml": "NVML utilization.gpu (driver-averaged over 1/6 s to 1 s), sampled"
        if sampler["sources"].get("nvml") == "available"
        else f"not measured ({sampler['sources'].get('nvml', 'not sampled')})",
    }
