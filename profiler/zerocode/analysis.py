"""A zero-code run of a multi-rank job (``stallscope run -- torchrun --nproc-per-node N train.py``): one row
per rank, from outside.

Pure: reads a :class:`~profiler.core.store.RunRecord` whose meta ``ranks`` lists the rank processes found under
the launcher (:mod:`profiler.core.sources.ranks`). docs/zero-code.md ("Multi-rank jobs") says what a row holds.
Invariants: nothing that needs step boundaries is guessed (those keys are null in each row); a rank with fewer
than ``MIN_SAMPLES`` main-thread samples gets no stall estimate or verdict; ``input_bound_ranks`` counts ranks
whose estimated stall is at least the moderate band; a straggler is named only when its data-wait interval
lies wholly above every other rank's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profiler.analysis.meta import AUTO_INSTRUMENTED, JSON, objects
from profiler.analysis.parts import Estimate, LoaderAttribution, StackEstimate, StackParse
from profiler.analysis.sampled import MIN_SAMPLES, rank_stacks
from profiler.analysis.stats import json_safe, mean
from profiler.analysis.verdict import MODERATE, verdict_for
from profiler.core.store import RunRecord

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary

AUTO_NOT_MEASURED = (
    "auto-instrumented: each rank's throughput, step time and data wait in ms are measured; device busy, sync "
    "and the per-step breakdown are not measured per rank and are null (the run's own breakdown is rank 0's)"
)
NOT_MEASURED = (
    "zero-code: throughput, step time, data wait in ms, sync and the per-step breakdown need instrumentation "
    "(stallscope run SCENARIO --nproc N) and are null"
)
_MEASURED_KEYS = ("throughput_samples_per_s", "step_time_ms", "data_wait_ms")  # what the start-up module gives a rank
_STEP_KEYS = (
    "throughput_samples_per_s",
    "step_time_ms",
    "device_busy_fraction",
    "data_wait_ms",
    "sync_ms_per_step",
    "breakdown_ms_per_step",
)


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank of a zero-code job: estimated from stack samples, or sampled (CPU, memory)."""

    rank: int
    pid: int
    local_rank: int | None
    node_rank: int | None
    world_size: int | None
    estimate: StackEstimate
    attribution: LoaderAttribution | None
    workers: int  # processes seen under the rank (py-spy's DataLoader workers, else the sampler's)
    cpu_pct: float  # rank process + everything under it, mean, % of one core
    main_cpu_pct: float
    workers_cpu_pct: float
    rss_mb_max: float
    measured: JSON | None = None  # the start-up module's figures for this rank (meta ``rank_steps``), when it ran

    @property
    def data_wait(self) -> Estimate | None:
        o = self.estimate.overall
        return o.data_wait if o is not None and o.samples >= MIN_SAMPLES else None

    @property
    def stall_fraction(self) -> float:
        """Measured (the start-up module's data wait / step time) when the rank was timed, else estimated."""
        m = self.measured or {}
        wait, step = m.get("data_wait_ms"), m.get("step_time_ms")
        if isinstance(wait, (int, float)) and isinstance(step, (int, float)) and step > 0:
            return float(wait) / float(step)
        o = self.estimate.overall
        return o.data_wait.fraction + o.h2d.fraction if o is not None and o.samples >= MIN_SAMPLES else math.nan

    @property
    def verdict(self) -> str:
        stall = self.stall_fraction
        return verdict_for(stall) if not math.isnan(stall) else f"unknown: fewer than {MIN_SAMPLES} samples"

    def top_loader_frames(self, n: int = 3) -> list[tuple[str, str, float]]:
        """(category, function, its share of all busy worker samples) for the busiest categories' top frames."""
        if self.attribution is None:
            return []
        out = []
        for cat, c in self.attribution.by_share():
            out += [(cat, f.function, f.of_category * c.share.fraction) for f in c.top[:1]]
        return sorted(out, key=lambda t: -t[2])[:n]

    def to_dict(self) -> JSON:
        dw = self.data_wait
        return {
            "rank": self.rank,
            "node_rank": self.node_rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "pid": self.pid,
            "status": None,  # a rank is the launcher's child, not ours: its exit is not seen
            **dict.fromkeys(_STEP_KEYS),
            **{k: self.measured.get(k) for k in _MEASURED_KEYS if self.measured is not None},
            "steps": self.measured.get("steps") if self.measured is not None else 0,
            "stall_fraction": self.stall_fraction,
            "data_wait_fraction": dw.to_dict() if dw else None,  # its "samples": those in the loader
            "main_thread_samples": self.estimate.overall.samples if self.estimate.overall else 0,
            "verdict": self.verdict,
            "cpu_pct": self.cpu_pct,
            "main_cpu_pct": self.main_cpu_pct,
            "workers_cpu_pct": self.workers_cpu_pct,
            "rss_mb_max": self.rss_mb_max,
            "workers": self.workers,
            "top_loader_frames": [
                {"category": c, "function": f, "of_busy_worker_samples": x} for c, f, x in self.top_loader_frames()
            ],
            "stack_estimate": self.estimate.to_dict(),
            "loader_attribution": self.attribution.to_dict() if self.attribution else None,
            "run_dir": None,  # one store holds the whole job
        }


