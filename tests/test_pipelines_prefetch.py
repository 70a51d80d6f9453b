"""The ``prefetch`` pipeline: same batches as naive, clean shutdown, errors across the thread, the CUDA copier
through a fake stream/event, and the overlap against injected load and compute times."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from conftest import wait_until
from torch import nn
from torch.nn import functional as F

import pipelines
from pipelines import LoaderSpec
from pipelines.prefetch import THREAD_NAME, PrefetchPipeline, _CudaCopier
from profiler import Session
from profiler.core.steps.device_timers import DeviceInfo
from profiler.core.store import load_run
from profiler.drivers.runner import RunConfig, run_scenario
from scenarios import Scenario
from scenarios.fashion_vgg import SyntheticFashion


class BrokenItem(ValueError):
    """Raised by ``Items`` at ``fail_at``; one-string constructor, so a worker can re-raise it."""


class Items:
    """Item i is ``(tensor([i, i]), i % 3)``; ``__getitem__`` sleeps ``sleep_s`` and raises at ``fail_at``."""

    def __init__(self, n: int, *, sleep_s: float = 0.0, fail_at: int | None = None) -> None:
        self.n = n
        self.sleep_s = sleep_s
        self.fail_at = fail_at
        self.calls = 0  # counted in this process only (workers=0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if i == self.fail_at:
            raise BrokenItem(f"item {i} is broken")
        return torch.tensor([float(i), float(i)]), i % 3


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def live(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def children() -> set[int]:
    """This process's children other than stallscope's own sampler processes (one beside each open Session)."""
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.cmdline()[1:3] != ["-m", "profiler.core.sampler_process"]
    }


@pytest.fixture(autouse=True)
def no_leftover_threads() -> Iterator[None]:
    yield
    assert wait_until(lambda: not prefetch_threads(), timeout=5), prefetch_threads()


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b, strict=True)
    )


# -- batches, config, epochs -------------------------------------------------------------------------------


def test_registered() -> None:
    assert "prefetch" in pipelines.names()
    assert isinstance(pipelines.get("prefetch"), PrefetchPipeline)


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_as_naive_over_epochs(workers: int) -> None:
    data = SyntheticFashion(length=70, seed=0, augment=True)  # augmentation depends on (seed, i, epoch)
    spec = LoaderSpec(batch_size=16, workers=workers, seed=3)
    fast = pipelines.get("prefetch").build(data, spec)
    slow = pipelines.get("naive").build(data, spec)
    try:
        epochs = []
        for epoch in range(3):
            data.set_epoch(epoch)  # as the runner does; persistent workers must see it too
            got = [fast.to_device(b) for b in fast.batches]
            assert same(got, [slow.to_device(b) for b in slow.batches]), (workers, epoch)
            epochs.append(got)
        assert not same(epochs[0], epochs[1])  # fresh shuffle and augmentation each epoch
        for x, y in epochs[0]:
            assert x.shape == (16, 1, 28, 28) and x.device.type == "cpu" and y.dtype == torch.int64
    finally:
        fast.close()
    assert fast.config == {
        "pipeline": "prefetch",
        "workers": workers,
        "pin_memory": False,
        "prefetch_factor": 2 if workers else None,
        "persistent_workers": workers > 0,
        "device_prefetch": "cpu-thread",
        "depth": 2,
    }


def test_to_device_on_cpu_hands_back_the_same_tensors() -> None:
    built = PrefetchPipeline().build(Items(8), LoaderSpec(batch_size=4, shuffle=False))
    batch = next(iter(built.batches))
    x, y = built.to_device(batch)
    assert x is batch[0] and y is batch[1]  # nothing left to copy: the h2d phase is near zero
    built.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_abandoned_epoch_does_not_shift_the_next(workers: int) -> None:
    spec = LoaderSpec(batch_size=4, workers=workers, seed=7)
    fast = pipelines.get("prefetch").build(Items(24), spec)
    slow = pipelines.get("naive").build(Items(24), spec)
    try:
        for built in (fast, slow):
            it = iter(built.batches)
            next(it)
            del it  # abandoned after one batch, as the runner does when it reaches its step count
        assert same(list(fast.batches), list(slow.batches))
    finally:
        fast.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_read_to_its_end_ahead_of_the_consumer_does_not_shift_the_next(workers: int) -> None:
    # the prefetch thread reads the whole epoch (6 batches, depth 8) while the consumer takes one: its sampler
    # is advanced past the end, where RandomSampler draws once more; naive's is not (one pass in five of
    # test_an_abandoned_epoch_does_not_shift_the_next beside busy processes, by chance; here every time)
    spec = LoaderSpec(batch_size=4, workers=workers, seed=7)
    fast = PrefetchPipeline(depth=8).build(Items(24), spec)
    slow = pipelines.get("naive").build(Items(24), spec)
    try:
        for built in (fast, slow):
            it = iter(built.batches)
            next(it)
            if built is fast:
                assert wait_until(lambda: not prefetch_threads(), timeout=20)  # read to its end, and done
            del it
        assert same(list(fast.batches), list(slow.batches))
    finally:
        fast.close()


def test_depth_bounds_the_batches_loaded_ahead() -> None:
    data = Items(64)
    built = PrefetchPipeline(depth=3).build(data, LoaderSpec(batch_size=2, shuffle=False))
    it = iter(built.batches)
    next(it)
    # one batch taken, three loaded ahead, then the thread waits for a free slot
    assert wait_until(lambda: data.calls == 2 * 4, timeout=5), data.calls
    time.sleep(0.2)  # a negative check: nothing more may be loaded
    assert data.calls == 2 * 4
    assert built.config["depth"] == 3
    built.close()
    assert wait_until(lambda: not prefetch_threads(), timeout=2)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="depth"):
        PrefetchPipeline(depth=0)
    with pytest.raises(ValueError, match="workers"):
        PrefetchPipeline().build(Items(8), LoaderSpec(batch_size=4, workers=-1))


# -- errors and shutdown -----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_error_reaches_the_consumer_where_its_batch_was_due(workers: int) -> None:
    built = PrefetchPipeline().build(Items(32, fail_at=13), LoaderSpec(batch_size=4, workers=workers, shuffle=False))
    delivered = []
    try:
        with pytest.raises(BrokenItem, match="item 13 is broken"):
            for batch in built.batches:
                delivered.append(batch)
        assert [int(x[0, 0]) for x, _ in delivered] == [0, 4, 8]  # the batches before the failing one
        # the loader is still usable: the next epoch fails at the same place, not earlier
        with pytest.raises(BrokenItem):
            list(built.batches)
    finally:
        built.close()


def test_abandoning_and_closing_leaves_no_thread_and_no_worker(tmp_path: Path) -> None:
    before = children()
    built = PrefetchPipeline().build(Items(400, sleep_s=0.002), LoaderSpec(batch_size=4, workers=2))
    with Session(tmp_path, sources=[]) as s:
        batches = s.wrap(built.batches)
        for i, _ in enumerate(batches):
            if i == 2:
                break
        workers = children() - before
        assert len(workers) == 2 and prefetch_threads()
        batches.close()  # what the runner does at the end of an epoch loop: GeneratorExit reaches the pipeline
        assert wait_until(lambda: not prefetch_threads(), timeout=2)
        assert live(workers) == workers  # persistent: they outlive the epoch
    built.close()
    assert wait_until(lambda: not live(workers), timeout=10), live(workers)


def test_close_stops_a_thread_that_nobody_consumes() -> None:
    built = PrefetchPipeline().build(Items(400, sleep_s=0.01), LoaderSpec(batch_size=4))
    it = iter(built.batches)
    next(it)  # the thread runs ahead and then waits for a slot, with the consumer holding a live generator
    assert prefetch_threads()
    built.close()
    assert wait_until(lambda: not prefetch_threads(), timeout=2)
    assert list(it) == []  # the closed epoch just ends


def test_runner_with_prefetch_and_workers(tmp_path: Path) -> None:
    scenario = Scenario(
        name="tiny",
        dataset=lambda: Items(24),  # 3 batches an epoch: the run spans several epochs
        model=lambda: nn.Linear(2, 3),
        loss=F.cross_entropy,
        batch_size=8,
        steps=8,
        warmup=2,
    )
    before = children()
    cfg = RunConfig(
        out=tmp_path, device=DeviceInfo("cpu", "cpu", "cpu"), pipeline="prefetch", workers=2, attribution=False
    )
    session = run_scenario(scenario, cfg)
    assert session.status == "complete"
    rec = load_run(tmp_path)
    assert len(rec.steps) == 10
    assert rec.meta["loader"]["device_prefetch"] == "cpu-thread" and rec.meta["loader"]["persistent_workers"]
    assert wait_until(lambda: not live(children() - before), timeout=10)


# -- CUDA copier logic through fakes -----------------------------------------------------------------------


class FakeCuda:
    """The few ``torch.cuda`` names the copier uses; every call lands in ``log`` in order."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.current = "consumer"  # the calling thread's current stream
        self.consumer = FakeStream("consumer", self)

    def Stream(self, device: torch.device) -> FakeStream:  # mirrors torch.cuda.Stream
        return FakeStream("side", self)

    def Event(self) -> FakeEvent:  # mirrors torch.cuda.Event
        return FakeEvent(self)

    @contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        prev, self.current = self.current, s.name
        try:
            yield
        finally:
            self.current = prev

    @contextmanager
    def device(self, d: torch.device) -> Iterator[None]:
        yield

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.consumer


