"""Known-cost scenario for the tuner's benchmark (benchmarks/tune_vs_grid.py): items of one kind, a step that computes.

STALLSCOPE_ITEMS picks the items' cost (each in the DataLoader's __getitem__, per sample):
- ``wait``: sleep ITEM_WAIT_S (4 ms): a loader that waits (storage, network), on no CPU;
- ``spin``: burn ITEM_SPIN_S (2 ms) of CPU in Python: a loader that computes (decode, augment);
- ``cheap``: a small tensor, no cost of its own.

The model computes for real on the CPU (LAYERS linear layers of WIDTH, forward and backward): about 40 ms a step at
batch 32 on the project's 2-core host, growing with the batch, so that loader workers and the training thread
compete for the cores as they do on a real host.
"""

import os
import time

import torch
from torch import nn

from scenarios import Scenario

ITEMS = os.environ.get("STALLSCOPE_ITEMS", "wait")
ITEM_WAIT_S = 0.004
ITEM_SPIN_S = 0.002
WIDTH = 1024
LAYERS = 16


def burn(cpu_s):
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        if ITEMS == "wait":
            time.sleep(ITEM_WAIT_S)
        elif ITEMS == "spin":
            burn(ITEM_SPIN_S)
        return torch.full((WIDTH,), float(i % 7) / 7), i % 10


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        return self.head(self.body(x))


scenario = Scenario(
    name=f"tune-items-{ITEMS}",
    dataset=Items,
    model=Model,
    loss=nn.functional.cross_entropy,
    batch_size=32,
    steps=30,
    warmup=2,
    description=f"known-cost items ({ITEMS}) and a step that computes, for the tuner's benchmark",
)
