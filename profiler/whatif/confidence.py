"""How sure a what-if is: the interval around each absolute prediction, and the speedups against the base.

Pure: numbers in, dataclasses out. An absolute prediction (samples/s) rests on one measured run, the base; what the
base can show about how well its own figures are known is

- its steps' spread: the standard error of the mean step time, and the standard error that consecutive blocks of
  steps give (a run whose steps drift, or come in bursts, shows it there and not in the steps' own spread);
- its length: few steps or blocks leave few degrees of freedom, and the Student t quantile widens the interval;
- with ``--check``, a repeat of it: the check re-measures the base configuration, and how far that run's
  throughput lies from the base's is direct evidence of the host's drift between runs, which no single run shows.

The relative half-width ``h`` = t x the larger standard error + the drift (0 without a repeat); a prediction that
moves the loading between the training process and workers, or loads with several workers, adds the 95% half-width
of the worker gap's and the workers' scaling's medians (``gap_half_width``), measured at ``whatif`` time. It is
applied where the prediction uses the base's measured figures: the loader's cost per sample and the loop's own time
per step are scaled by (1 + h) and by 1 / (1 + h) and the prediction made again (``interval``), so that a device-bound
prediction, which the measured figures do not set, keeps a narrow interval.

A speedup against the base (a prediction over the model's prediction for the base's own configuration, beside the
check's measurement over the re-measured base) cancels the drift: both runs of a ratio are made minutes apart.
docs/whatif.md states the rules and shows them on a run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from profiler.whatif.model import LoaderGap, median_error

if TYPE_CHECKING:
    from profiler.whatif.model import WhatIf

# A base shorter than either is "one short run": between-run drift on a shared host exceeds what its steps show
SHORT_STEPS = 30
SHORT_S = 10.0
# Blocks of consecutive steps for the between-block standard error: at most this many, at least 2 steps each
MAX_BLOCKS = 5
# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; 1.96 past the table
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
_T975_30 = 2.042  # 16-30 degrees of freedom: at most 2.120, at least 2.042


def t975(df: int) -> float:
    """The two-sided 95% Student t quantile for ``df`` degrees of freedom (inf for none)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    return 2.120 if df <= 20 else _T975_30 if df <= 30 else 1.96


@dataclass(frozen=True, slots=True)
class BaseSpread:
    """What the base run's own measured steps show about its mean step time (relative figures)."""

    steps: int
    seconds: float  # the measured steps' total wall time
    mean_ms: float
    steps_se: float  # standard error of the mean step time / the mean
    blocks: int  # consecutive blocks the steps were cut into (1: too few steps)
    blocks_se: float  # standard error from the blocks' means / the mean (NaN with one block)

    @property
    def se(self) -> float:
        """The larger of the two standard errors: steps that drift or burst show in the blocks."""
        return self.steps_se if math.isnan(self.blocks_se) else max(self.steps_se, self.blocks_se)

    @property
    def t(self) -> float:
        """The t quantile of the estimate that set ``se``: blocks - 1 or steps - 1 degrees of freedom."""
        by_blocks = not math.isnan(self.blocks_se) and self.blocks_se >= self.steps_se
        return t975(self.blocks - 1 if by_blocks else self.steps - 1)

    @property
    def half_width(self) -> float:
        """The 95% relative half-width of the base's mean step from its own steps."""
        return self.t * self.se if self.se > 0 else 0.0

    @property
    def short(self) -> bool:
        return self.steps < SHORT_STEPS or self.seconds < SHORT_S

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "seconds": self.seconds,
            "mean_step_ms": self.mean_ms,
            "steps_standard_error": self.steps_se,
            "blocks": self.blocks,
            "blocks_standard_error": None if math.isnan(self.blocks_se) else self.blocks_se,
            "t_quantile": None if math.isinf(self.t) else self.t,
            "half_width": None if math.isinf(self.half_width) else self.half_width,
            "short_run": self.short,
        }


