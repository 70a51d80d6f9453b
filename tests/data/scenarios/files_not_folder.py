"""A file-backed scenario (``data`` set) whose dataset is the user's own class, not an image folder.

Declared file-backed, it looks like one the dali pipeline can read; only building the loader finds that
DALI has no image-folder source to read. The tuner's default pipeline set must then note dali as failed
and go on with the others (an explicit ``--pipelines dali`` stays bad input). Every cost is nil: the items
are made in memory, whatever the data directory holds.
"""

import torch
from torch import nn

from scenarios import Scenario


def squared_error(out, y):
    return (out - y.unsqueeze(1).float()).square().mean()


class OwnItems(torch.utils.data.Dataset):
    def __init__(self, options):
        self.root = options.root

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return torch.full((4,), float(i % 7)), i % 3


scenario = Scenario(
    name="files-not-folder",
    dataset=OwnItems,
    model=lambda: nn.Linear(4, 3),
    loss=squared_error,
    batch_size=8,
    steps=5,
    warmup=1,
    data="imagenet-like",
    data_count=8,
    description="declares a data directory but reads it with its own dataset class",
)
