"""The workload behind the recorded py-spy outputs in this folder (see README.md): not a test.

A tiny training loop fed by a DataLoader with 2 worker processes whose ``__getitem__`` decodes an in-memory
JPEG with PIL, applies torchvision v2 transforms and does a little numpy. ``argv[1]`` is the run time in
seconds; further arguments are ignored (one recording passes odd ones to test command-line parsing).
"""

from __future__ import annotations

import io
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2


def make_jpeg(size: int = 256) -> bytes:
    rng = np.random.default_rng(0)
    arr = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class JpegDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int) -> None:
        self.n = n
        self.jpeg = make_jpeg()
        self.tf = v2.Compose(
            [
                v2.PILToTensor(),
                v2.RandomResizedCrop(128, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
            ]
        )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.open(io.BytesIO(self.jpeg))
        img = img.convert("RGB")
        x = self.tf(img)
        noise = np.random.default_rng(i).standard_normal(16).astype(np.float32)
        return x, int(noise.argmax())


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    loader = DataLoader(JpegDataset(100_000), batch_size=16, num_workers=2, shuffle=True)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 16),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    t0 = time.monotonic()
    steps = 0
    for xb, yb in loader:
        # copy=True makes the CPU stand-in for the host-to-device copy do real work (a plain .to("cpu") is a no-op)
        x = xb.to("cpu", copy=True)
        y = yb.to("cpu", copy=True)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if time.monotonic() - t0 > seconds:
            break
    print(f"steps={steps}", flush=True)


if __name__ == "__main__":
    main()
