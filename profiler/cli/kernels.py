"""``stallscope kernels TRACE``: the GPU's view of a torch.profiler trace a user already has."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from typing import Any

from profiler.cli.common import BadInput, Handler
from profiler.kernels.analysis import KERNEL_WAIT_US, analyze
from profiler.kernels.read import TraceError, read_trace
from profiler.kernels.render import render


def add_parsers(sub: Any) -> None:
    """Register ``kernels``."""
    k = sub.add_parser(
        "kernels",
        help="a torch.profiler trace's kernels, copies and sets: each stream's busy time and why it idled",
    )
    k.add_argument("trace", help="a torch.profiler (kineto) trace: .json or .json.gz")
    k.add_argument(
        "--kernel-wait-us", type=float, default=KERNEL_WAIT_US,
        help=f"a gap under this between two kernels is the cost of launching back to back (default {KERNEL_WAIT_US:g})",
    )  # fmt: skip
    k.add_argument(
        "--hta-window", action="store_true",
        help="the streams' figures over the work launched in every ProfilerStep but the last, as Holistic Trace "
        "Analysis 0.5 takes them (default: the whole trace)",
    )  # fmt: skip
    k.add_argument("--json", action="store_true", help="print the figures as JSON")


def cmd_kernels(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.kernel_wait_us) and args.kernel_wait_us >= 0):
        raise BadInput(f"--kernel-wait-us {args.kernel_wait_us}: allowed a number of microseconds >= 0")
    try:
        trace = read_trace(args.trace)
    except TraceError as exc:
        raise BadInput(str(exc)) from None
    tk = analyze(trace, kernel_wait_us=args.kernel_wait_us, hta_window=args.hta_window)
    if args.json:
        out = asdict(tk)
        out["busy_fraction"] = tk.busy_fraction if tk.activities else None
        print(json.dumps(out, indent=2))
    else:
        print(render(args.trace, tk, args.kernel_wait_us, hta_window=args.hta_window))
    return 0


HANDLERS: dict[str, Handler] = {"kernels": cmd_kernels}
