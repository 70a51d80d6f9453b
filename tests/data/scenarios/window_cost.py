"""A scenario whose steps a kernel window slows as CUPTI did on an H200 (tests/cupti_like.py): with
``STALLSCOPE_KERNEL_RECORDER=tests.cupti_like:CuptiLike`` each forward's work is FORWARD_S, 20% more inside a
window, and the window's stop holds the training thread 600 ms. ``WINDOW_COST_OWN=FILE``: when each batch's first
item was asked for (``time.perf_counter``, 0 workers: inside the loop's ``next()``) is written there at exit, the
loop's own clock (tests/test_window_apart.py)."""

import atexit
import os
import time

import torch
from torch import nn

from scenarios import Scenario
from tests import cupti_like

FORWARD_S = 0.006
OWN = os.environ.get("WINDOW_COST_OWN")
STARTS: list[float] = []
CALLS = [0]


def _write_own() -> None:
    with open(OWN, "w") as f:
        f.write("\n".join(map(repr, STARTS)) + "\n")


if OWN:
    atexit.register(_write_own)


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        CALLS[0] += 1
        if CALLS[0] % 8 == 1:  # a batch's first item (batch 8, 0 workers: fetched one after the other)
            STARTS.append(time.perf_counter())
        return torch.zeros(4), 0


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        cupti_like.work(FORWARD_S)
        return self.lin(x)


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="window-cost",
    dataset=Items,
    model=Model,
    loss=squared_error,
    batch_size=8,
    steps=30,
    warmup=2,
    description="steps of known cost, slowed inside a kernel window",
)
