"""The timing tier, run N times beside busy processes that compete for the cores (docs/testing.md).

Each pass runs ``make test-timing`` (as ``make test`` runs those tests: several at a time), while ``--busy``
processes (default 2) spin on the CPU for the whole pass. A timing test must pass here every time: its truth is
timed in the same run on the same clock, and its bounds come from the measured spread, never from a quiet host.

Run: ``make stress`` or ``.venv/bin/python benchmarks/stress_timing.py [--passes 5] [--busy 2] [--out DIR]
[-- PYTEST_ARGS...]``. Prints one line per pass (seconds, passed, failed, the failed tests' ids) and writes
``stress-timing.json`` into ``--out`` (default ``runs/stress-timing``); exit 0 when every pass passed, else 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPIN = "while True:\n    pass\n"


def busy(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that keep a core busy each until killed."""
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]


def one_pass(index: int, out: Path, extra: list[str]) -> dict[str, object]:
    """One run of the timing tier; its outcome from pytest's JUnit XML."""
    junit = out / f"pass-{index}.xml"
    flags = " ".join([f"--junitxml={junit}", *extra])
    t0 = time.monotonic()
    res = subprocess.run(
        ["make", "-s", "test-timing", f"PYTEST_ARGS={flags}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    seconds = time.monotonic() - t0
    (out / f"pass-{index}.log").write_text(res.stdout + res.stderr)
    failed: list[str] = []
    total = 0
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            total += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    return {"pass": index, "seconds": round(seconds, 1), "exit": res.returncode, "tests": total, "failed": failed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "stress-timing")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    if args.passes < 1 or args.busy < 0:
        parser.error(f"--passes {args.passes} --busy {args.busy}: allowed --passes >= 1, --busy >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    spinners = busy(args.busy)
    try:
        for i in range(1, args.passes + 1):
            row = one_pass(i, args.out, args.pytest_args)
            rows.append(row)
            print(
                f"pass {i}/{args.passes}: {row['seconds']} s, {row['tests']} tests, exit {row['exit']}, "
                f"{len(row['failed'])} failed {' '.join(row['failed'])}",  # type: ignore[arg-type]
                flush=True,
            )
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    ok = all(r["exit"] == 0 for r in rows)
    summary = {"passes": len(rows), "busy": args.busy, "all_passed": ok, "rows": rows}
    (args.out / "stress-timing.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{sum(r['exit'] == 0 for r in rows)}/{len(rows)} passes green beside {args.busy} busy processes")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
