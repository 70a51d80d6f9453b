"""A long run's Summary from its store read in bulk (:class:`~profiler.core.store.columns.RunColumns`): the same
Summary, to the last bit, as :func:`~profiler.analysis.summary.summarize` of its rows, without a PhaseRow per phase.

Pure: numpy columns in, a Summary out. The phases' figures (:class:`PhaseTotals`: each step's own sums, then
``math.fsum`` over the steps, and the steps' spread as :mod:`profiler.analysis.spread` makes it) are made from the
columns with the same float operations in the same order as from the rows, and handed to ``summarize(rec,
totals=...)``, whose record then holds every step as a row (a step row is cheap; a run has twice as many phases)
but only the phases a run-queue wait was read for (what contention reads): every other figure is made by the same
code.

Invariants:
- ``summarize_columns(cols) == summarize(cols.record())`` (tests/test_report_cache.py checks it on stores of each
  kind). A run whose phases carry device times (CUDA or simulated events) is summarised from its rows.
- Per-step sums are ``np.bincount`` sums: sequential, in the phases' order, from 0.0, as the rows' loop adds them.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist
from typing import TYPE_CHECKING

from profiler.analysis.parts import NESTED_SYNC, SYNC_PHASE, event_timer
from profiler.analysis.phasesums import PhaseTotals
from profiler.analysis.spread import BLOCKS, MIN_STEPS, StepSpread
from profiler.analysis.stats import quantile
from profiler.analysis.summary import Summary, summarize
from profiler.core.rows import RunRecord
from profiler.core.store.columns import RunColumns

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray


def summarize_columns(cols: RunColumns, now: float | None = None) -> Summary:
    """The run's Summary (see the module's invariants)."""
    import numpy as np

    from profiler.analysis.apart import measured_steps

    phases = cols.phases
    light = RunRecord(
        cols.meta,
        cols.steps.rows(),
        phases.rows(keep=~np.isnan(phases.runq_s)),  # what contention reads: the phases a run-queue wait was read for
        cols.samples,
        cols.events,
        cols.stacks_text,
        cols.windows,
    )
    measured = np.fromiter((s.step for s in measured_steps(light)), np.int64)
    in_measured = np.isin(phases.step, measured)
    kind = (cols.meta.get("device") or {}).get("kind")
    if event_timer(kind) is not None and not np.isnan(phases.dev_start[in_measured]).all():
        return summarize(cols.record(), now)  # device events: the stall's interval arithmetic works on rows
    return summarize(light, now, totals=_totals(cols, measured, in_measured))


def _totals(cols: RunColumns, measured: NDArray[np.int64], in_measured: NDArray[np.bool_]) -> PhaseTotals:
    """:class:`PhaseTotals` of the measured steps, as ``phasesums.phase_totals`` and ``spread.step_spread`` make it."""
    import numpy as np

    p = cols.phases
    names = p.names
    top = in_measured & (p.depth == 0)
    # each measured step's sum per top-level name: row = the step's place among the measured, column = the name
    at = np.searchsorted(measured, p.step[top]) * len(names) + p.name[top]
    sums = np.bincount(at, weights=p.t_end[top] - p.t_start[top], minlength=len(measured) * len(names))
    per_step = np.asarray(sums, np.float64)
    per_step = per_step.reshape(len(measured), len(names))
    present = sorted(names[k] for k in np.unique(p.name[top]).tolist())
    column = {name: per_step[:, names.index(name)] for name in present}
    host_s = {name: math.fsum(column[name].tolist()) for name in present}
    in_names = np.isin(p.name, [names.index(n) for n in (SYNC_PHASE, NESTED_SYNC) if n in names])
    nested = in_measured & (p.name == names.index(NESTED_SYNC)) if NESTED_SYNC in names else in_measured & False
    return PhaseTotals(
        host_s=host_s,
        nested_sync=list(zip(p.t_start[nested].tolist(), p.t_end[nested].tolist(), strict=True)),
        sync_recorded=bool((in_measured & in_names).any()),
        spread=_spread(cols, measured, column),
    )


def _spread(cols: RunColumns, measured: NDArray[np.int64], column: dict[str, NDArray[np.float64]]) -> StepSpread | None:
    """``spread.step_spread`` of the measured steps, its lists made from the columns (the same floats)."""
    import numpy as np

    n = len(measured)
    if n < MIN_STEPS:
        return None
    s = cols.steps
    rows = np.searchsorted(s.step, measured)
    step = (s.t_end[rows] - s.t_start[rows]) * 1e3
    wait = s.data_wait_s[rows] * 1e3
    phase_ms = {name: sums * 1e3 for name, sums in column.items()}
    other = (step - wait) - _parts(list(phase_ms.values()), n)
    sd = _sd(step)  # once for the three figures of the step time
    se = {
        "step": _se_of_mean(step, sd),
        "step_p50": _se_of_quantile(step, 0.5, sd),
        "step_p90": _se_of_quantile(step, 0.9, sd),
        "data_wait": _se_of_mean(wait),
        **{name: _se_of_mean(ms) for name, ms in phase_ms.items()},
        "other": _se_of_mean(other),
    }
    timed = step > 0
    h2d = column["h2d"] * 1e3 if "h2d" in column else np.zeros(n)
    stall = ((wait + h2d) / np.where(timed, step, 1.0))[timed]
    busy = None
    # device busy is the compute share where the steps took time (summary._busy_fraction's "host-compute-phase")
    if "compute" in column and math.fsum((s.t_end[rows] - s.t_start[rows]).tolist()) > 0:
        busy = _se_of_mean(((column["compute"] * 1e3) / np.where(timed, step, 1.0))[timed])
    return StepSpread(n, BLOCKS if n >= 2 * BLOCKS else 0, se, _se_of_mean(stall), busy)


def _parts(phase_ms: list[NDArray[np.float64]], n: int) -> NDArray[np.float64]:
    """Each step's top-level phases summed as spread.step_spread sums them (``math.fsum`` of the step's values):
    for one or two phases that is the values themselves or one IEEE addition (fsum's correctly rounded sum of two
    floats is their sum), so numpy adds them; three or more are fsum'd step by step."""
    import numpy as np

    if not phase_ms:
        return np.zeros(n)
    if len(phase_ms) <= 2:
        return phase_ms[0] + phase_ms[1] if len(phase_ms) == 2 else phase_ms[0]
    return np.array(list(map(math.fsum, zip(*(ms.tolist() for ms in phase_ms), strict=True))))


