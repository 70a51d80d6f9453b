"""A data-parallel job's stores -> one JobSummary: per-rank rows, job figures, the straggler, scaling efficiency.

Pure: a :class:`JobInput` (each node's ``job.json``, each rank's and node sampler's
:class:`~profiler.core.store.RunRecord`, read by :mod:`jobs.jobdir`) in, a :class:`JobSummary` out; no clock, no
file. A rank's row is its own :func:`~profiler.analysis.summary.summarize`, so it says what ``stallscope report
RUN_DIR/rank-R`` says. docs/multi-rank.md ("The job report") defines the figures and the JSON.
Invariants: ``JobSummary.to_dict()`` keeps the single-run keys for the job as a whole, and keys are only ever
added; a rank that could not be measured keeps its row, with its status and NaN figures (job figures are over
the measured ranks, and a note says so); failure times are seconds since the earliest node's ``started_at``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Protocol

from profiler.analysis.apart import measured_steps
from profiler.analysis.meta import JSON, objects, opt_float, opt_int, opt_str
from profiler.analysis.parts import Breakdown, StepTimes
from profiler.analysis.stats import json_safe, mean, quantile
from profiler.analysis.summary import Summary, summarize
from profiler.core.store import RunRecord

# Straggler rule (docs/multi-rank.md): a rank's data wait must exceed the median of the other ranks' by more than
# max(STRAGGLER_MIN_MS, STRAGGLER_STEP_SHARE x the median step time) ...
# Ranks seen ending within this many seconds of the first are told apart by their stores, not their times: the node
# sampler sees a death within one period (0.1 s at 10 Hz), and a rank that loses its peer fails a few ms later
FAILURE_TIE_S = 0.5
# What a rank's error says when it failed because another rank went away (gloo, NCCL, the c10d store)
PEER_LOSS = ("closed by peer", "connection reset", "broken pipe", "remote worker", "nccl", "peer", "timed out")
STRAGGLER_MIN_MS = 5.0  # below this, per-step jitter of a loaded host (a few ms on 2 cores) reads as a straggler
STRAGGLER_STEP_SHARE = 0.10  # a 10%-of-step excess makes the whole job >= 10% slower: worth naming
# ... and the others must wait for it in sync: their median sync per step at least this share of the excess
# (in data-parallel training every rank waits at the all-reduce for the last one to arrive; a data wait that
# the others do not wait for is not holding the job back).
STRAGGLER_SYNC_SHARE = 0.5
# Loader workers of the other ranks spending at least this share of a candidate's CPU per sample: the loaders are
# alike, and the candidate's extra data wait is lock-step phase, not a slower pipeline (loaders_alike)
LOADERS_ALIKE = 0.85
INPUT_BOUND = ("highly input-bound", "moderately input-bound")
_STATUS_ORDER = ("failed", "interrupted", "running", "complete")


@dataclass(frozen=True, slots=True)
class RankInput:
    """One rank as found on disk: its store read back (None when there is none or it is unreadable)."""

    rank: int
    node_rank: int | None
    run_dir: str
    record: RunRecord | None
    problem: str | None = None  # why there is no record


@dataclass(frozen=True, slots=True)
class NodeInput:
    """One node's directory: its ``job.json`` ({} when absent) and its sampler store (None when absent)."""

    run_dir: str
    job: JSON
    record: RunRecord | None = None


@dataclass(frozen=True, slots=True)
class BaselineInput:
    """The run scaling efficiency is measured against: a single run's record, or a job."""

    run_dir: str
    record: RunRecord | None = None
    job: JobInput | None = None


@dataclass(frozen=True, slots=True)
class JobInput:
    nodes: tuple[NodeInput, ...]
    ranks: tuple[RankInput, ...]  # in rank order
    baseline: BaselineInput | None = None
    notes: tuple[str, ...] = ()  # what reading the directories noticed (an unreadable baseline, ...)


@dataclass(frozen=True, slots=True)
class RankExit:
    """A rank the launcher saw end badly (``job.json`` ``rank_exits``)."""

    rank: int
    local_rank: int | None
    exitcode: int | None
    signal: str | None
    t_s: float  # seconds since the job started
    node_rank: int | None = None

    def describe(self) -> str:
        """``killed (SIGKILL) at 12.3 s`` / ``exited with code 1 at 4.0 s``."""
        how = f"killed ({self.signal})" if self.signal else f"exited with code {self.exitcode}"
        return f"{how} at {self.t_s:.1f} s"

    def to_dict(self) -> JSON:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "t_s": self.t_s,
            "node_rank": self.node_rank,
        }


