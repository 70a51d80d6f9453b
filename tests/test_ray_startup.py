"""The ray pipeline's start-up lasts until every Ray CPU of the run has run a map task (issue #68): Ray starts a CPU's
worker process only when Ray Data first runs a task on it, and with two CPUs that start fell on a step of the steady
state (1.0-1.6 s among steps of 8-70 ms). No Ray here: the start-up's rule on given pids and times, the pipeline's
epoch over a fake Ray iterator (every batch still reaches the loop, the pid column does not), and the analysis
holding the start-up's steps out of the measured ones, against figures computed from the injected steps."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from pipelines import LoaderSpec, ray_data
from pipelines.ray_data import PID, LoadItems, RayBatches, StartUp, batch_pids
from profiler.analysis import summarize
from profiler.analysis.apart import measured_steps, startup_held, startup_steps
from profiler.analysis.ray_view import ray_view
from profiler.core.rows import RunRecord, StepRow


def test_the_start_up_ends_at_the_batch_that_brings_the_last_cpus_first() -> None:
    s = StartUp(2)
    assert s.open
    assert not s.feed([101], 4.5)  # the first batch: one worker
    assert not s.feed([101], 4.6)
    assert s.feed([101, 202], 6.1)  # the second worker's first rows
    assert not s.open and s.batches == 3
    assert not s.feed([303], 6.2)  # over: nothing more counted
    assert s.to_config() == {
        "startup_cpus": 2,
        "startup_workers": 2,
        "startup_steps": 3,
        "startup_ms": 6100.0,
        "startup_end": "every Ray CPU (2) had run a task",
    }


def test_one_cpu_ends_it_at_the_first_batch() -> None:
    s = StartUp(1)
    assert s.feed([7], 0.25)
    assert s.to_config()["startup_steps"] == 1


@pytest.mark.parametrize(("batches", "seconds", "ended_at"), [(4, 1e9, 4), (1000, 2.0, 3)])
def test_a_bound_ends_it_and_says_so(batches: int, seconds: float, ended_at: int) -> None:
    s = StartUp(3, max_batches=batches, max_s=seconds)
    ends = [s.feed([11], t) for t in (0.5, 1.0, 2.5, 3.0, 3.5)]
    assert ends.index(True) == ended_at - 1 and s.batches == ended_at
    cfg = s.to_config()
    assert cfg["startup_steps"] == ended_at and cfg["startup_workers"] == 1
    assert cfg["startup_end"].startswith("1 of 3 Ray CPUs had run a task") and "all the same" in cfg["startup_end"]


def test_a_run_that_ends_first_holds_no_step() -> None:
    s = StartUp(2)
    s.feed([5], 1.0)
    cfg = s.to_config()
    assert "startup_steps" not in cfg and cfg["startup_end"].startswith("the run ended first: 1 of 2")


def test_batch_pids() -> None:
    assert batch_pids({"x": torch.zeros(3), PID: torch.tensor([9, 4, 9])}) == [4, 9]
    assert batch_pids({"x": torch.zeros(3)}) == []


class Items:
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full(2, i, dtype=np.float32), i % 3


def test_the_map_stage_tags_rows_with_its_workers_pid_only_when_asked() -> None:
    order = np.arange(12)
    tagged = LoadItems(Items(), 0, order, 4, tag=True)({"id": np.array([1])})
    assert tagged[PID].tolist() == [os.getpid()] * 4 and tagged["y"].tolist() == [1, 2, 0, 1]
    assert PID not in LoadItems(Items(), 0, order, 4)({"id": np.array([1])})


class FakeIterator:
    """Ray's DataIterator for one epoch: the map stage's batches, each row's pid the worker given for its batch."""

    def __init__(self, load: LoadItems, workers: list[int]) -> None:
        self.load, self.workers = load, workers

    def iter_torch_batches(self, **_: Any) -> Iterator[dict[str, torch.Tensor]]:
        for k, pid in enumerate(self.workers):
            out = self.load({"id": np.array([k])})
            if PID in out:
                out[PID][:] = pid
            yield {name: torch.as_tensor(v) for name, v in out.items()}


