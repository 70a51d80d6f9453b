"""What a sweep or a tune will run, decided before anything trains (profiler.sweep.plan): pure, no run."""

from __future__ import annotations

import pytest
import torch

from pipelines import usable_cores
from profiler.sweep.analysis import Config
from profiler.sweep.defaults import WORKER_CAP
from profiler.sweep.plan import (
    MAX_BATCH_FACTOR,
    TuneBounds,
    default_batch_sizes,
    default_workers,
    nproc_problem,
    sweep_configs,
    tune_bounds,
)


def test_the_default_batches_are_half_once_and_twice_the_scenarios() -> None:
    assert default_batch_sizes(16) == [8, 16, 32]
    assert default_batch_sizes(1) == [1, 2]  # half of 1 is 1: no duplicate, no 0


def test_the_default_workers_are_0_and_up_to_2_cores() -> None:
    assert default_workers() == sorted({0, min(2, usable_cores())})


def test_the_configurations_are_every_combination_in_order() -> None:
    configs = sweep_configs(["naive", "prefetch"], 8, [4, 8], [0, 2], [1, 2])
    assert len(configs) == 2 * 2 * 2 * 2
    assert configs[:3] == [Config("naive", 4, 0, 1), Config("naive", 8, 0, 1), Config("naive", 4, 0, 2)]
    assert configs[-1] == Config("prefetch", 8, 2, 2)
    defaults = sweep_configs(["naive"], 8, None, None, [1])
    assert {c.batch_size for c in defaults} == {4, 8, 16}
    assert {c.workers for c in defaults} == set(default_workers())
    assert sweep_configs(["naive"], 8, [8], [], [1]) == []  # an empty worker list is not the default


def test_rank_counts_that_cannot_run_say_why() -> None:
    assert nproc_problem([1], seconds=2.0, steps=None, cuda=True) is None  # one rank: nothing to check
    assert nproc_problem([1, 2], seconds=None, steps=None, cuda=False) is None
    assert nproc_problem([1, 2], seconds=2.0, steps=10, cuda=False) is None
    why = nproc_problem([1, 2], seconds=2.0, steps=None, cuda=False)
    assert why is not None and why.startswith("--nproc 1,2 with --seconds alone") and "allowed --steps N" in why


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the devices of a machine without CUDA")
def test_a_cuda_job_needs_a_device_per_rank() -> None:
    assert nproc_problem([2], seconds=None, steps=10, cuda=True) == "--nproc 2: this node has 0 CUDA device(s)"


def test_the_tuners_bounds_default_to_the_scenarios_batch_and_the_worker_cap() -> None:
    assert tune_bounds(16, None, None, 4096) == TuneBounds(MAX_BATCH_FACTOR * 16, WORKER_CAP)
    assert tune_bounds(1024, None, None, 4096).max_batch == 4096  # the CLI's ceiling
    assert tune_bounds(16, 32, 0, 4096) == TuneBounds(32, 0)  # given: as given, 0 workers included
