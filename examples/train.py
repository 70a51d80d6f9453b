"""A plain PyTorch training script, with no stallscope code in it, to try zero-code profiling on:

    stallscope run -- python examples/train.py --workers 2 --steps 200

Its Dataset decodes a JPEG and augments it per item (the usual CPU-bound input pipeline) and its loop
times its own data wait, which it prints at the end (and writes with --truth FILE): the ground truth the
tests compare stallscope's stack-sample estimate against. Data is generated in memory (synthetic).
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
import torch
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
    def __init__(self, jpegs: list[bytes], crop: int) -> None:
        self.jpegs = jpegs
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
    ap.add_argument("--truth", help="write the loop's own measured data-wait fraction to this JSON file")
    args = ap.parse_args()
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(
        JpegDataset(make_jpegs(64, args.image_size), args.crop),
        batch_size=args.batch_size,
        num_workers=args.workers,
        shuffle=True,
    )
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
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    wait = 0.0
    start = time.perf_counter()
    it = iter(loader)
    for step in range(args.steps):
        t = time.perf_counter()
        x, y = next(it)
        wait += time.perf_counter() - t
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    total = time.perf_counter() - start
    print(f"data wait fraction (measured by the script itself): {wait / total:.3f} over {total:.1f} s")
    if args.truth:
        with open(args.truth, "w") as fh:
            json.dump({"data_wait_fraction": wait / total, "seconds": total, "steps": args.steps}, fh)


if __name__ == "__main__":
    main()
