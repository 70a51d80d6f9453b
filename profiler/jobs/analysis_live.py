"""Rolling figures of a multi-rank job while it trains: one row per rank from its newest steps, the job's
throughput so far, and the straggler candidate of the recent window.

The job report's definitions (docs/multi-rank.md) over each rank's newest ``horizon_s`` of steps, and its own
straggler rule (:func:`profiler.jobs.analysis.find_straggler`), so live view and report never disagree.
Invariants: :func:`job_live` is pure (no clock, no file); a rank's window holds its measured steps only, once
it has any (docs/live.md, "A multi-rank job", says why); :class:`JobLiveAggregator` keeps bounded memory
(``max_steps`` steps per rank, ``horizon_s`` of node readings) and takes a step or sample handed twice once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from profiler.analysis.parts import NESTED_SYNC, SYNC_PHASE
from profiler.core.store import PhaseRow, StepRow
from profiler.jobs.analysis import Straggler, find_straggler

Step = tuple[StepRow, Sequence[PhaseRow]]
_NAN = math.nan


@dataclass(frozen=True, slots=True)
class RankRecent:
    """What a live feed holds of one rank at one instant."""

    rank: int
    steps: Sequence[Step]  # its newest steps, oldest first
    measured_samples: int = 0  # samples of every measured (non-warm-up) step so far
    measured_s: float = 0.0  # and their summed step time, s
    status: str = "running"
    node_rank: int | None = None
    workers: int | None = None  # loader workers per rank (the run's meta)
    cpu_pct: float = _NAN  # node sampler's rank{R}.cpu_pct, mean over the recent window; NaN: not sampled
    workers_cpu_pct: float = _NAN  # rank{R}.workers.cpu_pct likewise


@dataclass(frozen=True, slots=True)
class RankLive:
    """One rank's live row: figures in ms per step over its window (NaN: nothing to show yet)."""

    rank: int
    node_rank: int | None
    status: str
    steps_done: int  # steps resolved so far, warm-up included
    warmup: bool  # the window holds warm-up steps only
    window_steps: int
    throughput_samples_per_s: float
    step_ms: float
    data_wait_ms: float
    h2d_ms: float
    sync_ms: float
    stall_fraction: float  # (data wait + h2d) / step time, host times (docs/live.md)
    cpu_pct: float
    workers: int | None = None
    workers_cpu_pct: float = _NAN
    throughput_so_far: float = _NAN  # over every measured step so far

    @property
    def measured(self) -> bool:
        """Whether the straggler rule may read this row: a window of measured steps."""
        return self.window_steps > 0 and not self.warmup

    def figure(self, name: str) -> float:
        """A figure by the job report's names (RankFigures); NaN for one a live row does not have."""
        return {
            "throughput": self.throughput_samples_per_s,
            "step": self.step_ms,
            "stall": self.stall_fraction,
            "data_wait": self.data_wait_ms,
            "h2d": self.h2d_ms,
            "sync": self.sync_ms,
        }.get(name, _NAN)

    @property
    def loader_cpu_ms_per_sample(self) -> float:
        """CPU the rank's loader workers spend per sample delivered over the window (NaN: no workers, or not
        sampled): what keeps the straggler rule from naming a rank that waits only by phase."""
        t = self.throughput_samples_per_s
        if not (self.workers or 0) > 0 or math.isnan(self.workers_cpu_pct) or not t > 0:
            return _NAN
        return self.workers_cpu_pct / 100 / t * 1e3


@dataclass(frozen=True, slots=True)
class JobLive:
    """What the job's live view shows at one instant."""

    ranks: tuple[RankLive, ...]  # in rank order
    throughput_recent: float  # sum over ranks of their window's samples/s (NaN until every rank has one)
    throughput_so_far: float  # sum over ranks of samples/s over all their measured steps so far
    straggler: Straggler | None
    horizon_s: float
    t_s: float = 0.0  # run time of the newest step of any rank, s

    @property
    def steps_done(self) -> int:
        """The slowest rank's steps (a data-parallel job advances in lock-step)."""
        return min((r.steps_done for r in self.ranks), default=0)


def step_sync_s(phases: Sequence[PhaseRow]) -> float:
    """A step's sync time: a top-level ``sync`` phase, or ``compute/sync`` nested in compute (as the report)."""
    return math.fsum(
        p.t_end - p.t_start
        for p in phases
        if (p.depth == 0 and p.name == SYNC_PHASE) or (p.depth == 1 and p.name == NESTED_SYNC)
    )


def _window(steps: Sequence[Step], horizon_s: float) -> tuple[list[Step], bool]:
    measured = [s for s in steps if not s[0].warmup]
    pool = measured or list(steps)
    if not pool:
        return [], False
    newest = pool[-1][0].t_end
    return [s for s in pool if s[0].t_end >= newest - horizon_s], not measured


