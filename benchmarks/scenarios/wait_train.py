"""A plain PyTorch training script whose items wait (4 ms each, as storage or a network would), for the tuner's
benchmark of ``tune -- CMD`` (benchmarks/tune_vs_grid.py). Nothing in it knows stallscope: it is the kind of script
``stallscope tune -- python wait_train.py`` tunes unchanged.

    python benchmarks/scenarios/wait_train.py [--steps N] [--batch-size 32] [--workers 0]
"""

import argparse
import time

import torch
from torch import nn

WIDTH, LAYERS = 1024, 16


class WaitingItems(torch.utils.data.Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((WIDTH,), float(i % 7) / 7), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)), nn.Linear(WIDTH, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(
        WaitingItems(), batch_size=args.batch_size, num_workers=args.workers, shuffle=True
    )
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
