"""The live figures as Prometheus metrics (names, types, labels, base units), computed from what the live view
folds: a run's :class:`~profiler.live.analysis.LiveSnapshot` and totals, or a job's
:class:`~profiler.jobs.analysis_live.JobLive` and each rank's totals.

Invariants: pure functions returning plain :class:`Metric` records (no optional dependency); the naming
conventions are docs/integrations.md's "The metrics" (``stallscope_`` names, base units, ``rank`` and
``simulated="true"`` labels); a figure not known yet (NaN) is left out, never exported as NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from profiler.analysis.parts import SIMULATED
from profiler.jobs.analysis_live import JobLive
from profiler.live.analysis import LiveSnapshot, RunTotals

Labels = Mapping[str, str]
STATUSES = ("running", "complete", "interrupted", "failed")
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family: ``name`` without ``_total`` for a counter (prometheus_client adds it)."""

    name: str
    kind: str  # "gauge" | "counter"
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, labels: Labels | None = None) -> None:
        if not math.isnan(value):
            self.samples.append((dict(labels or {}), float(value)))


def _simulated(meta: Mapping[str, object]) -> bool:
    dev = meta.get("device")
    return isinstance(dev, dict) and dev.get("kind") == SIMULATED


def info_metrics(meta: Mapping[str, object], status: str) -> list[Metric]:
    """``stallscope_run_info`` (constant 1; the run's identity in labels) and ``stallscope_run_status``."""
    dev = meta.get("device")
    dev = dev if isinstance(dev, dict) else {}
    device = str(dev.get("name") or dev.get("torch_device") or meta.get("device_label") or "unknown")
    labels = {
        "run_id": str(meta.get("run_id") or meta.get("job_id") or ""),
        "scenario": str(meta.get("scenario") or ""),
        "pipeline": str(meta.get("pipeline") or ""),
        "mode": str(meta.get("mode") or ("job" if "world_size" in meta else "session")),
        "device": device,
        "device_kind": str(dev.get("kind") or ""),
        "simulated": "true" if _simulated(meta) else "false",
    }
    info = Metric("stallscope_run_info", "gauge", "The run this endpoint describes (value 1; identity in labels).")
    info.add(1.0, labels)
    state = Metric("stallscope_run_status", "gauge", "1 for the run's current status, 0 for the others.")
    for s in STATUSES:
        state.add(1.0 if status == s else 0.0, {"status": s})
    return [info, state]


_TOTALS: tuple[tuple[str, str, str, Callable[[RunTotals], float]], ...] = (
    ("stallscope_steps", "counter", "Steps resolved, warm-up included.", lambda t: t.steps),
    ("stallscope_warmup_steps", "counter", "Warm-up steps resolved (not in the sums).", lambda t: t.warmup_steps),
    ("stallscope_measured_steps", "counter", "Measured (non-warm-up) steps resolved.", lambda t: t.measured_steps),
    ("stallscope_step_seconds", "counter", "Step time summed over measured steps.", lambda t: t.step_s),
    ("stallscope_data_wait_seconds", "counter", "Host time blocked in next() on the loader, measured steps.",
     lambda t: t.data_wait_s),
    ("stallscope_h2d_seconds", "counter", "Host time in the h2d phase, measured steps.", lambda t: t.h2d_s),
    ("stallscope_compute_seconds", "counter", "Host time in the compute phase, measured steps.", lambda t: t.compute_s),
    ("stallscope_input_stall_seconds", "counter", "Data wait + h2d summed over measured steps.", lambda t: t.stall_s),
    ("stallscope_samples", "counter", "Samples of the measured steps.", lambda t: t.samples),
    ("stallscope_missed_steps", "counter", "Steps dropped by the live buffer before the exporter read them "
     "(counted in steps, not in the sums).", lambda t: t.missed_steps),
    ("stallscope_run_stall_ratio", "gauge", "(data wait + h2d) / step time over every measured step so far: the "
     "summary's stall_fraction (host-timed).", lambda t: t.stall_fraction),
    ("stallscope_run_throughput_samples_per_second", "gauge", "Samples / step time over the measured steps so far.",
     lambda t: t.samples / t.step_s if t.step_s > 0 and t.samples else math.nan),
)  # fmt: skip


