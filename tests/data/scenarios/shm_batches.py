"""Known-cost scenario for the loader's shared memory: every item is 1 MiB of float32 (a 512 x 512 image in one
channel), made at once, and the model sleeps FORWARD_S a step, so the workers are always ahead: every prefetch
slot holds a finished batch in /dev/shm. At batch B each batch is B MiB.
"""

import time

import torch
from torch import nn

from scenarios import Scenario

FORWARD_S = 0.040
ITEM = (512, 512)  # 1 MiB of float32


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full(ITEM, float(i % 5)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(1, 3)

    def forward(self, x):
        time.sleep(FORWARD_S)
        return self.lin(x[:, :1, 0])


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="shm-batches",
    dataset=Items,
    model=Model,
    loss=squared_error,
    batch_size=4,
    steps=60,
    warmup=5,
    description="1 MiB items made at once, a 40 ms sleeping model: the loader always ahead, its batches in /dev/shm",
)
