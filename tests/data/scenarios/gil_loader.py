"""Known-cost scenario for the GPU's wait for the host: a loader whose items compute in Python (holding the GIL)
and a model of many tiny kernels, for a simulated device whose launches hold the GIL too (``sim:NAME,launch=gil``).

- loader: every item burns ITEM_CPU_S of CPU in a Python loop (the GIL held, as a PIL or NumPy-free augmentation
  is), so a batch of 8 costs 16 ms of the CPU;
- model: LAYERS tiny linear layers: a few hundred kernels a step of next to no device time, each launched by
  the training thread (``launch=gil``: 10 us of Python each).

naive, 0 workers: the training thread loads each batch, then launches: the device waits for input most of the
step. prefetch, 0 workers: a thread in the training process loads while the training thread launches; the two
share the GIL, the launches slow down, and the device waits for the host.
"""

import time

import torch
from torch import nn

from scenarios import Scenario

ITEM_CPU_S = 0.002
LAYERS = 40


def burn(cpu_s):
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        burn(ITEM_CPU_S)
        return torch.full((16,), float(i % 7)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(LAYERS)))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layers(x))


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="gil-loader",
    dataset=Items,
    model=Model,
    loss=squared_error,
    batch_size=8,
    steps=60,
    warmup=5,
    description="items that compute in Python (2 ms each, the GIL held); a model of many tiny kernels",
)
