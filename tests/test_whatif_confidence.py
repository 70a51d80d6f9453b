"""How sure a what-if is (profiler.whatif.confidence, docs/whatif.md "How sure a prediction is"): the base's spread,
the interval it gives each absolute prediction, the drift a re-measured base adds, and the speedups against that
base, all on injected numbers whose answers are worked by hand."""

from __future__ import annotations

import math
import statistics

import pytest

from profiler.whatif.confidence import (
    SHORT_STEPS,
    Confidence,
    add_confidence,
    drift,
    interval,
    spread_of,
    t975,
)
from profiler.whatif.model import Checked, Host, LoaderCost, MeasuredRun, Target, WhatIf, predict

MS = 1e-3
GIB = 1 << 30
HOST = Host(usable_cores=8, other_cores=0.0, overhead_s=0.0)


def _target(workers: int, device_s: float = 5 * MS) -> Target:
    return Target("sim:v100", "naive", workers, 8, device_s, 1 * MS, 0.0, GIB, 16 * GIB)


def _cost(ms: float, k: float = 1.0) -> LoaderCost:
    return LoaderCost(ms * MS * k, ms * MS * k, "hand-made")


def test_the_spread_is_the_larger_of_the_steps_and_the_blocks_standard_error() -> None:
    steady = [100.0, 102.0] * 5  # alternating: the steps spread, the blocks of two do not
    s = spread_of(steady)
    assert s.steps == 10 and s.blocks == 5 and s.mean_ms == pytest.approx(101.0)
    assert s.steps_se == pytest.approx(statistics.stdev(steady) / math.sqrt(10) / 101.0)
    assert s.blocks_se == pytest.approx(0.0, abs=1e-12)
    assert s.se == s.steps_se and s.t == pytest.approx(t975(9)) == pytest.approx(2.262)
    assert s.half_width == pytest.approx(2.262 * s.steps_se)
    assert s.seconds == pytest.approx(1.01)
    drifting = [100.0, 100.0, 110.0, 110.0, 120.0, 120.0, 130.0, 130.0, 140.0, 140.0]  # a run that slows down
    d = spread_of(drifting)
    means = [100.0, 110.0, 120.0, 130.0, 140.0]
    assert d.blocks_se == pytest.approx(statistics.stdev(means) / math.sqrt(5) / 120.0)
    assert d.blocks_se > d.steps_se and d.se == d.blocks_se
    assert d.t == pytest.approx(t975(4)) == pytest.approx(2.776)  # 5 blocks: 4 degrees of freedom
    assert d.half_width == pytest.approx(2.776 * d.blocks_se)


def test_a_short_base_says_so_and_a_long_one_does_not() -> None:
    short = spread_of([300.0] * 10)  # 10 steps, 3 s: the base
    assert short.short and short.half_width == 0.0
    long = spread_of([400.0] * SHORT_STEPS)  # 30 steps, 12 s
    assert not long.short
    conf = Confidence(short, 100.0, math.nan, ())
    assert any("ONE SHORT RUN (10 steps, 3.0 s)" in line and "--check re-measures it" in line for line in conf.lines)
    assert not any("SHORT" in line for line in Confidence(long, 100.0, math.nan, ()).lines)
    one = spread_of([5.0])
    assert one.steps == 1 and math.isinf(one.half_width)
    assert interval(lambda k: 10.0 / k, one.half_width) == (0.0, math.inf)  # nothing known: no bound


def test_the_drift_of_the_re_measured_base_widens_the_half_width() -> None:
    assert drift(199.6, 150.0) == pytest.approx(199.6 / 150.0 - 1)  # the case: 33% apart
    assert drift(150.0, 199.6) == drift(199.6, 150.0) and drift(100.0, math.nan) == 0.0
    spread = spread_of([100.0, 102.0] * 5)
    alone = Confidence(spread, 199.6, math.nan, ())
    again = Confidence(spread, 199.6, 150.0, ())
    assert alone.half_width == pytest.approx(spread.half_width)
    assert again.half_width == pytest.approx(spread.half_width + 199.6 / 150.0 - 1)
    assert any("33.1% apart" in line and "widened" in line for line in again.lines)


def test_a_loader_bound_prediction_s_interval_scales_with_the_base_and_a_device_bound_one_does_not() -> None:
    h = 0.25
    # loader-bound: 2 workers of 10 ms a sample at batch 8: 40 ms a step, 200 samples/s; its loader cost x 1.25
    # and / 1.25 give 160 and 250
    loader = interval(lambda k: predict(_cost(10, k), HOST, _target(2)).samples_per_s, h)
    assert loader == pytest.approx((200 / 1.25, 200 * 1.25))
    # device-bound: a 100 ms device step is the pace whether the loader takes 10 ms a sample or 12.5
    dev = interval(lambda k: predict(_cost(10, k), HOST, _target(2, device_s=100 * MS)).samples_per_s, h)
    assert dev == pytest.approx((80.0, 80.0))


def _run() -> MeasuredRun:
    return MeasuredRun("r", "naive", "sim", 8, 0, 10, 50.0, 160.0, 150.0, 0.0, 5.0, 5.0, 24, 50.0, math.nan, 0.0, 2)


