"""The simulator's calibration table (profiler/sim/calibration.py; docs/sim.md, "Calibration").

For each point (NVIDIA's published eager-PyTorch ResNet-50 throughput, and what stallscope measured on an H100):
its kernels counted on the meta device at its batch size and precision, the model's device and host time per step
with the rounded constants of profiler/sim/specs.py, the prediction, and its error. Then the fit's own (unrounded)
constants, and the error to expect on a device without points (each precision's leave-one-device-out error). Last,
the points held out of the fit (the H200's, measured after it): each predicted as a run is, and its error.

Run: ``.venv/bin/python benchmarks/sim_calibration.py [--json]``. Deterministic: no timing, the same on any host.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler.sim import calibration, specs  # noqa: E402
from profiler.sim.calwork import point_work  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work_of = functools.cache(point_work)
    fit = calibration.calibrate(calibration.POINTS, work_of)
    rounded = calibration.Fit(
        specs.KERNEL_FILL_S, specs.DEVICE_EFFICIENCY, specs.EFFICIENCY, specs.LAUNCH_S, specs.FRAMEWORK_S
    )
    rows = [calibration.check(p, work_of(p), rounded) for p in calibration.POINTS]
    loo = calibration.leave_one_out(calibration.POINTS, work_of, fit)
    held = [calibration.check(p, work_of(p), rounded) for p in calibration.HELD_OUT]
    if args.json:
        out = {
            "points": [
                {
                    "point": c.point.label,
                    "bound": c.point.bound,
                    "kernels": len(work_of(c.point)),
                    "measured_ms": c.point.step_s * 1e3,
                    "device_ms": c.device_s * 1e3,
                    "host_ms": c.host_s * 1e3,
                    "predicted_ms": c.predicted_s * 1e3,
                    "error": c.error,
                    "date": c.point.date,
                }
                for c in rows
            ],
            "fit": {
                "fill_s": fit.fill_s,
                "launch_s": fit.launch_s,
                "framework_s": fit.framework_s,
                "device_efficiency": {f"{d} {p}": e for (d, p), e in fit.device_efficiency.items()},
                "efficiency": fit.efficiency,
            },
            "leave_one_device_out": {p: None if math.isnan(e) else e for p, e in loo.items()},
            "held_out": [
                {
                    "point": c.point.label,
                    "measured_ms": c.point.step_s * 1e3,
                    "predicted_ms": c.predicted_s * 1e3,
                    "efficiency": c.efficiency,
                    "error": c.error,
                }
                for c in held
            ],
        }
        print(json.dumps(out, indent=2))
        return 0
    print("| point | bound | kernels | measured ms | device ms | host ms | predicted samples/s | measured | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        p = c.point
        print(
            f"| {p.label} | {p.bound} | {len(work_of(p))} | {p.step_s * 1e3:.1f} | {c.device_s * 1e3:.1f} | "
            f"{c.host_s * 1e3:.1f} | {p.batch_size / c.predicted_s:,.0f} | {p.samples_per_s:,.0f} | {c.error:+.1%} |"
        )
    print(f"\nfit (unrounded): fill {fit.fill_s * 1e6:.2f} us, launch {fit.launch_s * 1e6:.1f} us, "
          f"framework {fit.framework_s * 1e3:.2f} ms")  # fmt: skip
    for (d, p), e in fit.device_efficiency.items():
        print(f"  efficiency {d} {p}: {e:.4f}")
    for p, e in fit.efficiency.items():
        print(f"  efficiency {p}, a device without points (median): {e:.4f}; leave one device out: "
              f"{'no other device' if math.isnan(loo.get(p, math.nan)) else f'{loo[p]:+.1%}'}")  # fmt: skip
    print("\nheld out of the fit (predicted with the constants above):")
    print("| point | bound | kernels | efficiency | measured ms | device ms | host ms | predicted samples/s | measured "
          "| error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in held:
        p = c.point
        print(
            f"| {p.label} | {p.bound} | {len(work_of(p))} | {c.efficiency:.2f} | {p.step_s * 1e3:.1f} | "
            f"{c.device_s * 1e3:.1f} | {c.host_s * 1e3:.1f} | {p.batch_size / c.predicted_s:,.0f} | "
            f"{p.samples_per_s:,.0f} | {c.error:+.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
