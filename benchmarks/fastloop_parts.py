"""The fast loop's cost to the training thread, part by part (issue #65 item 6).

The loop of ``overhead.py --only-fast`` (a tiny CNN on in-memory tensors, batch 32, one intra-op thread, a
DataLoader with 0 or 2 workers) runs one bare step and one step through a default Session (10 Hz, the default
sources) in turn, in one process, with the Session open throughout; the training thread's CPU time
(``time.thread_time``) is read around each part of each step, at the same spots in both: the batch's ``next()``,
the h2d phase's enter, its exit, the compute phase's enter and its exit. A part's cost is the mean over the steps of
the Session step's time there less the bare step's (a mean, not a median: the run-queue reads fall on one step in k).
Right after the model's compute the caches hold the model's data, and stallscope's code runs cold: that is the cost
the loop pays, not the one a loop of empty steps shows.

The schedstat reads and the hand-overs are counted and timed on their own (``perf_counter`` around each call),
and scaled to the loop's own pace: the run queue is read on one step in ``runq_every(step)`` and a hand-over comes
every ``min(64, 0.1 s / step)`` steps, where the alternation here makes a Session step twice as long. What the
threads and the sampler process cost the training thread by running beside it is measured apart: bare steps in
blocks, the sampler process stopped (SIGSTOP) in every other, the training thread's CPU time per step compared.

Run: ``.venv/bin/python benchmarks/fastloop_parts.py [--steps 2000] [--workers 0] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.environ.get("STALLSCOPE_ROOT") or str(Path(__file__).resolve().parents[1]))

from profiler import Session
from profiler.core.sources import sched as schedstat
from profiler.core.steps import clock as stepclock

PARTS = ("fetch", "enter_h2d", "exit_h2d", "enter_compute", "exit_compute")


def _loop(workers: int) -> tuple[Callable[[torch.Tensor, torch.Tensor], None], torch.utils.data.DataLoader]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 14 * 14, 10)
    )
    loss_fn, opt = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(2048, 1, 28, 28, generator=g), torch.randint(0, 10, (2048,), generator=g)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, drop_last=True, num_workers=workers,
                                         persistent_workers=workers > 0)  # fmt: skip

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, loader


class _Null:
    """The bare step's stand-in for a phase: ``with`` costs the same bytecode on both sides."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@contextlib.contextmanager
def _counted(reads: list[float], ticks: list[float]) -> Iterator[None]:
    """Time each schedstat read and each hand-over (perf_counter) while the block runs; the run queue read as for
    the loop's own step, where the alternation makes a Session step twice as long."""
    pc = time.perf_counter
    orig_init, orig_tick, orig_every = schedstat.ThreadSched.__init__, stepclock.StepClock._tick, schedstat.runq_every

    def init(self: schedstat.ThreadSched, *a: object, **k: object) -> None:
        orig_init(self, *a, **k)  # type: ignore[arg-type]
        raw = self.raw

        def timed() -> bytes:
            t = pc()
            try:
                return raw()
            finally:
                reads.append(pc() - t)

        self.raw = timed

    def tick(self: stepclock.StepClock, index: int, t: float) -> None:
        t0 = pc()
        orig_tick(self, index, t)
        ticks.append(pc() - t0)

    schedstat.ThreadSched.__init__ = init  # type: ignore[method-assign]
    stepclock.StepClock._tick = tick  # type: ignore[method-assign]
    schedstat.runq_every = lambda step_s: orig_every(step_s / 2)
    try:
        yield
    finally:
        schedstat.ThreadSched.__init__ = orig_init  # type: ignore[method-assign]
        stepclock.StepClock._tick = orig_tick  # type: ignore[method-assign]
        schedstat.runq_every = orig_every


def _sides(s: Session, src: Iterator[Any], step: Callable[[Any, Any], None]) -> tuple[Side, Side]:
    """A bare step and a Session step, each returning the training thread's CPU seconds in each part and in all."""
    tt, null = time.thread_time, _Null()
    wrapped = s.wrap(src)
    h2d, compute = s.phase("h2d"), s.phase("compute")

    def run(it: Iterator[Any], first: Any, second: Any) -> list[float]:
        a = tt()
        xb, yb = next(it)
        b = tt()
        with first:
            c = tt()
            x, y = xb.to("cpu"), yb.to("cpu")
            d = tt()
        e = tt()
        with second:
            f = tt()
            step(x, y)
            g = tt()
        h = tt()
        return [b - a, c - b, e - d, f - e, h - g, h - a]

    return (lambda: run(src, null, null)), (lambda: run(wrapped, h2d, compute))


Side = Callable[[], list[float]]


