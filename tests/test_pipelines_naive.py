"""The ``naive`` pipeline and the pipeline registry."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipelines
from pipelines import LoaderSpec, PipelineError
from pipelines.naive import NaivePipeline, WatchedLoader, move
from scenarios.fashion_vgg import SyntheticFashion
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def small() -> SyntheticFashion:
    return SyntheticFashion(length=70, seed=0, augment=False)


def test_registry_names_and_lookup() -> None:
    assert pipelines.names() == sorted(pipelines.PIPELINES)
    assert "naive" in pipelines.names()
    pipeline = pipelines.get("naive")
    assert isinstance(pipeline, NaivePipeline) and pipeline.name == "naive"
    assert pipelines.__all__ == sorted(pipelines.__all__)


def test_unknown_pipeline_names_the_value_and_the_choices() -> None:
    with pytest.raises(PipelineError) as info:
        pipelines.get("turbo")
    message = str(info.value)
    assert message == f"unknown pipeline 'turbo': choose one of {', '.join(pipelines.names())}"
    assert "\n" not in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_and_config(small: SyntheticFashion, workers: int) -> None:
    built = pipelines.get("naive").build(small, LoaderSpec(batch_size=16, workers=workers, seed=1))
    try:
        batches = [built.to_device(batch) for batch in built.batches]
    finally:
        built.close()
    assert len(batches) == 4  # 70 items, drop_last
    for x, y in batches:
        assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and x.device.type == "cpu"
        assert y.shape == (16,) and y.dtype == torch.int64
    assert built.config == {
        "pipeline": "naive",
        "workers": workers,
        "pin_memory": False,
        "prefetch_factor": 2 if workers else None,
        "persistent_workers": False,
    }


def test_shuffle_order_follows_the_seed(small: SyntheticFashion) -> None:
    def labels(seed: int, shuffle: bool = True) -> list[int]:
        spec = LoaderSpec(batch_size=10, seed=seed, shuffle=shuffle, drop_last=False)
        return [int(v) for _, y in pipelines.get("naive").build(small, spec).batches for v in y]

    assert labels(5) == labels(5)
    assert labels(5) != labels(6)
    assert labels(0, shuffle=False) == [small.raw(i)[1] for i in range(len(small))]


def test_drop_last_false_keeps_the_remainder(small: SyntheticFashion) -> None:
    built = NaivePipeline().build(small, LoaderSpec(batch_size=16, drop_last=False))
    assert [len(y) for _, y in built.batches] == [16, 16, 16, 16, 6]


def test_bad_spec_is_rejected(small: SyntheticFashion) -> None:
    with pytest.raises(ValueError, match="workers"):
        NaivePipeline().build(small, LoaderSpec(batch_size=16, workers=-1))
    with pytest.raises(RuntimeError):
        NaivePipeline().build(small, LoaderSpec(batch_size=16, device="nonsense"))


def test_move_handles_nested_batches() -> None:
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(1)]), "meta": "kept"}
    moved = move(batch, torch.device("cpu"))
    assert moved["meta"] == "kept"
    assert isinstance(moved["pair"], tuple) and isinstance(moved["pair"][1], list)
    assert torch.equal(moved["x"], batch["x"])


def test_a_batch_a_worker_cannot_send_is_one_line_not_a_traceback() -> None:
    # what a worker's queue thread does with a batch it cannot put in shared memory ("unable to allocate shared
    # memory ... No space left on device"): multiprocessing prints the traceback, then drops the batch. In a
    # worker of the naive pipeline (its worker_init_fn run, as in every worker) that is one line naming the worker.
    code = """
import multiprocessing, sys, time
import pipelines
from pipelines import LoaderSpec
from scenarios.fashion_vgg import SyntheticFashion

FULL = "unable to allocate shared memory(shm) for file </torch_1_2_3>: No space left on device (28)"

class Unsendable:
    def __reduce__(self):
        raise RuntimeError(FULL)

data = SyntheticFashion(length=8, seed=0, augment=False)
built = pipelines.get("naive").build(data, LoaderSpec(batch_size=4, workers=2))
built.batches.worker_init_fn(1)
queue = multiprocessing.Queue()
queue.put(Unsendable())
queue.put("sent")
print(queue.get(timeout=30))
"""
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert res.returncode == 0 and res.stdout == "sent\n", res.stderr
    lines = res.stderr.strip().splitlines()
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr
    assert re.fullmatch(
        r"stallscope: DataLoader worker 1 \(pid \d+\) could not send a batch: RuntimeError: unable to allocate shared "
        r"memory\(shm\) for file </torch_1_2_3>: No space left on device \(28\)",
        lines[0],
    ), lines


class _Collecting(torch.utils.data.Dataset[int]):
    """Items that run a full collection in whatever process loads them."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        gc.collect()
        return i


class _Cycle:
    """Garbage only the collector frees; its destructor writes the pid of the process that ran it."""

    def __init__(self, log: Path) -> None:
        self.me, self.log = self, log

    def __del__(self) -> None:
        with open(self.log, "a") as fh:
            fh.write(f"{os.getpid()}\n")


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_never_collects_garbage_it_inherited(tmp_path: Path, persistent: bool) -> None:
    """A forked worker that collected the main process's garbage would run its destructors there: a CUDA event's
    aborts the worker (seen on an H100). The main process's garbage is collected in the main process alone."""
    log = tmp_path / "destructors"
    loader = WatchedLoader(_Collecting(), batch_size=2, num_workers=2, persistent_workers=persistent)
    gc.collect()
    frozen = gc.get_freeze_count()  # 0 here; 375 on the H100 machine, whose sitecustomize freezes at start-up
    gc.disable()  # the cycle must still be garbage, uncollected, when the workers fork
    try:
        _Cycle(log)
        assert sum(len(b) for b in loader) == 8  # each item's gc.collect() ran in a worker
    finally:
        gc.enable()
    gc.collect()
    assert log.read_text().split() == [str(os.getpid())]  # run once, by the main process: no worker ran it
    # what the main process had frozen is as it was: nothing (its objects collectable again), or still frozen
    assert gc.get_freeze_count() == 0 if frozen == 0 else gc.get_freeze_count() > 0


def test_a_callers_own_freeze_is_kept_and_the_garbage_collected_before_the_fork(tmp_path: Path) -> None:
    log = tmp_path / "destructors"
    loader = WatchedLoader(_Collecting(), batch_size=4, num_workers=2)
    gc.collect()
    gc.freeze()  # the caller's
    gc.disable()
    try:
        _Cycle(log)  # garbage made after the caller's freeze: not frozen
        assert sum(len(b) for b in loader) == 8
        assert gc.get_freeze_count() > 0  # still frozen: unfreezing would have emptied it
    finally:
        gc.enable()
        gc.unfreeze()
    assert log.read_text().split() == [str(os.getpid())]  # collected before the fork, in the main process