def totals_metrics(totals: Iterable[tuple[Labels, RunTotals]]) -> list[Metric]:
    """Counters over the steps resolved so far, and the run-to-date ratios they give."""
    rows = list(totals)
    out = []
    for name, kind, help_, value in _TOTALS:
        m = Metric(name, kind, help_)
        for labels, t in rows:
            m.add(value(t), labels)
        out.append(m)
    return out


def sampler_metrics(latest: Mapping[str, float], sim: Labels) -> list[Metric]:
    """The newest sampler reading: device utilisation and memory (NVML), host and process CPU and memory."""
    util = Metric("stallscope_device_utilisation_ratio", "gauge", "NVML utilization.gpu of the newest sample, 0..1 "
                  "(NVML averages over 1/6 s to 1 s).")  # fmt: skip
    mem = Metric("stallscope_device_memory_used_bytes", "gauge", "Device memory in use, newest sample.")
    cpu = Metric("stallscope_process_cpu_cores", "gauge", "CPU of the run's processes, newest sample (1 = one core).")
    rss = Metric("stallscope_process_resident_memory_bytes", "gauge", "Resident memory of the run's processes.")
    rank_cpu = Metric("stallscope_rank_cpu_cores", "gauge", "CPU of each rank's processes, newest sample.")
    activity = Metric(
        "stallscope_device_activity_ratio",
        "gauge",
        "The GPU's own counters (NVML GPM: graphics, sm_active, sm_occupancy, tensor, dram_bw), 0..1, over the "
        "newest interval of 100 ms or more.",
    )
    for key, value in sorted(latest.items()):
        head, _, rest = key.partition(".")
        if head.startswith("gpu") and rest == "util_pct":
            util.add(value / 100, {"device": head, **sim})
        elif head.startswith("gpu") and rest.startswith("gpm_") and rest.endswith("_pct"):
            activity.add(value / 100, {"device": head, "counter": rest[4:-4], **sim})
        elif head.startswith("gpu") and rest == "mem_used_mb":
            mem.add(value * MIB, {"device": head, **sim})
        elif head == "proc" and rest.endswith(".cpu_pct"):
            cpu.add(value / 100, {"process": rest.removesuffix(".cpu_pct")})
        elif head == "proc" and rest.endswith(".rss_mb"):
            rss.add(value * MIB, {"process": rest.removesuffix(".rss_mb")})
        elif head.startswith("rank") and head[4:].isdigit() and rest == "cpu_pct":
            rank_cpu.add(value / 100, {"rank": head[4:]})
    host = Metric("stallscope_host_cpu_ratio", "gauge", "Whole-host CPU busy, 0..1 of all cores, newest sample.")
    host.add(latest.get("sys.cpu_pct", math.nan) / 100)
    host_mem = Metric("stallscope_host_memory_used_ratio", "gauge", "Host memory in use, 0..1, newest sample.")
    host_mem.add(latest.get("sys.mem_used_pct", math.nan) / 100)
    return [util, mem, activity, host, host_mem, cpu, rss, rank_cpu]


def _window(name: str, help_: str) -> Metric:
    return Metric(name, "gauge", help_ + " Over the newest steps (the live window, 5 s).")


def run_metrics(snap: LiveSnapshot, totals: RunTotals, meta: Mapping[str, object], status: str) -> list[Metric]:
    """A single run's metrics (``stallscope run``, ``watch RUN_DIR``, a Session, zero-code runs)."""
    sim = {"simulated": "true"} if _simulated(meta) else {}
    out = info_metrics(meta, status) + totals_metrics([(sim, totals)])
    stall = _window("stallscope_stall_ratio", "(data wait + h2d) / step time, 0..1.")
    thr = _window("stallscope_throughput_samples_per_second", "Samples per second of step time.")
    step = _window("stallscope_step_duration_seconds", "Mean step time.")
    wait = _window("stallscope_data_wait_per_step_seconds", "Mean data wait per step.")
    h2d = _window("stallscope_h2d_per_step_seconds", "Mean h2d time per step.")
    comp = _window("stallscope_compute_per_step_seconds", "Mean compute time per step.")
    n = _window("stallscope_window_steps", "Steps in the live window.")
    gpu = Metric("stallscope_gpu_time_ratio", "gauge", "The newest kernel window's steps split by what the device "
                 "did, 0..1: part busy, input, host, sync or short (docs/metrics.md).")  # fmt: skip
    if snap.gpu is not None:
        for part in ("busy", "input", "host", "sync", "short"):
            gpu.add(snap.gpu.fraction(part), {"part": part, **sim})
    st = snap.stats
    if st is not None:
        stall.add(st.stall_fraction, sim)
        thr.add(st.throughput_samples_per_s, sim)
        step.add(st.step_ms / 1e3, sim)
        wait.add(st.data_wait_ms / 1e3, sim)
        h2d.add(st.h2d_ms / 1e3, sim)
        comp.add(st.compute_ms / 1e3, sim)
        n.add(st.window_steps, sim)
    return [
        *out,
        stall,
        thr,
        step,
        wait,
        h2d,
        comp,
        n,
        gpu,
        *sampler_metrics(snap.latest, sim),
        *memory_metrics(snap.memory),
    ]


