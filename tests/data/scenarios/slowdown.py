"""Known-cost scenario: batch 16 trains SLOWER than batch 8 because the loader falls behind (the SSD story).

The seed: a Caffe SSD detector trained slower at batch 16 than at batch 8 while the GPU sat idle between
batches coming from the CPU. Here the loader's cost per batch grows faster than the batch:

- every item costs ITEM_S of CPU work to produce (decode + augment: a busy loop timed on the thread's own
  CPU clock, so its CPU cost is known whatever else the machine runs; its wall time grows on a busy one),
  paid where the loader runs it;
- the items of the batch being assembled stay in memory until the batch is collated. While at most
  WORKING_SET of them are alive they fit (in cache, in RAM); each further item of the same batch pays
  SPILL_S more CPU (evicting and re-reading: a cache miss, a page out). The dataset never sees the batch
  size: it counts its own live items (a weakref finalizer per item), as real decode buffers would pressure
  memory. With workers each worker counts its own batch.

The model's forward is a fixed FORWARD_S plus PER_SAMPLE_S per item of sleep (a device that is not
saturated), and the loss is a squared error (cross_entropy's log_softmax would enter torch's thread pool,
costly on a loaded 2-core machine).

Expected with 0 workers on an idle core, per step (data wait + compute) and samples/s:
    batch 4:  4 ms + 21 ms = 25 ms -> 160      batch 8: 8 ms + 22 ms = 30 ms -> 267
    batch 16: 10 x 1 + 6 x 11 = 76 ms + 24 ms = 100 ms -> 160
So batch 16 is ~40% slower than batch 8; data wait grew ~x9.5 while compute grew ~x1.1: the loader. If the
loader gets only 1/f of a core (other jobs), its wall time is f times longer and the drop only deeper
(f = 2: ~57%): batch 16 is slower than batch 8 however busy the machine.
"""

import time
import weakref

import torch
from torch import nn

from scenarios import Scenario

ITEM_S = 0.001
WORKING_SET = 10
SPILL_S = 0.010
FORWARD_S = 0.020
PER_SAMPLE_S = 0.00025


def burn(cpu_s):
    """Busy CPU work until this thread has used ``cpu_s`` seconds of CPU time."""
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class SpillingItems(torch.utils.data.Dataset):
    def __init__(self):
        self.live = [0]  # a list so that the finalizers, which must not hold self, can update it

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        burn(ITEM_S + (SPILL_S if self.live[0] >= WORKING_SET else 0.0))
        x = torch.full((4,), float(i % 7))
        self.live[0] += 1
        weakref.finalize(x, _release, self.live)
        return x, i % 3


def _release(live):
    live[0] -= 1


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(FORWARD_S + PER_SAMPLE_S * x.shape[0])
        return self.lin(x)


scenario = Scenario(
    name="slowdown",
    dataset=SpillingItems,
    model=Model,
    loss=squared_error,
    batch_size=8,
    steps=30,
    warmup=1,
    description="CPU-work loader whose per-item cost jumps past 10 live items; sleep-timed model",
)
