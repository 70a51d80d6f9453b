"""Fault scenario for stopping a sweep or tune part-way: only the default configuration (batch 4, no loader
workers) settles; any other never does, so it is still running when the signal comes.

- batch 4, 0 workers: every step costs STEADY_S (a sleep), stable after the sweep's 5 steps;
- any other batch: the forward alternates NOISY_S between two sleeps, and items loaded in a worker alternate
  too, so the step time's 95% interval stays far wider than 5% of its mean for thousands of steps.
"""

import time

import torch
from torch import nn

from scenarios import Scenario

STEADY_S = 0.020
NOISY_S = (0.001, 0.030)


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class Items(torch.utils.data.Dataset):
    def __init__(self):
        self.made = 0

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            self.made += 1
            time.sleep(NOISY_S[self.made % 2] / 4)
        return torch.full((4,), float(i % 7)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        time.sleep(STEADY_S if x.shape[0] == 4 else NOISY_S[self.calls % 2])
        return self.lin(x)


scenario = Scenario(
    name="stop-mid-sweep",
    dataset=Items,
    model=Model,
    loss=squared_error,
    batch_size=4,
    steps=30,
    warmup=2,
    description="only batch 4 with no workers settles: a sweep or tune is still running its second configuration",
)
