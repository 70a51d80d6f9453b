"""``stallscope whatif``: the prediction model on hand-made inputs (profiler.whatif.model is pure), the command's bad
input, and one end-to-end check against the known-cost scenario tests/data/scenarios/io_wait.py (its loader waits
20 ms per item: 0, 2 and 4 workers deliver 50, 100 and 200 samples/s at batch 8)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, stallscope

from profiler.analysis.apart import measured_steps
from profiler.cli import main
from profiler.core.store import load_run
from profiler.whatif.model import (
    MAIN,
    NO_GAP,
    WORKER,
    Checked,
    Host,
    LoaderCost,
    LoaderGap,
    MeasuredRun,
    Target,
    WhatIf,
    WhatIfError,
    gap_from_rounds,
    host_of,
    loader_cost,
    loader_place,
    on_host,
    predict,
    with_cores,
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


def test_repeated_checks_measure_the_median_and_keep_every_run() -> None:
    p = predict(cost(10), HOST, target(workers=2))  # 200 samples/s predicted
    c = Checked.of_runs(p, [150.0, 210.0, 190.0], [0.9, 0.8, 0.7], "x", "complete")
    assert c.measured_samples_per_s == 190.0  # the median, not the mean (183.3) nor the first
    assert c.measured_stall_fraction == pytest.approx(0.8)
    assert c.spread == (150.0, 210.0)
    assert c.error == pytest.approx(200 / 190 - 1)
    d = c.to_dict()
    assert d["measured_runs"] == [150.0, 210.0, 190.0]
    assert d["measured_spread"] == [150.0, 210.0]
    assert d["measured_throughput_samples_per_s"] == 190.0
    even = Checked.of_runs(p, [100.0, 300.0], [0.5, 0.7], "x", "complete")
    assert even.measured_samples_per_s == 200.0
    assert even.error == pytest.approx(0.0)
    one = Checked(p, 180.0, 0.9, "x", "complete")  # a single run, as before --repeat
    assert one.spread == (180.0, 180.0)
    assert one.to_dict()["measured_runs"] == [180.0]
    with pytest.raises(ValueError, match="one throughput"):
        Checked.of_runs(p, [], [], "x", "complete")


def test_the_gap_is_the_ratio_of_the_medians_of_the_rounds() -> None:
    g = gap_from_rounds([0.010, 0.011, 0.030], [0.012, 0.013, 0.012], samples=96)
    assert g.factor == pytest.approx(0.012 / 0.011)  # the 30 ms round (a burst) does not set it
    assert g.rounds == pytest.approx((1.2, 13 / 11, 0.4))
    assert g.samples == 96
    assert "measured" in g.source
    with pytest.raises(ValueError, match="one positive"):
        gap_from_rounds([0.01], [], samples=1)


def test_where_each_configuration_loads() -> None:
    assert loader_place("naive", 0) == MAIN
    assert loader_place("prefetch", 0) == MAIN  # its thread runs in the training process
    assert loader_place("naive", 2) == WORKER
    assert loader_place("prefetch", 1) == WORKER
    assert loader_place("dali", 4) == MAIN  # DALI's threads, not worker processes


def test_the_gap_applies_only_where_the_loading_moves() -> None:
    gap = LoaderGap(1.25, "injected")
    # measured in the main process (a 0-worker run), c = 10 ms: workers pay 12.5 ms
    same = predict(cost(10), HOST, target(workers=0), gap, MAIN)
    assert same.step_ms == pytest.approx(83.0)  # no crossing: as without the gap
    assert same.loader_scale == 1.0
    moved = predict(cost(10), HOST, target(workers=2), gap, MAIN)
    assert moved.step_ms == pytest.approx(8 * 12.5 / 2)
    assert moved.loader_scale == 1.25
    assert moved.to_dict()["loader_cost_scale"] == 1.25
    # the cores' limit scales too: a worker's CPU per sample is what the cores have to supply
    host = Host(usable_cores=2, other_cores=1.0, overhead_s=0.0)
    assert predict(cost(10), host, target(workers=4), gap, MAIN).step_ms == pytest.approx(8 * 12.5)
    # measured in workers, predicted for the main process: divided
    back = predict(cost(12.5), HOST, target(workers=0), gap, WORKER)
    assert back.step_ms == pytest.approx(2 + 8 * 10 + 1)
    assert predict(cost(12.5), HOST, target(workers=1), gap, WORKER).step_ms == pytest.approx(100.0)
    # dali's threads keep the run's cost; without a measured gap nothing changes
    assert predict(cost(10), HOST, target("dali", workers=2), gap, MAIN).loader_scale == 1.0
    assert predict(cost(10), HOST, target(workers=2), NO_GAP, MAIN).step_ms == pytest.approx(40.0)


def test_the_header_says_where_the_gap_came_from_and_its_value() -> None:
    gap = gap_from_rounds([0.010, 0.010, 0.010], [0.012, 0.012, 0.013], samples=192)
    m = run()
    w = WhatIf("runs/x", m, loader_cost(m), HOST, (predict(cost(10), HOST, target(workers=2), gap, MAIN),), gap=gap)
    assert "x1.2 MEASURED" in w.gap_line
    assert "10 ms/sample in the main process, 12 in one worker" in w.gap_line
    assert "loaded in the main process" in w.header
    d = w.to_dict()
    assert d["worker_gap"]["factor"] == pytest.approx(1.2)
    assert d["worker_gap"]["samples"] == 192
    assert d["measured"]["loaded_in"] == MAIN
    assert not gap.unsteady
    assert "UNSTEADY" not in w.gap_line
    busy = replace(w, gap=gap_from_rounds([0.010, 0.010, 0.010], [0.012, 0.004, 0.013], samples=192))
    assert busy.gap.unsteady
    assert "UNSTEADY" in busy.gap_line
    assert busy.to_dict()["worker_gap"]["unsteady"] is True
    bare = replace(w, gap=NO_GAP)
    assert "x1 (not measured" in bare.gap_line


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
        (["whatif", "tests/data/runs/cpu-workers", "--repeat", "3"], "add --check"),
        (["whatif", "tests/data/runs/cpu-workers", "--steps", "30"], "add --check"),
        (["whatif", "tests/data/runs/cpu-workers", "--check", "--repeat", "0"], "out of range"),
        (["whatif", "tests/data/runs/cpu-workers", "--check", "--warmup", "x"], "'x'"),
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


# alone (tests/scheduling.py): the prediction holds the host's load of the run measured just before, and its check
# must run beside the same load. Its items sleep (0.10-0.12 of a core), and it ran light, beside other tests, until
# the simulated host's launches became 8 ms a step (docs/sim.md): then stress runs 57 and 58 read a 4-worker check
# 17.8% off beside three other tests and two busy processes, where beside the two busy processes alone three tries
# read within 3.7%
@pytest.mark.alone
@pytest.mark.slow
def test_whatif_check_on_the_io_wait_scenario_is_within_15_percent(tmp_path: Path) -> None:
    # issue #56: from a 10-step base run on a simulated device (imagenet, sim:v100, 0 workers, 2 warm-up) the
    # check was 38-67% off, and the base measured 79-94 samples/s where the check's re-run of the same
    # configuration measured 133-147: the first run was slow. The base here is such a run, made twice
    scenario = str(ROOT / "tests/data/scenarios/io_wait.py")
    measured, again_run = tmp_path / "run", tmp_path / "again"
    for out in (measured, again_run):
        res = stallscope(
            "run", scenario, "--device", "sim:v100", "--steps", "10", "--warmup", "2", "--out", str(out),
            "--no-live", "--json",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    _first_run_as_the_second(measured, again_run)
    # the check's runs are longer than the base (a window of whole delivery bursts: io_wait.py), so that the
    # check measures as closely as it did with a 24-step base
    res = stallscope(
        "whatif", str(measured), "--workers", "0,2,4", "--check", "--steps", "24", "--warmup", "4", "--json"
    )
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
    # issue #65: the base's own configuration (w0) is the re-measured base; each row's error twice, absolute and as
    # a speedup against it, and an interval around each absolute figure that holds the prediction
    assert [r["base_configuration"] for r in out["predictions"]].count(True) == 1 and rows[0]["base_configuration"]
    conf = out["confidence"]
    assert conf["remeasured_base_throughput_samples_per_s"] == rows[0]["measured_throughput_samples_per_s"]
    assert conf["spread"]["steps"] == 10 and conf["spread"]["short_run"]
    assert any("ONE SHORT RUN (10 steps" in line for line in conf["lines"])
    for r in rows.values():
        low, high = r["predicted_throughput_samples_per_s_low"], r["predicted_throughput_samples_per_s_high"]
        assert low < r["predicted_throughput_samples_per_s"] < high, r
        assert r["absolute_error"] == r["relative_error"]
        assert abs(r["absolute_error"]) <= 0.15 or r["measured_inside_interval"], r
        base = rows[0]
        assert r["predicted_speedup_vs_base"] == pytest.approx(
            r["predicted_throughput_samples_per_s"] / base["predicted_throughput_samples_per_s"]
        )
        assert r["measured_speedup_vs_base"] == pytest.approx(
            r["measured_throughput_samples_per_s"] / base["measured_throughput_samples_per_s"]
        )
        assert abs(r["speedup_error"]) <= 0.15, r
    assert out["worst_speedup_error"] == max(abs(r["speedup_error"]) for r in rows.values())
    assert (
        "delivery" in out["measured"]["loader_cost"]["method"]
        or "data wait" in out["measured"]["loader_cost"]["method"]
    )
    # asked again about the same run: the calibration just made is reused, and said to be
    again = stallscope("whatif", str(measured), "--workers", "0,2,4", "--json")
    assert again.returncode == 0 and "is reused" in again.stderr, again.stderr
    gap, kept = out["worker_gap"], json.loads(again.stdout)["worker_gap"]
    assert kept["factor"] == gap["factor"] and kept["samples"] == gap["samples"] and "reused" in kept["source"]


def _first_run_as_the_second(first: Path, second: Path) -> None:
    """Two identical runs, the first in a fresh process as the second: their mean measured steps within 4 standard
    errors of the difference, or 1%. Measured beside two busy processes (4 pairs of 10-step io_wait runs): 0.2-0.6
    standard errors, 0.09-0.23%; quiet (2 pairs, each step's spread 0.05 ms) 2.9-3.1 standard errors, 0.12-0.13%:
    between two runs the sleeps' wake-ups differ by more than within one."""
    means = []
    for run in (first, second):
        steps = [(s.t_end - s.t_start) * 1e3 for s in measured_steps(load_run(run))]
        assert len(steps) == 10, len(steps)
        means.append((statistics.fmean(steps), statistics.stdev(steps) / math.sqrt(len(steps))))
    (m1, se1), (m2, se2) = means
    assert abs(m1 - m2) <= max(4 * math.hypot(se1, se2), 0.01 * m2), means


def test_a_kept_calibration_is_reused_only_for_the_same_key_and_while_fresh(tmp_path: Path) -> None:
    import time as clock

    from profiler.whatif.source import GAP_REUSE_S, kept_gap

    path = tmp_path / "loader-gap.json"
    gap = gap_from_rounds([0.010] * 3, [0.012] * 3, samples=96)
    key = {"host": "h", "batch_size": 8, "threads": 2, "usable_cores": 2, "samples": 128}
    doc = {"key": key, "at": clock.time() - 5, "gap": dataclasses.asdict(gap)}
    path.write_text(json.dumps(doc))
    kept = kept_gap(path, key)
    assert kept is not None and kept[0] == gap and 4 < kept[1] < 60
    assert kept_gap(path, {**key, "batch_size": 16}) is None  # another batch size: measured again
    path.write_text(json.dumps({**doc, "at": clock.time() - GAP_REUSE_S - 1}))
    assert kept_gap(path, key) is None  # too old
    path.write_text("{not json")
    assert kept_gap(path, key) is None


class _PlaceCost:
    """A dataset whose item costs ``main_ms`` in the training process and ``worker_ms`` in a DataLoader worker:
    a known gap for :func:`profiler.whatif.loadergap.measure_gap` to measure."""

    def __init__(self, main_ms: float, worker_ms: float, n: int = 256) -> None:
        self.main_ms, self.worker_ms, self.n = main_ms, worker_ms, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import time

        import torch
        from torch.utils.data import get_worker_info

        time.sleep((self.main_ms if get_worker_info() is None else self.worker_ms) / 1e3)
        return torch.zeros(4), i


# light (tests/scheduling.py): its items sleep; 0.06-0.13 of a core in four CI runs; 13 s and 8 s quiet since the
# workers loading together are not timed (21.8 s and 12.2 s before)
@pytest.mark.parametrize(
    ("main_ms", "worker_ms"),
    [
        pytest.param(40.0, 80.0, marks=pytest.mark.light(seconds=13)),
        pytest.param(40.0, 40.0, marks=pytest.mark.light(seconds=8)),
    ],
)
def test_the_calibration_measures_a_known_worker_gap(main_ms: float, worker_ms: float) -> None:
    # items of 40 ms or more, so that the scheduling delays of a shared 2-core host (a few ms a wake-up at a
    # load of 6) stay inside the tolerance: with 10 ms items, four tests at a time beside two busy processes
    # read 0.79 for an injected 1.0; the median of 5 rounds drops a round that a burst hit
    from profiler.whatif.loadergap import measure_gap

    # cores=1: the workers loading together (the cores' scaling: checked below) are not timed, a third or more of
    # each round
    gap = measure_gap(_PlaceCost(main_ms, worker_ms), 4, samples=12, rounds=5, max_rounds=5, threads=1, cores=1)
    assert gap.factor == pytest.approx(worker_ms / main_ms, rel=0.2), gap
    assert gap.main_s == pytest.approx(main_ms / 1e3, rel=0.5)
    assert gap.samples == 5 * 12
    assert len(gap.rounds) == 5


def test_the_medians_standard_error_decides_when_the_rounds_have_settled() -> None:
    from profiler.whatif.model import median_error, settled

    assert median_error([1.0, 1.0]) == math.inf  # too few rounds to tell
    assert median_error([1.0, 1.0, 1.0, 1.0, 1.0]) == 0.0
    # 0.93 +/- 0.04 over 5 rounds: MAD 0.04, sigma 0.0593, SE 1.2533 x 0.0593 / sqrt(5) = 0.0332, 3.6% of 0.93
    noisy = [0.89, 0.93, 0.97, 0.89, 0.97]
    assert median_error(noisy) == pytest.approx(1.2533 * 1.4826 * 0.04 / math.sqrt(5) / 0.93)
    assert not settled(noisy, 0.03)
    assert settled(noisy * 2, 0.03)  # the same spread over 10 rounds: sqrt(2) narrower
    # one round that a burst hit (x3) does not unsettle five that agree
    assert settled([0.93, 0.93, 0.94, 0.92, 2.8], 0.03)


class _NoisyInWorkers(_PlaceCost):
    """Items that cost 10 ms in the training process and, in a worker process, 10 ms in the first worker started,
    20 in the second, 40 in the third, 10 in the fourth, ...: rounds that disagree (x1, x2, x4, ...) as on a host
    whose load comes and goes, by construction (a count in shared memory that each worker takes one number from;
    two rounds alike and one apart would settle: one burst must not unsettle rounds that agree)."""

    def __init__(self, main_ms: float, worker_ms: float) -> None:
        import multiprocessing

        super().__init__(main_ms, worker_ms)
        self.started = multiprocessing.get_context("fork").Value("i", 0)

    def __getitem__(self, i: int) -> Any:
        import time

        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None and not hasattr(self, "worker_ms_drawn"):
            with self.started.get_lock():
                k = self.started.value
                self.started.value = k + 1
            self.worker_ms_drawn = (10.0, 20.0, 40.0)[k % 3]
        time.sleep((10.0 if info is None else self.worker_ms_drawn) / 1e3)
        return torch.zeros(4), i


# light (tests/scheduling.py): its items sleep; 0.10-0.12 of a core in four CI runs, 11 s
@pytest.mark.light(seconds=11)
def test_the_calibration_takes_more_rounds_until_its_medians_settle() -> None:
    from profiler.whatif.loadergap import measure_gap

    # sleeps agree within a few % even on a loaded host: settled to 10% after the first three rounds. Each round
    # times 4 batches of items that sleep 40 ms: with 2 batches (8 samples) of 10 ms one burst of the stress
    # run's load moved a round by 30% (1.29, 1.07, 0.71, ...) and it took 6 rounds; with 8 batches of 10 ms,
    # beside four other tests and two busy processes, the wake-ups after each sleep (a few ms each at that load)
    # spread the rounds 0.79-1.08 and it took 4
    steady = measure_gap(
        _PlaceCost(40.0, 40.0), 4, samples=16, rounds=3, max_rounds=6, precision=0.1, threads=1, cores=1
    )
    assert len(steady.rounds) == 3, steady.rounds
    # a worker's 10, 20 or 40 ms, round after round, against the main process's 10: never settled to 3% in 6 rounds
    noisy = measure_gap(_NoisyInWorkers(10.0, 10.0), 4, samples=8, rounds=3, max_rounds=6, threads=1, cores=1)
    assert len(noisy.rounds) == 6, noisy.rounds
    capped = measure_gap(
        _NoisyInWorkers(10.0, 10.0), 4, samples=8, rounds=3, max_rounds=6, max_s=0.0, threads=1, cores=1
    )
    assert len(capped.rounds) == 3  # the time cap stops more rounds; the first ones are always taken


def test_the_calibration_restores_the_thread_count_and_refuses_a_tiny_dataset() -> None:
    import torch

    from profiler.whatif.loadergap import measure_gap

    before = torch.get_num_threads()
    measure_gap(_PlaceCost(0.1, 0.1, n=16), 4, samples=8, rounds=1, max_rounds=1, threads=before + 1)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="too few"):
        measure_gap(_PlaceCost(0.1, 0.1, n=5), 4)


