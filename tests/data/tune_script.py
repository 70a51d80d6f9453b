"""A training script with no stallscope code, for ``stallscope tune -- CMD`` (tests/test_tune_command.py).

Its items either wait (``--items wait``: a sleep of ``--item-ms``, a stand-in for storage or the network: more
workers than cores help) or compute (``--items compute``: a fixed amount of CPU work, about ``--item-ms`` on an
idle core, so that past the cores more workers only compete); its step does a fixed amount of CPU work, about
``--step-ms``, then sleeps ``--step-sleep-ms`` (a device that is not saturated: a busy host does not stretch it).
Work is counted in loop iterations, not timed: a busy host stretches it rather than cutting it short. Its
DataLoader is built on one line the test names.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

PER_MS = 40_000  # loop iterations in about a millisecond of one idle core here


def work(ms: float) -> int:
    x = 0
    for i in range(int(ms * PER_MS)):
        x += i
    return x


class Items(Dataset[torch.Tensor]):
    def __init__(self, kind: str, item_ms: float) -> None:
        self.kind, self.item_s = kind, item_ms / 1e3

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.kind == "wait":
            time.sleep(self.item_s)
        else:
            work(self.item_s * 1e3)
        return torch.full((16,), float(i % 7))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", choices=("wait", "compute"), default="wait")
    ap.add_argument("--item-ms", type=float, default=10.0)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--step-sleep-ms", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Items(args.items, args.item_ms), batch_size=args.batch_size, num_workers=args.workers)
    for step, _batch in enumerate(loader):
        work(args.step_ms)
        if args.step_sleep_ms > 0:
            time.sleep(args.step_sleep_ms / 1e3)
        if step + 1 >= args.steps:
            break
    print(f"trained {step + 1} steps")


if __name__ == "__main__":
    main()
