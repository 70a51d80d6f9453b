"""``run --headspace``: the loader iterated alone before training, against the data set's own stage times over the
same window (the truth), and what the headline says in each case.

tests/data/scenarios/stage_costs.py: 2 workers whose items sleep 12 ms in their stages (timed by the items
themselves through pipelines.stages), a 4 ms model: the loader cannot keep up, alone or not. knee.py: a data set that
costs nothing and a model of 200 ms passes: the loader alone has far more than the training takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import ROOT, stallscope
from test_cli import assert_one_line_error

from profiler.analysis.stages import headspace, per_item
from profiler.core.store import load_run

SCENARIOS = ROOT / "tests" / "data" / "scenarios"


def run(out: Path, scenario: str, *args: str) -> dict[str, Any]:
    res = stallscope(
        "run", str(SCENARIOS / scenario), "--headspace", "--no-live", "--no-attribution", "--json", "--out", str(out),
        *args,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_the_loader_alone_runs_at_its_items_own_time(tmp_path: Path) -> None:
    summary = run(tmp_path / "run", "stage_costs.py", "--workers", "2")
    rec = load_run(tmp_path / "run")
    alone = rec.meta["loader_alone"]
    # the truth: the items' own stage times over the same window (the run's timeline), 2 workers side by side
    times = per_item(rec.samples, (alone["t0"], alone["t1"]))
    assert {"fetch", "decode", "augment"} <= times.keys(), times
    truth = 2 / sum(times.values())
    h = summary["headspace"]
    # the loader's work outside the stages (moving each batch between processes) only lowers the rate: 2.5% below
    # beside a CI run here, 7% at most in tests/test_stages_truth.py's runs of the same items
    assert 0.85 * truth <= h["alone_samples_per_s"] <= 1.03 * truth, (h, truth)
    assert h["batches"] == 40 or h["seconds"] >= 3.0, h  # the window: 40 batches or 3 s
    assert h["headspace"] < 1 and "cannot keep up even alone" in h["headline"], h
    assert h["headspace"] == h["alone_samples_per_s"] / h["demand_samples_per_s"]
    text = " ".join(stallscope("report", str(tmp_path / "run")).stdout.replace("│", " ").split())
    assert "Headspace: The loader alone delivered" in text and "headspace x0." in text, text


def test_a_loader_far_faster_than_the_training_is_not_the_limit(tmp_path: Path) -> None:
    h = run(tmp_path / "run", "knee.py", "--steps", "4", "--warmup", "1")["headspace"]
    # batch 8 in 200 ms passes: the training takes 40 samples/s; a data set that costs nothing gives thousands
    assert h["demand_samples_per_s"] < 45 and h["headspace"] > 10, h
    assert "the loader is not the limit" in h["headline"], h


def test_the_headline_tells_a_loader_that_slows_beside_the_training() -> None:
    short = headspace({"samples_per_s": 100.0, "batches": 40}, batch_size=4, step_ms=10, data_wait_ms=2, throughput=90)
    assert short is not None and short.demand_samples_per_s == 500 and short.headspace == 0.2
    assert "cannot keep up even alone" in short.headline
    # alone it has x2 the demand, beside the training it delivered 300 of 500: they compete
    slowed = headspace({"samples_per_s": 1000.0, "batches": 40}, batch_size=4, step_ms=10, data_wait_ms=2,
                       throughput=300)  # fmt: skip
    assert slowed is not None and "slows down when the training runs beside it" in slowed.headline
    fine = headspace({"samples_per_s": 1000.0, "batches": 40}, batch_size=4, step_ms=10, data_wait_ms=2, throughput=480)
    assert fine is not None and "the loader is not the limit" in fine.headline
    assert headspace(None, batch_size=4, step_ms=10, data_wait_ms=2, throughput=1) is None
    assert headspace({"samples_per_s": None}, batch_size=4, step_ms=10, data_wait_ms=2, throughput=1) is None


def test_headspace_with_no_training_to_set_it_beside_is_one_line_and_exit_2() -> None:
    res = stallscope("run", "fashion-vgg", "--headspace", "--loader-only", "--no-live")
    assert_one_line_error(res, "--headspace", "--loader-only")