class RankFigures(Protocol):
    """What the straggler rule reads of a rank: a :class:`RankRow` (the whole run) or a live view's row (its
    recent steps, ``analysis.joblive``), so both name a straggler by one rule."""

    @property
    def rank(self) -> int: ...

    @property
    def measured(self) -> bool: ...

    @property
    def loader_cpu_ms_per_sample(self) -> float: ...

    def figure(self, name: str) -> float: ...


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank's line of the job table."""

    rank: int
    node_rank: int | None
    status: str
    run_dir: str
    summary: Summary | None
    data_wait_ms: tuple[float, float]  # p50, p90 over the measured steps
    cpu_pct: float  # mean of the node sampler's rank{R}.cpu_pct over the rank's measured window; NaN: not sampled
    exit: RankExit | None = None
    workers_cpu_pct: float = math.nan  # the same for rank{R}.workers.cpu_pct: its loader worker processes

    @property
    def loader_cpu_ms_per_sample(self) -> float:
        """CPU its loader worker processes spent per sample delivered (NaN: no workers, or not sampled)."""
        s, t = self.summary, self.figure("throughput")
        if s is None or not (s.workers or 0) > 0 or math.isnan(self.workers_cpu_pct) or not t > 0:
            return math.nan
        return self.workers_cpu_pct / 100 / t * 1e3

    def figure(self, name: str) -> float:
        """A headline figure of the rank's summary by name; NaN when it has none."""
        s = self.summary
        if s is None or not s.steps:
            return math.nan
        value = {
            "throughput": s.throughput_samples_per_s,
            "step": s.step_time_ms.mean,
            "stall": s.stall_fraction,
            "busy": s.device_busy_fraction,
        }.get(name)
        return float(value) if value is not None else s.breakdown_ms_per_step.get(name)

    @property
    def measured(self) -> bool:
        return not math.isnan(self.figure("step"))

    @property
    def input_bound(self) -> bool:
        return self.measured and self.summary is not None and self.summary.verdict in INPUT_BOUND

    def to_dict(self) -> JSON:
        s = self.summary
        nan3 = StepTimes(math.nan, math.nan, math.nan)
        parts = ("data_wait", "h2d", "compute", "sync", "other")
        return {
            "rank": self.rank,
            "node_rank": self.node_rank,
            "status": self.status,
            "throughput_samples_per_s": self.figure("throughput"),
            "step_time_ms": (s.step_time_ms if s is not None and s.steps else nan3).to_dict(),
            "stall_fraction": self.figure("stall"),
            "device_busy_fraction": self.figure("busy"),
            "data_wait_ms": {"p50": self.data_wait_ms[0], "p90": self.data_wait_ms[1]},
            "sync_ms_per_step": self.figure("sync"),
            "cpu_pct": self.cpu_pct,
            "breakdown_ms_per_step": {p: self.figure(p) for p in parts},
            "verdict": s.verdict if s is not None else "unknown: no store",
            "run_dir": self.run_dir,
            "exit": self.exit.to_dict() if self.exit else None,
        }


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    data_wait_excess_ms_per_step: float
    others_sync_ms_per_step: float
    threshold_ms: float
    others: tuple[int, ...]
    evidence: str

    def to_dict(self) -> JSON:
        return {
            "rank": self.rank,
            "data_wait_excess_ms_per_step": self.data_wait_excess_ms_per_step,
            "others_sync_ms_per_step": self.others_sync_ms_per_step,
            "threshold_ms": self.threshold_ms,
            "others": list(self.others),
            "evidence": self.evidence,
        }


@dataclass(frozen=True, slots=True)
class Scaling:
    """Job throughput against ``world_size`` copies of the baseline's."""

    baseline_run: str
    baseline_throughput: float
    world_size: int
    job_throughput: float

    @property
    def ratio(self) -> float:
        denominator = self.world_size * self.baseline_throughput
        return self.job_throughput / denominator if denominator > 0 else math.nan

    def to_dict(self) -> JSON:
        return {
            "baseline_run": self.baseline_run,
            "baseline_throughput": self.baseline_throughput,
            "world_size": self.world_size,
            "job_throughput": self.job_throughput,
            "ratio": self.ratio,
        }


