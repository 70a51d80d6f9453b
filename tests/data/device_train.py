"""A training loop on an asynchronous device, as CUDA runs one: a step's work is queued and returns at once, the
device runs the queue in order, and a sync waits for it. No stallscope code: tests/test_instrument_device.py
runs it under ``stallscope run --`` and checks the start-up module's device (CUDA event) figures against the
device's own record of when it worked (``--truth FILE``: its busy intervals, when each batch arrived and when each step
ended, and, modelled, when it reached each event recorded on it, on ``time.perf_counter``).

Without ``--real`` the device is a model (:class:`ModelDevice`, installed as ``torch.cuda`` so that the start-up
module's events go to it): work queued runs for exactly ``--gpu-ms``; an event is reached once the work queued
before it is done; the device writes its busy intervals, the truth. With ``--real`` it is CUDA (a matmul loop of
about ``--gpu-ms``), and the truth is the script's own CUDA events around each step's work.

``--sync step``: next(), queue the work, wait for it (the device idles while the host waits for data).
``--sync overlap``: next(), wait for the previous step's work, queue this step's: the data wait hides under the
device's work, and the device idles only for the wait it cannot hide.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset


class ModelDevice:
    """The part of ``torch.cuda`` the start-up module and this script call, on a modelled device."""

    def __init__(self) -> None:
        self.free = 0.0  # when the queued work is done (time.perf_counter)
        self.busy: list[tuple[float, float]] = []
        self.reached: list[float] = []  # when the device reached each event recorded, in order
        self.ready = False

    def run(self, seconds: float) -> None:
        start = max(time.perf_counter(), self.free)
        self.free = start + seconds
        self.busy.append((start, self.free))

    def init(self) -> None:
        self.ready = True

    def is_initialized(self) -> bool:
        return self.ready

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def get_device_name(self, index: int = 0) -> str:
        return "modelled device"

    def synchronize(self, device: object = None) -> None:
        time.sleep(max(0.0, self.free - time.perf_counter()))

    def Event(self, enable_timing: bool = False) -> ModelEvent:
        return ModelEvent(self)


class ModelEvent:
    def __init__(self, device: ModelDevice) -> None:
        self.device = device
        self.t = 0.0

    def record(self) -> None:
        self.t = max(time.perf_counter(), self.device.free)
        self.device.reached.append(self.t)

    def query(self) -> bool:
        return time.perf_counter() >= self.t

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.t - time.perf_counter()))

    def elapsed_time(self, end: ModelEvent) -> float:
        return (end.t - self.t) * 1e3


class Items(Dataset[torch.Tensor]):
    def __init__(self, item_s: float) -> None:
        self.item_s = item_s

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.item_s)
        return torch.full((16,), float(i))


class RealWork:
    """A matmul loop of about ``seconds`` on CUDA, its steps timed by the script's own events."""

    def __init__(self, seconds: float) -> None:
        self.a = torch.randn(2048, 2048, device="cuda")
        self.spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.reps = 1
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            self.a @ self.a
        torch.cuda.synchronize()
        self.reps = max(1, round(seconds / ((time.perf_counter() - t) / 10)))

    def run(self, seconds: float) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.reps):
            self.a @ self.a
        end.record()
        self.spans.append((start, end))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--item-ms", type=float, default=5.0)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--gpu-ms", type=float, default=30.0)
    ap.add_argument("--sync", choices=["step", "overlap"], default="step")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--truth", required=True)
    args = ap.parse_args()
    if args.real:
        device: ModelDevice | RealWork = RealWork(args.gpu_ms / 1e3)
        sync = torch.cuda.synchronize
    else:
        device = ModelDevice()
        torch.cuda = device  # type: ignore[assignment] - the start-up module reads torch.cuda: the model
        device.init()
        sync = device.synchronize
    loader = DataLoader(Items(args.item_ms / 1e3), batch_size=args.batch_size)
    arrived, ended = [], [time.perf_counter()]  # each batch's arrival; each step's end (the next() call follows)
    for step, _batch in enumerate(loader):
        arrived.append(time.perf_counter())
        if step == args.steps:
            break
        if args.sync == "overlap":
            sync()
        device.run(args.gpu_ms / 1e3)
        if args.sync == "step":
            sync()
        ended.append(time.perf_counter())
    sync()
    if args.real:
        assert isinstance(device, RealWork)
        ref = torch.cuda.Event(enable_timing=True)
        ref.record()
        ref.synchronize()
        t0 = time.perf_counter()
        busy = [(t0 + ref.elapsed_time(a) / 1e3, t0 + ref.elapsed_time(b) / 1e3) for a, b in device.spans]
        reached: list[float] = []  # the start-up module's events are CUDA's own here
    else:
        assert isinstance(device, ModelDevice)
        busy, reached = device.busy, device.reached
    with open(args.truth, "w", encoding="utf-8") as fh:
        json.dump({"busy": busy, "arrived": arrived, "ended": ended, "reached": reached}, fh)


if __name__ == "__main__":
    main()
