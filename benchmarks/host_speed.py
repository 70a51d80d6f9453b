"""The host's own speed over time: the noise floor under every timing figure measured on this host.

One fixed piece of work (a 256x256 float32 matmul repeated, then a pure-Python loop: about 5 ms, one thread) is
timed back to back for ``--seconds``. The same instructions on the same data should take the same time; how much
they do not is what this host does to a run on its own, before stallscope or the workload changes anything. It
reports each piece's time (median, quartiles, range) and how the mean of a window of pieces moves between windows
of 1 s and of ``--window`` seconds (about one short training run): a run-to-run spread in a benchmark or a what-if
check that is no larger than the windows' is the host's, not the code's.

    python benchmarks/host_speed.py --seconds 120 --window 15 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from pairing import spread  # benchmarks/ is this script's sys.path[0]


def piece(a: torch.Tensor) -> None:
    for _ in range(8):
        a @ a
    x = 0
    for i in range(40_000):
        x += i


def timed_pieces(seconds: float) -> list[tuple[float, float]]:
    """(start, seconds) of each piece, back to back for ``seconds`` after a warm-up second."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        piece(a)
    out: list[tuple[float, float]] = []
    t_first = time.perf_counter()
    while (t := time.perf_counter()) - t_first < seconds:
        piece(a)
        out.append((t - t_first, time.perf_counter() - t))
    return out


def windows(pieces: list[tuple[float, float]], width_s: float) -> list[float]:
    """The mean piece time (s) in each whole window of ``width_s`` seconds."""
    by: dict[int, list[float]] = {}
    for t, d in pieces:
        by.setdefault(int(t // width_s), []).append(d)
    last = int(pieces[-1][0] // width_s)
    return [statistics.fmean(v) for k, v in sorted(by.items()) if k < last]  # the last window is cut short


def variation(values: list[float]) -> dict[str, float]:
    """:func:`pairing.spread` with the count, the coefficient of variation and max over min."""
    cv = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0
    return {"n": len(values), **spread(values), "cv": cv, "max_over_min": max(values) / min(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--window", type=float, default=15.0, help="the longer window, s (about one short run)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    if args.seconds < 3 * args.window or args.window < 1.0:
        print(f"--seconds {args.seconds:g} must hold three --window {args.window:g} (at least 1 s)", file=sys.stderr)
        return 2
    pieces = timed_pieces(args.seconds)
    got = {
        "pieces_ms": variation([d * 1e3 for _, d in pieces]),
        "window_1s_ms": variation([w * 1e3 for w in windows(pieces, 1.0)]),
        f"window_{args.window:g}s_ms": variation([w * 1e3 for w in windows(pieces, args.window)]),
    }
    for name, s in got.items():
        print(f"{name:>16}: n {s['n']:>5}  median {s['median']:.2f}  quartiles {s['q1']:.2f}-{s['q3']:.2f}  range "
              f"{s['min']:.2f}-{s['max']:.2f}  cv {s['cv']:.3f}  max/min {s['max_over_min']:.2f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
