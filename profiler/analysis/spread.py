"""A run's own step-to-step spread: how far each per-step figure's mean could move if the same run were made again.

``stallscope compare`` reads it to tell a change from noise (docs/trace-and-compare.md, "Within noise"): two runs of
the same command differ by a few standard errors of their means, never by a trend.

Pure: the measured steps and their per-step phase sums in, a :class:`StepSpread` out; no clock, no file.

Invariants:
- Every figure is a standard error of a mean over the measured steps, in the figure's own unit (ms per step, or a
  fraction for the stall fraction and the device busy fraction). It is the larger of two estimates: the
  independent-steps one, sd / sqrt(n), and the batch-means one, the sd of ``BLOCKS`` contiguous blocks' means
  / sqrt(``BLOCKS``), which also sees drift and runs of slow steps (a machine that warms up or gets busier).
- The step time's p50 and p90 get a quantile's standard error: sd / sqrt(n) times the normal-theory factor
  sqrt(q(1 - q)) / pdf(z_q) (1.25 for the median, 1.71 for p90), or the batch-means sd of the blocks' quantiles
  when that is larger.
- Phases are host times (perf_counter) per step; ``other`` is each step less its data wait and top-level phases.
  Where the summary's breakdown moves time between parts (device events, the ranks' wait nested in compute), the
  host spread still measures the noise of the same steps.
- Fewer than ``MIN_STEPS`` measured steps: no spread (None): the run cannot say what its noise is.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from profiler.analysis.meta import JSON
from profiler.analysis.stats import json_safe, mean, quantile
from profiler.core.rows import StepRow

MIN_STEPS = 4  # below this an sd says nothing
BLOCKS = 5  # contiguous blocks for the batch-means estimate, used from 2 steps a block
METHOD = (
    "standard error of each per-step mean over the measured steps: the larger of sd / sqrt(n) and the sd of "
    f"{BLOCKS} contiguous blocks' means / sqrt({BLOCKS}); quantiles: sd / sqrt(n) x sqrt(q(1-q)) / pdf(z_q)"
)


@dataclass(frozen=True, slots=True)
class StepSpread:
    """Standard errors of a run's per-step means (see the module docstring)."""

    steps: int
    blocks: int  # 0: too few steps for blocks, the independent-steps estimate alone
    se_ms: dict[str, float]  # "step", "step_p50", "step_p90", "data_wait", each phase, "other": ms per step
    stall_fraction_se: float  # of the per-step (data wait + h2d) / step time, a fraction
    device_busy_fraction_se: float | None = None  # where device busy is the compute phase's share (a CPU run)
    method: str = field(default=METHOD)

    def to_dict(self) -> JSON:
        return json_safe(
            {
                "steps": self.steps,
                "blocks": self.blocks,
                "se_ms_per_step": dict(self.se_ms),
                "stall_fraction_se": self.stall_fraction_se,
                "device_busy_fraction_se": self.device_busy_fraction_se,
                "method": self.method,
            }
        )


def _sd(xs: Sequence[float]) -> float:
    m = mean(xs)
    # d * d, not d ** 2: the product is correctly rounded, so a store read in bulk squares its columns in numpy to
    # the same bits (analysis/bulk.py); libm's pow differs from it in the last bit for about one value in 1,000
    return math.sqrt(math.fsum(d * d for d in [x - m for x in xs]) / (len(xs) - 1)) if len(xs) > 1 else math.nan


def _blocks(xs: Sequence[float]) -> list[Sequence[float]]:
    n = len(xs)
    if n < 2 * BLOCKS:
        return []
    edges = [round(i * n / BLOCKS) for i in range(BLOCKS + 1)]
    return [xs[a:b] for a, b in itertools.pairwise(edges)]


def se_of_mean(xs: Sequence[float]) -> float:
    """The larger of the independent-steps and the batch-means standard error of ``mean(xs)``; NaN for < 2."""
    iid = _sd(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
    blocks = _blocks(xs)
    if not blocks:
        return iid
    return max(iid, _sd([mean(b) for b in blocks]) / math.sqrt(len(blocks)))


def se_of_quantile(xs: Sequence[float], q: float) -> float:
    """A quantile's standard error: normal theory from sd / sqrt(n), or the blocks' quantiles' spread if larger."""
    if len(xs) < 2:
        return math.nan
    factor = math.sqrt(q * (1 - q)) / NormalDist().pdf(NormalDist().inv_cdf(q))
    theory = factor * _sd(xs) / math.sqrt(len(xs))
    blocks = _blocks(xs)
    if not blocks:
        return theory
    return max(theory, _sd([quantile(list(b), q) for b in blocks]) / math.sqrt(len(blocks)))


def step_spread(
    steps: Sequence[StepRow], per_step: Mapping[int, Mapping[str, float]], *, busy_is_compute: bool = False
) -> StepSpread | None:
    """The spread of ``steps`` (measured, in order); ``per_step``: each step's host seconds per top-level phase.
    ``busy_is_compute``: the run's device busy fraction is its compute phase's share of the step (a CPU run)."""
    n = len(steps)
    if n < MIN_STEPS:
        return None
    step_ms = [(s.t_end - s.t_start) * 1e3 for s in steps]
    wait_ms = [s.data_wait_s * 1e3 for s in steps]
    names = sorted({name for s in steps for name in per_step.get(s.step, {})})
    phase_ms = {name: [per_step.get(s.step, {}).get(name, 0.0) * 1e3 for s in steps] for name in names}
    parts = [math.fsum(phase_ms[k][i] for k in names) for i in range(n)]
    other = [st - w - p for st, w, p in zip(step_ms, wait_ms, parts, strict=True)]
    se = {
        "step": se_of_mean(step_ms),
        "step_p50": se_of_quantile(step_ms, 0.5),
        "step_p90": se_of_quantile(step_ms, 0.9),
        "data_wait": se_of_mean(wait_ms),
        **{name: se_of_mean(ms) for name, ms in phase_ms.items()},
        "other": se_of_mean(other),
    }
    h2d = phase_ms.get("h2d", [0.0] * n)
    stall = [(w + c) / st for w, c, st in zip(wait_ms, h2d, step_ms, strict=True) if st > 0]
    compute = phase_ms.get("compute")
    busy = None
    if busy_is_compute and compute is not None:
        busy = se_of_mean([c / st for c, st in zip(compute, step_ms, strict=True) if st > 0])
    return StepSpread(n, BLOCKS if _blocks(step_ms) else 0, se, se_of_mean(stall), busy)