def test_the_json_rows_carry_the_interval_and_both_errors() -> None:
    preds = tuple(predict(_cost(20), HOST, _target(w)) for w in (0, 2))  # 8 / (160 + 1) ms and 100 samples/s
    base_pred, two_pred = preds[0].samples_per_s, preds[1].samples_per_s
    assert two_pred == pytest.approx(100.0)
    # the base re-measured at 40 (a slow minute: its original run read 50), two workers at 84: every absolute
    # figure is high, the speedup right within 5%
    checked = (Checked(preds[0], 40.0, 1.0, "a", "complete"), Checked(preds[1], 84.0, 1.0, "b", "complete"))
    result = WhatIf("run", _run(), _cost(20), HOST, preds, checked=checked)
    spread = spread_of([160.0, 161.0] * 5)
    half = spread.half_width + 50.0 / 40.0 - 1
    spans = tuple((p.samples_per_s / (1 + half), p.samples_per_s * (1 + half)) for p in preds)
    conf = Confidence(spread, 50.0, 40.0, spans, base=0)
    assert conf.half_width == pytest.approx(half)
    out = result.to_dict()
    add_confidence(out, result, conf)
    rows = out["predictions"]
    assert isinstance(rows, list)
    base, two = rows
    assert base["base_configuration"] is True and two["base_configuration"] is False
    assert two["predicted_throughput_samples_per_s"] == pytest.approx(100.0)  # the contract's keys stay
    assert two["measured_throughput_samples_per_s"] == 84.0
    assert two["predicted_throughput_samples_per_s_low"] == pytest.approx(100.0 / (1 + half))
    assert two["predicted_throughput_samples_per_s_high"] == pytest.approx(100.0 * (1 + half))
    assert two["absolute_error"] == pytest.approx(100.0 / 84.0 - 1) == two["relative_error"]
    assert two["predicted_speedup_vs_base"] == pytest.approx(two_pred / base_pred)
    assert two["measured_speedup_vs_base"] == pytest.approx(84.0 / 40.0)
    assert two["speedup_error"] == pytest.approx((two_pred / base_pred) / (84.0 / 40.0) - 1)
    assert abs(two["speedup_error"]) < 0.05 < two["absolute_error"]  # drift cancels in the ratio
    assert two["measured_inside_interval"] is True
    assert base["speedup_error"] == pytest.approx(0.0) and base["absolute_error"] == pytest.approx(base_pred / 40 - 1)
    assert out["worst_speedup_error"] == pytest.approx(abs(two["speedup_error"]))
    assert out["worst_absolute_error"] == pytest.approx(max(abs(base_pred / 40 - 1), 100 / 84 - 1))
    confidence = out["confidence"]
    assert isinstance(confidence, dict)
    assert confidence["remeasured_base_throughput_samples_per_s"] == 40.0
    assert confidence["drift"] == pytest.approx(0.25) and confidence["half_width"] == pytest.approx(half)


def test_without_a_re_measured_base_there_is_no_speedup_but_still_an_interval() -> None:
    preds = (predict(_cost(20), HOST, _target(2)),)
    checked = (Checked(preds[0], 84.0, 1.0, "b", "complete"),)
    result = WhatIf("run", _run(), _cost(20), HOST, preds, checked=checked)
    conf = Confidence(spread_of([160.0] * 10), 50.0, math.nan, ((90.0, 110.0),), base=None)
    out = result.to_dict()
    add_confidence(out, result, conf)
    rows = out["predictions"]
    assert isinstance(rows, list)
    (row,) = rows
    assert row["predicted_speedup_vs_base"] is None and row["speedup_error"] is None
    assert row["measured_speedup_vs_base"] is None and out["worst_speedup_error"] is None
    assert row["predicted_throughput_samples_per_s_low"] == 90.0 and row["measured_inside_interval"] is False
    assert out["worst_absolute_error"] == pytest.approx(100 / 84 - 1)


def test_the_worker_gap_s_spread_widens_only_the_predictions_that_use_it() -> None:
    from profiler.whatif.confidence import gap_half_width
    from profiler.whatif.model import NO_GAP, LoaderGap, median_error

    gap = LoaderGap(
        1.2, "hand-made", rounds=(1.0, 1.2, 1.5), cores_scaling=0.8, cores_k=2, cores_rounds=(0.7, 0.8, 1.0)
    )
    assert median_error(gap.rounds) == pytest.approx(1.2533 * 1.4826 * 0.2 / math.sqrt(3) / 1.2)
    assert gap_half_width(gap, moved=False, workers=1) == 0.0  # loads where the base did, one worker
    assert gap_half_width(gap, moved=True, workers=1) == pytest.approx(1.96 * median_error(gap.rounds))
    assert gap_half_width(gap, moved=True, workers=2) == pytest.approx(
        1.96 * (median_error(gap.rounds) + median_error(gap.cores_rounds))
    )
    assert gap_half_width(NO_GAP, moved=True, workers=4) == 0.0  # not measured: nothing to add
    two = LoaderGap(1.2, "hand-made", rounds=(1.0, 1.2))
    assert math.isinf(gap_half_width(two, moved=True, workers=1))  # two rounds show no spread to trust