@dataclass(frozen=True, slots=True)
class JobSummary:
    """The whole job's figures; ``to_dict()`` is what ``stallscope report JOB_DIR --json`` prints."""

    job_id: str | None
    world_size: int
    nnodes: int
    status: str
    scenario: str | None
    pipeline: str | None
    device: JSON
    batch_size: int | None  # per rank
    workers: int | None  # per rank
    backend: str | None
    ranks: tuple[RankRow, ...]
    throughput_samples_per_s: float
    step_time_ms: StepTimes
    slowest_rank: int | None
    breakdown_ms_per_step: Breakdown
    stall_fraction: float
    device_busy_fraction: float
    verdict: str
    straggler: Straggler | None
    scaling: Scaling | None
    first_failure: RankExit | None
    run_dirs: tuple[str, ...]
    notes: tuple[str, ...] = ()
    straggler_rule: str = ""

    @property
    def input_bound_ranks(self) -> int:
        return sum(r.input_bound for r in self.ranks)

    @property
    def simulated(self) -> bool:
        return self.device.get("kind") == "sim"

    @property
    def measured_ranks(self) -> list[RankRow]:
        return [r for r in self.ranks if r.measured]

    def to_dict(self) -> JSON:
        measured = self.measured_ranks
        out: JSON = {
            "run_id": self.job_id,
            "scenario": self.scenario,
            "pipeline": self.pipeline,
            "device": self.device,
            "batch_size": self.batch_size,
            "workers": self.workers,
            "steps": min((r.summary.steps for r in measured if r.summary), default=0),
            "warmup_steps": measured[0].summary.warmup_steps if measured and measured[0].summary else None,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "step_time_ms": self.step_time_ms.to_dict(),
            "breakdown_ms_per_step": self.breakdown_ms_per_step.to_dict(),
            "stall_fraction": self.stall_fraction,
            "device_busy_fraction": self.device_busy_fraction,
            "verdict": self.verdict,
            "recommendations": [],
            "status": self.status,
            "mode": "job",
            "ranks": [r.to_dict() for r in self.ranks],
            "straggler": self.straggler.to_dict() if self.straggler else None,
            "straggler_rule": self.straggler_rule,
            "scaling_efficiency": self.scaling.to_dict() if self.scaling else None,
            "job": {
                "job_id": self.job_id,
                "world_size": self.world_size,
                "nnodes": self.nnodes,
                "status": self.status,
                "backend": self.backend,
                "first_failure": self.first_failure.to_dict() if self.first_failure else None,
                "slowest_rank": self.slowest_rank,
                "run_dirs": list(self.run_dirs),
            },
            "input_bound_ranks": self.input_bound_ranks,
            "notes": list(self.notes),
        }
        return json_safe(out)


# -- assembly -----------------------------------------------------------------------------------


def summarize_job(job: JobInput) -> JobSummary:
    """The job's summary: each rank summarised alone, then the job figures, straggler, scaling and failure."""
    notes = list(job.notes)
    t0 = _job_start(job)
    exits = _rank_exits(job, t0)
    rows = tuple(_rank_row(r, job, exits.get(r.rank)) for r in job.ranks)
    measured = [r for r in rows if r.measured]
    missing = [r.rank for r in rows if not r.measured]
    if missing:
        notes.append(
            f"{_ranks(missing)} {'has' if len(missing) == 1 else 'have'} no measured steps: "
            "job figures are over the other ranks"
        )
    jobs = [n.job for n in job.nodes if n.job]
    first = _first(jobs, "world_size")
    world = int(first) if isinstance(first, int) else len(rows)
    slowest = max(measured, key=lambda r: r.figure("step"), default=None)
    throughput = math.fsum(r.figure("throughput") for r in measured) if measured else math.nan
    straggler, rule = find_straggler(rows)
    if straggler is None and (note := phase_note(rows)) is not None:
        notes.append(note)
    device = _device(rows, jobs)
    return JobSummary(
        job_id=opt_str(_first(jobs, "job_id") or _rank_meta(job.ranks, "job_id")),
        world_size=world,
        nnodes=opt_int(_first(jobs, "nnodes")) or len(job.nodes) or 1,
        status=_job_status(jobs, rows),
        scenario=opt_str(_first(jobs, "scenario") or _rank_meta(job.ranks, "scenario")),
        pipeline=opt_str(_first(jobs, "pipeline") or _rank_meta(job.ranks, "pipeline")),
        device=device,
        batch_size=opt_int(_first(jobs, "batch_size") or _rank_meta(job.ranks, "batch_size")),
        workers=opt_int(
            _first(jobs, "workers") if _first(jobs, "workers") is not None else _rank_meta(job.ranks, "workers")
        ),
        backend=opt_str(_first(jobs, "backend") or _rank_meta(job.ranks, "backend")),
        ranks=rows,
        throughput_samples_per_s=throughput,
        step_time_ms=slowest.summary.step_time_ms if slowest and slowest.summary else StepTimes(*[math.nan] * 3),
        slowest_rank=slowest.rank if slowest else None,
        breakdown_ms_per_step=_mean_breakdown(measured),
        stall_fraction=mean([r.figure("stall") for r in measured]),
        device_busy_fraction=mean([r.figure("busy") for r in measured]),
        verdict=job_verdict(rows),
        straggler=straggler,
        scaling=_scaling(job.baseline, world, throughput, notes),
        first_failure=first_failure(exits, rows),
        run_dirs=tuple(n.run_dir for n in job.nodes),
        notes=tuple(notes),
        straggler_rule=rule,
    )