# spread.se_of_mean and se_of_quantile of an array, to the same bits: the same sums (math.fsum of the same floats,
# which is exact whatever their order) and the same squares (spread squares d * d, one correctly rounded product,
# as numpy does); x - mean is one IEEE subtraction either way. tests/test_report_cache.py and
# tests/test_killed_report.py check summarize_columns against summarize, spread included.
def _sd(xs: NDArray[np.float64]) -> float:
    n = len(xs)
    if n < 2:
        return math.nan
    m = math.fsum(xs.tolist()) / n
    d = xs - m
    return math.sqrt(math.fsum((d * d).tolist()) / (n - 1))


def _blocks(xs: NDArray[np.float64]) -> list[NDArray[np.float64]]:
    n = len(xs)
    if n < 2 * BLOCKS:
        return []
    edges = [round(i * n / BLOCKS) for i in range(BLOCKS + 1)]
    return [xs[a:b] for a, b in itertools.pairwise(edges)]


def _se_of_mean(xs: NDArray[np.float64], sd: float | None = None) -> float:
    import numpy as np

    iid = (_sd(xs) if sd is None else sd) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
    blocks = _blocks(xs)
    if not blocks:
        return iid
    means = np.array([math.fsum(b.tolist()) / len(b) for b in blocks])
    return max(iid, _sd(means) / math.sqrt(len(blocks)))


def _se_of_quantile(xs: NDArray[np.float64], q: float, sd: float | None = None) -> float:
    import numpy as np

    if len(xs) < 2:
        return math.nan
    factor = math.sqrt(q * (1 - q)) / NormalDist().pdf(NormalDist().inv_cdf(q))
    theory = factor * (_sd(xs) if sd is None else sd) / math.sqrt(len(xs))
    blocks = _blocks(xs)
    if not blocks:
        return theory
    return max(theory, _sd(np.array([quantile(b.tolist(), q) for b in blocks])) / math.sqrt(len(blocks)))