def rank_live(r: RankRecent, horizon_s: float = 5.0) -> RankLive:
    """One rank's row over its newest ``horizon_s`` of steps (measured steps once it has any)."""
    window, warmup = _window(r.steps, horizon_s)
    n = len(window)
    span = math.fsum(s.t_end - s.t_start for s, _ in window)
    wait = math.fsum(s.data_wait_s for s, _ in window)
    h2d = math.fsum(p.t_end - p.t_start for _, ps in window for p in ps if p.depth == 0 and p.name == "h2d")
    sync = math.fsum(step_sync_s(ps) for _, ps in window)
    counted = [s.samples for s, _ in window if s.samples is not None]
    per_step = (lambda x: x / n * 1e3) if n else (lambda _x: _NAN)
    return RankLive(
        rank=r.rank,
        node_rank=r.node_rank,
        status=r.status,
        steps_done=r.steps[-1][0].step + 1 if r.steps else 0,
        warmup=warmup,
        window_steps=n,
        throughput_samples_per_s=sum(counted) / span if span > 0 and len(counted) == n else _NAN,
        step_ms=per_step(span),
        data_wait_ms=per_step(wait),
        h2d_ms=per_step(h2d),
        sync_ms=per_step(sync),
        stall_fraction=(wait + h2d) / span if span > 0 else _NAN,
        cpu_pct=r.cpu_pct,
        workers=r.workers,
        workers_cpu_pct=r.workers_cpu_pct,
        throughput_so_far=r.measured_samples / r.measured_s if r.measured_s > 0 else _NAN,
    )


def job_live(ranks: Sequence[RankRecent], horizon_s: float = 5.0) -> JobLive:
    """The job's live figures from its ranks' recent steps; the straggler by the job report's rule."""
    rows = tuple(rank_live(r, horizon_s) for r in sorted(ranks, key=lambda r: r.rank))
    recent = [r.throughput_samples_per_s for r in rows]
    so_far = [r.throughput_so_far for r in rows if not math.isnan(r.throughput_so_far)]
    straggler, _rule = find_straggler(rows)
    return JobLive(
        ranks=rows,
        throughput_recent=math.fsum(recent) if recent and not any(math.isnan(x) for x in recent) else _NAN,
        throughput_so_far=math.fsum(so_far) if so_far else _NAN,
        straggler=straggler,
        horizon_s=horizon_s,
        t_s=max((r.steps[-1][0].t_end for r in ranks if r.steps), default=0.0),
    )


class _RankBuffer:
    def __init__(self, max_steps: int) -> None:
        self.steps: deque[Step] = deque(maxlen=max_steps)
        self.last = -1
        self.samples = 0
        self.seconds = 0.0
        self.meta: dict[str, object] = {}
        self.status = "running"


class JobLiveAggregator:
    """Folds each rank's steps and the node sampler's readings, as a feed hands them over, into
    :class:`RankRecent` records, and :meth:`snapshot` into a :class:`JobLive`."""

    def __init__(self, horizon_s: float = 5.0, max_steps: int = 1024) -> None:
        self._horizon = horizon_s
        self._max_steps = max_steps
        self._ranks: dict[int, _RankBuffer] = {}
        self._node: deque[tuple[float, dict[str, float]]] = deque()
        self._node_t = -math.inf

    def add_rank(
        self, rank: int, steps: Iterable[Step], meta: Mapping[str, object] | None = None, status: str | None = None
    ) -> None:
        buf = self._ranks.setdefault(rank, _RankBuffer(self._max_steps))
        if meta:
            buf.meta = dict(meta)
        if status:
            buf.status = status
        for row, phases in steps:
            if row.step <= buf.last:
                continue
            buf.last = row.step
            buf.steps.append((row, phases))
            if not row.warmup and row.samples is not None:
                buf.samples += row.samples
                buf.seconds += row.t_end - row.t_start

    def add_node_samples(self, rows: Iterable[tuple[float, dict[str, float]]]) -> None:
        for t, metrics in rows:
            if t <= self._node_t:
                continue
            self._node_t = t
            self._node.append((t, metrics))
        while self._node and self._node[0][0] < self._node_t - self._horizon:
            self._node.popleft()

    def _node_mean(self, metric: str) -> float:
        values = [v for _, m in self._node if not math.isnan(v := m.get(metric, _NAN))]
        return math.fsum(values) / len(values) if values else _NAN

    def recent(self) -> list[RankRecent]:
        out = []
        for rank, buf in sorted(self._ranks.items()):
            workers, node = buf.meta.get("workers"), buf.meta.get("node_rank")
            out.append(
                RankRecent(
                    rank=rank,
                    steps=list(buf.steps),
                    measured_samples=buf.samples,
                    measured_s=buf.seconds,
                    status=buf.status,
                    node_rank=node if isinstance(node, int) else None,
                    workers=workers if isinstance(workers, int) else None,
                    cpu_pct=self._node_mean(f"rank{rank}.cpu_pct"),
                    workers_cpu_pct=self._node_mean(f"rank{rank}.workers.cpu_pct"),
                )
            )
        return out

    def snapshot(self) -> JobLive:
        return job_live(self.recent(), self._horizon)


__all__ = ["JobLive", "JobLiveAggregator", "RankLive", "RankRecent", "job_live", "rank_live", "step_sync_s"]