def _first(jobs: list[JSON], key: str) -> object:
    return next((j[key] for j in jobs if j.get(key) is not None), None)


def _rank_meta(ranks: tuple[RankInput, ...], key: str) -> object:
    """A fact the ranks' stores recorded (the first found): for a job directory without job.json."""
    return next((r.record.meta[key] for r in ranks if r.record and r.record.meta.get(key) is not None), None)


def _device(rows: tuple[RankRow, ...], jobs: list[JSON]) -> JSON:
    for r in rows:
        if r.summary is not None:
            return r.summary.device.to_dict()
    text = _first(jobs, "device")
    return {"kind": str(text).split(":")[0] if text else None, "name": text}


def _job_start(job: JobInput) -> float:
    starts = [float(t) for n in job.nodes if isinstance(t := n.job.get("started_at"), (int, float))]
    if not starts:
        starts = [float(r.record.meta["started_at"]) for r in job.ranks if r.record and r.record.meta.get("started_at")]
    return min(starts, default=0.0)


def _rank_exits(job: JobInput, t0: float) -> dict[int, RankExit]:
    """Each failed rank's first exit, timed from the job's start (nodes start at slightly different times)."""
    out: dict[int, RankExit] = {}
    for node in job.nodes:
        started = node.job.get("started_at")
        offset = float(started) - t0 if isinstance(started, (int, float)) else 0.0
        for e in objects(node.job.get("rank_exits")):
            rank = e.get("rank")
            if not isinstance(rank, int) or rank in out:
                continue
            out[rank] = RankExit(
                rank=rank,
                local_rank=opt_int(e.get("local_rank")),
                exitcode=opt_int(e.get("exitcode")),
                signal=opt_str(e.get("signal")),
                t_s=(opt_float(e.get("t_s")) or 0.0) + offset,
                node_rank=opt_int(node.job.get("node_rank")),
            )
    return out


def _rank_row(r: RankInput, job: JobInput, exit_: RankExit | None) -> RankRow:
    if r.record is None:
        status = exit_.describe() if exit_ else f"missing: {r.problem or 'no store'}"
        return RankRow(r.rank, r.node_rank, status, r.run_dir, None, (math.nan, math.nan), math.nan, exit_)
    s = summarize(r.record)
    waits = [st.data_wait_s * 1e3 for st in measured_steps(r.record)]
    return RankRow(
        rank=r.rank,
        node_rank=r.node_rank,
        status=exit_.describe() if exit_ else s.status,
        run_dir=r.run_dir,
        summary=s,
        data_wait_ms=(quantile(waits, 0.5), quantile(waits, 0.9)),
        cpu_pct=rank_cpu(r, job.nodes),
        exit=exit_,
        workers_cpu_pct=rank_cpu(r, job.nodes, "workers.cpu_pct"),
    )


