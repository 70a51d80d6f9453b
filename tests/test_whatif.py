"""``stallscope whatif``: the prediction model on hand-made inputs (profiler.whatif is pure), the command's bad
input, and one end-to-end check against the known-cost scenario tests/data/scenarios/io_wait.py (its loader waits
20 ms per item: 0, 2 and 4 workers deliver 50, 100 and 200 samples/s at batch 8)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, stallscope

from profiler.cli import main
from profiler.whatif import (
    Checked,
    Host,
    LoaderCost,
    MeasuredRun,
    Target,
    WhatIfError,
    loader_cost,
    predict,
    worst_error,
)

MS = 1e-3
GIB = 1 << 30
HOST = Host(usable_cores=8, other_cores=0.0, overhead_s=0.0)


def target(pipeline: str = "naive", workers: int = 0, b: int = 8, **kw: float) -> Target:
    figures = {"device_s": 5 * MS, "launch_s": 1 * MS, "h2d_s": 2 * MS} | kw
    return Target(
        "sim:v100", pipeline, workers, b, figures["device_s"], figures["launch_s"], figures["h2d_s"], GIB, 16 * GIB
    )


def cost(c_ms: float, cpu_ms: float | None = None) -> LoaderCost:
    return LoaderCost(c_ms * MS, (c_ms if cpu_ms is None else cpu_ms) * MS, "hand-made")


def test_naive_without_workers_is_serial_load_then_the_blocking_copy_then_the_launch() -> None:
    p = predict(cost(10), HOST, target())
    # P = H + max(B c + o + K, D') = 2 + max(80 + 1, 5) ms
    assert p.step_ms == pytest.approx(83.0)
    assert p.samples_per_s == pytest.approx(8 / 0.083)
    assert p.binding == "loader"
    assert p.stall_fraction == pytest.approx(1 - 5 / 83)
    assert p.device_utilisation == pytest.approx(5 / 83)
    # an instant loader: 2 + max(1, 5) = 7 ms; 80 ms of loading needs ceil(80 / 7) = 12 workers
    assert p.workers_needed == 12
    assert p.cores_needed == 12


def test_naive_serial_device_longer_than_the_load_waits_for_the_device_in_the_copy() -> None:
    p = predict(cost(1), HOST, target(device_s=50 * MS))
    assert p.step_ms == pytest.approx(2 + 50)  # the copy waits for the previous step; the load hides under it
    assert p.binding == "device"
    assert p.stall_fraction == pytest.approx(1 - 50 / 52)


def test_workers_load_in_parallel_loader_bound() -> None:
    p = predict(cost(10), HOST, target(workers=2))
    assert p.step_ms == pytest.approx(40.0)  # B c / w = 80 / 2
    assert p.binding == "loader"
    assert predict(cost(10), HOST, target(workers=4)).samples_per_s == pytest.approx(2 * p.samples_per_s)


def test_workers_past_the_free_cores_do_not_help_a_cpu_bound_loader() -> None:
    host = Host(usable_cores=4, other_cores=2.0, overhead_s=0.0)  # 2 free cores
    two, eight = (predict(cost(10), host, target(workers=w)) for w in (2, 8))
    assert eight.step_ms == pytest.approx(two.step_ms) == pytest.approx(40.0)
    # a loader that waits (no CPU) is limited by its count, not the cores
    assert predict(cost(10, cpu_ms=0.1), host, target(workers=8)).step_ms == pytest.approx(10.0)


def test_device_bound() -> None:
    p = predict(cost(1), HOST, target(workers=4, device_s=30 * MS))
    assert p.step_ms == pytest.approx(2 + 30)  # P = H + max(o + K, D')
    assert p.binding == "device"
    assert p.device_utilisation == pytest.approx(30 / 32)
    assert p.workers_needed == 1


def test_launch_bound_and_host_link() -> None:
    launch = predict(cost(0.01), HOST, target(workers=4, device_s=1 * MS, launch_s=9 * MS))
    assert launch.binding == "launch"
    assert launch.step_ms == pytest.approx(2 + 9)
    link = predict(cost(0.01), HOST, target(workers=4, h2d_s=20 * MS))
    assert link.binding == "host link"
    assert link.step_ms == pytest.approx(20 + 5)


def test_prefetch_overlaps_the_copy_and_the_load_with_compute() -> None:
    # prefetch with 0 workers: its thread loads; P = max(B c, o + K, D', H)
    p = predict(cost(1), HOST, target("prefetch", device_s=20 * MS, h2d_s=10 * MS))
    assert p.step_ms == pytest.approx(20.0)
    assert p.stall_fraction == pytest.approx(0.0)
    naive = predict(cost(1), HOST, target("naive", device_s=20 * MS, h2d_s=10 * MS))
    assert naive.step_ms == pytest.approx(10 + 20)
    assert predict(cost(10), HOST, target("prefetch")).step_ms == pytest.approx(80.0)


def test_a_configuration_that_does_not_fit_is_oom() -> None:
    t = replace(target(), memory_bytes=17 * GIB)
    p = predict(cost(10), HOST, t)
    assert p.status == "OOM"
    assert math.isnan(p.samples_per_s)
    d = p.to_dict()
    assert d["status"] == "OOM"
    assert d["predicted_throughput_samples_per_s"] is None


def run(**kw: float | int | str) -> MeasuredRun:
    base = MeasuredRun(
        run_id="r", pipeline="naive", device_kind="sim", batch_size=8, workers=0, steps=10, throughput=50.0,
        step_ms=160.0, data_wait_ms=150.0, h2d_ms=1.0, compute_ms=1.0, other_ms=8.0, batch_bytes=800,
        main_cpu_pct=10.0, workers_cpu_pct=math.nan, other_processes_cpu_pct=0.0, usable_cores=4,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def test_loader_cost_from_a_zero_worker_run_is_the_data_wait_per_sample() -> None:
    c = loader_cost(run())
    assert c.wall_s == pytest.approx(150 * MS / 8)
    assert c.cpu_s == pytest.approx(0.10 * 0.160 / 8)  # the process's CPU per sample, under the wall time
    assert "data wait" in c.method
    assert run().bytes_per_sample == 100


def test_loader_cost_from_workers_loader_bound_is_the_delivery_rate() -> None:
    c = loader_cost(run(workers=2, throughput=100.0, data_wait_ms=70, step_ms=80, workers_cpu_pct=5.0))
    assert c.wall_s == pytest.approx(2 / 100)
    assert c.cpu_s == pytest.approx(0.05 / 100)
    assert "delivery rate" in c.method
    # the workers filled the free cores: the cores, not the count, set the rate
    full = loader_cost(run(workers=8, throughput=100.0, data_wait_ms=70, step_ms=80, workers_cpu_pct=390.0))
    assert full.wall_s == pytest.approx(4 / 100)


def test_loader_cost_from_workers_not_loader_bound_is_their_cpu_per_sample() -> None:
    c = loader_cost(run(workers=2, throughput=200.0, data_wait_ms=1, step_ms=40, workers_cpu_pct=60.0))
    assert c.wall_s == pytest.approx(0.6 / 200)
    assert "CPU seconds" in c.method


def test_a_run_without_measured_steps_cannot_be_used() -> None:
    with pytest.raises(WhatIfError, match="no measured steps"):
        loader_cost(run(steps=0, throughput=math.nan))


def test_worst_error_and_the_check_json_carry_both_throughputs() -> None:
    p = predict(cost(10), HOST, target(workers=2))
    checks = [Checked(p, 180.0, 0.9, "x", "complete"), Checked(p, 220.0, 0.9, "y", "complete")]
    assert worst_error(checks) == pytest.approx(max(abs(200 / 180 - 1), abs(200 / 220 - 1)))
    d = checks[0].to_dict()
    assert d["predicted_throughput_samples_per_s"] == pytest.approx(200.0)
    assert d["measured_throughput_samples_per_s"] == 180.0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["whatif", "tests/data/runs/cpu-workers", "--device", "cpu"], "simulated devices only"),
        (["whatif", "tests/data/runs/cpu-workers", "--workers", "-1"], "allowed a comma-separated list"),
        (["whatif", "tests/data/runs/cpu-workers", "--workers", "2,x"], "'x'"),
        (["whatif", "tests/data/runs/cpu-workers", "--batch-size", "0"], "out of range"),
        (["whatif", "tests/data/runs/cpu-workers", "--turbo"], "--turbo"),
        (["whatif", "no/such/run"], "no/such/run"),
        (["whatif", "tests/data/runs/cpu-workers"], "batch_bytes"),
        (["whatif", "tests/data/runs/cpu-workers", "--device", "sim:nope"], "unknown accelerator"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert needle in lines[0]


def test_a_run_with_no_measured_steps_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from profiler import Session

    with Session(tmp_path / "empty", sample_hz=1, device="cpu"):
        pass
    assert main(["whatif", str(tmp_path / "empty"), "--device", "sim:v100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "no measured steps" in err[0]


@pytest.mark.slow
def test_whatif_check_on_the_io_wait_scenario_is_within_15_percent(tmp_path: Path) -> None:
    scenario = str(ROOT / "tests/data/scenarios/io_wait.py")
    measured = tmp_path / "run"
    res = stallscope(
        "run", scenario, "--device", "sim:v100", "--steps", "24", "--warmup", "4", "--out", str(measured),
        "--no-live", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = stallscope("whatif", str(measured), "--workers", "0,2,4", "--check", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    rows = {r["workers"]: r for r in out["predictions"]}
    assert set(rows) == {0, 2, 4}
    for w, expected in ((0, 8 / 0.160), (2, 100.0), (4, 200.0)):
        r = rows[w]
        assert r["predicted_throughput_samples_per_s"] == pytest.approx(expected, rel=0.15), r
        assert abs(r["relative_error"]) <= 0.15, r
        assert r["binding"] == "loader"
        assert (measured / "whatif" / Path(r["check_run"]).name / "run.sqlite").exists()
    assert out["worst_relative_error"] <= 0.15
    assert (
        "delivery" in out["measured"]["loader_cost"]["method"]
        or "data wait" in out["measured"]["loader_cost"]["method"]
    )