class FakeStream:
    def __init__(self, name: str, cuda: FakeCuda) -> None:
        self.name = name
        self.cuda = cuda

    def wait_event(self, ev: FakeEvent) -> None:
        self.cuda.log.append(("wait", self.name, ev))


class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda

    def record(self, stream: FakeStream) -> None:
        self.cuda.log.append(("record", stream.name, self))


class FakeTensor(torch.Tensor):
    """A real tensor whose ``to`` and ``record_stream`` report to the fake CUDA instead of needing a GPU."""

    cuda: FakeCuda

    def to(self, *args: Any, **kwargs: Any) -> FakeTensor:  # type: ignore[override]
        out = torch.Tensor.clone(self).as_subclass(FakeTensor)
        self.cuda.log.append(("copy", self.cuda.current, kwargs.get("non_blocking"), out))
        return out

    def record_stream(self, stream: Any) -> None:
        self.cuda.log.append(("record_stream", stream.name, self))


def test_cuda_copier_orders_copy_event_wait_and_record_stream() -> None:
    cuda = FakeCuda()
    FakeTensor.cuda = cuda
    copier = _CudaCopier(torch.device("cuda", 0), cuda=cuda)
    x, y = torch.ones(2, 3).as_subclass(FakeTensor), torch.arange(2).as_subclass(FakeTensor)
    batch = {"x": x, "pair": (y, "meta")}

    pending = copier.start(batch)  # in the prefetch thread
    copies = [e for e in cuda.log if e[0] == "copy"]
    assert len(copies) == 2 and all(e[1] == "side" and e[2] is True for e in copies)  # async, on the side stream
    assert cuda.log[-1][:2] == ("record", "side")  # the event is recorded after the copies, on the side stream
    event = cuda.log[-1][2]
    assert cuda.current == "consumer"  # the side stream was current only for the copy

    cuda.log.clear()
    out = copier.finish(pending)  # in the consumer, at hand-over
    assert cuda.log[0] == ("wait", "consumer", event)  # the consumer stream waits before anything uses the batch
    recorded = [e[2] for e in cuda.log[1:] if e[:2] == ("record_stream", "consumer")]
    assert len(recorded) == 2 and {id(t) for t in recorded} == {id(out["x"]), id(out["pair"][0])}
    assert out["pair"][1] == "meta" and out["x"] is not x  # the copies, not the host tensors
    assert torch.equal(out["x"], x)

    second = copier.start(batch)
    assert second.copied is not event  # one event per batch


