"""Overhead of profiling a training loop with a Session.

1. Throughput ratio: a small CPU training loop (conv net on in-memory tensors through a DataLoader) run
   without and with a Session at the default sampling rate (10 Hz, host + NVML sources), paired in one
   process, the order alternating between pairs so drift cancels; the figure is the median of the
   per-pair ratios. Target: >= 0.99.
2. Live view: Session alone vs Session + the rich live view at 4 Hz, paired the same way.
3. Per-phase cost: ``with s.phase(name): pass`` inside an open step, and the per-step cost of
   ``Session.wrap`` over an in-memory list, in microseconds. Budget: < 20 us per phase.

Run: ``make bench`` or ``.venv/bin/python benchmarks/overhead.py [--pairs 5] [--steps 150] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler import Session


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def _loader(batch: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (4096,), generator=g)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True, generator=g
    )


def train(steps: int, session: Session | None, batch: int = 64) -> float:
    """Samples/s over ``steps`` steps (after 10 warm-up steps outside the timing)."""
    torch.manual_seed(0)
    model, loader = _model(), _loader(batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    done, t0 = 0, 0.0
    while done < steps + 10:
        batches = session.wrap(loader) if session is not None else loader
        for xb, yb in batches:
            if done == 10:
                t0 = time.perf_counter()
            if session is not None:
                with session.phase("h2d"):
                    x, y = xb.to("cpu"), yb.to("cpu")
                with session.phase("compute"):
                    loss = loss_fn(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            else:
                x, y = xb.to("cpu"), yb.to("cpu")
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            done += 1
            if done >= steps + 10:
                break
    return steps * batch / (time.perf_counter() - t0)


def throughput_pairs(pairs: int, steps: int) -> dict[str, object]:
    ratios, base, prof = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            order = ("base", "prof") if i % 2 == 0 else ("prof", "base")
            got = {}
            for which in order:
                if which == "base":
                    got["base"] = train(steps, None)
                else:
                    with Session(Path(tmp) / f"run{i}", sample_hz=10.0) as s:
                        got["prof"] = train(steps, s)
            base.append(got["base"])
            prof.append(got["prof"])
            ratios.append(got["prof"] / got["base"])
            print(
                f"  pair {i + 1}: without {got['base']:.0f} samples/s, with {got['prof']:.0f} samples/s, "
                f"ratio {ratios[-1]:.4f}",
                flush=True,
            )
    return {
        "pairs": pairs,
        "steps": steps,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "median_without_samples_per_s": statistics.median(base),
        "median_with_samples_per_s": statistics.median(prof),
    }


def live_pairs(pairs: int, steps: int) -> dict[str, object]:
    """Session alone vs Session + the rich live view redrawing at 4 Hz into a terminal-like sink."""
    from rich.console import Console

    from profiler.feeds import SessionFeed
    from profiler.render.live import LiveView

    ratios, frames = [], []
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
        for i in range(pairs):
            order = ("plain", "live") if i % 2 == 0 else ("live", "plain")
            got = {}
            for which in order:
                with Session(Path(tmp) / f"live{i}{which}", sample_hz=10.0) as s:
                    if which == "plain":
                        got[which] = train(steps, s)
                    else:
                        console = Console(file=sink, force_terminal=True, width=120)
                        with LiveView(SessionFeed(s), console=console) as view:
                            got[which] = train(steps, s)
                        frames.append(view.frames)
            ratios.append(got["live"] / got["plain"])
            print(f"  pair {i + 1}: session {got['plain']:.0f} samples/s, session + live view {got['live']:.0f} "
                  f"samples/s, ratio {ratios[-1]:.4f}", flush=True)
    return {"pairs": pairs, "steps": steps, "ratios": ratios, "median_ratio": statistics.median(ratios),
            "frames": frames}


def phase_cost(n: int = 200_000, repeats: int = 5) -> dict[str, float]:
    """Median over ``repeats`` of the mean cost of one phase enter+exit and of one wrapped step."""
    per_phase, per_step = [], []
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp) / "phase", sources=[]) as s:
        for _ in range(repeats):
            items = [None] * n
            t = time.perf_counter()
            for _ in items:
                pass
            bare = time.perf_counter() - t
            t = time.perf_counter()
            for _ in s.wrap(items, samples=1):
                pass
            per_step.append((time.perf_counter() - t - bare) / n * 1e6)
            for _ in s.wrap([None], samples=1):  # one open step to attribute phases to
                t = time.perf_counter()
                for _ in range(n):
                    with s.phase("compute"):
                        pass
                per_phase.append((time.perf_counter() - t) / n * 1e6)
    return {
        "phase_us_median": statistics.median(per_phase),
        "phase_us_max": max(per_phase),
        "wrap_step_us_median": statistics.median(per_step),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    cost = phase_cost()
    print(
        f"per-phase cost: {cost['phase_us_median']:.2f} us (median of 5 x 200k; worst batch "
        f"{cost['phase_us_max']:.2f} us; budget 20 us)   wrap per step: {cost['wrap_step_us_median']:.2f} us"
    )
    print(f"throughput with vs without a Session (10 Hz, host+nvml sources), {args.pairs} pairs:", flush=True)
    thr = throughput_pairs(args.pairs, args.steps)
    verdict = "meets" if thr["median_ratio"] >= 0.99 else "MISSES"  # type: ignore[operator]
    print(f"median ratio {thr['median_ratio']:.4f} ({verdict} the >= 0.99 target)")
    print("throughput with vs without the live view (rich, 4 Hz), both under a Session:", flush=True)
    live = live_pairs(args.pairs, args.steps)
    print(f"median ratio {live['median_ratio']:.4f}")
    if args.json:
        print(json.dumps({"phase_cost": cost, "throughput": thr, "live_view": live}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
