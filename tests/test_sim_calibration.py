"""The launch-aware device model and its calibration (docs/sim.md, "The device model" and "Calibration").

Ground truth: kernel lists of known FLOPs and bytes; synthetic points made by a model of known constants, which the
fit must give back; the meta device's count of a layer whose FLOPs and bytes are worked by hand; and the measured and
published points themselves, each within the error docs/sim.md states for it.
"""

from __future__ import annotations

import functools
import math

import pytest

from profiler.sim import calibration, specs
from profiler.sim.calibration import DEVICE, HOST, POINTS, Fit, Point, calibrate, check, fit_host, leave_one_out
from profiler.sim.roofline import Rates, implied_efficiency, kernel_times, lead_s, step_period_s
from profiler.sim.specs import ACCELERATORS, AcceleratorSpec

# -- the roofline ---------------------------------------------------------------------------------------------------


def test_a_kernel_takes_its_flops_or_its_bytes_whichever_is_longer_plus_the_fill() -> None:
    rates = Rates(flops_per_s=1e12, bytes_per_s=1e11, fill_s=2e-6)
    times = kernel_times([(1e9, 1e6), (0.0, 1e8), (1e6, 1e6)], rates)
    # 1 ms of arithmetic over 10 us of memory; 1 ms of memory; 1 us of arithmetic beside 10 us of memory
    assert times == pytest.approx((1e-3 + 2e-6, 1e-3 + 2e-6, 1e-5 + 2e-6))
    # a cost built by hand (no kernels listed): its FLOPs shared by its kernels at the FLOP rate alone
    assert kernel_times((), rates, flops=4e9, kernels=4) == pytest.approx((1e-3,) * 4)


def test_no_kernel_starts_before_it_is_launched() -> None:
    assert lead_s([1.0, 1.0, 1.0], 0.0) == pytest.approx(3.0)  # no launch time: the kernels' sum
    assert lead_s([1.0, 1.0, 1.0], 0.1) == pytest.approx(3.1)  # device-bound: the first launch, then back to back
    assert lead_s([0.1, 0.1, 0.1], 1.0) == pytest.approx(3.1)  # launch-bound: the last launch and its kernel
    assert lead_s([0.1, 2.0, 0.1], 1.0) == pytest.approx(2.0 + 2.1)  # the long kernel launched second sets it
    assert step_period_s([0.1, 0.1], 5.0) == 5.0 and step_period_s([3.0, 3.0], 5.0) == 6.0


def test_implied_efficiency_inverts_the_device_time() -> None:
    work = [(2e9, 1e6), (0.0, 4e8), (5e8, 1e3)]
    rates = Rates(1e12 * 0.37, 2e11, 3e-6)
    step = sum(kernel_times(work, rates))
    assert implied_efficiency(work, step, 1e12, 2e11, 3e-6) == pytest.approx(0.37, rel=1e-9)
    with pytest.raises(ValueError, match="memory and fill time alone"):
        implied_efficiency(work, 1e-3, 1e12, 2e11, 3e-6)  # the 2 ms of memory alone exceed 1 ms


# -- the fit, on points a known model made ---------------------------------------------------------------------------

_SPEC = AcceleratorSpec("x1", "Test X1", {"fp32": 10.0, "amp": 80.0}, 16.0, 10.0, 5.0, 300.0, 50.0, memory_gbps=500.0)
_SPEC2 = AcceleratorSpec("x2", "Test X2", {"fp32": 20.0, "amp": 200.0}, 16.0, 10.0, 5.0, 300.0, 50.0, memory_gbps=900.0)
_SPECS = {"x1": _SPEC, "x2": _SPEC2}
_TRUE = Fit(
    fill_s=6e-6,
    device_efficiency={("x1", "fp32"): 0.7, ("x1", "amp"): 0.3, ("x2", "amp"): 0.5},
    efficiency={"fp32": 0.7, "amp": 0.4},
    launch_s=25e-6,
    framework_s=3e-3,
)


