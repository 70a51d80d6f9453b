"""Known-cost scenario for the tuner: one loader worker and batch 16 double-and-more the default's throughput.

- loader: every item costs ITEM_S (a sleep: decode + augment), paid in the training process with 0
  workers and in parallel with the model's forward with 1 or more;
- model: an accelerator with LANES lanes (see knee.py): ceil(batch / LANES) passes of PASS_S each.
The loss is a squared error (cross_entropy's log_softmax would enter torch's thread pool, costly on a loaded
2-core machine). All costs are sleeps, so they do not depend on what else the CPU runs.

Expected samples/s (loader ms per batch, forward ms):
    batch 8,  0 workers: 8 / (16 + 40 ms) = 143       1+ workers: 8 / max(16, 40) ms = 200
    batch 16, 0 workers: 16 / (32 + 40 ms) = 222      1+ workers: 16 / max(32, 40) ms = 400
    batch 32, 0 workers: 32 / (64 + 80 ms) = 222      1+ workers: 32 / max(64, 80) ms = 400
The best of the grid is ~400 samples/s (batch >= 16 with >= 1 worker); the default (batch 8, 0 workers,
naive) makes ~143, so a tuner that finds the best measures a speedup of ~2.8.
"""

import math
import time

import torch
from torch import nn

from scenarios import Scenario

ITEM_S = 0.002
LANES = 16
PASS_S = 0.040


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(ITEM_S)
        return torch.full((4,), float(i % 7)), i % 3


class Lanes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(math.ceil(x.shape[0] / LANES) * PASS_S)
        return self.lin(x)


scenario = Scenario(
    name="tune",
    dataset=Items,
    model=Lanes,
    loss=squared_error,
    batch_size=8,
    steps=30,
    warmup=2,
    description="sleep-timed loader (2 ms an item) and a 16-lane model (40 ms a pass)",
)