def spread_of(step_ms: Sequence[float]) -> BaseSpread:
    """The spread of a run's measured step times (ms, in order)."""
    n = len(step_ms)
    if n == 0:
        return BaseSpread(0, 0.0, math.nan, math.inf, 1, math.nan)
    mean = statistics.fmean(step_ms)
    steps_se = statistics.stdev(step_ms) / math.sqrt(n) / mean if n >= 2 and mean > 0 else math.inf
    blocks = min(MAX_BLOCKS, n // 2)
    blocks_se = math.nan
    if blocks >= 2 and mean > 0:
        size = n // blocks  # the first n - blocks x size steps are left out of the blocks, not of the mean
        rest = n - blocks * size
        means = [statistics.fmean(step_ms[rest + i * size : rest + (i + 1) * size]) for i in range(blocks)]
        blocks_se = statistics.stdev(means) / math.sqrt(blocks) / mean
    return BaseSpread(n, math.fsum(step_ms) / 1e3, mean, steps_se, max(1, blocks), blocks_se)


def gap_half_width(gap: LoaderGap, moved: bool, workers: int) -> float:
    """The 95% relative half-width the worker gap adds to a prediction: its factor's where the prediction moves the
    loading (``moved``), the workers' scaling's where it loads with more than one worker (inf where such a figure
    has fewer than 3 rounds; 0 where it was not measured)."""
    out = 0.0
    if moved and gap.rounds:
        out += 1.96 * median_error(gap.rounds)
    if workers > 1 and gap.cores_k > 1 and gap.cores_rounds:
        out += 1.96 * median_error(gap.cores_rounds)
    return out


def drift(base: float, again: float) -> float:
    """How far two runs of one configuration lie apart: the larger throughput over the smaller, less one (0 when
    either is missing)."""
    if not (base > 0 and again > 0):
        return 0.0
    return max(base, again) / min(base, again) - 1.0


def interval(predict_at: Callable[[float], float], half_width: float) -> tuple[float, float]:
    """(low, high) of a prediction whose measured inputs are known to a relative ``half_width``: ``predict_at(k)``
    is the prediction with the base's measured costs scaled by k (1: as measured)."""
    if math.isinf(half_width) or math.isnan(half_width):
        return (0.0, math.inf)
    k = 1.0 + max(0.0, half_width)
    a, b = predict_at(k), predict_at(1.0 / k)
    return (min(a, b), max(a, b))


def speedup(value: float, base: float) -> float:
    """``value`` over ``base`` (NaN when either is missing)."""
    if math.isnan(value) or math.isnan(base) or not base > 0:
        return math.nan
    return value / base


def ratio_error(predicted: float, measured: float) -> float:
    """predicted / measured - 1 (NaN when either is missing)."""
    if math.isnan(predicted) or math.isnan(measured) or not measured > 0:
        return math.nan
    return predicted / measured - 1.0


@dataclass(frozen=True, slots=True)
class Confidence:
    """The base's spread, its repeat by ``--check`` (NaN: none), the relative half-width that follows, and each
    prediction's interval and speedups (aligned with the predictions; ``base`` indexes the base's own
    configuration among them, None when it is not there)."""

    spread: BaseSpread
    base_throughput: float  # the base run's own measured samples/s
    remeasured: float  # the check's re-measured base, samples/s (NaN: not re-measured)
    intervals: tuple[tuple[float, float], ...]
    base: int | None = None

    @property
    def drift(self) -> float:
        return drift(self.base_throughput, self.remeasured)

    @property
    def half_width(self) -> float:
        return self.spread.half_width + self.drift

    @property
    def lines(self) -> list[str]:
        """What the interval is made of, and what a short base means, in words."""
        s = self.spread
        own = (
            f"its steps' spread gives +/-{s.half_width:.1%} at 95% (standard error {s.se:.1%} of the mean step, "
            f"t {s.t:.2f} for {s.steps} steps in {s.blocks} blocks)"
            if not math.isinf(s.half_width)
            else "too few steps to show a spread"
        )
        out = [f"base run: {s.steps} measured steps, {s.seconds:.1f} s; {own}"]
        if not math.isnan(self.remeasured):
            out.append(
                f"re-measured by the check at {self.remeasured:.1f} samples/s against the base's "
                f"{self.base_throughput:.1f}: {self.drift:.1%} apart, the host's drift between runs; the "
                f"absolute intervals are widened by it (+/-{self.half_width:.1%} in all)"
            )
        if s.short:
            out.append(
                f"the base is ONE SHORT RUN ({s.steps} steps, {s.seconds:.1f} s): on a shared host a run of the same "
                "configuration can read differently by more than its own steps show, so an absolute figure is as "
                "good as this one run"
                + (
                    "; the speedups against the re-measured base cancel that drift"
                    if not math.isnan(self.remeasured)
                    else "; --check re-measures it, and its speedups against the re-measured base cancel the drift"
                )
            )
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "spread": self.spread.to_dict(),
            "base_throughput_samples_per_s": self.base_throughput,
            "remeasured_base_throughput_samples_per_s": None if math.isnan(self.remeasured) else self.remeasured,
            "drift": self.drift if not math.isnan(self.remeasured) else None,
            "half_width": None if math.isinf(self.half_width) else self.half_width,
            "lines": self.lines,
        }


def _num(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else x


def add_confidence(out: dict[str, object], result: WhatIf, conf: Confidence) -> None:
    """``out`` (``result.to_dict()``) with each row's interval, whether it is the base's own configuration and,
    checked, its speedup against the base and both errors; the worst of each; the confidence in words."""
    rows = out["predictions"]
    if not isinstance(rows, list) or len(rows) != len(result.predictions):
        raise ValueError("add_confidence takes result.to_dict() of the same result")
    base_pred = result.predictions[conf.base].samples_per_s if conf.base is not None else math.nan
    base_meas = conf.remeasured
    speed_errors, abs_errors = [], []
    for i, (row, p) in enumerate(zip(rows, result.predictions, strict=True)):
        lo, hi = conf.intervals[i] if i < len(conf.intervals) else (math.nan, math.nan)
        row["predicted_throughput_samples_per_s_low"] = _num(lo)
        row["predicted_throughput_samples_per_s_high"] = _num(hi)
        row["base_configuration"] = i == conf.base
        if not result.checked:
            continue
        c = result.checked[i]
        measured = c.measured_samples_per_s
        pred_speedup, meas_speedup = speedup(p.samples_per_s, base_pred), speedup(measured, base_meas)
        err, absolute = ratio_error(pred_speedup, meas_speedup), c.error
        row["predicted_speedup_vs_base"] = _num(pred_speedup)
        row["measured_speedup_vs_base"] = _num(meas_speedup)
        row["speedup_error"] = _num(err)
        row["absolute_error"] = _num(absolute)
        inside = lo <= measured <= hi if not math.isnan(measured) and not math.isnan(lo) else None
        row["measured_inside_interval"] = inside
        if not math.isnan(err):
            speed_errors.append(abs(err))
        if not math.isnan(absolute):
            abs_errors.append(abs(absolute))
    out["confidence"] = conf.to_dict()
    if result.checked:
        out["worst_speedup_error"] = max(speed_errors) if speed_errors else None
        out["worst_absolute_error"] = max(abs_errors) if abs_errors else None