def _fake_ray(monkeypatch: pytest.MonkeyPatch, workers: list[int], clock: list[float]) -> list[LoadItems]:
    loads: list[LoadItems] = []

    class Dataset:
        def __init__(self, load: LoadItems) -> None:
            self.load = load

        def iterator(self) -> FakeIterator:
            return FakeIterator(self.load, workers)

    def dataset(count: int, batch_bytes: int, load: LoadItems) -> Dataset:
        loads.append(load)
        return Dataset(load)

    class Clock:
        """The pipeline's ``time``: its readings are ``clock``'s, in order, then ``clock``'s last."""

        def __init__(self) -> None:
            self.ticks = iter(clock)

        def perf_counter(self) -> float:
            return next(self.ticks, clock[-1])

    monkeypatch.setattr(ray_data, "wait_for_cpu", lambda instance: None)
    monkeypatch.setattr(ray_data, "by_value", lambda dataset: None)
    monkeypatch.setattr(ray_data, "epoch_dataset", dataset)
    monkeypatch.setattr(ray_data, "lost_workers", lambda: None)
    monkeypatch.setattr("pipelines.ray_data.time", Clock())
    return loads


def test_an_epoch_names_its_start_up_and_every_batch_reaches_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # batches 0-3 from worker 1, batch 4 the second worker's first: the start-up is steps 0-4
    workers = [1, 1, 1, 1, 2, 1, 2, 1, 2, 1, 2, 1]
    # the clock: the epoch's start, then per batch the first batch's wait (the first) and the start-up's reading
    clock = [10.0, 14.0, 14.0, 14.1, 14.2, 14.3, 15.9, 16.0, 16.1]
    loads = _fake_ray(monkeypatch, workers, clock)
    config: dict[str, Any] = {"ray_instance": "fake", "ray_cpus": 2.0}
    spec = LoaderSpec(batch_size=1, workers=2, shuffle=False, drop_last=False, seed=0, device="cpu")
    batches = RayBatches(Items(), spec, config)
    got = list(batches)
    assert [int(y) for _, y in got] == [k % 3 for k in range(12)]  # every batch, in order, no pid in it
    assert all(len(b) == 2 for b in got) and loads[0].tag
    assert config["first_batch_ms"] == pytest.approx(4000.0)
    assert config["startup_steps"] == 5 and config["startup_ms"] == pytest.approx(5900.0)
    assert config["startup_workers"] == 2 and config["startup_cpus"] == 2
    # a later epoch is not tagged: the start-up is over
    monkeypatch.setattr("pipelines.ray_data.time", SimpleNamespace(perf_counter=lambda: 20.0))
    list(batches)
    assert not loads[1].tag and config["startup_steps"] == 5


def test_an_epoch_of_fewer_tasks_than_cpus_waits_for_no_more_workers_than_it_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 12 batches, one a task (read_tasks): 12 tasks, so 16 CPUs are waited for as 12
    clock = [0.0] + [1.0] * 40
    _fake_ray(monkeypatch, list(range(100, 112)), clock)
    config: dict[str, Any] = {"ray_instance": "fake", "ray_cpus": 16.0}
    spec = LoaderSpec(batch_size=1, workers=16, shuffle=False, drop_last=False, seed=0, device="cpu")
    list(RayBatches(Items(), spec, config))
    assert config["startup_cpus"] == 12 and config["startup_steps"] == 12


def _steps(step_s: list[float], warmup: int, batch: int = 8) -> list[StepRow]:
    out, t = [], 0.0
    for i, d in enumerate(step_s):
        out.append(StepRow(i, t, t + d, d / 2, batch, i < warmup, None, None))
        t += d
    return out


def _record(step_s: list[float], warmup: int, loader: dict[str, Any]) -> RunRecord:
    meta = {
        "scenario": "fake",
        "pipeline": "ray",
        "batch_size": 8,
        "warmup_steps": warmup,
        "status": "complete",
        "device": {"kind": "cpu"},
        "loader": loader,
    }
    return RunRecord(meta, _steps(step_s, warmup), [], [], [])