def parts(steps: int, workers: int) -> dict[str, object]:
    """The hot path's parts (see the module): per part the mean CPU us a step the Session adds, and the counted
    calls scaled to the loop's pace."""
    torch.set_num_threads(1)
    step, loader = _loop(workers)

    def forever() -> Iterator[Any]:
        while True:
            yield from loader

    src = forever()
    reads: list[float] = []
    ticks: list[float] = []
    keys = (*PARTS, "step")
    got_s: dict[str, dict[str, list[float]]] = {side: {p: [] for p in keys} for side in ("bare", "session")}
    with (
        _counted(reads, ticks),
        tempfile.TemporaryDirectory() as tmp,
        Session(Path(tmp) / "run", sample_hz=10.0, device="cpu") as s,
    ):
        bare, session = _sides(s, src, step)
        for _ in range(100):
            bare()
            session()
        n_reads, n_ticks, t0 = len(reads), len(ticks), time.perf_counter()
        for i in range(steps):
            for name in ("bare", "session") if i % 2 else ("session", "bare"):
                for p, v in zip(keys, bare() if name == "bare" else session(), strict=True):
                    got_s[name][p].append(v)
        wall = time.perf_counter() - t0
        every = s._st.edges.every
    bare_s, sess_s = got_s["bare"], got_s["session"]
    step_s = statistics.median(bare_s["step"])
    got: dict[str, Any] = {"steps": steps, "workers": workers, "bare_step_ms": step_s * 1e3, "runq_every": every}
    for p in PARTS:
        got[f"{p}_us"] = (statistics.fmean(sess_s[p]) - statistics.fmean(bare_s[p])) * 1e6
    r, t = reads[n_reads:], ticks[n_ticks:]
    got["runq_reads_a_step"] = len(r) / steps
    got["runq_read_us_mean"] = statistics.fmean(r) * 1e6 if r else 0.0
    got["runq_us_a_step"] = sum(r) / steps * 1e6
    got["tick_us_mean"] = statistics.fmean(t) * 1e6 if t else 0.0
    got["tick_us_a_step"] = got["tick_us_mean"] / min(stepclock.HANDOFF_STEPS, stepclock.HANDOFF_S / step_s)
    got["hot_path_us_a_step"] = sum(got[f"{p}_us"] for p in PARTS)
    got["wall_s"] = wall
    return got


def background(blocks: int, block_steps: int, workers: int) -> dict[str, float]:
    """The training thread's CPU per bare step with the sampler process stopped (SIGSTOP) and running, in turn,
    a Session open throughout (its threads in this process run in both): the mean extra us a step while it runs."""
    torch.set_num_threads(1)
    step, loader = _loop(workers)

    def forever() -> Iterator[Any]:
        while True:
            yield from loader

    src = forever()
    extra = []
    with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp) / "bg", sample_hz=10.0, device="cpu") as s:
        proc = getattr(s.recording, "proc", None)
        assert proc is not None, "the Session has no sampler process"
        try:
            for _ in range(blocks // 2):
                per: dict[bool, float] = {}
                for stopped in (True, False):
                    proc.send_signal(signal.SIGSTOP if stopped else signal.SIGCONT)
                    c0 = time.thread_time()
                    for _ in range(block_steps):
                        x, y = next(src)
                        step(x, y)
                    per[stopped] = (time.thread_time() - c0) / block_steps
                extra.append((per[False] - per[True]) * 1e6)
        finally:
            proc.send_signal(signal.SIGCONT)
    return {"blocks": blocks, "sampler_beside_us_median": statistics.median(extra),
            "sampler_beside_us_mean": statistics.fmean(extra)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    got = parts(args.steps, args.workers)
    bg = background(args.blocks, 40, args.workers)
    got.update(bg)
    if args.json:
        print(json.dumps(got, indent=2))
        return 0
    print(f"fast loop, {args.workers} workers, bare step {got['bare_step_ms']:.2f} ms, {args.steps} steps each side "
          f"(load average {os.getloadavg()[0]:.1f}): the training thread's CPU a step, Session less bare")  # fmt: skip
    for p in PARTS:
        print(f"  {p:14s} {got[f'{p}_us']:7.1f} us")
    print(f"  hot path, all  {got['hot_path_us_a_step']:7.1f} us")
    print(f"  of which schedstat reads (1 step in {got['runq_every']}): {got['runq_reads_a_step']:.2f} a step x"
          f" {got['runq_read_us_mean']:.1f} us = "
          f"{got['runq_us_a_step']:.1f} us a step (perf_counter)")  # fmt: skip
    print(f"  hand-overs: {got['tick_us_mean']:.1f} us each = {got['tick_us_a_step']:.1f} us a step at this pace")
    print(f"  the sampler process beside it (SIGSTOP in turn, {bg['blocks']} blocks): "
          f"{bg['sampler_beside_us_median']:.1f} us a step (median; mean "
          f"{bg['sampler_beside_us_mean']:.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
