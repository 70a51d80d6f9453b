"""``whatif`` on the launch-aware model against the real H100 (docs/sim.md, "whatif against the real H100").

The measured points (../shared/measured/h100-2026-11-27.md; docs/sim.md copies them): ResNet-50, batch 64, the
imagenet scenario's generated set, on one H100 80GB HBM3 with a 16-core host, eager PyTorch 2.11:
naive, 0 workers: 184 samples/s, stall 88.1%; prefetch, 8 workers: 997 samples/s, stall 41.7%.

Here, on this host, with the device simulated: a naive run with 0 workers and a prefetch run with 2 workers on
``sim:h100`` (``--runs`` each, the one of median throughput kept), then ``stallscope whatif RUN --device sim:h100
--host-cores 16`` with the H100 run's workers (0 and 8). Prints each prediction beside the measured point, its error,
and the two parts the prediction is made of: the device's step (the model's; the real step's compute) and the
loader's cost per sample (measured here; on the H100 host, implied by its naive run's data wait).

Run: ``.venv/bin/python benchmarks/whatif_h100.py [--steps 8] [--warmup 2] [--runs 3] [--json]``.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# ResNet-50 b64 on the H100 host (measured 2026-11-27): samples/s, stall, data wait and compute ms per step
MEASURED = {
    ("naive", 0): {"samples_per_s": 184.0, "stall": 0.881},
    ("prefetch", 8): {"samples_per_s": 997.0, "stall": 0.417},
}
H100_DEVICE_BOUND = 1716.0  # --synthetic-input, samples/s: the device's step is 64 / 1716 s
H100_NAIVE_MS_PER_SAMPLE = 0.881 / 184.0 * 1e3  # naive, 0 workers: the data wait per sample, stall / rate


def stallscope(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "profiler", *args], capture_output=True, text=True, check=False, env=env, cwd=ROOT
    )


def measured_run(out: Path, pipeline: str, workers: int, args: argparse.Namespace) -> tuple[Path, list[float]]:
    """``--runs`` runs of the configuration here; the run of median throughput and every run's throughput."""
    runs: list[tuple[float, Path]] = []
    for i in range(args.runs):
        d = out / f"{pipeline}-w{workers}-{i}"
        res = stallscope(
            "run", "imagenet", "--model", "resnet50", "--device", "sim:h100", "--batch-size", "64", "--pipeline",
            pipeline, "--workers", str(workers), "--steps", str(args.steps), "--warmup", str(args.warmup), "--no-live",
            "--json", "--out", str(d),
        )  # fmt: skip
        if res.returncode != 0:
            raise SystemExit(f"run failed: {res.stderr.strip().splitlines()[-1:]}")
        runs.append((json.loads(res.stdout)["throughput_samples_per_s"], d))
    runs.sort()
    return runs[len(runs) // 2][1], [t for t, _ in runs]


def predict(run_dir: Path, workers: int) -> dict[str, Any]:
    res = stallscope(
        "whatif", str(run_dir), "--device", "sim:h100", "--workers", str(workers), "--host-cores", "16", "--json"
    )
    if res.returncode != 0:
        raise SystemExit(f"whatif failed: {res.stderr.strip().splitlines()[-1:]}")
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="whatif-h100-") as tmp:
        for (pipeline, workers), here in ((("naive", 0), 0), (("prefetch", 8), 2)):
            run_dir, here_rates = measured_run(Path(tmp), pipeline, here, args)
            doc = predict(run_dir, workers)
            (p,) = doc["predictions"]
            real = MEASURED[(pipeline, workers)]
            rows.append({
                "configuration": f"{pipeline} b64 w{workers}", "measured_here_from": f"{pipeline} w{here}",
                "here_samples_per_s": here_rates, "predicted_samples_per_s": p["predicted_throughput_samples_per_s"],
                "predicted_stall": p["predicted_stall_fraction"], "measured_samples_per_s": real["samples_per_s"],
                "measured_stall": real["stall"],
                "error": p["predicted_throughput_samples_per_s"] / real["samples_per_s"] - 1,
                "device_ms": p["parts_ms_per_step"]["device"], "launch_ms": p["parts_ms_per_step"]["launch"],
                "loader_ms_per_sample_here": doc["measured"]["loader_cost"]["seconds_per_sample"] * 1e3,
            })  # fmt: skip
    h100_device_ms = 64 / H100_DEVICE_BOUND * 1e3
    if args.json:
        print(json.dumps({"rows": rows, "h100_device_ms": h100_device_ms}, indent=2))
        return 0
    print(
        "| configuration (ResNet-50 b64) | predicted from | predicted samples/s | stall | H100 measured | stall "
        "| error |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['configuration']} | {r['measured_here_from']} here ({statistics.median(r['here_samples_per_s']):.0f}"
            f" samples/s) | {r['predicted_samples_per_s']:.0f} | {r['predicted_stall']:.0%} | "
            f"{r['measured_samples_per_s']:.0f} | {r['measured_stall']:.0%} | {r['error']:+.0%} |"
        )
    for r in rows:
        print(
            f"{r['configuration']}: device {r['device_ms']:.1f} ms a step (the H100's device-bound step "
            f"{h100_device_ms:.1f} ms), host launches {r['launch_ms']:.1f} ms; loader "
            f"{r['loader_ms_per_sample_here']:.2f} ms a sample here, {H100_NAIVE_MS_PER_SAMPLE:.2f} on the H100's host "
            "(its naive run's data wait)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
