"""The slow work units' seconds, from a CI run's ``--durations`` list: tests/data/unit_seconds.json.

Run: ``.venv/bin/python benchmarks/unit_seconds.py LOG [--note TEXT]`` on the output of ``make test
PYTEST_ARGS=--durations=90`` (or ``.ci/run``'s log with it). Each listed test's setup, call and teardown are summed
into its xdist work unit (tests/scheduling.py: a doc's commands, a file whose tests share a fixture, else the test),
and the table is written for ``scheduling.run_order``, which hands out the longest units first. Only the listed
(slowest) tests are there: every other unit counts as short, so a longer list changes little.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import scheduling  # noqa: E402 - the tests' own module, on the path just above

LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")


def durations(text: str) -> dict[str, float]:
    """Each test's seconds (its phases summed) in the ``slowest N durations`` list of a pytest run's output."""
    out: collections.defaultdict[str, float] = collections.defaultdict(float)
    inside = False
    for line in text.splitlines():
        if re.search(r"slowest (\d+ )?durations", line):
            inside = True
        elif inside and line.startswith("="):
            break
        elif inside and (m := LINE.match(line)):
            out[m.group(3)] += float(m.group(1))
    return dict(out)


def unit_seconds(tests: dict[str, float]) -> dict[str, float]:
    """The seconds summed per work unit, longest first."""
    units: collections.defaultdict[str, float] = collections.defaultdict(float)
    for nodeid, seconds in tests.items():
        units[scheduling.work_unit(nodeid)] += seconds
    return {unit: round(s, 1) for unit, s in sorted(units.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path, help="a pytest run's output with --durations=N")
    ap.add_argument("--note", default="", help="where and how the run was made (kept in the table)")
    ap.add_argument("--out", type=Path, default=scheduling.UNIT_SECONDS)
    args = ap.parse_args(argv)
    tests = durations(args.log.read_text(encoding="utf-8", errors="replace"))
    if not tests:
        print(f"no 'slowest durations' list in {args.log}: run pytest with --durations=90", file=sys.stderr)
        return 2
    table = {"source": args.note or str(args.log), "seconds": unit_seconds(tests)}
    args.out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"{len(table['seconds'])} units from {len(tests)} tests -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