def memory_metrics(memory: Mapping[str, float]) -> list[Metric]:
    """The loader's memory, newest reading of each figure (docs/metrics.md, "Loader memory")."""
    uss = Metric("stallscope_process_unique_memory_bytes", "gauge", "USS: memory only this process maps (smaps).")
    pss = Metric("stallscope_process_proportional_memory_bytes", "gauge", "PSS: shared pages divided among "
                 "the processes that map them (smaps).")  # fmt: skip
    for key, value in sorted(memory.items()):
        _mem, proc, figure = [*key.split(".", 2), "", ""][:3]
        if figure == "uss_mb" and proc not in ("shm", "host", "total"):
            uss.add(value * MIB, {"process": proc})
        elif figure == "pss_mb" and proc not in ("shm", "host", "total"):
            pss.add(value * MIB, {"process": proc})
    singles = [
        ("stallscope_job_proportional_memory_bytes", "mem.total.pss_mb", "The job's memory: the sum of PSS."),
        ("stallscope_shm_job_bytes", "mem.shm.job_mb", "The /dev/shm files the job's processes map or hold open."),
        ("stallscope_shm_used_bytes", "mem.shm.used_mb", "The /dev/shm segment in use, every process's files."),
        ("stallscope_shm_size_bytes", "mem.shm.size_mb", "The /dev/shm segment's size."),
        ("stallscope_host_available_memory_bytes", "mem.host.available_mb", "The host's available memory."),
    ]
    out = [uss, pss]
    for name, key, help_ in singles:
        metric = Metric(name, "gauge", help_ + " Newest reading.")
        if key in memory:
            metric.add(memory[key] * MIB)
        out.append(metric)
    return out


def job_metrics(
    job: JobLive, totals: Mapping[int, RunTotals], node: Mapping[str, float], meta: Mapping[str, object], status: str
) -> list[Metric]:
    """A multi-rank job's metrics: per-rank figures labelled ``rank``, the job's throughput, the straggler."""
    sim = {"simulated": "true"} if _simulated(meta) else {}
    out = info_metrics(meta, status)
    out += totals_metrics([({"rank": str(r), **sim}, t) for r, t in sorted(totals.items())])
    fams = {
        "stall_fraction": _window("stallscope_stall_ratio", "(data wait + h2d) / step time, 0..1."),
        "throughput_samples_per_s": _window("stallscope_throughput_samples_per_second", "Samples per second."),
        "step_ms": _window("stallscope_step_duration_seconds", "Mean step time."),
        "data_wait_ms": _window("stallscope_data_wait_per_step_seconds", "Mean data wait per step."),
        "h2d_ms": _window("stallscope_h2d_per_step_seconds", "Mean h2d time per step."),
        "sync_ms": _window("stallscope_sync_per_step_seconds", "Mean sync (all-reduce wait) time per step."),
        "window_steps": _window("stallscope_window_steps", "Steps in the live window."),
    }
    for row in job.ranks:
        labels = {"rank": str(row.rank), **sim}
        for attr, m in fams.items():
            value = float(getattr(row, attr))
            m.add(value / 1e3 if attr.endswith("_ms") else value, labels)
    thr = Metric("stallscope_job_throughput_samples_per_second", "gauge", "Sum over ranks of their live window's "
                 "samples per second.")  # fmt: skip
    thr.add(job.throughput_recent, sim)
    strag = Metric("stallscope_straggler", "gauge", "1 for the rank the job report's rule names a straggler now.")
    if job.straggler is not None:
        strag.add(1.0, {"rank": str(job.straggler.rank)})
    return [*out, *fams.values(), thr, strag, *sampler_metrics(node, sim)]


__all__ = ["Metric", "info_metrics", "job_metrics", "run_metrics", "sampler_metrics", "totals_metrics"]
