"""The tuner against a plain grid, on loaders of known cost (#47; docs/sweep-and-tune.md, "Measured figures").

For each kind of loader: items that wait (``wait``: 4 ms of sleep, as storage or a network), items that compute
(``spin``: 2 ms of CPU in Python), cheap items (``cheap``), all in benchmarks/scenarios/tune_items.py with a step
that computes about 40 ms at batch 32; and an unmodified script whose items wait (``script``:
benchmarks/scenarios/wait_train.py, through ``-- CMD``):

1. the grid: ``stallscope sweep`` over pipelines naive and prefetch, batch 32 and 64, workers 0, 1, 2, 4, 8 (a
   script: workers 0, 1, 2, 4, 8 at its own batch), its best configuration;
2. the tune: ``stallscope tune --budget-s 180`` (default search space), its pick and the time it used;
3. side by side, in the same run: the default, the grid's best and the pick re-run in ``--rounds`` alternating
   rounds (the order rotates each round); the medians give pick / grid best and pick / default.

Run: ``.venv/bin/python benchmarks/tune_vs_grid.py [--kinds wait,spin,cheap,script] [--budget-s 180] [--rounds 3]
[--json]``. About 8-10 minutes a kind on the 2-core host.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "benchmarks" / "scenarios" / "tune_items.py"
SCRIPT = ROOT / "benchmarks" / "scenarios" / "wait_train.py"
GRID = {"pipelines": "naive,prefetch", "batch_sizes": "32,64", "workers": "0,1,2,4,8"}
Cfg = tuple[str, int, int]  # pipeline, batch, workers


def stallscope(*args: str, items: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)} | ({"STALLSCOPE_ITEMS": items} if items else {})
    res = subprocess.run(
        [sys.executable, "-m", "profiler", *args], capture_output=True, text=True, check=False, env=env, cwd=ROOT
    )
    if res.returncode != 0:
        raise SystemExit(f"stallscope {' '.join(args[:2])} failed: {res.stderr.strip().splitlines()[-1:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def cfg_of(d: dict[str, Any]) -> Cfg:
    return (d["pipeline"], int(d["batch_size"]), int(d["workers"]))


def scenario_kind(kind: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    grid = stallscope(
        "sweep", str(SCENARIO), "--pipelines", GRID["pipelines"], "--batch-sizes", GRID["batch_sizes"], "--workers",
        GRID["workers"], "--no-live", "--json", "--out", str(tmp / "grid"), items=kind,
    )  # fmt: skip
    rows = {cfg_of(r): r["throughput_samples_per_s"] for r in grid["rows"] if r.get("throughput_samples_per_s")}
    best = max(rows, key=lambda c: rows[c])
    t0 = time.monotonic()
    tune = stallscope(
        "tune", str(SCENARIO), "--budget-s", str(args.budget_s), "--no-live", "--json", "--out", str(tmp / "tune"),
        items=kind,
    )  # fmt: skip
    tune_s = time.monotonic() - t0
    pick, default = cfg_of(tune["recommended"]), cfg_of(tune["default"])
    measured = side_by_side(kind, [default, best, pick], tmp, args.rounds)
    return summary(kind, rows, best=best, pick=pick, default=default, measured=measured, tune=tune, tune_s=tune_s)


def side_by_side(kind: str, cfgs: list[Cfg], tmp: Path, rounds: int) -> dict[Cfg, list[float]]:
    distinct = list(dict.fromkeys(cfgs))
    out: dict[Cfg, list[float]] = {c: [] for c in distinct}
    for r in range(rounds):
        order = distinct[r % len(distinct) :] + distinct[: r % len(distinct)]
        for p, b, w in order:
            d = stallscope(
                "run", str(SCENARIO), "--pipeline", p, "--batch-size", str(b), "--workers", str(w), "--no-live",
                "--json", "--out", str(tmp / f"r{r}-{p}-b{b}-w{w}"), items=kind,
            )  # fmt: skip
            out[(p, b, w)].append(d["throughput_samples_per_s"])
    return out


def summary(
    kind: str,
    grid: dict[Cfg, float],
    *,
    best: Cfg,
    pick: Cfg,
    default: Cfg,
    measured: dict[Cfg, list[float]],
    tune: dict[str, Any],
    tune_s: float,
) -> dict[str, Any]:
    med = {c: statistics.median(v) for c, v in measured.items()}
    return {
        "kind": kind,
        "grid_best": "-".join(map(str, best)),
        "grid_best_in_grid": grid[best],
        "pick": "-".join(map(str, pick)),
        "pick_in_grid": grid.get(pick),
        "default": "-".join(map(str, default)),
        "rounds": {"-".join(map(str, c)): v for c, v in measured.items()},
        "pick_over_grid_best": med[pick] / med[best],
        "pick_over_default": med[pick] / med[default],
        "tune_speedup": tune.get("speedup"),
        "tune_trials": len(tune.get("trials", [])),
        "tune_configurations": len({t["config"] for t in tune.get("trials", [])}),
        "tune_elapsed_s": tune.get("elapsed_s"),
        "tune_wall_s": tune_s,
        "stopped": tune.get("stopped"),
    }


def script_kind(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = ["--", sys.executable, str(SCRIPT)]
    grid = stallscope("sweep", "--workers", GRID["workers"], "--json", "--out", str(tmp / "grid"), *cmd)
    rows = {cfg_of(r): r["throughput_samples_per_s"] for r in grid["rows"] if r.get("throughput_samples_per_s")}
    best = max(rows, key=lambda c: rows[c])
    t0 = time.monotonic()
    tune = stallscope("tune", "--budget-s", str(args.budget_s), "--json", "--out", str(tmp / "tune"), *cmd)
    tune_s = time.monotonic() - t0
    pick, default = cfg_of(tune["recommended"]), cfg_of(tune["default"])
    measured: dict[Cfg, list[float]] = {c: [] for c in dict.fromkeys([default, best, pick])}
    for r in range(args.rounds):  # each round: the script unchanged, then the grid's best and the pick
        workers = ",".join(str(w) for w in dict.fromkeys([best[2], pick[2]]))
        d = stallscope("sweep", "--workers", workers, "--json", "--out", str(tmp / f"round{r}"), *cmd)
        for row in d["rows"]:
            c = cfg_of(row)
            if c in measured and row.get("throughput_samples_per_s"):
                measured[c].append(row["throughput_samples_per_s"])
    return summary("script", rows, best=best, pick=pick, default=default, measured=measured, tune=tune, tune_s=tune_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="wait,spin,cheap,script")
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for kind in args.kinds.split(","):
        with tempfile.TemporaryDirectory(prefix=f"tune-vs-grid-{kind}-") as tmp:
            r = script_kind(Path(tmp), args) if kind == "script" else scenario_kind(kind, Path(tmp), args)
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print("| loader | grid's best | tune's pick | pick / grid best | pick / default | tune: trials, budget used |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['kind']} | {r['grid_best']} ({r['grid_best_in_grid']:.0f}) | {r['pick']} | "
            f"{r['pick_over_grid_best']:.2f} | {r['pick_over_default']:.2f} | {r['tune_trials']} "
            f"({r['tune_configurations']} configurations), {r['tune_elapsed_s']:.0f} of {args.budget_s:g} s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