class _SharedResource(_PlaceCost):
    """Items of ``worker_ms`` that each hold one lock shared by every worker while they wait: workers loading
    together take turns, so ``k`` of them deliver one worker's rate (the cores' scaling is 1/k), as workers
    contending for one core, one disk or one lock do. Without the lock they wait side by side (scaling 1)."""

    def __init__(self, ms: float, shared: bool) -> None:
        import multiprocessing

        super().__init__(ms, ms)
        self.lock = multiprocessing.get_context("fork").Lock() if shared else None

    def __getitem__(self, i: int) -> Any:
        if self.lock is None:
            return super().__getitem__(i)
        with self.lock:
            return super().__getitem__(i)


@pytest.mark.parametrize(("shared", "scaling"), [(True, 0.5), (False, 1.0)])
def test_the_calibration_measures_how_much_workers_deliver_together(shared: bool, scaling: float) -> None:
    from profiler.whatif.loadergap import measure_gap

    # 8 batches a timing: batches that workers finished ahead of the clock's start count as delivered in the window,
    # up to k x prefetch_factor of them, so 2 batches a timing read 0.33-0.46 for a lock the items themselves held
    # 99% of the time (scaling 0.49-0.50 by their own clock, beside five busy processes) and one round 0.95; with
    # 8 batches, 0.45-0.53 against the items' 0.48-0.51 there
    gap = measure_gap(_SharedResource(10.0, shared), 4, samples=32, rounds=3, max_rounds=3, threads=1, cores=2)
    assert gap.cores_k == 2
    assert gap.cores_scaling == pytest.approx(scaling, rel=0.2), gap
    assert len(gap.cores_rounds) == 3
    assert gap.parallel(2) == pytest.approx(2 * gap.cores_scaling)
    one = measure_gap(_SharedResource(1.0, False), 4, samples=8, rounds=1, max_rounds=1, threads=1, cores=1)
    assert (one.cores_k, one.cores_scaling, one.cores_rounds) == (1, 1.0, ())  # one core: nothing to time


