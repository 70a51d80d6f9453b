"""``whatif --ray-cpus N``: the model on made-up figures (no Ray), the RAY_CPUS advice on a made-up run, and one
end-to-end ``whatif --ray-cpus`` from a base run and a ray run (a real local Ray instance started once for the
module), its Ray figures checked against those Ray stored for the ray run."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import stallscope

from profiler.whatif.model import Host, LoaderCost, MeasuredRun, Target, predict
from profiler.whatif.ray import RayCost, predict_ray, ray_cost, ray_figures, ray_lines

# one xdist worker runs the module's Ray tests beside tests/test_pipelines_ray.py's
pytestmark = pytest.mark.xdist_group("ray")


def _target(pipeline: str = "ray", n: int = 1, *, device_s: float = 0.003, h2d_s: float = 0.001) -> Target:
    return Target("sim:v100", pipeline, n, 10, device_s, 0.002, h2d_s, 1, 2)


def _cost(*, handoff: float = 0.001, outside: float = 0.0005) -> RayCost:
    return RayCost(0.001, 0.0002, handoff, 10, outside, "ray run R")


HOST = Host(usable_cores=2, other_cores=1.0, overhead_s=0.0005)  # one free core


def test_remote_cpus_divide_the_tasks_and_the_trainer_gains_the_handoff() -> None:
    # a batch: 10 x (1 + 0.2) ms = 12 ms on a Ray CPU; the trainer: copy 1 + max(0.5 + 2 + 1 hand-off, 3) = 4.5 ms
    one = predict_ray(_cost(outside=0.0), HOST, _target(n=1))
    assert one.step_ms == pytest.approx(12.0) and one.binding == "loader"
    assert one.samples_per_s == pytest.approx(10 / 0.012)
    four = predict_ray(_cost(outside=0.0), HOST, _target(n=4))
    assert four.step_ms == pytest.approx(4.5) and four.binding == "launch"
    assert one.cores_needed == 3  # ceil(12 / 4.5)
    without = predict_ray(_cost(handoff=0.0, outside=0.0), HOST, _target(n=4))
    assert without.step_ms == pytest.approx(4.0)  # copy 1 + max(2.5, 3)
    # what stays on this host: 10 x 0.5 ms of CPU outside the tasks a batch, over its one free core
    kept = predict_ray(_cost(), HOST, _target(n=4))
    assert kept.step_ms == pytest.approx(5.0) and kept.binding == "cores"


def test_remote_cpus_do_not_share_the_hosts_cores_as_workers_do() -> None:
    # the same CPU cost as 4 DataLoader workers on this host's one free core: the core bounds them, not Ray's
    workers = predict(LoaderCost(0.0012, 0.0012, "made up"), HOST, _target("naive", 4))
    ray = predict_ray(_cost(handoff=0.0, outside=0.0), HOST, _target(n=4))
    assert workers.step_ms == pytest.approx(12.0)  # 10 x 1.2 ms of CPU over 1 free core
    assert ray.samples_per_s > 2.5 * workers.samples_per_s


def test_on_this_host_every_cpu_second_of_a_batch_shares_the_free_cores() -> None:
    # local: (12 ms of tasks + 10 x 0.5 ms outside them) over 1 free core = 17 ms, whatever N
    for n in (1, 2, 4):
        p = predict_ray(_cost(), HOST, _target(n=n), local=True)
        assert p.step_ms == pytest.approx(17.0) and p.binding == "cores"
    roomy = dataclasses.replace(HOST, usable_cores=8, other_cores=0.0)
    assert predict_ray(_cost(), roomy, _target(n=4), local=True).step_ms == pytest.approx(4.5)


def test_on_this_host_a_task_holds_its_ray_cpu_for_its_wall_time() -> None:
    # the ray run's tasks held their CPUs 1.5 s a CPU second (waiting for a core beside the trainer): on this host a
    # batch's 12 ms of task CPU holds one Ray CPU 18 ms, the loader's period at 1 CPU; 8 cores free, so not "cores"
    roomy = dataclasses.replace(HOST, usable_cores=8, other_cores=0.0)
    slow = dataclasses.replace(_cost(outside=0.0), wall_per_cpu=1.5)
    here = predict_ray(slow, roomy, _target(n=1), local=True)
    assert here.step_ms == pytest.approx(18.0) and here.binding == "loader"
    assert predict_ray(slow, roomy, _target(n=2), local=True).step_ms == pytest.approx(9.0)
    # N remote CPUs: a task for its CPU time, as before
    assert predict_ray(slow, roomy, _target(n=1)).step_ms == pytest.approx(12.0)


def test_ray_figures_are_rays_own_per_row_and_per_batch() -> None:
    stats = {
        "operators": [
            {"operator": "FromNumpy", "cpu_s": 0.6, "rows": 60000.0},  # the epoch's ids, all read at once
            {"operator": "MapBatches(LoadItems)", "wall_s": 2.0, "cpu_s": 1.196, "rows": 400.0, "tasks": 50},
        ],
        "user_thread_blocked_s": 0.9,
        "blocked_on_production_s": 0.5,
        "batches": 50,
    }
    f = ray_figures("R", "mlp-mnist", 8, stats, 0.004)
    assert f.task_cpu_s_per_sample == pytest.approx(0.003) and f.handoff_s_per_batch == pytest.approx(0.008)
    assert f.wall_per_cpu == 1.0  # an operator without Ray's wall time: none taken
    timed = {**stats, "operators": [{"operator": "MapBatches(LoadItems)", "wall_s": 2.0, "cpu_s": 1.2, "rows": 400.0}]}
    g = ray_figures("R", "mlp-mnist", 8, timed, 0.004)
    assert g.task_wall_s_per_sample == pytest.approx(0.005) and g.wall_per_cpu == pytest.approx(2.0 / 1.2)
    assert ray_cost(_run(), LoaderCost(0.003, 0.002, "made up"), g).wall_per_cpu == pytest.approx(2.0 / 1.2)
    with pytest.raises(ValueError, match="no operators"):
        ray_figures("R", "x", 8, {"operators": []}, 0.0)
    with pytest.raises(ValueError, match="iteration timers"):
        ray_figures("R", "x", 8, {**stats, "user_thread_blocked_s": None}, 0.0)


def _run(pipeline: str = "naive") -> MeasuredRun:
    return MeasuredRun(
        "r", pipeline, "sim", 8, 0, 10, 100.0, 80.0, 40.0, 1.0, 5.0, 1.0, 800, 60.0, math.nan, 0.0, 2,
        storage_s_per_sample=0.001,
    )  # fmt: skip


def test_rays_overhead_is_the_ray_runs_task_cost_beyond_the_bases_loader() -> None:
    cost = LoaderCost(0.005, 0.004, "made up")
    f = ray_figures("R", "s", 8, {"operators": [{"cpu_s": 0.5, "rows": 100.0}], "user_thread_blocked_s": 0.2,
                                  "blocked_on_production_s": 0.1, "batches": 10}, 0.007)  # fmt: skip
    rc = ray_cost(_run(), cost, f)
    assert rc.loader_cpu_s == pytest.approx(0.005)  # 4 ms of CPU + 1 ms waiting for storage
    assert rc.overhead_s == pytest.approx(0.001) and rc.handoff_s == pytest.approx(0.01)
    assert rc.outside_s == pytest.approx(0.002) and rc.measured
    base_ray = ray_cost(_run("ray"), cost, f)
    assert base_ray.loader_cpu_s == pytest.approx(0.005) and base_ray.overhead_s == 0.0
    bare = ray_cost(_run(), cost, None, "no ray run")
    assert not bare.measured and bare.overhead_s == 0.0 and "NOT INCLUDED (no ray run)" in bare.line()
    assert bare.to_dict()["overhead_included"] is False


def test_the_check_lines_name_the_cpu_counts_this_host_cannot_stand_in_for() -> None:
    preds = [
        dataclasses.replace(predict_ray(_cost(), HOST, _target(n=n), local=True), remote_samples_per_s=500.0)
        for n in (1, 2)
    ]
    lines = ray_lines([_cost()], HOST, preds, check=True)
    assert "PREDICTED for this host" in lines[1]
    assert lines[-1].startswith("this host cannot stand in for a cluster of N = 1 (1.2 cores), 2 (2.2 cores)")
    assert "remote" in ray_lines([_cost()], HOST, preds, check=False)[-1]


def test_the_advice_gives_the_cpus_the_loader_needs_where_the_cores_are_spent() -> None:
    from profiler.analysis import summarize
    from tests.test_summary_contract import known

    spent = known(workers=2)
    spent = dataclasses.replace(
        spent, samples=[(t, s, m, 95.0 if m == "sys.cpu_pct" else v) for t, s, m, v in spent.samples]
    )
    recs = {r.code: r.text for r in summarize(spent).recommendations}
    # the made-up run: workers 70-81% of a core (mean 75.5), 100 ms steps, 30 ms of data wait
    assert "needs 2 CPUs: its workers took 75.5 ms of CPU per batch" in recs["RAY_CPUS"]
    assert "70.0 ms" in recs["RAY_CPUS"] and "whatif RUN_DIR --ray-cpus 2" in recs["RAY_CPUS"]
    idle = {r.code for r in summarize(known(workers=2)).recommendations}  # the cores 60% busy: workers can grow
    assert "RAY_CPUS" not in idle


@pytest.fixture(scope="module")
def instance() -> Iterator[str]:
    """One local Ray instance for the module; its GCS address for the CLI's subprocesses (RAY_ADDRESS)."""
    ray = pytest.importorskip("ray", reason="the end-to-end check needs the ray extra (pip install 'stallscope[ray]')")
    ray.init(
        num_cpus=1,
        object_store_memory=80 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
    )
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


