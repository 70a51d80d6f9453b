"""Known-cost scenario for the GPU's wait for the host: a loader whose items compute in Python (holding the GIL)
and a model of many tiny kernels, for a simulated device whose launches hold the GIL too (``sim:NAME,launch=gil``).

- loader: every item burns ITEM_CPU_S of CPU in a Python loop (the GIL held, as a pure-Python augmentation
  holds it), so a batch of 8 costs W = 24 ms of CPU;
- model: LAYERS tiny linear layers: 259 kernels a step of next to no device time, each launched by the training
  thread (``launch=gil``: the calibrated host cost, 7.3 ms a step and 34 us a kernel, spread over the launches:
  L = 16.1 ms a step).

naive, 0 workers: the training thread loads each batch (input: W), then launches (host: L): input-bound, W = 1.5L.
prefetch, 0 workers: a thread in the training process loads while the training thread launches, and the two share
one GIL: the loader takes it while a launch's C++ dispatch runs without it, and keeps it until the training thread
has waited the switch interval (5 ms), so the launches crawl while the next batch loads and the device waits for
the host (measured 2026-11-29, 7 runs, 3 of them beside two busy processes: prefetch host 95.6-97.8% against input
0.1-0.2%, naive input 58-60% against host 36-39%). The item's cost keeps naive's input above its host: W = 1.5L.
"""

import time

import torch
from torch import nn

from scenarios import Scenario

ITEM_CPU_S = 0.003
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
    description="items that compute in Python (0.65 ms each, the GIL held); a model of many tiny kernels",
)
