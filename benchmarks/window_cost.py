"""What one kernel window costs the training thread, against the activities it recorded (issue #55; docs/benchmarks.md,
"Kernel windows: the cost per window").

The run's recorder (profiler.core.kernelwin.TorchKernelRecorder) is timed by part on the training thread:
``start`` (torch.profiler's start: CUPTI's subscription on a GPU), ``sync`` (on CUDA, the window's last kernels),
``stop`` (the profiler's stop: CUPTI's flush and kineto's post-processing, C++ holding the GIL) and ``read`` (the
events read into activities, in Python). Without a GPU the same recorder runs over torch's CPU operators
(``activity="cpu"``: the same start, stop and read, with CPU events where CUPTI's would be): a loop of tiny
in-place adds makes about 1,000 to 35,000 events a window. With CUDA (``torch.cuda.is_available()``) it runs on the
GPU too, with a loop of tiny kernels (a kernel and its launch are two activities).

Each size: ``--repeats`` windows (the first window of the process, kineto's own set-up, is run and not counted);
medians printed, in ms, with the events per window. Run: ``.venv/bin/python benchmarks/window_cost.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from profiler.core.kernelwin import TorchKernelRecorder  # noqa: E402

SIZES = (1_000, 5_000, 15_000, 35_000)  # target events a window
PARTS = ("start", "sync", "stop", "read")


def window(rec: TorchKernelRecorder, ops: int, x: torch.Tensor) -> dict[str, float]:
    rec.start()
    for _ in range(ops):
        x.add_(1)
    rec.stop()
    parts = dict(rec.parts)
    parts["total"] = sum(parts.get(p, 0.0) for p in PARTS)
    return parts


def measure(activity: str, repeats: int) -> list[dict[str, float]]:
    device = "cuda" if activity == "cuda" else "cpu"
    x = torch.ones(4, device=device)
    rec = TorchKernelRecorder(torch, time.perf_counter, activity=activity)
    probe = window(rec, 1000, x)  # kineto's set-up (the process's first window) happens here, not counted
    per_op = probe["events"] / 1000
    rows = []
    for target in SIZES:
        ops = max(1, round(target / per_op))
        got = [window(rec, ops, x) for _ in range(repeats)]
        row = {k: statistics.median(g[k] for g in got) for k in (*PARTS, "total", "events")}
        rows.append({"activity": activity, **row})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = measure("cpu", args.repeats)
    if torch.cuda.is_available():
        rows += measure("cuda", args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'recorder over':<14}{'events':>9}{'start':>9}{'sync':>8}{'stop':>9}{'read':>9}{'total ms':>10}")
    for r in rows:
        print(
            f"{r['activity']:<14}{r['events']:>9.0f}"
            + "".join(f"{r[k] * 1e3:>{w}.1f}" for k, w in (("start", 9), ("sync", 8), ("stop", 9), ("read", 9)))
            + f"{r['total'] * 1e3:>10.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
