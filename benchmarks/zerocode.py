"""Overhead of zero-code profiling: examples/train.py alone vs under `stallscope run -- ...` (py-spy at the
default rate on the main process and its 2 loader workers, plus the host/NVML sampler), paired back to back
with alternating order; the figure is the median of the per-pair throughput ratios. Target: >= 0.97.

The throughput is the script's own: steps / the seconds its training loop took (it writes both with --truth),
so start-up and the profiler's attach time are not counted against either side.

With ``--nproc 2`` the script runs under torchrun as 2 DDP ranks (each with its 2 workers), profiled through
the launcher (every rank and worker under one py-spy, plus the ranks source); rank 0's steps/s is the job's.

Run: ``.venv/bin/python benchmarks/zerocode.py [--pairs 5] [--steps 120] [--rate 10] [--nproc 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pairing import paired_ratios  # benchmarks/ is this script's sys.path[0]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "train.py")


def one(steps: int, profiled: bool, rate: int, tmp: Path, tag: str, *, nproc: int = 1) -> float:
    truth = tmp / f"{tag}-rank{{rank}}.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)] if nproc > 1 else []
    script = [*launch, *([] if launch else [sys.executable]), EXAMPLE, "--steps", str(steps), "--workers", "2",
              "--read-ms", "0", "--truth", str(truth)]  # fmt: skip
    if profiled:
        cmd = [sys.executable, "-m", "profiler", "run", "--no-live", "--json", "--pyspy-rate", str(rate),
               "--out", str(tmp / tag), "--", *script]  # fmt: skip
    else:
        cmd = script
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got = json.loads(Path(str(truth).format(rank=0)).read_text())
    return float(got["steps"] / got["seconds"])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rate", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=1, help="ranks under torchrun (1: a plain process)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)

        def show(i: int, alone: float, profiled: float) -> None:
            print(f"  pair {i + 1}: alone {alone:.2f} steps/s, profiled {profiled:.2f} steps/s, "
                  f"ratio {profiled / alone:.4f}", flush=True)  # fmt: skip

        ratios = paired_ratios(
            lambda side, i: one(args.steps, side, args.rate, tmp, f"{i}{'p' if side else 'b'}", nproc=args.nproc),
            args.pairs,
            show,
        )
    med = statistics.median(ratios)
    print(
        f"py-spy at {args.rate} Hz + sampler: median throughput ratio {med:.4f} "
        f"({'meets' if med >= 0.97 else 'MISSES'} the <= 3% overhead target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
