"""A plain PyTorch training script, with no stallscope code in it, to try zero-code profiling on:

    stallscope run -- python examples/train.py --workers 2 --steps 200
    stallscope run -- torchrun --nproc-per-node 2 examples/train.py --steps 60

Under torchrun (WORLD_SIZE set) it trains data-parallel: gloo, a DistributedSampler, DistributedDataParallel.

Its Dataset reads each item (``--read-ms``: a sleep standing in for storage latency, a disk or a network
filesystem; 0 for data already in memory), decodes a JPEG and augments it (the usual CPU-bound input
pipeline), and its loop times its own data wait, which it prints at the end (and writes with --truth FILE): the
ground truth the tests compare stallscope's stack-sample estimate against. Data is generated in memory.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torchvision.transforms import v2


def make_jpegs(n: int, size: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        yy, xx = np.mgrid[0:size, 0:size]
        img = np.stack(
            [
                (xx * rng.uniform(0.2, 1)) % 256,
                (yy * rng.uniform(0.2, 1)) % 256,
                ((xx + yy) * rng.uniform(0.2, 1)) % 256,
            ],
            axis=-1,
        ).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class JpegDataset(torch.utils.data.Dataset):
    def __init__(self, jpegs: list[bytes], crop: int, read_s: float = 0.0) -> None:
        self.jpegs = jpegs
        self.read_s = read_s
        self.tf = v2.Compose(
            [
                v2.PILToTensor(),
                v2.RandomResizedCrop(crop, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.5] * 3, [0.25] * 3),
            ]
        )

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        if self.read_s:
            time.sleep(self.read_s)  # reading the file from storage
        img = Image.open(io.BytesIO(self.jpegs[i % len(self.jpegs)]))
        img.load()
        return self.tf(img.convert("RGB")), i % 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--image-size", type=int, default=320)
    ap.add_argument("--crop", type=int, default=64)
    ap.add_argument("--read-ms", type=float, default=2.0, help="storage latency per item (0: data in memory)")
    ap.add_argument("--truth", help="write the loop's own data-wait fractions to this JSON file ({rank}: the rank)")
    args = ap.parse_args()
    torch.manual_seed(0)
    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    data = JpegDataset(make_jpegs(64, args.image_size), args.crop, args.read_ms / 1e3)
    sampler = torch.utils.data.DistributedSampler(data) if distributed else None
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, num_workers=args.workers, shuffle=sampler is None, sampler=sampler
    )
    model = build_model(distributed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    wait = first_wait = 0.0
    second: float | None = None  # when the second step's next() began: the first step (it starts the workers) is
    start = time.perf_counter()  # warm-up in stallscope's figures
    it = iter(loader)
    for step in range(args.steps):
        t = time.perf_counter()
        x, y = next(it)
        wait += time.perf_counter() - t
        if step == 0:
            first_wait = wait
        elif step == 1:
            second = t
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    end = time.perf_counter()
    total = end - start
    who = f"rank {rank} " if distributed else ""
    print(f"{who}data wait fraction (measured by the script itself): {wait / total:.3f} over {total:.1f} s")
    if args.truth:
        after = (wait - first_wait) / (end - second) if second is not None else None
        with open(args.truth.format(rank=rank), "w") as fh:
            json.dump({"data_wait_fraction": wait / total, "data_wait_fraction_after_first_step": after,
                       "seconds": total, "steps": args.steps}, fh)  # fmt: skip
    if distributed:
        dist.destroy_process_group()


def build_model(distributed: bool) -> nn.Module:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    return nn.parallel.DistributedDataParallel(model) if distributed else model


if __name__ == "__main__":
    main()
