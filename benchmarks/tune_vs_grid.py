"""The tuner against a plain grid, on loaders of known cost (#47; docs/sweep-and-tune.md, "Measured figures").

For each kind of loader: items that wait (``wait``: 4 ms of sleep, as storage or a network), items that compute
(``spin``: 2 ms of CPU in Python), cheap items (``cheap``), all in benchmarks/scenarios/tune_items.py with a step
that computes about 40 ms at batch 32; and an unmodified script whose items wait (``script``:
benchmarks/scenarios/wait_train.py, through ``-- CMD``):

1. the grid: ``stallscope sweep`` over pipelines naive and prefetch, batch 32 and 64, workers 0, 1, 2, 4, 8 (a
   script: workers 0, 1, 2, 4, 8 at its own batch), its best configuration;
2. the tune: ``stallscope tune --budget-s 180`` (default search space, the loader's own knobs included), its pick
   and the time it used;
3. side by side, in the same run: the default, the grid's best and the pick (with the knobs it set) re-run in
   ``--rounds`` alternating rounds (the order rotates each round); the medians give pick / grid best and
   pick / default.

Steps 2 and 3 run ``--repeats`` times on one grid: the table gives the median of the repeats' ratios and their
range, and each repeat's pick.

Run: ``.venv/bin/python benchmarks/tune_vs_grid.py [--kinds wait,spin,cheap,script] [--budget-s 180] [--rounds 2]
[--repeats 3] [--json]``. About 15 minutes a kind on the 2-core host at the defaults.
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
# pipeline, batch, workers, prefetch_factor, pin_memory (None: the loader's own)
Cfg = tuple[str, int, int, int | None, bool | None]


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
    return (d["pipeline"], int(d["batch_size"]), int(d["workers"]), d.get("prefetch_factor"), d.get("pin_memory"))


def name(c: Cfg) -> str:
    knobs = (f"-pf{c[3]}" if c[3] is not None else "") + ("" if c[4] is None else "-pin" if c[4] else "-nopin")
    return f"{c[0]}-{c[1]}-{c[2]}{knobs}"


def run_flags(c: Cfg) -> list[str]:
    """``stallscope run``'s flags for ``c``: the pick trains as the tune ran it."""
    out = ["--pipeline", c[0], "--batch-size", str(c[1]), "--workers", str(c[2])]
    out += ["--prefetch-factor", str(c[3])] if c[3] is not None else []
    return out + (["--pin-memory", "on" if c[4] else "off"] if c[4] is not None else [])


