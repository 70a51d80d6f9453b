"""A scenario whose model reads a value in forward (``.item()``): it trains on a CPU, but its step cannot be
traced on the meta device, so a simulated device cannot cost it (bad input, exit 2)."""

import torch
from torch import nn

from scenarios import Scenario


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4,), float(i % 5)), i % 3


class ReadsAValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        scale = 1.0 if x.sum().item() > 0 else 2.0
        return self.lin(x) * scale


scenario = Scenario(
    name="untraceable",
    dataset=Items,
    model=ReadsAValue,
    loss=nn.functional.cross_entropy,
    batch_size=8,
    steps=4,
    warmup=1,
)