def test_workers_together_deliver_the_measured_scaling_not_a_whole_core_each() -> None:
    gap = replace(NO_GAP, cores_scaling=0.75, cores_k=2)
    assert gap.parallel(0) == 0.0
    assert gap.parallel(1) == 1.0  # one worker is itself
    assert gap.parallel(2) == pytest.approx(1.5)
    assert gap.parallel(4) == pytest.approx(3.0)  # held at the measured per-worker share beyond k
    wide = replace(NO_GAP, cores_scaling=0.5, cores_k=5)
    assert wide.parallel(3) == pytest.approx(3 * (1 - 0.5 * 2 / 4))  # interpolated from 1 at one worker
    assert NO_GAP.parallel(3) == 3.0  # not measured: each worker a whole one
    # 2 loader-bound workers at 10 ms/sample, batch 8: T_L = 80 / 1.5 ms, not 80 / 2
    p = predict(cost(10), HOST, target(workers=2), gap, WORKER)
    assert p.step_ms == pytest.approx(80 / 1.5)
    assert predict(cost(10), HOST, target(workers=2), NO_GAP, WORKER).step_ms == pytest.approx(40.0)
    # the CPU bound scales the same way: 4 workers on 2 free cores at 0.75 each
    two = Host(usable_cores=2, other_cores=0.0, overhead_s=0.0)
    assert predict(cost(10), two, target(workers=4), gap, WORKER).step_ms == pytest.approx(80 / (2 * 0.75))
    # DALI's threads and the main process are not worker processes: no scaling
    assert predict(cost(10), HOST, target("dali", workers=2), gap, MAIN).step_ms == pytest.approx(
        predict(cost(10), HOST, target("dali", workers=2), NO_GAP, MAIN).step_ms
    )


