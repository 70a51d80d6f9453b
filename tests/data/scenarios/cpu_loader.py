"""Known-cost scenario: a loader whose items COMPUTE (decode + augment on the CPU), the opposite of io_wait.py.

- loader: every item costs ITEM_CPU_S of CPU work (a busy loop timed on the thread's own CPU clock, so its
  CPU cost is known whatever else the machine runs; its wall time grows on a busy one). A worker is busy on
  the CPU all the time it prepares items: its CPU busy fraction is ~100% while it has a core to itself;
- model: a fixed FORWARD_S per step (a sleep: an accelerator that is not saturated, leaving the cores to
  the loader).
The loss is a squared error (cross_entropy's log_softmax would enter torch's thread pool).

Expected samples/s at batch 8 on c idle cores (40 ms of CPU a batch; forward 10 ms):
    0 workers: 8 / (40 + 10 ms) = 160      1 worker: 8 / 40 ms = 200      2 workers (c >= 2): 8 / 20 ms = 400
    W workers: 8 / max(40 / min(W, c), 10) ms: no more than c workers ever run at once, so on 2 cores 4 or 8
    workers make the same 400 (less, for the switching) while each gets half a core or less.
So on a 2-core machine the best is 2 workers; a tuner that reads the workers' CPU use (~100% each at 2)
knows that no third fits without trying, and one that tries 4 finds no gain.
"""

import time

import torch
from torch import nn

from scenarios import Scenario

ITEM_CPU_S = 0.005
FORWARD_S = 0.010


def burn(cpu_s):
    """Busy CPU work until this thread has used ``cpu_s`` seconds of CPU time."""
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class ComputedItems(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        burn(ITEM_CPU_S)
        return torch.full((4,), float(i % 7)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(FORWARD_S)
        return self.lin(x)


scenario = Scenario(
    name="cpu-loader",
    dataset=ComputedItems,
    model=Model,
    loss=squared_error,
    batch_size=8,
    steps=30,
    warmup=2,
    description="loader items cost 5 ms of CPU each; sleep-timed 10 ms model",
)
