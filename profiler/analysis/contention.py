"""CPU contention: how long the training thread and the loader workers waited for a CPU (run-queue wait).

Pure: a :class:`profiler.core.store.RunRecord` in, a :class:`Contention` out; no clock, no file.
docs/metrics.md, "CPU contention", defines the figures and justifies :data:`THRESHOLD`. Invariants:
- Only measured (non-warm-up) steps count; a step or phase whose wait was not measured (NULL) is left out of
  both the numerator and the denominator, never counted as zero wait.
- Sampled figures are the summary's host figures: read, not recomputed.
- ``available`` is False, with a one-line ``reason``, when the per-phase figure was not measured; those
  figures are then NaN rather than 0.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from profiler.analysis.apart import measured_steps
from profiler.analysis.meta import AUTO_INSTRUMENTED, JSON
from profiler.analysis.parts import HostFigures
from profiler.analysis.stats import json_safe
from profiler.core.store import RunRecord, StepRow

# Training thread's run-queue wait / compute phase time at or above which CPU_CONTENTION is recommended.
# docs/metrics.md "CPU contention" gives the measurements: on a quiet 2-core machine fashion-vgg measured 3-5%;
# 11% came with no throughput loss; from 18% on, every run lost throughput (18% at 18%, 61% at 51%).
THRESHOLD = 0.15
SCHEDSTAT = "schedstat: the time runnable but not on a CPU"
# CPU use (% of one core) that makes other processes or the loader workers a competitor worth naming
BUSY_PCT = 10.0
_WORKER = re.compile(r"sched\.(w\d+)\.runq_pct")


@dataclass(frozen=True, slots=True)
class Contention:
    """The training thread's run-queue wait per part of the step, and the sampled waits beside it."""

    available: bool
    reason: str | None  # why the per-phase figures are missing, else None
    compute_runq_fraction: float  # training thread's run-queue wait in compute phases / compute phase time
    step_runq_fraction: float  # the same over whole steps
    runq_ms_per_step: dict[str, float]  # data_wait, h2d, compute, user phases, other: ms per measured step
    main_runq_pct: float  # sampled: % of wall time the main thread waited
    process_runq_pct: float  # sampled: all threads of the training process, % of one core
    workers_runq_pct: float  # sampled: all loader workers' threads, % of one core (NaN: no workers)
    per_worker_runq_pct: dict[str, float] = field(default_factory=dict)
    steps_timed: int = 0  # measured steps whose schedstat the training thread read (all, or one in k: RUNQ_BUDGET)
    steps_measured: int = 0
    workers: int | None = None
    torch_threads: int | None = None
    cpu_count: int | None = None
    # psutil means over the window, % of one core: training process, workers, other processes (the rest of
    # the machine's use); who took the cores the training thread waited for
    cpu_pct: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> JSON:
        """The ``contention`` object of summary.json: NaN becomes null."""
        out: JSON = asdict(self)
        return json_safe(out)


def contention_of(rec: RunRecord, host: HostFigures) -> Contention:
    """Contention figures of a stored run (measured steps only); ``host`` are its sampled means over the
    measured window (the summary's host figures, which hold the ``sched`` source's metrics too)."""
    meta = rec.meta
    measured = measured_steps(rec)
    sampled = host.by_metric
    per_worker = {w.group(1): v for m, v in sampled.items() if (w := _WORKER.fullmatch(m)) is not None}
    cpu = _cpu_use(host, _int(meta.get("workers")), _int(meta.get("cpu_count")))
    reason = _unavailable(meta, measured)
    timed = [s for s in measured if s.runq_s is not None]
    fraction, per_step = math.nan, dict[str, float]()
    if reason is None:
        fraction, per_step = _phase_figures(rec, timed)
    step_wall = math.fsum(s.t_end - s.t_start for s in timed)
    step_runq = math.fsum(s.runq_s for s in timed if s.runq_s is not None)
    return Contention(
        available=reason is None,
        reason=reason,
        compute_runq_fraction=fraction,
        step_runq_fraction=step_runq / step_wall if reason is None and step_wall > 0 else math.nan,
        runq_ms_per_step=per_step,
        main_runq_pct=sampled.get("sched.main.runq_pct", math.nan),
        process_runq_pct=sampled.get("sched.proc.runq_pct", math.nan),
        workers_runq_pct=sampled.get("sched.workers.runq_pct", math.nan),
        per_worker_runq_pct=per_worker,
        steps_timed=len(timed),
        steps_measured=len(measured),
        workers=_int(meta.get("workers")),
        torch_threads=_int(meta.get("torch_threads")),
        cpu_count=_int(meta.get("cpu_count")),
        cpu_pct=cpu,
        sources=_sources(rec, reason, len(timed), len(measured)),
    )