def test_a_loader_bound_worker_run_counts_its_workers_at_the_measured_scaling() -> None:
    m = run(workers=2, throughput=100.0, data_wait_ms=70, step_ms=80, workers_cpu_pct=5.0)
    gap = replace(NO_GAP, cores_scaling=0.8, cores_k=2)
    assert loader_cost(m, gap).wall_s == pytest.approx(1.6 / 100)  # 2 workers delivered 1.6 workers' rate
    assert loader_cost(m).wall_s == pytest.approx(2 / 100)


def test_with_cores_is_the_ratio_of_the_medians_per_worker_at_most_one() -> None:
    g = with_cores(NO_GAP, 2, [0.010, 0.010, 0.010], [0.008, 0.006, 0.0062])
    assert g.cores_scaling == pytest.approx(0.010 / 0.0062 / 2)
    assert g.cores_rounds == pytest.approx((0.625, 0.010 / 0.006 / 2, 0.010 / 0.0062 / 2))
    assert with_cores(NO_GAP, 2, [0.010], [0.004]).cores_scaling == 1.0  # faster than k single ones: noise
    with pytest.raises(ValueError):
        with_cores(NO_GAP, 1, [0.01], [0.01])


def test_workers_needed_count_the_measured_scaling() -> None:
    # 80 ms of loading a batch against a 7 ms fed step: 11.4 single workers' rates; at 0.75 each, 16 workers
    gap = replace(NO_GAP, cores_scaling=0.75, cores_k=2)
    p = predict(cost(10), HOST, target(workers=2), gap, WORKER)
    assert p.workers_needed == math.ceil(80 / 7 / 0.75)
    assert p.cores_needed == math.ceil(80 / 7 / 0.75)
    assert predict(cost(10), HOST, target(workers=2), NO_GAP, WORKER).workers_needed == 12
    assert predict(cost(10), HOST, target("dali", workers=2), gap, MAIN).workers_needed == 12  # threads: whole


