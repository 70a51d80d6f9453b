"""What one memory reading of a loader's processes costs, by method, in CPU time of the reading thread (the kernel's
walk of the page tables is charged to it): the memory source's psutil ``memory_full_info`` (``smaps_rollup`` and
``statm``), a raw read of ``/proc/PID/smaps_rollup``, and the cheap files that hold no private memory (``statm``,
``status``). The processes: a training process holding 400,000 records as Python dicts (issue #65's data set) and its
2 DataLoader workers after 150 batches of 64, each of which has copied the pages it touched (copy-on-read).

    python benchmarks/memory_reads.py [--repeat N]

docs/benchmarks.md, "Memory readings", has the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
import torch

from profiler.core.sources.memory import take

N = 400_000


class Records(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    def __init__(self) -> None:
        self.rows = [{"id": i, "x": float(i % 97), "y": i % 10, "name": f"r{i:07d}"} for i in range(N)]

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        r = self.rows[i]
        return torch.tensor([r["x"], float(r["id"] % 7)]), int(r["y"])


def cpu_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median and max CPU ms of ``fn`` on this thread over ``repeat`` calls."""
    spent = []
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        spent.append((time.thread_time() - t) * 1e3)
    return statistics.median(spent), max(spent)


def raw(path: str) -> Callable[[], bytes]:
    def read() -> bytes:
        with open(path, "rb") as f:
            return f.read()

    return read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    loader = torch.utils.data.DataLoader(Records(), batch_size=64, num_workers=2, shuffle=True)
    it = iter(loader)
    for _ in range(150):
        next(it)
    pids = [("main", os.getpid())] + [(f"w{i}", w.pid) for i, w in enumerate(it._workers)]
    print(f"{'process':8} {'RSS MiB':>8} {'USS MiB':>8} {'full_info ms':>13} {'smaps_rollup ms':>16} "
          f"{'statm us':>9} {'status us':>10}   (CPU time: median, max of {args.repeat})")  # fmt: skip
    for label, pid in pids:
        p = psutil.Process(pid)
        info = p.memory_full_info()
        full = cpu_ms(p.memory_full_info, args.repeat)
        rollup = cpu_ms(raw(f"/proc/{pid}/smaps_rollup"), args.repeat)
        statm = cpu_ms(raw(f"/proc/{pid}/statm"), args.repeat)
        status = cpu_ms(raw(f"/proc/{pid}/status"), args.repeat)
        print(f"{label:8} {info.rss / 2**20:8.0f} {info.uss / 2**20:8.1f} {full[0]:6.2f} {full[1]:6.2f} "
              f"{rollup[0]:8.2f} {rollup[1]:7.2f} {statm[0] * 1e3:9.0f} {status[0] * 1e3:10.0f}")  # fmt: skip
    workers = [pid for label, pid in pids if label != "main"]
    end = cpu_ms(lambda: take(workers), args.repeat)
    print(f"the loop's end reading of the {len(workers)} workers in the training process (take): "
          f"{end[0]:.2f} ms median, {end[1]:.2f} max")  # fmt: skip


if __name__ == "__main__":
    main()
