"""The suite's time per test file, from pytest's JUnit XML: the table in docs/testing.md.

Run: ``.venv/bin/python benchmarks/test_times.py AFTER.xml [--before BEFORE.xml]``. Prints a Markdown table, one
row per test file (its tier, tests, and the seconds summed over its tests), slowest first, and the totals.
``--cpu DIR`` adds each file's CPU seconds, from a run with ``STALLSCOPE_TEST_CPU=DIR`` (tests/conftest.py: what the
test's pytest process, its warm server and every process under them used while it ran), and lists the light tests
(tests/scheduling.py) with the share of a core each used, marking any over the quarter a light test may use.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timing_files() -> set[str]:
    """``TIMING_FILES`` as tests/conftest.py lists it (read, not imported)."""
    for node in ast.walk(ast.parse((ROOT / "tests" / "conftest.py").read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TIMING_FILES" for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def per_file(junit: Path) -> tuple[dict[str, float], dict[str, int]]:
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        module = next((p for p in name if p.startswith("test_")), name[0]) + ".py"
        seconds[module] += float(case.get("time", 0.0))
        count[module] += 1
    return seconds, count


def cpu_per_file(folder: Path) -> dict[str, float]:
    """{test file: CPU seconds} from the per-worker JSON lines a ``STALLSCOPE_TEST_CPU`` run wrote."""
    out: dict[str, float] = defaultdict(float)
    for f in sorted(folder.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            out[rec["test"].split("::", 1)[0].rsplit("/", 1)[-1]] += float(rec["cpu_s"])
    return out


LIGHT_CORES = 0.25  # the most of a core a light test may use over its run (tests/scheduling.py)


def light_shares(folder: Path) -> list[tuple[str, float, float]]:
    """(test, wall seconds, cores used) of each light test in a ``STALLSCOPE_TEST_CPU`` folder."""
    out = []
    for f in sorted(folder.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("light"):
                wall = float(rec["wall_s"])
                out.append((rec["test"], wall, float(rec["cpu_s"]) / wall if wall > 0 else 0.0))
    return sorted(out, key=lambda r: -r[2])


def tier(module: str, timing: set[str]) -> str:
    if module == "test_docs_examples.py":
        return "docs"
    return "timing" if module in timing else "fast"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("after", type=Path)
    parser.add_argument("--before", type=Path)
    parser.add_argument("--cpu", type=Path, help="a STALLSCOPE_TEST_CPU folder: each file's CPU seconds too")
    args = parser.parse_args()
    after, count = per_file(args.after)
    before = per_file(args.before)[0] if args.before else {}
    timing = timing_files()
    cpu = cpu_per_file(args.cpu) if args.cpu else {}
    head = "| file | tier | tests |" + (" before (s) | after (s) |" if before else " seconds |")
    head += " CPU (s) |" if cpu else ""
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for module in sorted(after, key=lambda m: -after[m]):
        cells = [f"`{module}`", tier(module, timing), str(count[module])]
        if before:
            cells.append(f"{before.get(module, 0.0):.1f}")
        cells.append(f"{after[module]:.1f}")
        if cpu:
            cells.append(f"{cpu.get(module, 0.0):.1f}")
        print("| " + " | ".join(cells) + " |")
    totals = ["**total**", "", str(sum(count.values()))]
    if before:
        totals.append(f"{sum(before.values()):.0f}")
    totals.append(f"{sum(after.values()):.0f}")
    if cpu:
        totals.append(f"{sum(cpu.values()):.0f}")
    print("| " + " | ".join(totals) + " |")
    if args.cpu:
        print("\nlight tests (tests/scheduling.py): cores used over each one's run")
        for test, wall, cores in light_shares(args.cpu):
            over = f"  OVER {LIGHT_CORES}: not light" if cores > LIGHT_CORES else ""
            print(f"  {cores:.2f} over {wall:5.1f} s  {test}{over}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
