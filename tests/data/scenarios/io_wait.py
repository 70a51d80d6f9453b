"""Known-cost scenario: a loader whose items WAIT rather than compute (network, cold storage, an object store).

- loader: every item waits ITEM_S (a sleep: the read's latency) and costs almost no CPU, paid in the training
  process with 0 workers and in parallel across workers with 1 or more; so W workers deliver W batches every
  batch x ITEM_S, however few cores the machine has;
- model: a fixed FORWARD_S per step (a sleep: an accelerator that is not saturated).
The loss is a squared error (cross_entropy's log_softmax would enter torch's thread pool, costly on a loaded
2-core machine). All costs are sleeps, so they do not depend on what else the CPU runs.

Expected samples/s at batch 8 (loader: 8 x 20 = 160 ms a batch in one worker; forward 20 ms):
    0 workers: 8 / (160 + 20 ms) = 44       1 worker: 8 / 160 ms = 50      2 workers: 8 / 80 ms = 100
    4 workers: 8 / 40 ms = 200              8 workers: 8 / max(20, 20) ms = 400
    16 workers: 8 / 20 ms = 400 (the forward is the bound)
So the best is 8 workers at ~400 samples/s, x9 the default's 44, on any number of cores: the workers are idle
on the CPU almost all the time. A tuner that stops at 2 workers (the cores of a 2-core machine) reaches 100,
a quarter of it. A larger batch does not help at 8 workers: batch 16 is 16 x 20 / 8 = 40 ms a batch, 400.
The 8 workers start together and so deliver their batches in bursts of 8, one burst every batch x 20 ms: a
measured window that is not a whole number of bursts long reads above or below 400 (by up to ~20% at
batch 16-64 in a trial of 1-4 s), which is why the tests that use this file hold the batch at 8.
"""

import time

import torch
from torch import nn

from scenarios import Scenario

ITEM_S = 0.020
FORWARD_S = 0.020


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class WaitingItems(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(ITEM_S)
        return torch.full((4,), float(i % 7)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(FORWARD_S)
        return self.lin(x)


scenario = Scenario(
    name="io-wait",
    dataset=WaitingItems,
    model=Model,
    loss=squared_error,
    batch_size=8,
    steps=30,
    warmup=2,
    description="loader items wait 20 ms each (I/O latency, no CPU); sleep-timed 20 ms model",
)