def rank_cpu(r: RankInput, nodes: tuple[NodeInput, ...], what: str = "cpu_pct") -> float:
    """Mean ``rank{R}.cpu_pct`` (the rank's process and its loader workers, % of one core; ``what``
    "workers.cpu_pct": the workers alone) from the node sampler, over the rank's measured window put on the node's
    clock through both stores' ``started_at``; over all the node's samples when the rank has no measured step;
    NaN when no node sampled it."""
    metric = f"rank{r.rank}.{what}"
    rec = r.record
    for node in nodes:
        n = node.record
        if n is None or (r.node_rank is not None and node.job.get("node_rank", r.node_rank) != r.node_rank):
            continue
        values = [(t, v) for t, _src, m, v in n.samples if m == metric and v is not None]
        if not values:
            continue
        steps = measured_steps(rec) if rec is not None else []
        shift = _started(rec) - _started(n) if rec is not None else math.nan
        if steps and not math.isnan(shift):
            lo, hi = steps[0].t_start + shift, steps[-1].t_end + shift
            inside = [v for t, v in values if lo <= t <= hi]
            if inside:
                return mean(inside)
        return mean([v for _t, v in values])
    return math.nan


def _started(rec: RunRecord | None) -> float:
    value = rec.meta.get("started_at") if rec is not None else None
    return float(value) if isinstance(value, (int, float)) else math.nan


def _job_status(jobs: list[JSON], rows: tuple[RankRow, ...]) -> str:
    """The launcher's status (the worst over nodes); without job.json, the worst of the ranks' own."""
    statuses = [str(j["status"]) for j in jobs if j.get("status")]
    if not statuses:
        statuses = [r.summary.status for r in rows if r.summary is not None] or ["interrupted"]
    return min(statuses, key=lambda s: _STATUS_ORDER.index(s) if s in _STATUS_ORDER else -1)


def _mean_breakdown(rows: list[RankRow]) -> Breakdown:
    def m(part: str) -> float:
        return mean([r.figure(part) for r in rows])

    recorded = any(r.summary is not None and r.summary.breakdown_ms_per_step.sync_recorded for r in rows)
    sync = m("sync") if rows else 0.0
    return Breakdown(m("data_wait"), m("h2d"), m("compute"), m("other"), sync=sync, sync_recorded=recorded)


# -- the straggler, the verdict, scaling ---------------------------------------------------------


def straggler_rule() -> str:
    return (
        f"a rank is named when its data wait per step exceeds the median of the other ranks' by more than "
        f"max({STRAGGLER_MIN_MS:g} ms, {STRAGGLER_STEP_SHARE:.0%} of the median step) and the other ranks wait "
        f"at least {STRAGGLER_SYNC_SHARE:.0%} of that excess in sync"
    )


def find_straggler(rows: Sequence[RankFigures]) -> tuple[Straggler | None, str]:
    """The rank whose input pipeline holds the job back (the largest qualifying excess), and the rule in words."""
    named = [c for c in _candidates(rows) if not loaders_alike(c.rank_row, c.other_rows)]
    best = max(named, key=lambda c: c.straggler.data_wait_excess_ms_per_step, default=None)
    return (best.straggler if best else None), straggler_rule()


def phase_note(rows: tuple[RankRow, ...] | list[RankRow]) -> str | None:
    """When a rank's timing alone looks like a straggler's but every rank's loader costs the same (loaders_alike),
    the sentence that says so; else None."""
    for c in _candidates(rows):
        if loaders_alike(c.rank_row, c.other_rows):
            costs = ", ".join(f"{o.loader_cpu_ms_per_sample:.0f}" for o in (c.rank_row, *c.other_rows))
            return (
                f"{c.straggler.evidence}, but the loader workers of every rank spend about the same CPU per sample "
                f"({costs} ms, ranks {c.rank_row.rank}, {', '.join(str(o.rank) for o in c.other_rows)}): every "
                f"rank's input pipeline is the limit, and the wait falls on rank {c.rank_row.rank} by the ranks' "
                "phase, not a slower loader; no straggler is named"
            )
    return None


@dataclass(frozen=True, slots=True)
class _Candidate:
    rank_row: RankFigures
    other_rows: list[RankFigures]
    straggler: Straggler


def _candidates(rows: Sequence[RankFigures]) -> list[_Candidate]:
    """Every rank whose data wait per step is above the others' median by more than the threshold while the
    others wait at least STRAGGLER_SYNC_SHARE of that excess in sync."""
    measured = [r for r in rows if r.measured]
    if len(measured) < 2:
        return []
    step = median([r.figure("step") for r in measured])
    threshold = max(STRAGGLER_MIN_MS, STRAGGLER_STEP_SHARE * step)
    found = []
    for r in measured:
        others = [o for o in measured if o.rank != r.rank]
        excess = r.figure("data_wait") - median([o.figure("data_wait") for o in others])
        sync = median([o.figure("sync") for o in others])
        if excess <= threshold or sync < STRAGGLER_SYNC_SHARE * excess:
            continue
        names = tuple(o.rank for o in others)
        who = f"ranks {', '.join(map(str, names))} wait" if len(names) > 1 else f"rank {names[0]} waits"
        evidence = (
            f"rank {r.rank}'s data wait is {excess:.0f} ms/step above the others'; {who} {sync:.0f} ms/step in sync"
        )
        found.append(_Candidate(r, others, Straggler(r.rank, excess, sync, threshold, names, evidence)))
    return found