# -- overlap ground truth ----------------------------------------------------------------------------------


def _median_wait_ms(pipeline: str, tmp: Path, load_s: float, compute_s: float, steps: int = 10) -> float:
    """Median measured data wait per step, loader of ``load_s`` per batch, a step of ``compute_s``."""
    built = pipelines.get(pipeline).build(Items(steps, sleep_s=load_s), LoaderSpec(batch_size=1, shuffle=False))
    try:
        with Session(tmp, warmup=2, sources=[]) as s:
            for batch in s.wrap(built.batches):
                with s.phase("h2d"):
                    built.to_device(batch)
                with s.phase("compute"):
                    time.sleep(compute_s)
    finally:
        built.close()
    waits = [row.data_wait_s for row in load_run(tmp).steps if not row.warmup]
    assert len(waits) == steps - 2
    return statistics.median(waits) * 1e3


def test_prefetch_hides_the_load_under_compute(tmp_path: Path) -> None:
    # load 40 ms, compute 60 ms: prefetch waits ~max(0, 40 - 60) = 0, naive waits the whole 40 ms
    assert _median_wait_ms("prefetch", tmp_path / "p", 0.040, 0.060) < 15
    assert _median_wait_ms("naive", tmp_path / "n", 0.040, 0.060) > 30


def test_prefetch_waits_only_for_the_load_compute_cannot_hide(tmp_path: Path) -> None:
    # load 50 ms, compute 20 ms: ~30 ms of the load is still exposed each step
    wait = _median_wait_ms("prefetch", tmp_path / "p", 0.050, 0.020)
    assert 18 < wait < 45, wait


# -- real GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_side_stream_copy_is_correct_and_on_the_device() -> None:
    data = SyntheticFashion(length=70, seed=0, augment=False)
    spec = LoaderSpec(batch_size=16, workers=2, seed=1, device="cuda")
    built = pipelines.get("prefetch").build(data, spec)
    want = list(pipelines.get("naive").build(data, LoaderSpec(batch_size=16, workers=0, seed=1)).batches)
    try:
        got = []
        for batch in built.batches:
            x, y = built.to_device(batch)
            assert x.device.type == "cuda" and y.device.type == "cuda"
            got.append((x * 1, y))  # a kernel on the consumer stream reads the copy
        torch.cuda.synchronize()
        assert same([(x.cpu(), y.cpu()) for x, y in got], want)
    finally:
        built.close()
    assert built.config["pin_memory"] is True and built.config["device_prefetch"] == "cuda-side-stream"
