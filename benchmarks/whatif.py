"""The what-if model's truth check (#11): predictions from one measured run against runs of what they predict.

For each scenario (default imagenet and ssd): one measured run on the first simulated device with ``--from-workers``
workers (default 0) and ``--steps``/``--warmup`` (with ``--from-runs N``, N such runs and the one of median
throughput: a host's run-to-run noise then does not pick the run the predictions start from), then ``stallscope
whatif RUN --device sim:v100,sim:h100 --workers 0,1,2 --check --repeat N [--steps S --warmup W] --json``, which
predicts every configuration from that one run (measuring the worker vs main-process gap of its dataset, and how
much two workers deliver together, where a prediction needs them) and then trains each configuration N times on its
simulated device; the median of those runs is the measured figure. Prints each prediction's relative error of
throughput (predicted / median measured - 1), the runs' spread, the stalls, the worst |error| over all of them, and
the host's /proc/loadavg before and after each scenario (other users of a small host move every measured figure).
Run as a user runs it (``stallscope`` in a fresh interpreter).

Run: ``.venv/bin/python benchmarks/whatif.py [--scenarios imagenet,ssd] [--devices sim:v100,sim:h100]
[--workers 0,1,2] [--from-workers 0] [--from-runs 1] [--steps 8] [--warmup 2] [--repeat 1] [--check-steps S]
[--check-warmup W] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def stallscope(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "profiler", *args], capture_output=True, text=True, check=False, env=env, cwd=ROOT
    )


def measure(scenario: str, args: argparse.Namespace, tmp: Path) -> tuple[Path, list[float]] | dict[str, Any]:
    """The measured run(s): ``--from-runs`` runs of the source configuration, and the one of median throughput
    (the run predictions are made from), or {"error": ...}."""
    first = args.devices.split(",")[0]
    runs: list[tuple[float, Path]] = []
    for i in range(args.from_runs):
        run_dir = tmp / (scenario if i == 0 else f"{scenario}-m{i + 1}")
        res = stallscope(
            "run", scenario, "--device", first, "--workers", str(args.from_workers), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--out", str(run_dir), "--no-live", "--json",
        )  # fmt: skip
        if res.returncode != 0:
            return {"error": f"run failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}"}
        runs.append((float(json.loads(res.stdout)["throughput_samples_per_s"]), run_dir))
    ranked = sorted(runs)
    return ranked[(len(ranked) - 1) // 2][1], [t for t, _ in runs]


def check(scenario: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One scenario: measure, predict, check. The whatif JSON (with every measured run's throughput), or
    {"error": ...}."""
    measured = measure(scenario, args, tmp)
    if isinstance(measured, dict):
        return measured
    run_dir, throughputs = measured
    window = [] if args.check_steps is None else ["--steps", str(args.check_steps)]
    window += [] if args.check_warmup is None else ["--warmup", str(args.check_warmup)]
    res = stallscope(
        "whatif", str(run_dir), "--device", args.devices, "--workers", args.workers, "--check", "--repeat",
        str(args.repeat), *window, "--json",
    )  # fmt: skip
    if res.returncode not in (0, 1) or not res.stdout.strip():
        return {"error": f"whatif failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}"}
    out: dict[str, Any] = json.loads(res.stdout)
    out["measured_runs_throughput"] = throughputs
    return out


def loadavg() -> str:
    """The host's 1, 5 and 15 minute load averages (other users of the host show here)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _f(x: Any, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scenarios", default="imagenet,ssd")
    ap.add_argument("--devices", default="sim:v100,sim:h100")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--from-workers", type=int, default=0, help="workers of the measured run (default 0)")
    ap.add_argument(
        "--from-runs",
        type=int,
        default=1,
        help="runs of the measured configuration; predictions come from the one of median throughput (default 1)",
    )
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="check runs per configuration; the median is measured")
    ap.add_argument("--check-steps", type=int, default=None, help="steps of each check run (default --steps)")
    ap.add_argument("--check-warmup", type=int, default=None, help="warm-up of each check run (default --warmup)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in args.scenarios.split(","):
            print(f"whatif benchmark: {scenario} ...", file=sys.stderr, flush=True)
            before = loadavg()
            t1 = time.perf_counter()
            results[scenario] = check(scenario, args, Path(tmp))
            results[scenario]["loadavg"] = {"before": before, "after": loadavg()}
            results[scenario]["wall_s"] = time.perf_counter() - t1
    wall = time.perf_counter() - t0
    errors = [
        abs(r["relative_error"])
        for out in results.values()
        for r in out.get("predictions", [])
        if r.get("relative_error") is not None
    ]
    worst = max(errors) if errors else None
    speedups = [
        abs(r["speedup_error"])
        for out in results.values()
        for r in out.get("predictions", [])
        if r.get("speedup_error") is not None
    ]
    worst_speedup = max(speedups) if speedups else None
    if args.json:
        print(
            json.dumps(
                {
                    "results": results,
                    "worst_relative_error": worst,
                    "worst_speedup_error": worst_speedup,
                    "wall_s": wall,
                },
                indent=2,
            )
        )
        return 0 if errors else 1
    for scenario, out in results.items():
        if "error" in out:
            print(f"{scenario}: {out['error']}")
            continue
        cost, gap = out["measured"]["loader_cost"], out["worker_gap"]
        print(f"{scenario}: loader cost {cost['seconds_per_sample'] * 1e3:.2f} ms/sample ({cost['method']})")
        print(f"  worker gap x{gap['factor']:.3f} ({gap['source']}; rounds {gap['round_factors']})")
        print(f"  cores' scaling {gap.get('cores_scaling')} at {gap.get('cores_k')} workers")
        print(f"  measured runs (samples/s): {out['measured_runs_throughput']}, predicting from the median")
        print(f"  loadavg before {out['loadavg']['before']}, after {out['loadavg']['after']} ({out['wall_s']:.0f} s)")
        print(
            f"  {'device':<26} {'w':>2} {'pred/s':>8} {'meas/s':>8} {'runs min-max':>14} {'error':>7} "
            f"{'pred stall':>10} {'meas stall':>10} {'95% range':>14} {'speedup err':>11}"
        )
        for r in out["predictions"]:
            pred = "OOM" if r["status"] == "OOM" else _f(r["predicted_throughput_samples_per_s"], ".1f")
            spread = r.get("measured_spread")
            runs = "n/a" if not spread else f"{spread[0]:.1f}-{spread[1]:.1f}"
            print(
                f"  {r['device']:<26} {r['workers']:>2} {pred:>8} "
                f"{_f(r['measured_throughput_samples_per_s'], '.1f'):>8} {runs:>14} "
                f"{_f(r['relative_error'], '+.1%'):>7} "
                f"{_f(r['predicted_stall_fraction'], '.0%'):>10} {_f(r['measured_stall_fraction'], '.0%'):>10} "
                f"{_range(r):>14} {_f(r.get('speedup_error'), '+.1%'):>11}"
            )
    print(f"worst |error| over {len(errors)} predictions: {_f(worst, '.1%')} (wall {wall:.0f} s)")
    print(f"worst |error| of the speedups against the re-measured base: {_f(worst_speedup, '.1%')}")
    return 0 if errors else 1


def _range(row: dict[str, Any]) -> str:
    lo, hi = row.get("predicted_throughput_samples_per_s_low"), row.get("predicted_throughput_samples_per_s_high")
    return "n/a" if lo is None or hi is None else f"{lo:.1f}-{hi:.1f}"


if __name__ == "__main__":
    sys.exit(main())
