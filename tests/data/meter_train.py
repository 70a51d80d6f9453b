"""A training script that times itself the way common training scripts do (PyTorch's ImageNet example): an
average meter for the data time (from the end of the last step to the batch's arrival) and one for the batch
time (from the end of the last step to the end of this one), around a plain ``for ... in loader`` loop.

It has no stallscope code: tests/test_instrument.py runs it under ``stallscope run --`` and checks the
start-up module's step figures against the per-step times this script writes (``--truth FILE``, a JSON list
of ``[data_s, batch_s, data_runq_s]``; ``{rank}`` in FILE is replaced under torchrun). ``data_runq_s`` is the
time the loop's thread waited for a CPU inside its data window (the kernel's schedstat, read just inside the
window's two clock reads; null where the kernel has none): the test nets out what of it fell outside ``next()``.
Each item sleeps ``--sleep-ms`` (a stand-in for storage) and does a little numpy, so the loader is slower than
the model with few workers.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class AverageMeter:
    def __init__(self) -> None:
        self.values: list[float] = []

    def update(self, value: float) -> None:
        self.values.append(value)

    @property
    def avg(self) -> float:
        return sum(self.values) / len(self.values)


def runq_s() -> float | None:
    """This thread's run-queue wait so far (s), from /proc/thread-self/schedstat; None where there is none."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class Items(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.sleep_s)
        x = np.random.default_rng(i).standard_normal(4096).astype(np.float32)
        return torch.from_numpy(np.sqrt(np.abs(x))[:256].copy()), i % 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sleep-ms", type=float, default=10.0)
    ap.add_argument("--truth", required=True)
    args = ap.parse_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    data = Items(args.sleep_ms / 1e3)
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers, sampler=sampler)
    model: nn.Module = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data_time, batch_time, data_runq = AverageMeter(), AverageMeter(), []
    end = time.time()
    q_end = runq_s()
    for i, (x, y) in enumerate(loader):
        q_data = runq_s()
        data_time.update(time.time() - end)
        data_runq.append(q_data - q_end if q_data is not None and q_end is not None else None)
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        batch_time.update(time.time() - end)
        end = time.time()
        q_end = runq_s()
        if i + 1 == args.steps:
            break
    rank = dist.get_rank() if distributed else 0
    print(f"rank {rank}: data {data_time.avg * 1e3:.2f} ms  batch {batch_time.avg * 1e3:.2f} ms")
    with open(args.truth.format(rank=rank), "w") as fh:
        json.dump(list(zip(data_time.values, batch_time.values, data_runq, strict=True)), fh)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