def _cli(*args: str) -> str:
    out = stallscope(*args)  # the warm interpreter (tests/warm.py): torch is imported once per pytest worker
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_whatif_ray_cpus_end_to_end(instance: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.analysis import summarize
    from profiler.core.store import load_run
    from profiler.whatif.source import storage_wait

    # 30 measured steps: at 10-12 ms a step the ray run's 6 were shorter than the sampler's 100 ms period, and one run
    # in five here had no host CPU reading in them ("a ray run without a host CPU reading in its measured steps")
    common = ["--device", "sim:v100", "--batch-size", "64", "--steps", "30", "--warmup", "2", "--no-live", "--json"]
    _cli("run", "mlp-mnist", "--workers", "0", "--out", str(tmp_path / "base"), *common)
    with monkeypatch.context() as m:
        m.setenv("RAY_ADDRESS", instance)
        _cli("run", "mlp-mnist", "--pipeline", "ray", "--workers", "1", "--out", str(tmp_path / "ray"), *common)
    doc = json.loads(
        _cli("whatif", str(tmp_path / "base"), "--ray-cpus", "1,4", "--ray-run", str(tmp_path / "ray"), "--json")
    )
    # the truth: Ray's own figures as the ray run stored them
    stats = load_run(tmp_path / "ray").meta["loader"]["ray_stats"]
    ray_cpu = sum(o["cpu_s"] / o["rows"] for o in stats["operators"])
    handoff = (stats["user_thread_blocked_s"] - stats["blocked_on_production_s"]) / stats["batches"]
    rc = doc["ray"]
    task = rc["loader_cpu_seconds_per_sample"] + rc["ray_overhead_seconds_per_sample"]
    base_cpu = doc["measured"]["loader_cost"]["cpu_seconds_per_sample"]
    # the base's storage wait as it stored it: none on a quiet host; beside two busy processes the 0-worker base's
    # main process was blocked in I/O 0.016 ms a sample (a fresh-clone CI's run), which a Ray CPU pays as well
    storage = storage_wait(summarize(load_run(tmp_path / "base")))
    assert rc["loader_cpu_seconds_per_sample"] == pytest.approx(base_cpu + storage)
    # Ray's overhead: its tasks' CPU beyond the loader's
    assert task == pytest.approx(max(ray_cpu, base_cpu) + storage)
    assert rc["handoff_seconds_per_batch"] == pytest.approx(handoff) and rc["handoff_batch_size"] == 64
    assert rc["overhead_included"] is True and any("MEASURED from ray run" in line for line in rc["lines"])
    rows = {(r["pipeline"], r["workers"]): r for r in doc["predictions"]}
    one, four = rows[("ray", 1)], rows[("ray", 4)]
    assert one["ray_cpus"] == 1 and one["ray_cpus_on"] == "remote" and four["ray_cpus"] == 4
    # both rows take the one ray run's figures (1 CPU); 4 CPUs is not its count, and the lines say so
    assert one["ray_figures_from"] == four["ray_figures_from"] == f"ray run {tmp_path / 'ray'}"
    assert one["ray_figures_cpus"] == four["ray_figures_cpus"] == 1
    assert any(line.startswith("at 4 CPUs no ray run of that count was given") for line in rc["lines"])
    # remote CPUs: the tasks' period is a batch's task seconds over N, whatever this host's free cores
    assert one["parts_ms_per_step"]["loader"] == pytest.approx(64 * task * 1e3, rel=1e-6)
    assert four["parts_ms_per_step"]["loader"] == pytest.approx(16 * task * 1e3, rel=1e-6)
    parts = one["parts_ms_per_step"]
    fed = parts["host link"] + max(parts["launch"], parts["device"])
    here = parts.get("cores", 0.0)  # the host CPU outside the tasks, over the base's free cores
    assert one["predicted_step_time_ms"] == pytest.approx(max(parts["loader"], fed, here), rel=1e-3)
    assert one["predicted_throughput_samples_per_s_low"] <= one["predicted_throughput_samples_per_s"]
    assert rows[("naive", 0)]["base_configuration"] is True
