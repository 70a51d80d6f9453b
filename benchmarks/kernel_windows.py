"""What kernel windows cost (profiler/core/kernel_windows/windows.py; docs/benchmarks.md, "Kernel windows").

1. **Outside the windows**, the training process's hot path: the fast loop (a tiny CNN, batches in memory, about
   0.8 ms a step on these 2 cores) through two Sessions in one process, one with kernel windows off and one with a
   window of 2 steps every 100 whose recorder records nothing (so what is measured is the windows' own machinery:
   the ticks made due at their steps, the opening and closing). Blocks of 20 steps in groups of four (off, on, on,
   off): the median over the groups of off / on step time, and the cost per step in microseconds; then the same
   with windows off in both Sessions: the comparison's own bias (an A/A run), against which the first is read.
2. **Inside the windows, on the simulated device** (``launch=sleep``): ``stallscope run`` of
   tests/data/scenarios/gil_loader.py with ``--kernel-windows 20:20:60`` over 200 steps, three times: the windows'
   cost to the training thread (``gpu.window_cost_ms``), and the median step inside them against outside.
3. **On CUDA** (where ``torch.cuda.is_available()``): the fast loop on the GPU with the CUPTI recorder, windows of
   20 steps every 100 over 600 steps: what opening and closing them cost (CUPTI's start, the profiler's stop,
   reading its events), the median step inside them against outside, and the 20 steps after each window against
   the 20 before it (a CUPTI left attached slows every later launch; TEARDOWN_CUPTI=1 should leave none).

Run: ``.venv/bin/python benchmarks/kernel_windows.py [--groups 60] [--sim-runs 3] [--json]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from profiler import Session  # noqa: E402

BLOCK = 20


class NullRecorder:
    """A kernel recorder that records nothing: the windows' machinery alone."""

    source = "cupti"

    def usable(self) -> str | None:
        return None

    def start(self) -> None:
        pass

    def stop(self) -> list[tuple[int, int, float, float, float]]:
        return []


def _step_fn(device: str) -> tuple[Callable[[torch.Tensor, torch.Tensor], None], list[Any]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 26 * 26, 10)).to(device)
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 1, 28, 28, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device))
               for _ in range(32)]  # fmt: skip

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, batches