def test_the_analysis_holds_the_start_up_steps_out_of_the_measured_ones() -> None:
    # 3 warm-up steps, the second worker's start on step 5 (1.5 s), the start-up over at step 5: steps 6-11 measured
    step_s = [4.0, 0.02, 0.02, 0.02, 0.02, 1.5, 0.02, 0.03, 0.02, 0.03, 0.02, 0.03]
    loader = {"pipeline": "ray", "startup_steps": 6, "startup_ms": 5600.0, "startup_cpus": 2, "startup_workers": 2}
    rec = _record(step_s, 3, loader)
    assert startup_steps(rec.meta) == 6
    assert [s.step for s in measured_steps(rec)] == [6, 7, 8, 9, 10, 11]
    s = summarize(rec)
    truth = 8 * 6 / math.fsum(step_s[6:])  # samples over the steady steps' own time
    assert s.steps == 6 and s.throughput_samples_per_s == pytest.approx(truth, rel=1e-9)
    assert s.step_time_ms.mean == pytest.approx(1e3 * math.fsum(step_s[6:]) / 6, rel=1e-9)
    # without the start-up named, the worker's start is a measured step (the figure the check compared before)
    plain = summarize(_record(step_s, 3, {"pipeline": "ray"}))
    assert plain.steps == 9 and plain.throughput_samples_per_s < truth / 2


def test_a_start_up_inside_the_warm_up_changes_nothing() -> None:
    step_s = [4.0, 0.02, 0.02, 0.03, 0.02]
    rec = _record(step_s, 3, {"pipeline": "ray", "startup_steps": 1})
    assert [s.step for s in measured_steps(rec)] == [3, 4]


@pytest.mark.parametrize("bad", [None, True, -2, 0, "6", 6.0])
def test_no_start_up_where_the_loader_names_none(bad: object) -> None:
    assert startup_steps({"loader": {"startup_steps": bad}}) == 0
    assert startup_steps({}) == 0 and startup_steps({"loader": "naive"}) == 0


def test_the_ray_view_names_the_start_up() -> None:
    loader = {
        "ray_stats": {"operators": [], "batches": 12},
        "startup_steps": 6,
        "startup_ms": 5600.0,
        "startup_cpus": 2,
        "startup_workers": 2,
        "startup_end": "every Ray CPU (2) had run a task",
    }
    view = ray_view(loader, data_wait_ms=1.0, steps=6)
    assert view is not None and view.startup_steps == 6 and view.startup_ms == 5600.0
    assert "Ray's start-up: steps 0-5 (5.60 s from the first epoch's start; every Ray CPU (2) had run a task)" in (
        view.headline
    )
    assert view.to_dict()["startup_steps"] == 6
    ended = ray_view({"ray_stats": {}, "startup_end": "the run ended first: 1 of 2"}, data_wait_ms=1.0, steps=3)
    assert ended is not None and "none held out (the run ended first: 1 of 2)" in ended.headline
    assert "start-up" not in (ray_view({"ray_stats": {}}, data_wait_ms=1.0, steps=3) or view).headline


def test_the_reports_throughput_line_counts_the_start_up_beyond_the_warm_up() -> None:
    from profiler.render.figures import figure_rows

    step_s = [4.0, 0.02, 0.02, 0.02, 0.02, 1.5, 0.02, 0.03, 0.02, 0.03, 0.02, 0.03]
    loader = {"pipeline": "ray", "ray_stats": {"operators": [], "batches": 12}, "startup_steps": 6}
    rows = dict(figure_rows(summarize(_record(step_s, 3, loader))))
    assert rows["throughput"].endswith("6 steps after 3 warm-up and 3 more of Ray's start-up)")
    inside = dict(figure_rows(summarize(_record(step_s, 3, {**loader, "startup_steps": 2}))))
    assert inside["throughput"].endswith("9 steps after 3 warm-up)")


def test_a_start_up_past_every_measured_step_is_not_held_and_said() -> None:
    step_s = [4.0, 0.02, 0.02, 0.02, 0.02, 1.5]
    loader = {"pipeline": "ray", "ray_stats": {"operators": [], "batches": 6}, "startup_steps": 6}
    loader |= {"startup_ms": 5600.0, "startup_end": "every Ray CPU (2) had run a task"}
    rec = _record(step_s, 3, loader)
    assert not startup_held(rec) and [s.step for s in measured_steps(rec)] == [3, 4, 5]
    s = summarize(rec)
    assert s.steps == 3 and s.ray is not None and s.ray.startup_steps == 0
    assert "none held out (every Ray CPU (2) had run a task; it lasted past the measured steps" in s.ray.headline
    assert startup_held(_record([*step_s, 0.02], 3, loader))


def test_the_cpus_waited_for_are_the_instances() -> None:
    assert ray_data.run_cpus({"ray_cpus": 2.0}) == 2 and ray_data.run_cpus({"ray_cpus": 0.0}) == 1