def scenario_kind(kind: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    grid = stallscope(
        "sweep", str(SCENARIO), "--pipelines", GRID["pipelines"], "--batch-sizes", GRID["batch_sizes"], "--workers",
        GRID["workers"], "--no-live", "--json", "--out", str(tmp / "grid"), items=kind,
    )  # fmt: skip
    rows = {cfg_of(r): r["throughput_samples_per_s"] for r in grid["rows"] if r.get("throughput_samples_per_s")}
    best = max(rows, key=lambda c: rows[c])
    repeats = []
    for k in range(args.repeats):
        t0 = time.monotonic()
        tune = stallscope(
            "tune", str(SCENARIO), "--budget-s", str(args.budget_s), "--no-live", "--json", "--out",
            str(tmp / f"tune{k}"), items=kind,
        )  # fmt: skip
        tune_s = time.monotonic() - t0
        pick, default = cfg_of(tune["recommended"]), cfg_of(tune["default"])
        measured = side_by_side(kind, [default, best, pick], tmp / f"rounds{k}", args.rounds)
        repeats.append(repeat(rows, best=best, pick=pick, default=default, measured=measured, tune=tune, tune_s=tune_s))
    return summary(kind, rows, best, repeats)


def side_by_side(kind: str, cfgs: list[Cfg], tmp: Path, rounds: int) -> dict[Cfg, list[float]]:
    distinct = list(dict.fromkeys(cfgs))
    out: dict[Cfg, list[float]] = {c: [] for c in distinct}
    for r in range(rounds):
        order = distinct[r % len(distinct) :] + distinct[: r % len(distinct)]
        for c in order:
            d = stallscope(
                "run", str(SCENARIO), *run_flags(c), "--no-live", "--json", "--out", str(tmp / f"r{r}-{name(c)}"),
                items=kind,
            )  # fmt: skip
            out[c].append(d["throughput_samples_per_s"])
    return out


def repeat(
    grid: dict[Cfg, float],
    *,
    best: Cfg,
    pick: Cfg,
    default: Cfg,
    measured: dict[Cfg, list[float]],
    tune: dict[str, Any],
    tune_s: float,
) -> dict[str, Any]:
    """One tune and its side-by-side rounds."""
    med = {c: statistics.median(v) for c, v in measured.items()}
    return {
        "pick": name(pick),
        "pick_in_grid": grid.get(pick),
        "default": name(default),
        "rounds": {name(c): v for c, v in measured.items()},
        "pick_over_grid_best": med[pick] / med[best],
        "pick_over_default": med[pick] / med[default],
        "tune_speedup": tune.get("speedup"),
        "tune_trials": len(tune.get("trials", [])),
        "tune_configurations": len({t["config"] for t in tune.get("trials", [])}),
        "tune_elapsed_s": tune.get("elapsed_s"),
        "tune_wall_s": tune_s,
        "stopped": tune.get("stopped"),
    }


def summary(kind: str, grid: dict[Cfg, float], best: Cfg, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """The kind's grid best and the median (and range) of its repeats' ratios."""

    def spread(key: str) -> dict[str, float]:
        values = [r[key] for r in repeats]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "kind": kind,
        "grid_best": name(best),
        "grid_best_in_grid": grid[best],
        "pick_over_grid_best": spread("pick_over_grid_best"),
        "pick_over_default": spread("pick_over_default"),
        "tune_trials": spread("tune_trials"),
        "tune_elapsed_s": spread("tune_elapsed_s"),
        "repeats": repeats,
    }


def script_kind(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(SCRIPT)]
    grid = stallscope("sweep", "--workers", GRID["workers"], "--json", "--out", str(tmp / "grid"), "--", *cmd)
    rows = {cfg_of(r): r["throughput_samples_per_s"] for r in grid["rows"] if r.get("throughput_samples_per_s")}
    best = max(rows, key=lambda c: rows[c])
    repeats = []
    for k in range(args.repeats):
        t0 = time.monotonic()
        tune = stallscope(
            "tune", "--budget-s", str(args.budget_s), "--json", "--out", str(tmp / f"tune{k}"), "--", *cmd
        )
        tune_s = time.monotonic() - t0
        pick, default = cfg_of(tune["recommended"]), cfg_of(tune["default"])
        measured = script_rounds(cmd, [default, best, pick], tmp / f"rounds{k}", args)
        repeats.append(repeat(rows, best=best, pick=pick, default=default, measured=measured, tune=tune, tune_s=tune_s))
    return summary("script", rows, best, repeats)


def script_rounds(cmd: list[str], cfgs: list[Cfg], tmp: Path, args: argparse.Namespace) -> dict[Cfg, list[float]]:
    """The script's configurations re-run in alternating rounds through the tuner's own trials (the start-up module
    sets each one's knobs, the pick's prefetch_factor and pin_memory included), each measured as long as a tune
    trial; ``cfgs[0]``, the script's own setting, runs the script unchanged and runs first."""
    from profiler.sweep.analysis import Config
    from profiler.sweep.command import CommandSpec, CommandTrials
    from profiler.sweep.run import trial_seconds

    tmp.mkdir(parents=True, exist_ok=True)
    trials = CommandTrials(CommandSpec(cmd, seconds=trial_seconds(None, args.budget_s)), tmp)
    distinct = list(dict.fromkeys(cfgs))
    out: dict[Cfg, list[float]] = {c: [] for c in distinct}
    for r in range(args.rounds):
        for c in distinct[r % len(distinct) :] + distinct[: r % len(distinct)]:
            cfg = Config("script", c[1], c[2], prefetch_factor=c[3], pin_memory=c[4])
            label = f"r{r}-{name(c)}"
            row = trials.first(label) if c == cfgs[0] else trials(cfg, label, "")
            out[c].append(row.throughput_samples_per_s)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="wait,spin,cheap,script")
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # the script's rounds run the tuner's own trials
    results = []
    for kind in args.kinds.split(","):
        with tempfile.TemporaryDirectory(prefix=f"tune-vs-grid-{kind}-") as tmp:
            r = script_kind(Path(tmp), args) if kind == "script" else scenario_kind(kind, Path(tmp), args)
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"medians of {args.repeats} repeats (range), each with {args.rounds} side-by-side rounds")
    print("| loader | grid's best | picks | pick / grid best | pick / default | trials, budget used |")
    print("|---|---|---|---|---|---|")
    for r in results:
        g, d = r["pick_over_grid_best"], r["pick_over_default"]
        picks = ", ".join(x["pick"] for x in r["repeats"])
        print(
            f"| {r['kind']} | {r['grid_best']} ({r['grid_best_in_grid']:.0f}) | {picks} | {g['median']:.2f} "
            f"({g['min']:.2f}-{g['max']:.2f}) | {d['median']:.2f} ({d['min']:.2f}-{d['max']:.2f}) | "
            f"{r['tune_trials']['median']:.0f}, {r['tune_elapsed_s']['median']:.0f} of {args.budget_s:g} s |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
