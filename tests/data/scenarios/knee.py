"""Known-cost scenario: a throughput curve with a knee at batch 16 and a compute slowdown at batch 64.

The model stands for an accelerator with LANES parallel lanes: a batch runs in ceil(batch / LANES) passes
and each pass takes PASS_S whatever how many lanes it fills, so up to LANES items cost the same time and
throughput grows with the batch until the lanes are full, then stays flat. Past CAPACITY items the batch's
working set no longer fits (cache, or device memory spilling) and every pass takes SPILL times as long.
The cost is a sleep, so it does not depend on what else the CPU runs. The dataset costs nothing. The loss
is a squared error: cross_entropy's log_softmax enters torch's thread pool even for 8 x 3 logits, which on a
loaded 2-core machine costs tens of ms of barrier waits per step and would blur the known costs.

Expected samples/s (before the loop's own cost per step, o):
    batch 8: 8 / 200 ms = 40    batch 16: 16 / 200 ms = 80    batch 32: 32 / 400 ms = 80
    batch 64: 64 / (4 x 400 ms) = 40
So the knee (smallest batch within 5% of the best of its line) is 16, and batch 64 is ~50% slower than
batch 32 because compute per sample doubled (12.5 -> 25 ms) while the loader's data wait stayed near zero.
The knee stays at 16 while (400 + o) / (400 + 2 o) >= 0.95, i.e. for o up to ~22 ms: a pass of 200 ms, so
that a loaded host does not move it (beside two busy processes and three other tests, with passes of 80 ms,
o reached 12-15 ms and the knee moved to 32, as it should on such a host).
A batch above 64 raises torch.OutOfMemoryError in the forward, as a GPU out of memory would.
"""

import math
import time

import torch
from torch import nn

from scenarios import Scenario

LANES = 16
PASS_S = 0.200
CAPACITY = 32
SPILL = 2.0
FITS = 64  # a larger batch does not fit at all: the forward raises torch.OutOfMemoryError, as CUDA would


def forward_seconds(batch: int) -> float:
    if batch > FITS:
        raise torch.OutOfMemoryError(f"simulated: a batch of {batch} does not fit (at most {FITS})")
    return math.ceil(batch / LANES) * PASS_S * (SPILL if batch > CAPACITY else 1.0)


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full((4,), float(i % 7)), i % 3


class Lanes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(forward_seconds(x.shape[0]))
        return self.lin(x)


scenario = Scenario(
    name="knee",
    dataset=Items,
    model=Lanes,
    loss=squared_error,
    batch_size=8,
    steps=30,
    warmup=1,
    description="sleep-timed model: 16 lanes of 80 ms, twice as slow past 32 items",
)
