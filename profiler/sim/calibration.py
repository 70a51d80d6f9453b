"""The simulator's calibration: the points it is fitted on, the fit, and each point's error (docs/sim.md).

Pure: a point's kernels (each one's FLOPs and bytes, :mod:`profiler.sim.cost` counts them on the meta device) are
given by the caller, so this module imports no torch. The fit, in order:

1. **Fill time** per kernel: where one device and precision was measured device-bound at two batch sizes, the
   fill time at which both imply the same efficiency (a larger batch fills the device better; a fixed time per
   kernel is what makes a batch of 64 slower per image than one of 256). The median over such pairs.
2. **Efficiency** per device and precision: the median over that pair's device-bound points of the fraction of the
   FLOP peak at which the kernels take the measured step (memory at ``MEMORY_EFFICIENCY`` of the bandwidth, the
   fill time above). Per precision, the median over devices: the default for a device that has no point.
3. **Host**: ``framework + kernels x launch`` seconds per step, least squares in relative error over the
   launch-bound points (steps whose time is the host's: the device was idle between kernels).

Every figure is an estimate of a training step's time, fitted on throughput that NVIDIA published or that was
measured on a real GPU; :func:`errors` gives each point's error and, for a device without points, the error of
taking the other devices' median (leave one device out).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from profiler.sim.roofline import Rates, Work, host_s, implied_efficiency, kernel_times, step_period_s
from profiler.sim.specs import ACCELERATORS, MEMORY_EFFICIENCY, AcceleratorSpec

DEVICE, HOST = "device", "host"


@dataclass(frozen=True, slots=True)
class Point:
    """One measured training step: ``step_s`` seconds for ``batch_size`` samples of ``model`` on ``accelerator``
    at ``precision`` (the simulator's name: fp32 | tf32 | amp). ``bound``: "device" when the device ran the whole
    step (the published runs feed it; a step of one batch kept on the device), "host" when the host's launches set
    it (a launch-bound compute span: the device idled between kernels)."""

    model: str  # resnet50 | resnet18 (torchvision) | fashion-vgg (the scenario's model)
    accelerator: str
    precision: str
    batch_size: int
    step_s: float
    bound: str
    source: str
    date: str

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.step_s

    @property
    def label(self) -> str:
        return f"{self.accelerator} {self.model} {self.precision} b{self.batch_size}"


_DLE = (
    "NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 (eager PyTorch, DALI input), pytorch-21.03 NGC container, "
    "README 'Training performance results', 1-GPU row of the {table} table; batch size from configs.yml "
    "https://github.com/NVIDIA/DeepLearningExamples/tree/master/PyTorch/Classification/ConvNets/resnet50v1.5"
)
_V100 = _DLE.format(table="'NVIDIA DGX-1 16GB (8x V100 16GB)'")
_A100 = _DLE.format(table="'NVIDIA DGX A100 (8x A100 80GB)'")
_H100 = (
    "measured by stallscope on one NVIDIA H100 80GB HBM3 (16-core host, torch 2.11.0+cu130, eager PyTorch, "
    "SGD): {what} (docs/sim.md, 'Calibration')"
)
_H100_RN50 = _H100.format(what="ResNet-50 with one batch kept on the device (run --synthetic-input), {arith}")
_TF32 = "PyTorch's default arithmetic (cuDNN convolutions in TF32)"
_BF16 = "bf16 autocast and channels_last"
_SPAN = "the CUDA-event span of the compute phase per step, {how} (benchmarks/gpu_check.py, 10 steps)"
_DLE_DATE, _H100_DATE = "2021-03", "2026-11-27"

POINTS: tuple[Point, ...] = (
    Point("resnet50", "v100", "fp32", 112, 112 / 367.0, DEVICE, _V100, _DLE_DATE),
    Point("resnet50", "v100", "amp", 256, 256 / 1200.0, DEVICE, _V100, _DLE_DATE),
    Point("resnet50", "a100", "tf32", 256, 256 / 938.0, DEVICE, _A100, _DLE_DATE),
    Point("resnet50", "a100", "amp", 256, 256 / 2470.0, DEVICE, _A100, _DLE_DATE),
    Point("resnet50", "h100", "tf32", 64, 64 / 1716.0, DEVICE, _H100_RN50.format(arith=_TF32), _H100_DATE),
    Point("resnet50", "h100", "tf32", 256, 256 / 1862.0, DEVICE, _H100_RN50.format(arith=_TF32), _H100_DATE),
    Point("resnet50", "h100", "amp", 256, 256 / 4002.0, DEVICE, _H100_RN50.format(arith=_BF16), _H100_DATE),
    Point("resnet50", "h100", "amp", 64, 64 / 2556.0, HOST, _H100_RN50.format(arith=_BF16), _H100_DATE),
    Point(
        "resnet18", "h100", "tf32", 32, 13.7e-3, HOST,
        _H100.format(what=_SPAN.format(how="imagenet scenario, naive pipeline, 0 workers")), _H100_DATE,
    ),
    Point(
        "fashion-vgg", "h100", "tf32", 64, 10.3e-3, HOST,
        _H100.format(what=_SPAN.format(how="fashion-vgg scenario, naive pipeline, 0 workers")), _H100_DATE,
    ),
)  # fmt: skip

_H200 = (
    "measured by stallscope on one NVIDIA H200 (16-core host, torch 2.11.0+cu130, eager PyTorch, SGD): ResNet-50 "
    "with one batch kept on the device (run --synthetic-input), {arith}, the median step outside the kernel window "
    "(../shared/measured/h200-2026-11-28.md)"
)
_H200_DATE = "2026-11-28"
# Out of sample: not fitted, each predicted with the constants above (the H200 takes the H100's efficiency: its SMs
# and clocks, AcceleratorSpec.compute_of) and held within OUT_OF_SAMPLE_ERROR by tests/test_sim_calibration.py
HELD_OUT: tuple[Point, ...] = (
    Point("resnet50", "h200", "tf32", 64, 27.0e-3, DEVICE, _H200.format(arith=_TF32), _H200_DATE),
    Point("resnet50", "h200", "amp", 64, 25.1e-3, HOST, _H200.format(arith=_BF16), _H200_DATE),
    Point("resnet50", "h200", "amp", 256, 54.5e-3, DEVICE, _H200.format(arith=_BF16), _H200_DATE),
)
OUT_OF_SAMPLE_ERROR = 0.15

WorkOf = Callable[[Point], Work]  # a point's kernels, counted at its batch size and precision


@dataclass(frozen=True, slots=True)
class Fit:
    """The model's constants, unrounded."""

    fill_s: float
    device_efficiency: dict[tuple[str, str], float]
    efficiency: dict[str, float]  # per precision: the median over devices
    launch_s: float
    framework_s: float


def _bytes_per_s(spec: AcceleratorSpec) -> float:
    return spec.memory_gbps * 1e9 * MEMORY_EFFICIENCY


def _implied(p: Point, work: Work, fill_s: float, specs: Mapping[str, AcceleratorSpec]) -> float:
    spec = specs[p.accelerator]
    return implied_efficiency(work, p.step_s, spec.peak_tflops[p.precision] * 1e12, _bytes_per_s(spec), fill_s)


def fit_fill(points: Sequence[Point], work_of: WorkOf, specs: Mapping[str, AcceleratorSpec] = ACCELERATORS) -> float:
    """Step 1 (module docstring): 0 when no device and precision was measured device-bound at two batch sizes."""
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        if p.bound == DEVICE:
            groups.setdefault((p.accelerator, p.precision), []).append(p)
    fills = []
    for group in groups.values():
        small, large = min(group, key=lambda p: p.batch_size), max(group, key=lambda p: p.batch_size)
        if small.batch_size == large.batch_size:
            continue
        ws, wl = work_of(small), work_of(large)
        lo, hi = 0.0, min(small.step_s / len(ws), large.step_s / len(wl))
        for _ in range(60):  # the small batch's implied efficiency grows faster with the fill time than the large's
            mid = (lo + hi) / 2
            try:
                below = _implied(small, ws, mid, specs) < _implied(large, wl, mid, specs)
            except ValueError:  # the fill time alone exceeds a step: too long
                below = False
            lo, hi = (mid, hi) if below else (lo, mid)
        fills.append(lo)
    return statistics.median(fills) if fills else 0.0


def fit_host(points: Iterable[tuple[int, float]]) -> tuple[float, float]:
    """Step 3: (launch_s, framework_s) minimising the squared relative error of ``framework + kernels x launch``
    against each (kernels, step seconds); one point gives launch only, none gives (0, 0)."""
    pts = list(points)
    if not pts:
        return 0.0, 0.0
    if len({k for k, _ in pts}) < 2:
        return statistics.median(s / k for k, s in pts), 0.0
    # weighted least squares, weight 1/s^2: minimise sum((F + K L - s) / s)^2 over L and F
    w = [1.0 / (s * s) for _, s in pts]
    sw = sum(w)
    sk = sum(wi * k for wi, (k, _) in zip(w, pts, strict=True))
    ss = sum(wi * s for wi, (_, s) in zip(w, pts, strict=True))
    skk = sum(wi * k * k for wi, (k, _) in zip(w, pts, strict=True))
    sks = sum(wi * k * s for wi, (k, s) in zip(w, pts, strict=True))
    launch = (sw * sks - sk * ss) / (sw * skk - sk * sk)
    return launch, (ss - launch * sk) / sw


def calibrate(points: Sequence[Point], work_of: WorkOf, specs: Mapping[str, AcceleratorSpec] = ACCELERATORS) -> Fit:
    """The three steps of the module docstring."""
    fill = fit_fill(points, work_of, specs)
    implied: dict[tuple[str, str], list[float]] = {}
    for p in points:
        if p.bound == DEVICE:
            implied.setdefault((p.accelerator, p.precision), []).append(_implied(p, work_of(p), fill, specs))
    device = {k: statistics.median(v) for k, v in sorted(implied.items())}
    by_precision: dict[str, list[float]] = {}
    for (_, precision), e in device.items():
        by_precision.setdefault(precision, []).append(e)
    efficiency = {p: statistics.median(v) for p, v in sorted(by_precision.items())}
    launch, framework = fit_host((len(work_of(p)), p.step_s) for p in points if p.bound == HOST)
    return Fit(fill, device, efficiency, launch, framework)


@dataclass(frozen=True, slots=True)
class Checked:
    """One point beside the model's prediction of it."""

    point: Point
    device_s: float  # the kernels' time on the device
    host_s: float  # the host's time to launch them
    predicted_s: float  # the step: the longer of the two
    efficiency: float  # the efficiency used

    @property
    def error(self) -> float:
        """Predicted over measured throughput, less one."""
        return self.point.step_s / self.predicted_s - 1.0


def check(
    point: Point,
    work: Work,
    fit: Fit,
    *,
    efficiency: float | None = None,
    specs: Mapping[str, AcceleratorSpec] = ACCELERATORS,
) -> Checked:
    """The model's step for ``point`` with ``fit``'s constants (``efficiency`` in place of the device's own)."""
    spec = specs[point.accelerator]
    if efficiency is None:
        own = fit.device_efficiency.get((point.accelerator, point.precision))
        shared = fit.device_efficiency.get((spec.compute_of or point.accelerator, point.precision))
        efficiency = own if own is not None else shared if shared is not None else fit.efficiency[point.precision]
    rates = Rates(spec.peak_tflops[point.precision] * 1e12 * efficiency, _bytes_per_s(spec), fit.fill_s)
    times = kernel_times(work, rates)
    host = host_s(len(work), fit.launch_s, fit.framework_s)
    return Checked(point, sum(times), host, step_period_s(times, host), efficiency)


def leave_one_out(
    points: Sequence[Point], work_of: WorkOf, fit: Fit, specs: Mapping[str, AcceleratorSpec] = ACCELERATORS
) -> dict[str, float]:
    """Per precision, the largest error (in size, sign kept) on a device-bound point predicted with the median of the
    *other* devices' efficiencies: the error to expect on a device without points of its own (NaN: no other device
    was measured in that precision)."""
    errors: dict[str, list[float]] = {}
    for p in points:
        if p.bound != DEVICE:
            continue
        others = [e for (d, q), e in fit.device_efficiency.items() if q == p.precision and d != p.accelerator]
        if others:
            errors.setdefault(p.precision, []).append(
                check(p, work_of(p), fit, efficiency=statistics.median(others), specs=specs).error
            )
        else:
            errors.setdefault(p.precision, [])
    return {q: max(v, key=abs) if v else math.nan for q, v in errors.items()}