def _work(batch: int, kernels: int = 200) -> list[tuple[float, float]]:
    """A model whose FLOPs and bytes grow with the batch: a third of its kernels compute, the rest stream memory."""
    return [(batch * 4e8, batch * 1e5) if i % 3 == 0 else (0.0, batch * 6e5) for i in range(kernels)]


# two small models whose kernels are tiny: their steps are the host's
_WORK = {
    ("m", 32): _work(32),
    ("m", 256): _work(256),
    ("small", 8): [(1e6, 1e4)] * 60,
    ("small", 4): [(1e6, 1e4)] * 120,
}


def _point(accel: str, precision: str, batch: int, bound: str, model: str = "m") -> Point:
    made = Point(model, accel, precision, batch, 1.0, bound, "synthetic", "today")
    truth = check(made, _WORK[(model, batch)], _TRUE, specs=_SPECS)
    return Point(model, accel, precision, batch, truth.predicted_s, bound, "synthetic", "today")


def test_calibrate_gives_back_the_constants_that_made_the_points() -> None:
    points = [
        _point("x1", "fp32", 32, DEVICE),
        _point("x1", "fp32", 256, DEVICE),
        _point("x1", "amp", 256, DEVICE),
        _point("x2", "amp", 256, DEVICE),
        _point("x1", "fp32", 8, HOST, "small"),
        _point("x1", "fp32", 4, HOST, "small"),
    ]
    for p in points[4:]:  # the host points are launch-bound: the host's time is the step
        work = _WORK[(p.model, p.batch_size)]
        assert p.step_s == pytest.approx(_TRUE.framework_s + len(work) * _TRUE.launch_s)
    fit = calibrate(points, lambda p: _WORK[(p.model, p.batch_size)], _SPECS)
    assert fit.fill_s == pytest.approx(_TRUE.fill_s, rel=1e-6)
    assert fit.device_efficiency == pytest.approx(_TRUE.device_efficiency, rel=1e-6)
    assert fit.efficiency == pytest.approx(_TRUE.efficiency, rel=1e-6)  # amp: the median of 0.3 and 0.5
    assert fit.launch_s == pytest.approx(_TRUE.launch_s, rel=1e-6)
    assert fit.framework_s == pytest.approx(_TRUE.framework_s, rel=1e-6)
    # each amp point predicted with the other device's efficiency: x1 (0.3) with x2's 0.5 too fast, x2 with 0.3
    # too slow; the stated error is the larger of the two, sign kept
    loo = leave_one_out(points, lambda p: _WORK[(p.model, p.batch_size)], fit, _SPECS)
    x1 = check(points[2], _WORK[("m", 256)], fit, efficiency=fit.device_efficiency[("x2", "amp")], specs=_SPECS)
    x2 = check(points[3], _WORK[("m", 256)], fit, efficiency=fit.device_efficiency[("x1", "amp")], specs=_SPECS)
    assert x1.error > 0.1 and x2.error < -0.1
    assert loo["amp"] == pytest.approx(max(x1.error, x2.error, key=abs))
    assert math.isnan(loo["fp32"])  # no other device measured fp32


def test_fit_host_is_the_least_squares_line_in_relative_error() -> None:
    assert fit_host([(100, 5e-3), (300, 11e-3)]) == pytest.approx((30e-6, 2e-3))
    launch, framework = fit_host([(100, 5e-3), (300, 11e-3), (200, 9e-3)])
    assert 30e-6 < launch < 40e-6 and 1e-3 < framework < 3e-3  # the third point, 1 ms above the line, pulls it
    assert fit_host([(100, 5e-3)]) == pytest.approx((50e-6, 0.0)) and fit_host([]) == (0.0, 0.0)


# -- the meta device's count, kernel by kernel ----------------------------------------------------------------------


