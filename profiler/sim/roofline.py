"""A training step's time on a simulated device and on its host, kernel by kernel (docs/sim.md, "The device model").

Pure arithmetic, no torch: each kernel of a step (its FLOPs and the bytes it reads and writes, counted on the meta
device by :mod:`profiler.sim.cost`) takes ``max(FLOPs / achieved FLOP rate, bytes / achieved memory rate)`` plus
the fill time (the ramp-up and tail of a kernel that does not keep every SM busy the whole time: a small kernel's
efficiency is ``t / (t + fill)``); the host launches the kernels one ``interval`` apart, and no kernel starts
before it is launched. :func:`implied_efficiency` inverts the device time for the calibration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Work = Sequence[tuple[float, float]]  # each kernel's (FLOPs, bytes read and written), in launch order


@dataclass(frozen=True, slots=True)
class Rates:
    """What one simulated device achieves: FLOP/s (peak x efficiency), bytes/s (bandwidth x memory efficiency),
    and each kernel's fill time in seconds."""

    flops_per_s: float
    bytes_per_s: float
    fill_s: float


def kernel_times(work: Work, rates: Rates, *, flops: float = 0.0, kernels: int = 1) -> tuple[float, ...]:
    """Seconds each kernel runs. Without ``work`` (a cost built by hand), ``kernels`` equal kernels sharing
    ``flops`` at the FLOP rate alone, with no memory or fill time."""
    if not work:
        n = max(1, kernels)
        return (flops / rates.flops_per_s / n,) * n
    return tuple(max(f / rates.flops_per_s, b / rates.bytes_per_s) + rates.fill_s for f, b in work)


def lead_s(times: Sequence[float], interval: float) -> float:
    """Seconds from a step's issue to the end of its last kernel on an idle device, when kernel ``i`` is launched
    ``(i + 1) x interval`` after the issue and starts once launched and once kernel ``i - 1`` has ended:
    ``max over i of ((i + 1) x interval + the time of kernels i..n-1)``. With no launch time it is the kernels'
    sum; with slow launches, the last launch plus the last kernel."""
    suffix = best = 0.0
    for i in range(len(times) - 1, -1, -1):
        suffix += times[i]
        best = max(best, (i + 1) * interval + suffix)
    return best


def host_s(kernels: int, launch_s: float, framework_s: float) -> float:
    """The host's time to issue one step: the framework's per-step cost plus one launch per kernel."""
    return framework_s + kernels * launch_s


def step_period_s(times: Sequence[float], host: float) -> float:
    """A loop that does nothing but train (no input wait): the host runs ahead of the device until the launch
    queue fills, so a step takes the longer of the host's time and the device's."""
    return max(host, sum(times))


def implied_efficiency(work: Work, step_s: float, peak_flops: float, bytes_per_s: float, fill_s: float) -> float:
    """The fraction of ``peak_flops`` at which the kernels of ``work`` take ``step_s`` on the device (memory and
    fill time as given): the inverse of the device time, found by bisection. 1.0 when even the peak is too slow
    (the memory and fill time alone exceed ``step_s``) is not possible: then ValueError."""

    def device(e: float) -> float:
        return sum(kernel_times(work, Rates(peak_flops * e, bytes_per_s, fill_s)))

    lo, hi = 1e-6, 1.0
    if device(hi) > step_s:
        raise ValueError(f"the kernels' memory and fill time alone exceed {step_s * 1e3:.2f} ms at the peak")
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if device(mid) > step_s else (lo, mid)
    return hi
