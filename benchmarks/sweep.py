"""Wall time of a 36-configuration ``stallscope sweep`` of fashion-vgg, run as a user runs it.

Axes: pipelines naive,prefetch x batch sizes 8,16,24,32,48,64 x workers 0,1,2 = 36 configurations, each
1 warm-up step + at most ``--steps`` (default 2) measured steps (the early-stop rule needs 5, so with 2 the
cap ends every configuration: this measures the per-configuration fixed cost plus a few real steps).
Target: under 3 minutes on the project's 2-core CPU machine. The figure is the wall time of the whole command
(interpreter start, torch import, every configuration, the table and the plot); the per-configuration wall
times come from sweep.json.

Run: ``.venv/bin/python benchmarks/sweep.py [--steps 2] [--pipelines naive,prefetch] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 180.0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--pipelines", default="naive,prefetch")
    ap.add_argument("--batch-sizes", default="8,16,24,32,48,64")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = len(args.pipelines.split(",")) * len(args.batch_sizes.split(",")) * len(args.workers.split(","))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        cmd = [
            sys.executable, "-m", "profiler", "sweep", "fashion-vgg", "--pipelines", args.pipelines,
            "--batch-sizes", args.batch_sizes, "--workers", args.workers, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--device", "cpu", "--no-live", "--json", "--out", str(out),
        ]  # fmt: skip
        t0 = time.perf_counter()
        res = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False
        )
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            return res.returncode
        sweep = json.loads(res.stdout)
    rows = sweep["rows"]
    walls = [r["wall_s"] for r in rows if r["wall_s"] is not None]
    # what a configuration costs beyond its steps (set-up, worker start, tear-down, summary): its wall time less
    # (warm-up + measured steps) x the mean measured step, a rough split (the warm-up step runs slower)
    fixed = [
        r["wall_s"] - (r["steps"] + r["warmup_steps"]) * r["step_time_ms"]["mean"] / 1e3
        for r in rows
        if r["status"] == "complete" and r["step_time_ms"].get("mean") is not None
    ]
    per_sample = [r["step_time_ms"]["mean"] / r["batch_size"] for r in rows if r["status"] == "complete"]
    result = {
        "configurations": n,
        "completed": sum(r["status"] == "complete" for r in rows),
        "wall_s": wall,
        "target_s": TARGET_S,
        "met": wall < TARGET_S,
        "per_configuration_s": {
            "median": statistics.median(walls),
            "min": min(walls),
            "max": max(walls),
            "sum": sum(walls),
        },
        "outside_configurations_s": wall - sum(walls),
        "fixed_per_configuration_s_median": statistics.median(fixed) if fixed else None,
        "step_ms_per_sample_median": statistics.median(per_sample) if per_sample else None,
        "knee": sweep["knee"],
        "slowdowns": [s["text"] for s in sweep["slowdowns"]],
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    pc = result["per_configuration_s"]
    print(
        f"fashion-vgg sweep, {n} configurations ({result['completed']} completed), --steps {args.steps} "
        f"--warmup {args.warmup}: {wall:.1f} s (target < {TARGET_S:.0f} s: {'met' if result['met'] else 'MISSED'})"
    )
    print(
        f"per configuration: median {pc['median']:.2f} s, min {pc['min']:.2f} s, max {pc['max']:.2f} s; "
        f"outside the configurations (start-up, table, plot): {result['outside_configurations_s']:.1f} s"
    )
    print(
        f"beyond the steps, a configuration costs ~{result['fixed_per_configuration_s_median']:.2f} s (median); "
        f"a step costs {result['step_ms_per_sample_median']:.1f} ms per sample (median)"
    )
    print(f"load average before/after: {load_before[0]:.1f} / {result['loadavg_after'][0]:.1f}")
    if sweep["knee"]:
        print(sweep["knee"]["text"])
    for text in result["slowdowns"]:
        print("slowdown:", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