def outside(groups: int, plan: str = "0:2:100") -> dict[str, float]:
    """Part 1: the hot path with windows off against windows planned (see the module); ``plan="off"``: the same
    two Sessions both without windows, the comparison's own bias (an A/A run)."""
    torch.set_num_threads(1)
    step, batches = _step_fn("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        off = Session(Path(tmp) / "off", device="cpu", sources=[], kernel_windows="off").start()
        on = Session(Path(tmp) / "on", device="cpu", sources=[], kernel_windows=plan,
                     kernel_recorder=NullRecorder()).start()  # fmt: skip
        runs = {"off": off.wrap(itertools.cycle(batches)), "on": on.wrap(itertools.cycle(batches))}

        def block(name: str) -> None:
            it, s = runs[name], off if name == "off" else on
            for _ in range(BLOCK):
                x, y = next(it)
                with s.phase("compute"):
                    step(x, y)

        for name in ("off", "on") * 10:  # warm-up
            block(name)
        ratios, costs, step_ms = [], [], []
        for _ in range(groups):
            t = [time.perf_counter()]
            for name in ("off", "on", "on", "off"):
                block(name)
                t.append(time.perf_counter())
            off_s, on_s = t[1] - t[0] + t[4] - t[3], t[3] - t[1]
            ratios.append(off_s / on_s)
            costs.append((on_s - off_s) / (2 * BLOCK) * 1e6)
            step_ms.append(off_s / (2 * BLOCK) * 1e3)
        for it in runs.values():
            it.close()
        on.close()
        off.close()
        summary = on.summary()
        windows = summary.gpu.windows if summary is not None and summary.gpu is not None else 0
    return {
        "groups": groups,
        "median_ratio_off_over_on": statistics.median(ratios),
        "median_cost_us_per_step": statistics.median(costs),
        "step_ms": statistics.median(step_ms),
        "windows_opened": windows,
    }


def inside_sim(runs: int) -> dict[str, Any]:
    """Part 2: the windows on the simulated device (see the module)."""
    rows = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            res = subprocess.run(
                [sys.executable, "-m", "profiler", "run", str(ROOT / "tests/data/scenarios/gil_loader.py"),
                 "--device", "sim:h100", "--steps", "200", "--kernel-windows", "20:20:60", "--no-attribution",
                 "--no-live", "--json", "--out", str(Path(tmp) / "run")],
                cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
            if res.returncode != 0:
                raise SystemExit(f"kernel_windows: the sim run failed: {res.stderr[-500:]}")
            gpu = json.loads(res.stdout)["gpu"]
            rows.append(gpu)
    return {
        "runs": runs,
        "windows": rows[0]["windows"],
        "window_cost_ms": statistics.median(r["window_cost_ms"] for r in rows),
        "window_step_ms": statistics.median(r["window_step_ms"] for r in rows),
        "other_step_ms": statistics.median(r["other_step_ms"] for r in rows),
        "launched_per_step": rows[0]["launched_per_step"],
    }


def on_cuda(steps: int = 600) -> dict[str, Any] | None:
    """Part 3, on a GPU (None without one): see the module."""
    if not torch.cuda.is_available():
        return None
    step, batches = _step_fn("cuda")
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        s = Session(Path(tmp) / "cuda", device="cuda", warmup=20, kernel_windows="30:20:100").start()
        t_prev = None
        for x, y in s.wrap(itertools.islice(itertools.cycle(batches), steps)):
            with s.phase("compute"):
                step(x, y)
            now = time.perf_counter()
            if t_prev is not None:
                times.append(now - t_prev)
            t_prev = now
        summary = s.close()
    gpu = summary.gpu if summary is not None else None
    if gpu is None:
        return {"error": "no kernel window measured a step", "events": []}
    first = 20 + 30  # the first window opens at step 50, then every 100 steps, for 20 steps
    starts = list(range(first, steps - 40, 100))
    before = [t for w in starts for t in times[w - 20 : w]]
    after = [t for w in starts for t in times[w + 21 : w + 41]]
    return {
        "device": torch.cuda.get_device_name(0),
        "windows": gpu.windows,
        "window_cost_ms_each": gpu.window_cost_s * 1e3 / max(gpu.windows, 1),
        "window_step_ms": gpu.window_step_ms,
        "other_step_ms": gpu.other_step_ms,
        "after_over_before": statistics.median(after) / statistics.median(before) if before and after else None,
        "busy_fraction": gpu.busy_fraction,
        "host_fraction": gpu.fraction("host"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--groups", type=int, default=60)
    ap.add_argument("--sim-runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--aa", action="store_true", help="part 1 only, with windows off in both Sessions (its bias)")
    args = ap.parse_args(argv)
    if args.aa:
        print(json.dumps(outside(args.groups, "off")))
        return 0
    out = {
        "outside": outside(args.groups),
        "outside_aa": outside(args.groups, "off"),
        "inside_sim": inside_sim(args.sim_runs),
        "cuda": on_cuda(),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    o, aa, i, c = out["outside"], out["outside_aa"], out["inside_sim"], out["cuda"]
    print(f"outside the windows: off / on step time {o['median_ratio_off_over_on']:.4f} (median of {o['groups']} "
          f"groups of {o['step_ms']:.2f} ms steps), {o['median_cost_us_per_step']:+.1f} us a step, "
          f"{o['windows_opened']} windows of 2 steps opened and closed; the same comparison with windows off in "
          f"both (its own bias): {aa['median_ratio_off_over_on']:.4f}, "
          f"{aa['median_cost_us_per_step']:+.1f} us")  # fmt: skip
    print(
        f"inside, simulated device: {i['window_cost_ms']:.1f} ms for {i['windows']} windows; window steps "
        f"{i['window_step_ms']:.2f} ms against {i['other_step_ms']:.2f} outside (median of {i['runs']} runs)"
    )
    if c is None:
        print("on CUDA: no GPU here (torch.cuda.is_available() is False)")
    else:
        print(f"on CUDA: {json.dumps(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