def test_each_kernel_carries_its_flops_and_the_bytes_it_reads_and_writes() -> None:
    import torch

    from profiler.sim.cost import measure_step

    def model() -> torch.nn.Module:
        return torch.nn.Linear(4, 3, bias=False)

    sample = (torch.zeros(4), torch.zeros(3))
    fp32 = measure_step(model, sample, 2, precision="fp32", loss=torch.nn.functional.mse_loss)
    # the forward's matmul: [2, 4] x [4, 3], 2 x 2 x 4 x 3 FLOPs, reading 8 + 12 floats and writing 6
    assert (48.0, (8 + 12 + 6) * 4.0) in fp32.work
    # and the backward's one matmul, the weight's gradient (the input needs none)
    assert sum(f for f, _ in fp32.work) == fp32.flops == 2 * 48
    assert fp32.kernels == len(fp32.work) and fp32.bytes_moved == sum(b for _, b in fp32.work)
    amp = measure_step(model, sample, 2, precision="amp", loss=torch.nn.functional.mse_loss)
    assert (48.0, (8 + 12 + 6) * 2.0) in amp.work  # the matmul in half precision
    # one weight of 12 elements: its cast to half (read 4, write 2 bytes each) and its gradient's back
    assert amp.kernels == fp32.kernels + 2 and amp.work[-2:] == ((0.0, 72.0), (0.0, 72.0))
    opt32 = [w for w in fp32.work if w[0] == 0.0][-3:]  # the optimizer's foreach kernels keep fp32
    assert all(w in amp.work for w in opt32)


def test_throughput_grows_with_the_batch_then_flattens_and_small_batches_are_launch_bound() -> None:
    import torch

    from profiler.sim.cost import measure_step
    from profiler.sim.device import SimDevice
    from scenarios import imagenet

    dev = SimDevice(specs.parse("sim:h100"))
    rates = {}
    for batch in (4, 32, 256, 1024):
        cost = measure_step(imagenet.resnet18, (torch.zeros(3, 224, 224), 0), batch, loss=imagenet.cross_entropy)
        period = step_period_s(dev.kernel_times(cost), dev.launch_total_s(cost))
        rates[batch] = batch / period
        if batch == 4:
            assert dev.launch_total_s(cost) > dev.step_s(cost)  # the host's launches set a small batch's pace
    assert rates[4] < rates[32] < rates[256] < rates[1024]
    # 8x the batch: near 8x the rate while the launches set the pace, then less, then little (the fill time shrinks
    # to nothing beside the kernels)
    assert rates[32] / rates[4] > 4 and rates[256] / rates[32] < 4 and rates[1024] / rates[256] < 1.3


# -- the measured and published points ------------------------------------------------------------------------------


@functools.cache
def _point_work(point: Point) -> tuple[tuple[float, float], ...]:
    from profiler.sim.calwork import point_work

    return tuple(point_work(point))


def _rounded() -> Fit:
    return Fit(
        specs.KERNEL_FILL_S, specs.DEVICE_EFFICIENCY, specs.EFFICIENCY, specs.LAUNCH_S, specs.FRAMEWORK_S
    )  # fmt: skip


@pytest.mark.slow
def test_the_constants_are_the_calibration_to_two_significant_digits() -> None:
    fit = calibrate(POINTS, _point_work)

    def two(x: float) -> float:
        return float(f"{x:.2g}")

    assert {k: two(v) for k, v in fit.device_efficiency.items()} == specs.DEVICE_EFFICIENCY
    assert {k: two(v) for k, v in fit.efficiency.items()} == specs.EFFICIENCY
    assert two(fit.fill_s) == specs.KERNEL_FILL_S
    assert two(fit.launch_s) == specs.LAUNCH_S and two(fit.framework_s) == specs.FRAMEWORK_S


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.label.replace(" ", "-"))
def test_each_point_within_the_error_docs_state_and_the_device_runs_it_so(point: Point) -> None:
    """docs/sim.md's calibration table: every point within 6% with the rounded constants (the fit itself is exact on
    the device-bound points; rounding and the host line leave the rest); and the simulated device, stepping the
    point's kernels in a loop that does nothing else, takes the step the model predicts."""
    from profiler.sim.cost import StepCost
    from profiler.sim.device import SimDevice

    work = _point_work(point)
    checked = check(point, work, _rounded())
    assert abs(checked.error) <= 0.06, (checked.error, point.label)
    assert (checked.host_s >= checked.device_s) == (point.bound == HOST), point.label  # the bound it was taken for

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

        def sleep(self, s: float) -> None:
            self.t += max(s, 0.0)

    clock = Clock()
    dev = SimDevice(specs.parse(f"sim:{point.accelerator},precision={point.precision}"), clock=clock, sleep=clock.sleep)
    flops = sum(f for f, _ in work)
    dev.load(StepCost(point.batch_size, flops, len(work), 0, 0, 0, 0, point.precision, work))
    for _ in range(3):
        dev.step()
    dev.synchronize()
    t0 = clock()
    for _ in range(20):
        dev.step()
    dev.synchronize()
    period = (clock() - t0) / 20
    assert period == pytest.approx(checked.predicted_s, rel=0.02), (period, checked.predicted_s)


