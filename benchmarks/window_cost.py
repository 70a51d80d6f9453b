"""What one kernel window costs the training thread, against the activities it recorded (issue #55; docs/benchmarks.md,
"Kernel windows: the cost per window").

The run's recorder (profiler.core.kernel_windows.windows.TorchKernelRecorder) is timed by part on the training thread:
``start`` (torch.profiler's start: CUPTI's subscription on a GPU), ``sync`` (on CUDA, the window's last kernels),
``stop`` (the profiler's stop: CUPTI's flush and kineto's post-processing, C++ holding the GIL) and ``read``: either
kineto's events read into activities here, in Python (``read here``: a Session without a sampler process, and the
start-up module of ``run --``), or kineto's trace written in C++ for the sampler process to read (``handed over``:
a Session's default; ``parse`` is that read, timed here but paid in the sampler process). Without a GPU the same
recorder runs over torch's CPU operators (``activity="cpu"``: the same start, stop and read, with CPU events where
CUPTI's would be): a loop of tiny in-place adds makes about 1,000 to 35,000 events a window. With CUDA
(``torch.cuda.is_available()``) it runs on the GPU too, with a loop of tiny kernels (a kernel and its launch are two
activities).

**Off the thread** (CUDA's path in a run: ``off_thread``, :class:`profiler.core.kernel_windows.windows.WindowThread`):
the recorder starts and stops on the windows' own thread while the training thread goes on stepping; what it costs
the training thread is its wait for the start plus what its steps lost while the stop and the hand-over ran there
(their time over as many steps at the median of 50 steps before and 50 after; ``lost``). CPU operators are
recorded only on the thread that started the profiler, where CUPTI records every thread's kernels, so here the
window thread makes the window's operators itself, right after its start (not counted); the training thread's
steps are 20 small matrix products.
The hand-over, on every path, is torch's public ``export_chrome_trace`` (its binding holds the GIL while kineto's C++
writes the trace: off the thread, the training thread's steps wait that long, counted in ``lost``). Until
issue #65 a fourth row timed the same C++ called through ``ctypes`` with the GIL released; that path could abort the
process on a torch whose memory layout it did not know, and was removed (docs/benchmarks.md gives its figures).

Each size: ``--repeats`` windows (the first window of the process, kineto's own set-up, is run and not counted);
medians printed, in ms, with the events per window. Run: ``.venv/bin/python benchmarks/window_cost.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from profiler.core.kernel_windows.trace_file import fill, trace_path  # noqa: E402
from profiler.core.kernel_windows.windows import TorchKernelRecorder, WindowThread  # noqa: E402
from profiler.core.rows import KernelWindow  # noqa: E402

SIZES = (1_000, 5_000, 15_000, 35_000)  # target events a window
PARTS = ("start", "sync", "stop", "read")


def window(rec: TorchKernelRecorder, ops: int, x: torch.Tensor, handoff: Path | None) -> dict[str, float]:
    """One window of ``ops`` tiny operators: read in this process (``handoff`` None), or handed over as kineto's
    trace in ``handoff`` and then read as the sampler process reads it (``parse``: off the training thread)."""
    rec.start()
    for _ in range(ops):
        x.add_(1)
    if handoff is None:
        rec.stop()
        parts = dict(rec.parts)
    else:
        rec.stop_to(trace_path(handoff, 1))
        parts = dict(rec.parts)
        t0 = time.perf_counter()
        parts["events"] = len(fill(KernelWindow(1, 0.0, 0.0, 0.0, []), handoff, 0.0).activities)
        parts["parse"] = time.perf_counter() - t0
    parts["total"] = sum(parts.get(p, 0.0) for p in PARTS)  # ``read`` holds the export (the GIL held for it)
    return parts


class OpsAtStart:
    """The off-thread proxy's recorder: the run's recorder, whose window's ``ops`` CPU operators are made on the window
    thread right after its start (see the module)."""

    off_thread = True

    def __init__(self, rec: TorchKernelRecorder, ops: int, x: torch.Tensor) -> None:
        self.rec, self.ops, self.x = rec, ops, x

    @property
    def parts(self) -> dict[str, float]:
        return self.rec.parts

    def start(self) -> None:
        self.rec.start()
        for _ in range(self.ops):
            self.x.add_(1)

    def stop_to(self, path: Path, boundary: object = None) -> None:
        self.rec.stop_to(path, boundary)


def off_thread(rec: TorchKernelRecorder, ops: int, x: torch.Tensor, handoff: Path) -> dict[str, float]:
    """One window started and stopped on a WindowThread while this (training) thread steps: its cost here."""
    y = torch.full((48, 48), 0.5)

    def step() -> float:
        t0 = time.perf_counter()
        z = y
        for _ in range(20):
            z = torch.mm(z, y) * 0.01
        return time.perf_counter() - t0

    before = [step() for _ in range(50)]
    thread = WindowThread(OpsAtStart(rec, ops, x), time.perf_counter)
    thread.start()
    start = rec.parts["start"]  # the operators made after it are the proxy's, not the window's cost
    thread.stop(None, trace_path(handoff, 1))
    during = []
    while not thread.done.is_set():
        during.append(step())
    after = [step() for _ in range(50)]
    thread.close()
    if isinstance(thread.result, BaseException):
        raise thread.result
    # the baseline from both sides: this host's speed drifts by 10% within seconds, as much as the window costs
    lost = max(0.0, math.fsum(during) - len(during) * statistics.median(before + after))
    parts = {**rec.parts, "start": start, "lost": lost, "total": start + lost}
    t0 = time.perf_counter()
    parts["events"] = len(fill(KernelWindow(1, 0.0, 0.0, 0.0, []), handoff, 0.0).activities)
    parts["parse"] = time.perf_counter() - t0
    return parts


def measure(activity: str, repeats: int, sizes: tuple[int, ...] = SIZES) -> list[dict[str, float]]:
    device = "cuda" if activity == "cuda" else "cpu"
    x = torch.ones(4, device=device)
    rec = TorchKernelRecorder(torch, time.perf_counter, activity=activity)
    probe = window(rec, 1000, x, None)  # kineto's set-up (the process's first window) happens here, not counted
    per_op = probe["events"] / 1000
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for target in sizes:
            ops = max(1, round(target / per_op))
            for how, where in (("read here", None), ("handed over", Path(tmp))):
                got = [window(rec, ops, x, where) for _ in range(repeats)]
                keys = (*PARTS, "total", "events", *(("parse",) if where else ()))
                row = {k: statistics.median(g[k] for g in got) for k in keys}
                rows.append({"activity": activity, "path": how, **row})
            got = [off_thread(rec, ops, x, Path(tmp)) for _ in range(repeats)]
            keys = ("start", "sync", "stop", "read", "lost", "total", "events", "parse")
            rows.append({"activity": activity, "path": "off thread",
                         **{k: statistics.median(g.get(k, 0.0) for g in got) for k in keys}})  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--only", choices=("cpu", "cuda"), help="one recorder (default: CPU, and CUDA where available)")
    p.add_argument("--sizes", help=f"events a window, comma-separated (default: {','.join(map(str, SIZES))})")
    args = p.parse_args()
    torch.set_num_threads(1)
    sizes = tuple(int(x) for x in args.sizes.split(",")) if args.sizes else SIZES
    rows = measure("cpu", args.repeats, sizes) if args.only != "cuda" else []
    if args.only != "cpu" and torch.cuda.is_available():
        rows += measure("cuda", args.repeats, sizes)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("ms a window; off thread: stop and read ran on the window thread, the training thread paid start + lost")
    print(
        f"{'recorder over':<14}{'path':<13}{'events':>8}{'start':>8}{'sync':>7}{'stop':>8}{'read':>8}{'lost':>8}"
        f"{'training thread':>17}{'parse (elsewhere)':>19}"
    )
    for r in rows:
        parse = f"{r['parse'] * 1e3:>19.1f}" if "parse" in r else f"{'-':>19}"
        lost = f"{r['lost'] * 1e3:>8.1f}" if "lost" in r else f"{'-':>8}"
        print(
            f"{r['activity']:<14}{r['path']:<13}{r['events']:>8.0f}"
            + "".join(f"{r[k] * 1e3:>{w}.1f}" for k, w in (("start", 8), ("sync", 7), ("stop", 8), ("read", 8)))
            + f"{lost}{r['total'] * 1e3:>17.1f}{parse}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
