"""Known-cost scenario for storage: each item reads BYTES from the emulated store (pipelines.store.pace: the run's
``--store-mbps``, or none) inside its fetch stage, then decodes and augments for known sleeps; the model sleeps
MODEL_S a step. With 2 workers and a slow store the loader waits on the store; without one it is bound by its
10 ms of work per item. ``whatif --cached`` / ``--storage-mbps`` predict the other stores; ``--check`` runs them.
"""

import time

import torch
from torch import nn

from pipelines import stages, store
from scenarios import Scenario

BYTES = 100_000
WORK_S = {"decode": 0.005, "augment": 0.005}
MODEL_S = 0.002


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        with stages.timed("fetch"):
            store.pace(BYTES)
        for stage, seconds in WORK_S.items():
            with stages.timed(stage):
                time.sleep(seconds)
        return torch.full((4,), float(i % 5)), i % 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        time.sleep(MODEL_S)
        return self.lin(x)


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


scenario = Scenario(
    name="store-costs",
    dataset=Items,
    model=Model,
    loss=squared_error,
    batch_size=4,
    steps=40,
    warmup=4,
    description="100 kB per item from the emulated store, 10 ms of work per item, a 2 ms model",
)