def contention_advice(c: Contention | None) -> str | None:
    """The CPU_CONTENTION recommendation's text, quoting the measured wait; None under :data:`THRESHOLD`.

    The advice follows what took the cores, by the CPU use measured beside the wait: other processes,
    the loader workers, or (neither being busy) the training process's own intra-op threads.
    """
    if c is None or not c.available or not c.compute_runq_fraction >= THRESHOLD:
        return None
    ms = c.runq_ms_per_step.get("compute", math.nan)
    text = (
        f"The training thread waited for a CPU {c.compute_runq_fraction:.0%} of its compute time "
        f"({ms:.0f} ms per step; {SCHEDSTAT})"
    )
    workers, threads, cores = c.workers or 0, c.torch_threads, c.cpu_count
    who = ([f"{workers} loader worker(s)"] if workers else []) + ([f"{threads} intra-op thread(s)"] if threads else [])
    if who and cores:
        text += f": {' and '.join(who)} share {cores} core(s)"
    if workers and not math.isnan(c.workers_runq_pct):
        text += f" (the workers waited {c.workers_runq_pct:.0f}% of a core)"
    cpu = c.cpu_pct
    if cpu:
        text += "; CPU use " + ", ".join(f"{k} {v:.0f}%" for k, v in cpu.items()) + " (psutil, 100% = one core)"
    return text + ". " + _fixes(c) + "."


def _fixes(c: Contention) -> str:
    """The advice for the biggest measured competitor: other processes, the loader workers, or intra-op threads."""
    workers, threads, cores = c.workers or 0, c.torch_threads, c.cpu_count
    others = c.cpu_pct.get("other processes", math.nan)
    busy_workers = c.cpu_pct.get("workers", math.nan)
    if others >= BUSY_PCT and not busy_workers > others:
        return (
            f"Other processes took {others:.0f}% of a core: run where cores are free, or reserve cores for the "
            "training (taskset, a cpuset)"
        )
    oversubscribed = bool(cores and threads and workers + threads > cores)
    if workers and (busy_workers >= BUSY_PCT or (math.isnan(busy_workers) and oversubscribed)):
        fixes = [f"fewer loader workers (now {workers})"]
        goal = max(1, cores - workers) if cores else None
        if threads and goal and goal < threads:
            fixes.append(f"fewer intra-op threads (torch.set_num_threads({goal}); now {threads})")
        return (
            "Use "
            + ", ".join(fixes)
            + ", or pin them apart (taskset / os.sched_setaffinity, workers in worker_init_fn)"
        )
    if cores and threads and threads > cores:
        return f"Use at most one intra-op thread per core (torch.set_num_threads({cores}); now {threads})"
    return (
        "No other process or loader worker used much CPU (psutil): find what else runs on these cores "
        "(top -H, pidstat), or reserve cores for the training (taskset, a cpuset)"
    )


_NO_SCHEDSTAT = {
    "zero-code": "zero-code run: no step phases on the training thread to time (see the sampled figures)",
    AUTO_INSTRUMENTED: "the start-up module could not read the training thread's schedstat",
}


def _unavailable(meta: Mapping[str, object], measured: list[StepRow]) -> str | None:
    status = meta.get("schedstat")
    if status is None:
        return _NO_SCHEDSTAT.get(
            str(meta.get("mode")),
            f"not recorded: run store schema v{meta.get('schema_version')} predates run-queue wait",
        )
    if status != "available":
        return str(status).removeprefix("unavailable: ")
    if not measured:
        return "no measured steps"
    if all(s.runq_s is None for s in measured):
        return "no measured step was timed on the thread that iterated Session.wrap()"
    return None


