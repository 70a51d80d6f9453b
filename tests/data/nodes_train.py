"""A training script over a torchdata.nodes pipeline (sampler -> parallel map on threads -> batch -> collate -> Loader),
timing itself with average meters for data time and batch time around its ``for`` loop, as
tests/data/meter_train.py does over a DataLoader. No stallscope code: tests/test_instrument.py runs it under
``stallscope run --`` and checks the start-up module's steps against the per-step pairs written to ``--truth``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import SequentialSampler
from torchdata.nodes import Batcher, Loader, Mapper, ParallelMapper, SamplerWrapper


def item(i: int, sleep_s: float) -> tuple[torch.Tensor, int]:
    time.sleep(sleep_s)
    return torch.full((256,), float(i % 7)), i % 10


def collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sleep-ms", type=float, default=10.0)
    ap.add_argument("--truth", required=True)
    args = ap.parse_args()
    sleep_s = args.sleep_ms / 1e3
    # exactly the items the run takes, read to the end: breaking out left the mapper's daemon threads inside
    # torch.full at interpreter exit, and the process aborted ("terminate called without an active exception",
    # 4 of 20 runs beside two busy loops, without stallscope)
    items = range(args.steps * args.batch_size)
    node = ParallelMapper(SamplerWrapper(SequentialSampler(items)), lambda i: item(i, sleep_s), args.workers)
    loader = Loader(Mapper(Batcher(node, batch_size=args.batch_size), collate))
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pairs = []
    end = time.time()
    for x, y in loader:
        data = time.time() - end
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        pairs.append((data, time.time() - end))
        end = time.time()
    with open(args.truth, "w") as fh:
        json.dump(pairs, fh)


if __name__ == "__main__":
    main()