@dataclass(frozen=True, slots=True)
class ZeroCodeJob:
    """The ranks of a zero-code job and what can be said across them."""

    launcher_pid: int | None
    world_size: int | None
    ranks: tuple[RankRow, ...]
    mode: str = "zero-code"

    @property
    def measured(self) -> bool:
        """Whether the start-up module timed the ranks' steps (``run --`` without ``--no-instrument``)."""
        return any(r.measured for r in self.ranks)

    @property
    def not_measured(self) -> str:
        return AUTO_NOT_MEASURED if self.measured else NOT_MEASURED

    @property
    def input_bound_ranks(self) -> int:
        return sum(1 for r in self.ranks if r.stall_fraction >= MODERATE)

    @property
    def straggler(self) -> RankRow | None:
        """The rank whose data-wait interval lies wholly above every other rank's (None if no such rank)."""
        known = [r for r in self.ranks if r.data_wait is not None]
        if len(known) < 2:
            return None
        top = max(known, key=lambda r: r.data_wait.fraction if r.data_wait else 0.0)
        low = top.data_wait.low if top.data_wait else 0.0
        others = [r for r in known if r is not top]
        return top if all(r.data_wait is not None and r.data_wait.high < low for r in others) else None

    def straggler_evidence(self) -> str | None:
        s = self.straggler
        if s is None or s.data_wait is None:
            return None
        rest = "; ".join(
            f"rank {r.rank}: {_share(r.data_wait)}" for r in self.ranks if r is not s and r.data_wait is not None
        )
        return f"rank {s.rank}'s main thread waited for data an estimated {_share(s.data_wait)} of the time ({rest})"

    def to_dict(self) -> JSON:
        """The keys a zero-code summary of a job adds to the single-run summary (``ranks``, ``job``, ...)."""
        s = self.straggler
        out: JSON = {
            "ranks": [r.to_dict() for r in self.ranks],
            "job": {
                "mode": self.mode,
                "launcher_pid": self.launcher_pid,
                "world_size": self.world_size,
                "ranks_seen": len(self.ranks),
                "status": None,
                "first_failure": None,
                "not_measured": self.not_measured,
            },
            "input_bound_ranks": self.input_bound_ranks,
            "straggler": None
            if s is None or s.data_wait is None
            else {
                "rank": s.rank,
                "data_wait_fraction": s.data_wait.fraction,
                "others_max_data_wait_fraction": max(
                    r.data_wait.fraction for r in self.ranks if r is not s and r.data_wait is not None
                ),
                "evidence": self.straggler_evidence(),
            },
            "scaling_efficiency": None,
        }
        return json_safe(out)

    def summary_dict(self, summary: Summary) -> JSON:
        """summary.json of the job: the single-run summary's keys (the job as a whole) plus :meth:`to_dict`'s."""
        return {**summary.to_dict(), **self.to_dict()}


def _share(e: Estimate) -> str:
    return f"{e.fraction:.0%} ({e.low:.0%}-{e.high:.0%})"


def is_zero_code(meta: Mapping[str, Any]) -> bool:
    """A zero-code run's meta (its report may add a job view: :func:`zero_code_job`)."""
    return meta.get("mode") in ("zero-code", AUTO_INSTRUMENTED)


def zero_code_job(rec: RunRecord) -> ZeroCodeJob | None:
    """The job view of a zero-code run that found ranks under its target; None for any other run."""
    meta = rec.meta
    found = [r for r in meta.get("ranks") or [] if isinstance(r, dict)]
    if not is_zero_code(meta) or not found:
        return None
    stacks = {s.pid: s for s in rank_stacks(rec)}
    measured = {r.get("pid"): r for r in objects(meta.get("rank_steps"))}
    series = _rank_series(rec)
    rows = []
    for r in sorted(found, key=lambda r: (r.get("rank", 0), r.get("pid", 0))):
        rank, pid = int(r["rank"]), int(r["pid"])
        st = stacks.get(pid)
        est = st.estimate if st else StackEstimate(_no_parse(), note="no py-spy samples")
        att = st.attribution if st else None
        m = series.get(rank, {})
        rows.append(
            RankRow(
                rank=rank,
                pid=pid,
                local_rank=r.get("local_rank"),
                node_rank=r.get("node_rank"),
                world_size=r.get("world_size"),
                estimate=est,
                attribution=att,
                workers=att.workers if att else len(r.get("worker_pids") or []),
                cpu_pct=mean(m.get("cpu_pct", [])),
                main_cpu_pct=mean(m.get("main.cpu_pct", [])),
                workers_cpu_pct=mean(m.get("workers.cpu_pct", [])),
                rss_mb_max=max(m.get("rss_mb", []), default=math.nan),
                measured=measured.get(pid),
            )
        )
    sizes = {row.world_size for row in rows if row.world_size is not None}
    target = meta.get("target_pid")
    world = max(sizes) if sizes else None
    return ZeroCodeJob(target if isinstance(target, int) else None, world, tuple(rows), str(meta.get("mode")))


def _rank_series(rec: RunRecord) -> dict[int, dict[str, list[float]]]:
    """rank -> quantity (``cpu_pct``, ``main.cpu_pct``, ...) -> its sampled values (NaN readings left out)."""
    out: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for _t, _source, metric, value in rec.samples:
        if value is None or not metric.startswith("rank") or math.isnan(value):
            continue
        head, _, quantity = metric.partition(".")
        if head[4:].isdigit():
            out[int(head[4:])][quantity].append(value)
    return out


def _no_parse() -> StackParse:
    return StackParse(format="none", records=0, samples=0, bad_records=0, truncated=0, error="no py-spy stacks")