def _phase_figures(rec: RunRecord, timed: list[StepRow]) -> tuple[float, dict[str, float]]:
    """Compute-phase wait fraction, and run-queue ms per step by part of the step (timed steps only)."""
    ids = {s.step for s in timed}
    runq: dict[str, float] = defaultdict(float)
    compute_wall = compute_runq = 0.0
    for p in rec.phases:
        if p.step not in ids or p.depth != 0 or p.runq_s is None:
            continue
        runq[p.name] += p.runq_s
        if p.name == "compute":
            compute_wall += p.t_end - p.t_start
            compute_runq += p.runq_s
    n = len(timed)
    if not n:
        return math.nan, {}
    wait = math.fsum(s.data_wait_runq_s or 0.0 for s in timed)
    whole = math.fsum(s.runq_s or 0.0 for s in timed)
    out = {"data_wait": wait / n * 1e3, "h2d": runq.pop("h2d", 0.0) / n * 1e3}
    out["compute"] = runq.pop("compute", 0.0) / n * 1e3
    out.update({name: v / n * 1e3 for name, v in sorted(runq.items())})
    # every part is a difference of the same thread's counter over disjoint intervals inside the step
    out["other"] = max(0.0, whole / n * 1e3 - math.fsum(out.values()))
    return (compute_runq / compute_wall if compute_wall > 0 else math.nan), out


def _every(meta: Mapping[str, object], timed: int, measured: int) -> str:
    """Why some steps' schedstat was not read: the training thread reads it on every step where that costs under
    a share of the step, else on one step in k (``meta.schedstat_budget``, from core.session)."""
    budget = meta.get("schedstat_budget")
    if timed >= measured or not isinstance(budget, dict):
        return ""
    cost, share = budget.get("cost_s"), budget.get("share")
    if not isinstance(cost, (int, float)) or not isinstance(share, (int, float)) or not share > 0:
        return ""
    return (
        f" (read on every step of {cost / share * 1e3:.3g} ms or more, on one in k of shorter ones: those reads cost "
        f"~{cost * 1e6:.0f} us a step, kept under {share:.1%} of it)"
    )


def _cpu_use(host: HostFigures, workers: int | None, cores: int | None) -> dict[str, float]:
    """Mean CPU use over the window, % of one core; empty without host samples or a core count."""
    main, kids, system = host.main_cpu_pct, host.children_cpu_pct, host.sys_cpu_pct
    if not cores or math.isnan(main) or math.isnan(system):
        return {}
    kids = 0.0 if math.isnan(kids) else kids
    out = {"training process": main}
    if workers:
        out["workers"] = kids
    # psutil's system figure counts 100% as every core busy; sampling skew can make the rest slightly negative
    out["other processes"] = max(0.0, system * cores - main - kids)
    return out


def _sources(rec: RunRecord, reason: str | None, timed: int, measured: int) -> dict[str, str]:
    meta = rec.meta
    path = meta.get("schedstat_path") or "/proc/<pid>/task/<tid>/schedstat"
    sched = next((msg for _t, kind, src, msg in rec.events if kind == "source" and src == "sched"), "not sampled")
    sampled = (
        f"/proc/<pid>/task/*/schedstat field 2 (run delay), summed over the threads, sampled at "
        f"{meta.get('sample_hz', '?')} Hz by the sched source; mean over the measured window"
        if sched == "available"
        else f"not measured ({sched})"
    )
    return {
        "compute_runq_fraction": f"{path} field 2 (run delay), read by the training thread at phase enter and "
        f"exit, on {timed} of the {measured} measured steps{_every(rec.meta, timed, measured)}; summed over compute "
        "phases / compute phase time"
        if reason is None
        else f"not measured ({reason})",
        "main_runq_pct": sampled.replace(
            "task/*/schedstat field 2 (run delay), summed over the threads",
            "task/<pid>/schedstat field 2 (run delay), main thread",
        ),
        "process_runq_pct": sampled + "; 100% = one core",
        "workers_runq_pct": sampled + "; loader worker processes (as labelled by the host source); 100% = one core",
        "cpu_pct": "psutil means over the measured window: proc.main.cpu_pct, proc.children.cpu_pct, and for "
        "other processes sys.cpu_pct x cores less both",
    }


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None
