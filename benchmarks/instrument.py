"""Overhead of the start-up module alone (profiler/zerocode/boot): a script run plain vs with the module loaded
and timing every DataLoader call (no py-spy, no sampler: those are benchmarks/zerocode.py's), paired back to
back with alternating order; the figure is the median of the per-pair throughput ratios. Target: >= 0.99.

Two scripts, each timing itself (so start-up is not counted against either side):

- ``train``: examples/train.py with 2 workers, a realistic step (tens of ms); steps / its loop's seconds.
- ``fast``: tests/data/meter_train.py with items that do not sleep and 0 workers: steps of about a
  millisecond, the worst case for a per-step cost; steps / the sum of its own batch times.

The throughput pairs on a shared 2-core machine spread by several percent, more than a 1% effect, so the
script also measures the module's cost per ``next()`` directly (``per_call``: 20,000 calls on a trivial
in-memory loader, plain vs patched, medians of 5 in one process); that cost over a step time is the overhead.

Run: ``.venv/bin/python benchmarks/instrument.py [--pairs 7]``.
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
sys.path.insert(0, str(ROOT))

from pairing import paired_ratios  # noqa: E402

from profiler.zerocode.instrument import child_env  # noqa: E402

SCRIPTS = {
    "train": [str(ROOT / "examples" / "train.py"), "--workers", "2", "--steps", "120", "--read-ms", "0"],
    "fast": [str(ROOT / "tests" / "data" / "meter_train.py"), "--workers", "0", "--sleep-ms", "0", "--steps", "3000"],
}


def one(name: str, instrumented: bool, tmp: Path, tag: str) -> float:
    truth = tmp / f"{tag}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if instrumented:
        (tmp / tag).mkdir()
        env = child_env(tmp / tag, base=env)
    cmd = [sys.executable, *SCRIPTS[name], "--truth", str(truth)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got = json.loads(truth.read_text())
    if name == "train":
        return float(got["steps"] / got["seconds"])
    return len(got) / sum(row[1] for row in got)  # rows: [data_s, batch_s, ...]


PER_CALL = """
import os, statistics, sys, tempfile, time
import torch
from torch.utils.data import DataLoader, TensorDataset

def run(n=20000):
    it = iter(DataLoader(TensorDataset(torch.zeros(n, 2)), batch_size=1, num_workers=0))
    t = time.perf_counter()
    for _ in range(n - 1):
        next(it)
    return (time.perf_counter() - t) / (n - 1) * 1e6

plain = statistics.median(run() for _ in range(5))
sys.path.insert(0, sys.argv[1])
import stallscope_instrument as si
os.environ[si.DIR_ENV] = tempfile.mkdtemp()
si.install()  # torch.utils.data is imported already: it patches now
print(plain, statistics.median(run() for _ in range(5)))
"""


def per_call() -> tuple[float, float]:
    """(us per next() plain, patched) on a trivial loader: the module's own cost per call."""
    boot = str(ROOT / "profiler" / "zerocode" / "boot")
    res = subprocess.run([sys.executable, "-c", PER_CALL, boot], check=True, cwd=ROOT, capture_output=True, text=True)
    plain, patched = (float(x) for x in res.stdout.split())
    return plain, patched


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--scripts", default="train,fast")
    args = ap.parse_args()
    plain, patched = per_call()
    print(
        f"per next(): plain {plain:.1f} us, with the start-up module {patched:.1f} us: {patched - plain:.1f} us a "
        f"call, {(patched - plain) / 100:.3f}% of a 10 ms step",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in args.scripts.split(","):

            def show(i: int, plain: float, inst: float, name: str = name) -> None:
                print(f"  {name} pair {i + 1}: plain {plain:.2f} steps/s, instrumented {inst:.2f} steps/s, "
                      f"ratio {inst / plain:.4f}", flush=True)  # fmt: skip

            ratios = paired_ratios(
                lambda side, i, name=name: one(name, side, tmp, f"{name}{i}{'i' if side else 'b'}"), args.pairs, show
            )
            med = statistics.median(ratios)
            print(
                f"{name}: start-up module, median throughput ratio {med:.4f} over {args.pairs} pairs "
                f"({'meets' if med >= 0.99 else 'MISSES'} the <= 1% overhead target)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
