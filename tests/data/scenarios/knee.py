"""Known-cost scenario: a throughput curve with a knee at batch 16 and a compute slowdown at batch 64.

The model stands for an accelerator with LANES parallel lanes: a batch runs in ceil(batch / LANES) passes
and each pass takes PASS_S whatever how many lanes it fills, so up to LANES items cost the same time and
throughput grows with the batch until the lanes are full, then stays flat. Past CAPACITY items the batch's
working set no longer fits (cache, or device memory spilling) and every pass takes SPILL times as long.
The cost is a sleep, so it does not depend on what else the CPU runs. The dataset costs nothing. The loss
is a squared error: cross_entropy's log_softmax enters torch's thread pool even for 8 x 3 logits, which on a
loaded 2-core machine costs tens of ms of barrier waits per step and would blur the known costs.

Expected samples/s (before the loop's own cost per step, o):
    batch 8: 8 / 200 ms = 40    batch 16: 16 / 200 ms = 80    batch 32: 32 / 412 ms = 77.7
    batch 64: 64 / (4 x 412 ms) = 38.8
So batch 16 is the best and the knee (smallest batch within 5% of the best of its line); batch 32 is 3% slower,
inside the sweep's 5% (no slowdown), and batch 64 is ~50% slower than batch 32 because compute per sample doubled
while the loader's data wait stayed near zero. The knee stays at 16 while 16 / (200 + o) >= 0.95 x 32 / (412 + o),
i.e. for o up to ~35 ms, and a row's noise must lift batch 32 by 8% over batch 16 to move it: passes of 200 ms
and 32 a little slower than 16, so that a loaded host does not move it (with passes of 80 ms and 32 exactly as
fast as 16, beside two busy processes and three other tests, o reached 12-15 ms and the knee moved to 32).
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
MORE = 1.03  # a batch of more than one pass costs 3% more a pass (scheduling the passes): batch 16 is the best
FITS = 64  # a larger batch does not fit at all: the forward raises torch.OutOfMemoryError, as CUDA would


def forward_seconds(batch: int) -> float:
    if batch > FITS:
        raise torch.OutOfMemoryError(f"simulated: a batch of {batch} does not fit (at most {FITS})")
    passes = math.ceil(batch / LANES)
    return passes * PASS_S * (MORE if passes > 1 else 1.0) * (SPILL if batch > CAPACITY else 1.0)


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
