"""The measured steps' phases as the breakdown takes them on a host clock: each step's host seconds per top-level
phase name (:func:`phase_sums`), and their totals over the steps (:class:`PhaseTotals`), which the Summary is made
from. Pure. :mod:`profiler.analysis.bulk` makes the same totals from a store read in bulk, to the same bits."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from profiler.analysis.parts import NESTED_SYNC, SYNC_PHASE
from profiler.analysis.spread import StepSpread
from profiler.analysis.stats import Interval
from profiler.core.rows import PhaseRow, StepRow


@dataclass(frozen=True, slots=True)
class PhaseTotals:
    """What the breakdown takes of the measured steps' phases on a host clock (no device events): host seconds by
    top-level name (each step's own sum in phase order, then math.fsum over the steps), the ranks' waits nested in
    compute, whether a sync phase was recorded, and the steps' spread. Made from the phases' rows
    (:func:`phase_totals`), or from a store read in bulk (:mod:`profiler.analysis.bulk`), to the same bits."""

    host_s: dict[str, float]
    nested_sync: list[Interval]
    sync_recorded: bool
    spread: StepSpread | None


def phase_sums(steps: list[StepRow], phases: list[PhaseRow]) -> dict[int, dict[str, float]]:
    """Per step, host seconds per top-level phase name (nested phases would double count)."""
    out: dict[int, dict[str, float]] = {s.step: defaultdict(float) for s in steps}
    for p in phases:
        if p.depth == 0:
            out[p.step][p.name] += p.t_end - p.t_start
    return out


def phase_totals(steps: list[StepRow], phases: list[PhaseRow], per_step: dict[int, dict[str, float]]) -> PhaseTotals:
    """The measured steps' :class:`PhaseTotals` from their phases' rows (``per_step``: :func:`phase_sums`'); no spread
    (the caller computes it where it knows whether device busy is the compute share)."""
    names = {name for sums in per_step.values() for name in sums}
    return PhaseTotals(
        host_s={name: math.fsum(per_step[s.step].get(name, 0.0) for s in steps) for name in sorted(names)},
        nested_sync=[(p.t_start, p.t_end) for p in phases if p.name == NESTED_SYNC],
        sync_recorded=any(p.name in (SYNC_PHASE, NESTED_SYNC) for p in phases),
        spread=None,
    )
