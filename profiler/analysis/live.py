"""Rolling figures for live views, from the Session's bounded buffer of recent steps.

Same definitions as the run summary (docs/metrics.md), over the newest ``horizon_s`` of steps, so
a live line and the final report never disagree about what a figure means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from profiler.store import PhaseRow, StepRow


@dataclass(frozen=True, slots=True)
class LiveStats:
    steps_total: int  # steps resolved so far (warm-up included)
    window_steps: int
    throughput_samples_per_s: float
    step_ms: float
    data_wait_ms: float
    h2d_ms: float
    compute_ms: float
    stall_fraction: float
    warmup: bool  # the newest step is a warm-up step


def window_stats(recent: Sequence[tuple[StepRow, Sequence[PhaseRow]]], horizon_s: float = 5.0) -> LiveStats | None:
    if not recent:
        return None
    newest = recent[-1][0]
    window = [(r, ps) for r, ps in recent if r.t_end >= newest.t_end - horizon_s]
    n = len(window)
    span = math.fsum(r.t_end - r.t_start for r, _ in window)
    wait = math.fsum(r.data_wait_s for r, _ in window)
    h2d = math.fsum(p.t_end - p.t_start for _, ps in window for p in ps if p.depth == 0 and p.name == "h2d")
    comp = math.fsum(p.t_end - p.t_start for _, ps in window for p in ps if p.depth == 0 and p.name == "compute")
    counted = [r.samples for r, _ in window if r.samples is not None]
    thr = sum(counted) / span if span > 0 and len(counted) == n else math.nan
    return LiveStats(
        steps_total=newest.step + 1,
        window_steps=n,
        throughput_samples_per_s=thr,
        step_ms=span / n * 1e3,
        data_wait_ms=wait / n * 1e3,
        h2d_ms=h2d / n * 1e3,
        compute_ms=comp / n * 1e3,
        stall_fraction=(wait + h2d) / span if span > 0 else math.nan,
        warmup=newest.warmup,
    )