def test_a_host_of_given_cores_is_the_prediction_s_and_nothing_else_runs_on_it() -> None:
    measured = run(usable_cores=2, other_processes_cpu_pct=60.0, other_ms=3.0)
    here, there = host_of(measured), host_of(measured, 16)
    assert (here.usable_cores, here.free_cores, here.given) == (2, pytest.approx(1.4), False)
    assert (there.usable_cores, there.free_cores, there.given) == (16, 16.0, True)
    assert there.overhead_s == here.overhead_s == pytest.approx(3 * MS)  # the loop's own time goes with it
    assert there.to_dict()["usable_cores_source"] == "given (--host-cores)"
    # a CPU-bound loader (10 ms of CPU a sample) with 8 workers: the 1.4 free cores here bound it, 16 there do not
    cpu_bound = cost(10)
    slow, fast = predict(cpu_bound, here, target(workers=8)), predict(cpu_bound, there, target(workers=8))
    assert slow.parts_ms is not None and slow.parts_ms["loader"] == pytest.approx(8 * 10 / 1.4)
    assert fast.parts_ms is not None and fast.parts_ms["loader"] == pytest.approx(8 * 10 / 8)
    assert fast.samples_per_s == pytest.approx(8 / (10 * MS))


def test_the_workers_scaling_measured_among_this_host_s_cores_is_not_carried_to_another_host() -> None:
    gap = with_cores(gap_from_rounds([1.0, 1.0, 1.0], [1.2, 1.2, 1.2], 30), 2, [1.2] * 3, [0.8] * 3)
    assert gap.cores_scaling == pytest.approx(0.75) and gap.parallel(8) == pytest.approx(6.0)
    there = on_host(gap, Host(16, 0.0, 0.0, given=True))
    assert there.parallel(8) == 8 and there.factor == gap.factor  # the per-sample cost is kept
    assert "not applied to a host of 16 cores" in there.source
    assert on_host(gap, HOST) is gap  # the run's own host: as measured


def test_host_cores_is_checked_and_refused_beside_check(tmp_path: Path) -> None:
    res = stallscope("whatif", str(tmp_path), "--host-cores", "0")
    assert res.returncode == 2 and "--host-cores" in res.stderr and "Traceback" not in res.stderr
    res = stallscope("whatif", str(tmp_path), "--host-cores", "16", "--check")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "stallscope: error: --host-cores 16 predicts for another host, and --check measures on this one: use one"
    ]