def test_every_point_names_a_known_device_and_precision_and_its_source() -> None:
    for p in POINTS:
        assert p.precision in ACCELERATORS[p.accelerator].peak_tflops, p.label
        assert p.bound in (DEVICE, HOST) and p.step_s > 0 and p.date and p.source.strip()
    assert {p.accelerator for p in POINTS} == {"v100", "a100", "h100"}
    assert calibration.POINTS[0].samples_per_s == pytest.approx(367.0)


@pytest.mark.parametrize("point", calibration.HELD_OUT, ids=lambda p: p.label.replace(" ", "-"))
def test_the_h200s_real_rows_out_of_sample_within_15_percent(point: Point) -> None:
    """issue #65: measured on an H200 after the fit and not fitted on. Its twin predicts each as a run does (the
    rounded constants; the H100's efficiency, whose SMs and clocks it has); bf16 at batch 256 had come out 32%
    fast with the median efficiency, and the default arithmetic at 64 -9% without the convolutions' transposes."""
    assert point not in POINTS and point.accelerator == "h200"
    checked = check(point, _point_work(point), _rounded())
    assert checked.efficiency == specs.default_efficiency("h200", point.precision)
    assert abs(checked.error) <= calibration.OUT_OF_SAMPLE_ERROR, (checked.error, point.label)
    assert (checked.host_s >= checked.device_s) == (point.bound == HOST), point.label
    # the same point with the median of the calibrated devices (what a device without points takes) misses the bf16
    # batch of 256 by more than 15%: the test can fail
    if point.precision == "amp" and point.batch_size == 256:
        median = check(point, _point_work(point), _rounded(), efficiency=specs.EFFICIENCY["amp"])
        assert median.error > calibration.OUT_OF_SAMPLE_ERROR, median.error


def test_tf32_convolutions_add_their_layout_transposes_and_amp_does_not() -> None:
    """One convolution, its bytes worked by hand: in tf32 each of its 4-d channels-first tensors is read and written
    once more (cuDNN's NHWC tensor-core kernels); fp32 and amp count none."""
    import torch

    from profiler.sim.cost import measure_step

    def model() -> torch.nn.Module:
        return torch.nn.Conv2d(2, 3, 3, padding=1, bias=False)

    sample = (torch.zeros(2, 4, 4), torch.zeros(3, 4, 4))
    fp32 = measure_step(model, sample, 1, precision="fp32", loss=torch.nn.functional.mse_loss)
    tf32 = measure_step(model, sample, 1, precision="tf32", loss=torch.nn.functional.mse_loss)
    amp = measure_step(model, sample, 1, precision="amp", loss=torch.nn.functional.mse_loss)
    x, w, y = 2 * 16 * 4, 3 * 2 * 9 * 4, 3 * 16 * 4  # input [1,2,4,4], weight [3,2,3,3], output [1,3,4,4], fp32
    forward = 2.0 * (x + w + y)
    backward = 2.0 * (y + x + w + w)  # grad_output, input, weight; grad_weight (the input needs no gradient)
    extra = [b for b in tf32.work if b not in fp32.work]
    assert (0.0, forward) in tf32.work and (0.0, backward) in tf32.work, extra
    assert tf32.kernels == fp32.kernels + 2 and tf32.flops == fp32.flops
    assert amp.kernels == fp32.kernels + 2  # its two casts of the weight, no transposes
    assert all(b not in (forward, backward) for _, b in amp.work)
