"""Overhead of zero-code profiling: examples/train.py alone vs under `stallscope run -- ...` (py-spy at the
default rate on the main process and its 2 loader workers, plus the host/NVML sampler), paired back to back
with alternating order; the figure is the median of the per-pair throughput ratios. Target: >= 0.97.

The throughput is the script's own: steps / the seconds its training loop took (it writes both with --truth),
so start-up and the profiler's attach time are not counted against either side.

Run: ``.venv/bin/python benchmarks/zerocode.py [--pairs 5] [--steps 120] [--rate 10]``.
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

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "train.py")


def one(steps: int, profiled: bool, rate: int, tmp: Path, tag: str) -> float:
    truth = tmp / f"{tag}.json"
    script = [sys.executable, EXAMPLE, "--steps", str(steps), "--workers", "2", "--truth", str(truth)]
    if profiled:
        cmd = [sys.executable, "-m", "profiler", "run", "--no-live", "--json", "--pyspy-rate", str(rate),
               "--out", str(tmp / tag), "--", *script]  # fmt: skip
    else:
        cmd = script
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got = json.loads(truth.read_text())
    return float(got["steps"] / got["seconds"])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rate", type=int, default=10)
    args = ap.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {p: one(args.steps, p, args.rate, tmp, f"{i}{'p' if p else 'b'}") for p in order}
            ratios.append(got[True] / got[False])
            print(
                f"  pair {i + 1}: alone {got[False]:.2f} steps/s, profiled {got[True]:.2f} steps/s, "
                f"ratio {ratios[-1]:.4f}",
                flush=True,
            )
    med = statistics.median(ratios)
    print(
        f"py-spy at {args.rate} Hz + sampler: median throughput ratio {med:.4f} "
        f"({'meets' if med >= 0.97 else 'MISSES'} the <= 3% overhead target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
