"""--price-per-hour: cost per 1,000 samples and per epoch at the measured throughput, against a known cost."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from profiler.analysis.summary import cost_figures
from tests.conftest import stallscope


def test_cost_figures_arithmetic() -> None:
    c = cost_figures(3.6, 200.0, 4096)
    assert c is not None
    # 3.6/h = 0.001/s; 200 samples/s -> 5e-6 per sample
    assert c.per_1k_samples == pytest.approx(0.005)
    assert c.per_epoch == pytest.approx(4096 * 5e-6)
    assert cost_figures(None, 200.0, 4096) is None
    no_epoch = cost_figures(1.0, 100.0, None)
    assert no_epoch is not None and math.isnan(no_epoch.per_epoch) and no_epoch.epoch_samples is None
    nan_cost = cost_figures(1.0, math.nan, 10)
    assert nan_cost is not None and math.isnan(nan_cost.per_1k_samples)


@pytest.mark.slow
def test_cost_is_quoted_from_the_measured_throughput(tmp_path: Path, tiny_scenario) -> None:
    # forward sleeps 50 ms per batch of 8, items are free: ~160 samples/s, so 3.6/hour costs ~0.00625 per 1k
    path = tiny_scenario(forward_sleep=0.05, steps=12)
    out = tmp_path / "run"
    r = stallscope("run", str(path), "--price-per-hour", "3.6", "--no-live", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    thr = s["throughput_samples_per_s"]
    assert 40 < thr <= 160 * 1.02  # the sleep is a floor on the step time; a busy 2-core host adds to it
    cost = s["cost"]
    assert cost["price_per_hour"] == 3.6 and cost["epoch_samples"] == 4096
    assert cost["per_1k_samples"] == pytest.approx(1000 * 0.001 / thr)
    # ground truth: the injected sleep sets the cheapest possible cost; overhead can only add to it
    assert 0.00625 * 0.98 <= cost["per_1k_samples"] < 0.00625 * 4
    assert cost["per_epoch"] == pytest.approx(4096 * 0.001 / thr)
    text = stallscope("report", str(out)).stdout
    assert "per 1,000 samples" in text and "at 3.6/hour" in text
