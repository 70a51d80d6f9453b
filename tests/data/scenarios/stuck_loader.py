"""Known-cost scenario for the shared-memory watch: a loader that stops delivering. Items are 4 KiB tensors; each
worker process serves SERVED items (two batches of 4), then sleeps an hour in the next, as a batch that a worker's
queue dropped never comes: with 2 workers, steps 0-3 arrive and the fifth ``next()`` waits (tests/test_shmwatch.py).
Counted per process, not by index: the loader shuffles."""

import time

import torch
from torch import nn

from scenarios import Scenario

SERVED = 8


class Items(torch.utils.data.Dataset):
    def __init__(self):
        self.served = 0  # in each worker, its own copy's count

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if self.served >= SERVED:
            time.sleep(3600)
        self.served += 1
        return torch.zeros(1024), i % 2


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="stuck-loader",
    dataset=Items,
    model=lambda: nn.Linear(1024, 1),
    loss=squared_error,
    batch_size=4,
    steps=20,
    warmup=1,
    description="a loader whose batches stop coming after the third",
)
