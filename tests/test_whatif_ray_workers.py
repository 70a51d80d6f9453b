"""``whatif --ray-cpus N`` on this host: what a Ray CPU holds a batch for beyond its tasks' CPU (its worker's framing,
its wait for a core, its idle between tasks), read from a ray run's task workers, on made-up readings (no Ray)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from profiler.analysis.loader_time import ProcessTime
from profiler.whatif.confidence import spread_of
from profiler.whatif.model import Host, LoaderCost, MeasuredRun, Target, WhatIfError
from profiler.whatif.ray import (
    RayCost,
    long_step,
    predict_ray,
    ray_cost,
    ray_cost_at,
    ray_figures,
    ray_lines,
    task_workers,
)
from profiler.whatif.source import ray_of

B = 10
STATS = {
    "operators": [{"operator": "MapBatches(LoadItems)", "wall_s": 1.2, "cpu_s": 1.0, "rows": 1000.0}],
    "user_thread_blocked_s": 0.2,
    "blocked_on_production_s": 0.1,
    "batches": 100,
}  # the tasks: 1 ms of CPU a sample, 10 ms a batch of 10
ROOMY = Host(usable_cores=8, other_cores=0.0, overhead_s=0.0005)


def _target(n: int = 1) -> Target:
    return Target("sim:v100", "ray", n, B, 0.003, 0.002, 0.001, 1, 2)


def _run(pipeline: str = "naive", workers: int = 0) -> MeasuredRun:
    return MeasuredRun(
        "r", pipeline, "sim", B, workers, 30, 500.0, 20.0, 12.0, 1.0, 5.0, 1.0, 800, 60.0, math.nan, 0.0, 8,
    )  # fmt: skip


def test_the_task_workers_are_the_ray_cpus_with_the_most_cpu_per_batch() -> None:
    # a step every 20 ms; the task worker's loop thread: 60% on a CPU, 15% waiting for one, the rest (25%) idle;
    # Ray's other processes barely run; the host ran 1.5 cores in all
    w = task_workers([(2.0, 1.0), (60.0, 15.0), (0.5, 0.0)], 1, 0.020, host_cores=1.5, usable_cores=2, waited=True)
    assert w is not None
    assert (w.cpu_s, w.runq_s, w.idle_s) == pytest.approx((0.012, 0.003, 0.005))
    assert w.stretch == pytest.approx(1.25) and w.rest_cores == pytest.approx(0.9)
    # two Ray CPUs: each makes half of the batches, so per batch their shares of the wall time add up
    two = task_workers([(40.0, 10.0), (2.0, 1.0), (30.0, 20.0)], 2, 0.020, host_cores=2.0, usable_cores=2, waited=True)
    assert two is not None and (two.cpu_s, two.runq_s, two.idle_s) == pytest.approx((0.014, 0.006, 0.020))
    # a loop that did not wait for data: the workers idled because the loop was slow, not a cost of theirs
    ahead = task_workers([(60.0, 15.0)], 1, 0.020, host_cores=1.0, usable_cores=2, waited=False)
    assert ahead is not None and math.isnan(ahead.idle_s)
    assert task_workers([(60.0, 15.0)], 2, 0.020, host_cores=1.0, usable_cores=2, waited=True) is None


def _ray_cost(w: object) -> RayCost:
    f = ray_figures("R", "s", B, STATS, 0.0015, workers=w)  # type: ignore[arg-type]
    return ray_cost(_run(), LoaderCost(0.001, 0.001, "made up"), f)


def test_a_loader_bound_ray_runs_period_is_rebuilt_from_its_workers_parts() -> None:
    # injected truth: the ray run's loop waited for data, one Ray CPU delivering a batch every 20 ms: its worker 14 ms
    # on a CPU (10 ms of tasks by Ray's count + 4 ms framing), 4 ms waiting for a core, 2 ms idle between tasks
    w = task_workers([(70.0, 20.0)], 1, 0.020, host_cores=1.4, usable_cores=8, waited=True)
    rc = _ray_cost(w)
    assert rc.framing_s == pytest.approx(0.0004) and rc.idle_s == pytest.approx(0.002)
    here = predict_ray(rc, ROOMY, _target(1), local=True)
    assert here.parts_ms["loader"] == pytest.approx(20.0) and here.binding == "loader"
    # N remote CPUs: the framing and the idle hold a Ray CPU there too; the wait for this host's cores does not
    assert predict_ray(rc, ROOMY, _target(1)).parts_ms["loader"] == pytest.approx(16.0)
    assert predict_ray(rc, ROOMY, _target(2)).parts_ms["loader"] == pytest.approx(8.0)
    assert "0.4 ms/sample of CPU beyond the tasks' and 2 ms/batch between tasks" in rc.line()
    out = rc.to_dict()
    assert out["worker_idle_seconds_per_batch"] == pytest.approx(0.002)
    assert out["task_workers"]["runq_seconds_per_batch"] == pytest.approx(0.004)  # type: ignore[index]


def test_more_local_cpus_than_the_ray_run_share_the_cores_fairly() -> None:
    # the ray run's one worker waited 0.25 s a CPU second beside 1.4 cores of the rest, on 2 cores: (1 + 1.4) / 2 =
    # 1.2 runnable a core; two workers: (2 + 1.4) / 2 = 1.7, so each waits longer, x 1.7 / 1.2 (ESTIMATED)
    w = task_workers([(64.0, 16.0)], 1, 0.025, host_cores=2.0, usable_cores=2, waited=True)
    assert w is not None and w.rest_cores == pytest.approx(1.36)
    rc = _ray_cost(dataclasses.replace(w, rest_cores=1.4))
    assert rc.stretch(1) == pytest.approx(1.25) and rc.stretch(2) == pytest.approx(1.25 * 1.7 / 1.2)
    # on a host with cores to spare the share stays 1: no more waiting than measured
    roomy = _ray_cost(dataclasses.replace(w, rest_cores=1.4, usable_cores=8))
    assert roomy.stretch(4) == pytest.approx(1.25)
    held = B * (rc.task_s + rc.framing_s)
    p = predict_ray(rc, ROOMY, _target(2), local=True)
    assert p.parts_ms["loader"] == pytest.approx((held * 1.25 * 1.7 / 1.2 + rc.idle_s) / 2 * 1e3)


def test_without_the_workers_readings_a_task_holds_its_cpu_for_its_wall_time() -> None:
    rc = _ray_cost(None)
    assert rc.workers is None and rc.framing_s == 0.0 and rc.idle_s == 0.0
    assert rc.stretch(2) == pytest.approx(1.2)  # Ray's wall_s over its cpu_s, as before
    assert predict_ray(rc, ROOMY, _target(1), local=True).parts_ms["loader"] == pytest.approx(12.0)
    assert "between tasks" not in rc.line() and rc.to_dict()["task_workers"] is None
    lines = ray_lines([rc], ROOMY, [], check=True)
    assert "MEASURED by Ray" in lines[1]


def _source(stall: float, sys_cpu: float = 70.0) -> SimpleNamespace:
    processes = (
        ProcessTime("main", 3.0, 1.0, 0.0, 0.0, 0.0, 20.0, 76.0, 0.0),
        ProcessTime("w0", 1.0, 0.5, 0.0, 98.5, 0.0, 0.0, 0.0, 0.0),  # raylet
        ProcessTime("w1", 70.0, 20.0, 0.0, 10.0, 0.0, 0.0, 0.0, 0.0),  # the task worker
    )
    summary = SimpleNamespace(
        loader_time=SimpleNamespace(processes=processes),
        host=SimpleNamespace(sys_cpu_pct=sys_cpu),
        stall_fraction=stall,
    )
    run = dataclasses.replace(_run("ray", 1), step_ms=20.0, usable_cores=2)
    return SimpleNamespace(
        run_dir="R",
        measured=run,
        meta={"scenario": "s", "loader": {"ray_stats": STATS}},
        summary=summary,
        step_ms=(20.0,) * 29 + (900.0,),
    )


def test_a_ray_runs_task_workers_are_read_from_its_loader_processes() -> None:
    f = ray_of(_source(0.5))  # type: ignore[arg-type]
    w = f.workers
    assert w is not None and w.cpus == 1
    assert (w.cpu_s, w.runq_s, w.idle_s) == pytest.approx((0.014, 0.004, 0.002))
    assert w.rest_cores == pytest.approx(1.4 - 0.7)  # 70% of 2 cores, less the worker's 0.7
    # a ray run whose loop hardly waited for data: its workers' idle is not counted
    ahead = ray_of(_source(0.1)).workers  # type: ignore[arg-type]
    assert ahead is not None and math.isnan(ahead.idle_s)
    assert ray_of(_source(0.5, math.nan)).workers is None  # type: ignore[arg-type]
    assert f.long_step.startswith("the ray run's measured step 30 of 30 took 900 ms, 45x their median (61% of")
    assert f.cpus == 1
    # a ray run too short for a host reading inside its measured steps: said so, with what to change
    short = _source(0.5)
    short.measured = dataclasses.replace(short.measured, main_cpu_pct=math.nan)
    short.step_ms = (14.0, 13.0, 15.0)
    with pytest.raises(
        WhatIfError,
        match=r"^R: a ray run without a host CPU reading in its measured steps \(3 steps, "
        r"0\.04 s, shorter than the sampler's period\): give a ray run of more --steps$",
    ):
        ray_of(short)  # type: ignore[arg-type]


def test_an_event_step_in_the_ray_run_is_named_beside_the_predictions() -> None:
    # a step at ten times the median or more: named with its share of the steps' time; one under it is not
    assert long_step([20.0, 20.0, 20.0, 200.0]) == (
        "the ray run's measured step 4 of 4 took 200 ms, 10x their median (77% of their time): its per-batch figures "
        "carry that step's work (the ray rows are lower for it); a longer --ray-run dilutes it"
    )
    assert long_step([20.0, 20.0, 20.0, 199.0]) == "" and long_step([20.0, 900.0]) == ""
    f = ray_figures("R", "s", B, STATS, 0.0015, step_ms=[20.0, 20.0, 20.0, 200.0])
    rc = ray_cost(_run(), LoaderCost(0.001, 0.001, "made up"), f)
    assert ray_lines([rc], ROOMY, [], check=False)[1] == f.long_step


def _at(cpus: int, idle_ms: float) -> RayCost:
    """The Ray cost of a ray run of ``cpus`` Ray CPUs whose task workers idled ``idle_ms`` a batch between tasks."""
    w = task_workers([(60.0, 15.0)] * cpus, cpus, 0.020, host_cores=1.5, usable_cores=2, waited=True)
    assert w is not None
    f = ray_figures(f"R{cpus}", "s", B, STATS, 0.0015, workers=dataclasses.replace(w, idle_s=idle_ms / 1e3), cpus=cpus)
    return ray_cost(_run(), LoaderCost(0.001, 0.001, "made up"), f)


def test_each_cpu_count_takes_the_ray_run_of_that_count_else_the_nearest() -> None:
    # two local Ray CPUs idle between tasks where one does not (docs/whatif.md): a run of one cannot show it
    one, two, three = _at(1, 0.5), _at(2, 25.0), _at(3, 30.0)
    assert (one.cpus, two.cpus, three.cpus) == (1, 2, 3)
    assert ray_cost_at([one, two], 1) is one and ray_cost_at([one, two], 2) is two
    assert ray_cost_at([one, two], 8) is two  # the nearest count
    assert ray_cost_at([one, three], 2) is one  # a tie: the fewer CPUs
    # at its own count a run's hold on a Ray CPU is its own: the period is (held x its stretch + its idle) / N
    p = predict_ray(two, ROOMY, _target(2), local=True)
    held = B * (two.task_s + two.framing_s)
    assert p.parts_ms is not None
    assert p.parts_ms["loader"] == pytest.approx((held * two.workers.stretch + 0.025) / 2 * 1e3)  # type: ignore[union-attr]
    # the lines name each run's count, and the counts that had none
    preds = [predict_ray(ray_cost_at([one, two], n), ROOMY, _target(n)) for n in (1, 2, 4)]
    lines = ray_lines([one, two], ROOMY, preds, check=False)
    assert lines[1].startswith("  at 1 CPU: ") and lines[2].startswith("  at 2 CPUs: ")
    assert any(line.startswith("at 4 CPUs no ray run of that count was given") for line in lines)
    assert not any("no ray run of that count" in line for line in ray_lines([one, two], ROOMY, preds[:2], False))


def test_two_ray_runs_of_one_cpu_count_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.whatif import run as whatif_run

    def fake(run_dir: str, cpus: int) -> SimpleNamespace:
        steps = [10.0 + (i % 3) * cpus for i in range(30)]  # the run's measured steps, ms
        return SimpleNamespace(
            run_dir=run_dir, meta={"scenario": "s"}, measured=SimpleNamespace(batch_size=B, workers=cpus), step_ms=steps
        )

    runs = {"A": fake("A", 2), "B": fake("B", 2), "C": fake("C", 1)}
    monkeypatch.setattr(whatif_run, "read_run", runs.__getitem__)
    monkeypatch.setattr(
        whatif_run, "ray_of", lambda src: ray_figures(src.run_dir, "s", B, STATS, 0.0015, cpus=src.measured.workers)
    )
    base = fake("base", 0)
    req = whatif_run.Request("base", ray_cpus=[1, 2], ray_runs=("A", "B"))
    with pytest.raises(WhatIfError, match=r"--ray-run: A and B both ran on 2 Ray CPUs: give one ray run per CPU count"):
        whatif_run._ray_costs(base, _run(), LoaderCost(0.001, 0.001, "made up"), req, print)  # type: ignore[arg-type]
    req = dataclasses.replace(req, ray_runs=("A", "C"))
    got = whatif_run._ray_costs(base, _run(), LoaderCost(0.001, 0.001, "made up"), req, print)  # type: ignore[arg-type]
    assert [rc.cpus for rc in got] == [1, 2] and [rc.source for rc in got] == ["ray run C", "ray run A"]
    # each carries its own run's spread, as the base's is figured (a ray row's interval adds it)
    assert [rc.half_width for rc in got] == [spread_of(runs[k].step_ms).half_width for k in "CA"]
    assert 0 < got[0].half_width < got[1].half_width


def test_a_ray_row_names_the_ray_run_its_figures_came_from_and_none_without_one() -> None:
    from profiler.whatif import run as whatif_run
    from profiler.whatif.model import AS_MEASURED, NO_GAP

    cost = LoaderCost(0.001, 0.001, "made up")

    def row(rc: RayCost) -> dict[str, object]:
        model = whatif_run._Model(_run(), cost, ROOMY, NO_GAP, AS_MEASURED, (rc,))
        return model.predict(_target(1)).to_dict()

    measured = row(_at(1, 0.5))
    assert (measured["ray_figures_from"], measured["ray_figures_cpus"]) == ("ray run R1", 1)
    bare = row(ray_cost(_run(), cost, None, "no run on the ray pipeline to measure it from"))
    assert bare["ray_figures_from"] is None and bare["ray_figures_cpus"] is None
