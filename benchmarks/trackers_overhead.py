"""Overhead of live logging to the experiment trackers: a CPU loop of ``--step-ms`` (default 40) ms of computation
per step in a Session, without and with ``log_to=`` each tracker at its default interval (10 s), paired (the order
alternating so that drift cancels), medians of the throughput ratios (with / without).

Trackers: ``tensorboard`` (a temporary log directory), ``mlflow`` (a SQLite store in a temporary directory: the
tracker's import, its store's migrations and every write run in the sampler process), ``wandb`` (offline, attached
to a run this process made, as a user's script would: its writes run on a thread of this process). Each side's
throughput is the measured steps over their wall time (the Session's start and close, where the trackers open and
take their last point, are outside it: they are reported apart as ``close_s``). The loop computes (a matrix
product on one thread), so that the trackers' CPU use in this process shows up in it.

Run: ``.venv/bin/python benchmarks/trackers_overhead.py [--pairs 5] [--steps 500] [--step-ms 40] [--only T,...]
[--json]`` (500 steps of 40 ms: 20 s a side, two points at the default interval); smoke: ``--pairs 1 --steps 30``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from pairing import paired_ratios

from profiler import Session

TRACKERS = ("tensorboard", "mlflow", "wandb")


def spin(a: torch.Tensor, seconds: float) -> None:
    """About ``seconds`` of CPU work: matrix products until the thread's own CPU clock has advanced that much."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        a @ a


def one_run(tmp: Path, target: str | None, steps: int, step_s: float, tag: str) -> tuple[float, float]:
    """(measured steps per second, seconds from the loop's end to the close's)."""
    a = torch.randn(128, 128)
    out = tmp / f"run-{tag}"
    with Session(out, warmup=2, meta={"batch_size": 1}, log_to=target) as s:
        t0 = 0.0
        for i, _ in enumerate(s.wrap(range(steps + 2))):
            if i == 2:
                t0 = time.perf_counter()
            with s.phase("compute"):
                spin(a, step_s)
        wall = time.perf_counter() - t0
        t_end = time.perf_counter()
    return steps / wall, time.perf_counter() - t_end


def target_for(tracker: str, tmp: Path) -> str:
    if tracker == "tensorboard":
        return f"tensorboard:{tmp / 'tb'}"
    if tracker == "mlflow":
        return f"mlflow:sqlite:///{tmp / 'mlflow.db'}"
    return "wandb"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--step-ms", type=float, default=40.0)
    ap.add_argument("--only", default=",".join(TRACKERS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    results = {}
    with tempfile.TemporaryDirectory(prefix="stallscope-trackers-bench-") as d:
        tmp = Path(d)
        os.environ["WANDB_DIR"] = str(tmp)
        for tracker in args.only.split(","):
            target = target_for(tracker, tmp)
            closes: list[float] = []
            run = None
            if tracker == "wandb":
                import wandb

                run = wandb.init(project="stallscope-bench")

            def measure(
                with_it: bool, pair: int, tracker: str = tracker, target: str = target, closes: list[float] = closes
            ) -> float:
                tput, close_s = one_run(tmp, target if with_it else None, args.steps, args.step_ms / 1e3,
                                        f"{tracker}-{pair}-{with_it}")  # fmt: skip
                if with_it:
                    closes.append(close_s)
                return tput

            def show(i: int, without: float, with_: float, tracker: str = tracker) -> None:
                if not args.json:
                    print(f"{tracker} pair {i}: {without:.3f} -> {with_:.3f} steps/s ({with_ / without - 1:+.2%})")

            ratios = paired_ratios(measure, args.pairs, show)
            if run is not None:
                run.finish()
            results[tracker] = {
                "median_ratio": statistics.median(ratios),
                "ratios": ratios,
                "close_s_median": statistics.median(closes),
            }
            if not args.json:
                r = results[tracker]
                print(
                    f"{tracker}: median throughput with/without {r['median_ratio']:.4f} "
                    f"(pairs {min(ratios):.4f}-{max(ratios):.4f}); close {r['close_s_median']:.2f} s"
                )
    if args.json:
        print(json.dumps({"step_ms": args.step_ms, "steps": args.steps, "pairs": args.pairs, "trackers": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