def first_failure(exits: dict[int, RankExit], rows: tuple[RankRow, ...]) -> RankExit | None:
    """The rank that failed first. The earliest end the launcher recorded, except that among the ranks that ended
    within FAILURE_TIE_S of it, the cause comes first: a rank that died without closing its store (killed: status
    interrupted with no error), then one that failed for a reason of its own, then one that failed because it lost
    a peer (gloo's "Connection closed by peer") or was stopped by a signal."""
    if not exits:
        return None
    t_first = min(e.t_s for e in exits.values())
    tied = [e for e in exits.values() if e.t_s <= t_first + FAILURE_TIE_S]
    by_rank = {r.rank: r for r in rows}

    def consequence(e: RankExit) -> int:
        row = by_rank.get(e.rank)
        s = row.summary if row is not None else None
        if e.signal == "SIGKILL" or (s is not None and s.status == "interrupted" and not s.error):
            return 0
        error = (s.error or "").lower() if s is not None else ""
        if s is not None and s.status == "failed" and not any(p in error for p in PEER_LOSS):
            return 1
        return 2

    return min(tied, key=lambda e: (consequence(e), e.t_s, e.rank))


def loaders_alike(r: RankFigures, others: Sequence[RankFigures]) -> bool:
    """Whether the other ranks' loader workers spend as much CPU per sample as ``r``'s (at least LOADERS_ALIKE of
    it). Ranks stepping in lock-step with equally slow loaders share the wait by phase, not by cause: the rank
    that arrives last waits for data, and the workers of the others load their next batch while they wait in
    sync; so the timing alone looks like a straggler. Equal loader CPU per sample says every rank's input
    pipeline is the limit. False when a figure is missing (no workers: the data wait is the loader's whole cost)."""
    mine = r.loader_cpu_ms_per_sample
    theirs = [o.loader_cpu_ms_per_sample for o in others]
    if math.isnan(mine) or not theirs or any(math.isnan(t) for t in theirs):
        return False
    return median(theirs) >= LOADERS_ALIKE * mine


def job_verdict(rows: tuple[RankRow, ...] | list[RankRow]) -> str:
    """``input-bound on 1 of 4 ranks: rank 1 (highly input-bound, stall 38%)`` / ``not input-bound on any of 4
    ranks`` (``of 3 measured ranks`` when some were not measured)."""
    measured = [r for r in rows if r.measured]
    if not measured:
        return "unknown: no rank has measured steps"
    of = f"{len(measured)} ranks" if len(measured) == len(rows) else f"{len(measured)} measured ranks"
    bound = [r for r in measured if r.input_bound]
    if not bound:
        return f"not input-bound on any of {of}"
    which = ", ".join(
        f"rank {r.rank} ({r.summary.verdict if r.summary else '?'}, stall {r.figure('stall'):.0%})" for r in bound
    )
    return f"input-bound on {len(bound)} of {of}: {which}"


def _scaling(baseline: BaselineInput | None, world: int, throughput: float, notes: list[str]) -> Scaling | None:
    if baseline is None:
        return None
    if baseline.job is not None:
        base = summarize_job(baseline.job).throughput_samples_per_s
    elif baseline.record is not None:
        base = summarize(baseline.record).throughput_samples_per_s
    else:
        base = math.nan
    if not (base > 0) or math.isnan(throughput):
        notes.append(f"scaling efficiency not computed: the baseline '{baseline.run_dir}' has no measured throughput")
        return None
    return Scaling(baseline.run_dir, base, world, throughput)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


__all__ = [
    "BaselineInput",
    "JobInput",
    "JobSummary",
    "NodeInput",
    "RankExit",
    "RankFigures",
    "RankInput",
    "RankRow",
    "Scaling",
    "Straggler",
    "find_straggler",
    "job_verdict",
    "rank_cpu",
    "straggler_rule",
    "summarize_job",
]
