"""Worst error of the Session's figures against injected ground truth (loaders and phases made of sleeps),
over the configurations the ground-truth tests use. Prints each configuration's errors and the worst.

Run: ``.venv/bin/python benchmarks/ground_truth.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler import Session

CONFIGS = [  # (data wait, h2d, compute) seconds per step
    (0.030, 0.020, 0.040),
    (0.015, 0.0, 0.035),
    (0.004, 0.0, 0.046),
    (0.0, 0.0, 0.030),
    (0.050, 0.005, 0.010),
]


def run(tmp: Path, wait: float, h2d: float, compute: float, steps: int = 25) -> dict[str, float]:
    def loader():
        for _ in range(steps + 2):
            time.sleep(wait)
            yield [0] * 8

    with Session(tmp, warmup=2) as s:
        for _ in s.wrap(loader()):
            if h2d:
                with s.phase("h2d"):
                    time.sleep(h2d)
            with s.phase("compute"):
                time.sleep(compute)
    summ = s.summary()
    b = summ.breakdown_ms_per_step
    truth_stall = (wait + h2d) / (wait + h2d + compute)
    errs = {"stall_pp": abs(summ.stall_fraction - truth_stall) * 100}
    for name, truth in (("data_wait", wait), ("h2d", h2d), ("compute", compute)):
        if truth >= 0.004:
            errs[f"{name}_pct"] = abs(b[name] / 1e3 - truth) / truth * 100
    return errs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    worst: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):
            for i, (w, h, c) in enumerate(CONFIGS):
                errs = run(Path(d) / f"{r}-{i}", w, h, c)
                print(
                    f"wait {w * 1e3:.0f} ms, h2d {h * 1e3:.0f} ms, compute {c * 1e3:.0f} ms: "
                    + "  ".join(f"{k} {v:.2f}" for k, v in errs.items()),
                    flush=True,
                )
                for k, v in errs.items():
                    worst[k] = max(worst.get(k, 0.0), v)
    print(
        "worst: stall fraction error {:.2f} percentage points; phase time error {:.2f}% (budget: 2 pp, 5%)".format(
            worst["stall_pp"], max(v for k, v in worst.items() if k.endswith("_pct"))
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
