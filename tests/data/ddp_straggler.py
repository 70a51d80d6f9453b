"""A two-rank DDP job (gloo, CPU) with a straggler injected into one rank's input pipeline, for the
zero-code multi-rank truth tests (tests/test_zerocode_ranks.py). Run it under torchrun:

    torchrun --nproc-per-node 2 tests/data/ddp_straggler.py --slow-rank 1 --sleep-ms 6 --truth DIR

Every item costs every rank a little CPU in ``augment`` (numpy); on ``--slow-rank`` it also sleeps
``--sleep-ms`` in ``slow_read`` (a stand-in for slow storage), so that rank's loader is the bottleneck and
the other rank waits for it in DDP's gradient all-reduce (inside backward), not in its loader. Each rank
times its own ``iter``/``next(loader)`` and writes ``DIR/truth-rank{RANK}.json``: its data-wait fraction over its
training loop; the same from its second step's ``next()`` to the loop's end (``data_wait_fraction_after_first_step``,
the ground truth the profiler's stack-sample estimate is checked against: its span leaves the first step out as
warm-up); over steps 1 .. n-2 (``steady_data_wait_fraction``, the truth for the start-up module's figures); and its
pid.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

RANK = int(os.environ["RANK"])


def slow_read(seconds: float) -> None:
    time.sleep(seconds)


def augment(i: int) -> np.ndarray:
    x = np.random.default_rng(i).standard_normal(32768).astype(np.float32)
    for _ in range(4):
        x = np.sqrt(np.abs(x * 1.0001 + 0.5))
    return x


class Items(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.sleep_s:
            slow_read(self.sleep_s)
        x = augment(i)
        return torch.from_numpy(x[:64].copy()), i % 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--sleep-ms", type=float, default=6.0)
    ap.add_argument("--seconds", type=float, default=4.0, help="train for about this long")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--truth", required=True, help="directory for truth-rank{RANK}.json")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    sleep_s = args.sleep_ms / 1e3 if args.slow_rank == RANK else 0.0
    data = Items(sleep_s)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=1, sampler=DistributedSampler(data))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # every rank must run the same number of steps (DDP): rank 0 decides when the time is up
    stop = torch.zeros(1)
    wait, steps = 0.0, 0
    start = time.perf_counter()
    it = iter(loader)  # starts the worker: the device would wait for that too
    wait += time.perf_counter() - start
    # each step's start (its next() call) and data wait: the start-up module's steps run from one next() call to
    # the next, the first is warm-up and the last has no end, so its truth is over steps 1 .. n-2 exactly
    starts: list[float] = []
    waits: list[float] = []
    while True:
        t = time.perf_counter()
        starts.append(t)
        x, y = next(it)
        waits.append(time.perf_counter() - t)
        wait += waits[-1]
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        stop[0] = float(RANK == 0 and time.perf_counter() - start >= args.seconds)
        dist.broadcast(stop, 0)
        if stop[0]:
            break
    end = time.perf_counter()
    total = end - start
    out = Path(args.truth) / f"truth-rank{RANK}.json"
    steady = sum(waits[1:-1]) / (starts[-1] - starts[1]) if steps >= 3 else None
    # the stack estimate's span: from the second step's next() to the loop's end (its first step is warm-up)
    after_first = sum(waits[1:]) / (end - starts[1]) if steps >= 2 else None
    out.write_text(json.dumps({"rank": RANK, "pid": os.getpid(), "data_wait_fraction": wait / total,
                               "data_wait_fraction_after_first_step": after_first,
                               "steady_data_wait_fraction": steady, "seconds": total, "steps": steps}))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
