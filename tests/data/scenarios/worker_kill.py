"""Fault scenario: DataLoader worker 1 SIGKILLs itself after preparing KILL_AFTER items (an out-of-memory kill,
a node's watchdog). Run with --workers 2 or more; with 0 workers no item is prepared in a worker and the run
completes. Each item sleeps ITEM_S, so the steps before the kill are recorded at a known pace.

Worker 1 (not 0) is the one killed so that a message naming "worker 0" by default would be caught wrong.
"""

import os
import signal
import time

import torch
from torch import nn

from scenarios import Scenario

KILLED_WORKER = 1
KILL_AFTER = 40  # items worker 1 prepares before it dies: 5 of its batches of 8
ITEM_S = 0.001


class DyingItems(torch.utils.data.Dataset):
    def __init__(self):
        self.made = 0

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == KILLED_WORKER:
            self.made += 1
            if self.made > KILL_AFTER:
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(ITEM_S)
        return torch.full((4,), float(i % 7)), i % 3


scenario = Scenario(
    name="worker-kill",
    dataset=DyingItems,
    model=lambda: nn.Linear(4, 3),
    loss=nn.functional.cross_entropy,
    batch_size=8,
    steps=200,
    warmup=2,
    description="DataLoader worker 1 is SIGKILLed after 40 items",
)
