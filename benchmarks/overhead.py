"""Overhead of profiling a training loop with a Session.

1. The fast loop (issue #44): a GIL-bound loop of 2-5 ms steps, as the host side of a fast GPU's loop is (a tiny
   CNN on in-memory tensors, one intra-op thread: ``torch.set_num_threads(1)``), with 0 and with 2 loader workers.
   Many short rounds; in each, two child processes, one with the code before (``--before REV``, default the
   landed main of issue #65) and one with this checkout's, each running the bare loop and the loop through a
   default Session (10 Hz, the default sources) back to back. Two figures, each the median of the per-round ratios
   with their quartiles and range: the Session's samples/s over the bare run's in the same child (wall time), and
   the bare run's training-thread CPU time a step over the Session's (``time.thread_time``: what a shared host's
   other load moves least). Target: >= 0.99 now, in both. ``benchmarks/fastloop_parts.py`` splits the CPU by part.
2. The original loop: a small CPU conv net (torch's default threads), bare vs Session, paired the same way.
3. Live view: Session alone vs Session + the rich live view at 4 Hz.
4. The hot path: one step of ``Session.wrap`` and one phase (enter + exit) in microseconds, the steps handed to the
   sampler process; budget < 20 us per phase.

Run: ``make bench`` or ``.venv/bin/python benchmarks/overhead.py [--pairs 5] [--steps 150] [--fast-pairs 15]
[--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pairing import spread  # benchmarks/ is this script's sys.path[0]
from torch import nn

# the project's package: this checkout's, or the tree a fast-loop child is told to measure (fast_loop)
sys.path.insert(0, os.environ.get("STALLSCOPE_ROOT") or str(Path(__file__).resolve().parents[1]))

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


def train(steps: int, session: Session | None, batch: int = 64) -> tuple[float, float]:
    """(samples/s, process CPU ms per step) over ``steps`` steps after 10 warm-up steps outside the timing.

    Process CPU time counts every thread of this process (torch's, the sampler's, the store writer's, the
    live view's), so its ratio is the profiler's CPU cost, which other load on the machine does not move.
    """
    torch.manual_seed(0)
    model, loader = _model(), _loader(batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    done, t0, c0 = 0, 0.0, 0.0
    while done < steps + 10:
        batches = session.wrap(loader) if session is not None else loader
        for xb, yb in batches:
            if done == 10:
                t0, c0 = time.perf_counter(), time.process_time()
            h2d = session.phase("h2d") if session is not None else contextlib.nullcontext()
            compute = session.phase("compute") if session is not None else contextlib.nullcontext()
            with h2d:
                x, y = xb.to("cpu"), yb.to("cpu")
            with compute:
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            done += 1
            if done >= steps + 10:
                break
    return steps * batch / (time.perf_counter() - t0), (time.process_time() - c0) / steps * 1e3


Config = Callable[[Path], tuple[float, float]]


def paired(name_a: str, run_a: Config, name_b: str, run_b: Config, pairs: int) -> dict[str, object]:
    """Run A and B back to back ``pairs`` times, alternating which goes first; ratios are B / A."""
    thr_ratios, cpu_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            order = ((name_a, run_a), (name_b, run_b))
            got = {}
            for name, run in order if i % 2 == 0 else order[::-1]:
                got[name] = run(Path(tmp) / f"{name}{i}")
            (ta, ca), (tb, cb) = got[name_a], got[name_b]
            thr_ratios.append(tb / ta)
            cpu_ratios.append(cb / ca)
            print(
                f"  pair {i + 1}: {name_a} {ta:.0f} samples/s {ca:.2f} CPU ms/step | {name_b} {tb:.0f} samples/s "
                f"{cb:.2f} CPU ms/step | throughput ratio {thr_ratios[-1]:.4f}",
                flush=True,
            )
    return {
        "pairs": pairs,
        "throughput_ratios": thr_ratios,
        "median_throughput_ratio": statistics.median(thr_ratios),
        "cpu_per_step_ratios": cpu_ratios,
        "median_cpu_per_step_ratio": statistics.median(cpu_ratios),
    }


def session_vs_bare(pairs: int, steps: int) -> dict[str, object]:
    def bare(_d: Path) -> tuple[float, float]:
        return train(steps, None)

    def profiled(d: Path) -> tuple[float, float]:
        with Session(d, sample_hz=10.0) as s:
            return train(steps, s)

    return paired("bare", bare, "session", profiled, pairs)


def _tiny() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 14 * 14, 10)
    )


def fast_train(
    steps: int, session: Session | None, workers: int, warmup: int = 100, batch: int = 32
) -> tuple[float, float]:
    """(samples/s, the training thread's CPU seconds a step) of the fast loop over ``steps`` steps after ``warmup``
    (which covers a sampler process's start). The thread's CPU time (``time.thread_time``) is what stallscope's work
    on that thread adds to, and what other load on a shared host moves least: a preempted thread is not charged."""
    torch.manual_seed(0)
    model, loss_fn = _tiny(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(2048, 1, 28, 28, generator=g), torch.randint(0, 10, (2048,), generator=g)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
                                         persistent_workers=workers > 0)  # fmt: skip
    done, t0, c0 = 0, 0.0, 0.0
    while done < steps + warmup:
        for xb, yb in session.wrap(loader) if session is not None else loader:
            if done == warmup:
                t0, c0 = time.perf_counter(), time.thread_time()
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
            if done >= steps + warmup:
                break
    return steps * batch / (time.perf_counter() - t0), (time.thread_time() - c0) / steps


# The code before issue #65's fast-loop work (the landed main it was found on): a step's run-queue reads every 7th step
# at 3.6 ms, each boundary's gap counted from before its read, _got and _opened called on every step.
BEFORE = "99c2829"


def source_tree(rev: str, into: Path) -> Path:
    """The project's files at git revision ``rev``, unpacked under ``into`` (``git archive``)."""
    repo = Path(__file__).resolve().parents[1]
    out = into / f"stallscope-{rev}"
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def fast_child(steps: int, workers: int, session_first: bool, batch: int) -> dict[str, float]:
    """One round's pairs in this process, after a warm-up run: the bare loop and the loop through a Session (the
    ``profiler`` package on this process's path: STALLSCOPE_ROOT), in the order A B B A (A: the Session when
    ``session_first``) so that a drift inside the child cancels; samples/s of each side over its two runs, and the
    training thread's CPU seconds a step (``NAME_cpu``)."""
    torch.set_num_threads(1)
    fast_train(steps // 4, None, workers, batch=batch)  # a child's first run is slow: counted for neither
    seconds = {"bare": 0.0, "session": 0.0}
    cpu = {"bare": 0.0, "session": 0.0}
    first, second = ("session", "bare") if session_first else ("bare", "session")
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate((first, second, second, first)):
            if name == "bare":
                rate, c = fast_train(steps, None, workers, batch=batch)
            else:
                with Session(Path(tmp) / f"run{i}", sample_hz=10.0, device="cpu") as s:
                    rate, c = fast_train(steps, s, workers, batch=batch)
            seconds[name] += steps * batch / rate
            cpu[name] += c / 2
    return {**{name: 2 * steps * batch / t for name, t in seconds.items()}, **{f"{k}_cpu": v for k, v in cpu.items()}}


def fast_loop(pairs: int, steps: int, workers: int, before: Path | None, batch: int) -> dict[str, object]:
    """``pairs`` rounds; in each, the code before (``before``: a source tree; None: not run) and the code now, each a
    child process that runs the bare loop and the loop through a Session back to back (the order alternating by
    round; which child goes first, too). A round's ratio is the Session's samples/s over the bare run's of the same
    child."""
    roots = {"now": Path(__file__).resolve().parents[1], **({"before": before} if before is not None else {})}
    ratios: dict[str, list[float]] = {k: [] for k in roots}
    cpu_ratios: dict[str, list[float]] = {k: [] for k in roots}
    cpu_us: dict[str, list[float]] = {k: [] for k in roots}  # the Session's CPU us a step over the bare loop's
    step_ms: list[float] = []
    for i in range(pairs):
        for name in sorted(roots) if i % 2 == 0 else sorted(roots, reverse=True):
            cmd = [sys.executable, __file__, "--fast-child", str(steps), str(workers), str(i % 2), str(batch)]
            env = {**os.environ, "STALLSCOPE_ROOT": str(roots[name])}
            # run in the tree measured: its sampler process (python -m, the working directory first) is that tree's
            out = subprocess.run(cmd, env=env, cwd=roots[name], check=True, capture_output=True, text=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            ratios[name].append(got["session"] / got["bare"])
            cpu_ratios[name].append(got["bare_cpu"] / got["session_cpu"])
            cpu_us[name].append((got["session_cpu"] - got["bare_cpu"]) * 1e6)
            step_ms.append(batch / got["bare"] * 1e3)
        sides = " | ".join(f"{k} {ratios[k][-1]:.4f} (CPU {cpu_ratios[k][-1]:.4f})" for k in sorted(roots))
        print(f"  round {i + 1}: bare {step_ms[-1]:.2f} ms/step | {sides}", flush=True)
    return {
        "pairs": pairs,
        "workers": workers,
        "batch": batch,
        "before": BEFORE,
        "bare_step_ms_median": statistics.median(step_ms),
        **{f"{k}_ratios": v for k, v in ratios.items()},
        **{f"median_{k}_ratio": statistics.median(v) for k, v in ratios.items()},
        **{f"{k}_cpu_ratios": v for k, v in cpu_ratios.items()},
        **{f"median_{k}_cpu_ratio": statistics.median(v) for k, v in cpu_ratios.items()},
        **{f"{k}_spread": spread(v) for k, v in ratios.items()},
        **{f"{k}_cpu_spread": spread(v) for k, v in cpu_ratios.items()},
        **{f"median_{k}_cpu_us_a_step": statistics.median(v) for k, v in cpu_us.items()},
    }


def _fast_model() -> tuple[Callable[[torch.Tensor, torch.Tensor], None], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The fast loop's step (forward, backward, SGD) and 64 batches of 32 in memory."""
    torch.manual_seed(0)
    model, loss_fn = _tiny(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(64)]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, batches


def hot_path_interleaved(blocks: int = 200, block_steps: int = 20) -> dict[str, float]:
    """The training process's own cost per step, with the drift of a shared host cancelled: one loop runs blocks of
    ``block_steps`` bare steps and blocks through a Session (wrap + h2d + compute phases), ~40 ms each, in groups
    of four (bare, Session, Session, bare); the sampler process runs throughout, so only the hot path differs.
    Median over the groups of bare / instrumented step time."""
    import itertools

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    step, batches = _fast_model()
    bare_it = itertools.cycle(batches)
    ratios, costs, cpu_ratios, cpu_costs = [], [], [], []
    clocks = (time.perf_counter, time.thread_time)  # wall, and the training thread's CPU (no host's preemption)
    try:
        with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp) / "hot", sample_hz=10.0, device="cpu") as s:
            wrapped = s.wrap(itertools.cycle(batches))
            for _ in range(10 * block_steps):  # warm-up
                step(*next(bare_it))

            def bare_block() -> None:
                for _ in range(block_steps):
                    x, y = next(bare_it)
                    x, y = x.to("cpu"), y.to("cpu")
                    step(x, y)

            def session_block() -> None:
                for _ in range(block_steps):
                    xb, yb = next(wrapped)
                    with s.phase("h2d"):
                        x, y = xb.to("cpu"), yb.to("cpu")
                    with s.phase("compute"):
                        step(x, y)
                # its last step ends at the next block's fetch: that is not timed here

            for _ in range(blocks // 4):  # bare, session, session, bare: a drift across the four cancels
                marks = [[c() for c in clocks]]
                for block in (bare_block, session_block, session_block, bare_block):
                    block()
                    marks.append([c() for c in clocks])
                for k, (r, c) in enumerate(((ratios, costs), (cpu_ratios, cpu_costs))):
                    bare_s = marks[1][k] - marks[0][k] + marks[4][k] - marks[3][k]
                    session_s = marks[3][k] - marks[1][k]
                    r.append(bare_s / session_s)
                    c.append((session_s - bare_s) / (2 * block_steps) * 1e6)
            wrapped.close()
    finally:
        torch.set_num_threads(threads)
    return {
        "blocks": blocks,
        "median_ratio": statistics.median(ratios),
        "median_cost_us": statistics.median(costs),
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "median_cpu_cost_us": statistics.median(cpu_costs),
    }


def background_interleaved(blocks: int = 60, block_s: float = 0.3) -> dict[str, float]:
    """What the sampler process (at 10 Hz, the default sources) costs the training process by running beside it,
    drift cancelled: bare steps in blocks of ``block_s``, the sampler process stopped (SIGSTOP) in every other one.
    Median over adjacent block pairs of the step time with it stopped / running."""
    import signal

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    step, batches = _fast_model()
    ratios = []
    try:
        with tempfile.TemporaryDirectory() as tmp, Session(Path(tmp) / "bg", sample_hz=10.0, device="cpu") as s:
            proc = getattr(s.recording, "proc", None)
            assert proc is not None, "the Session has no sampler process"
            i = 0
            for _ in range(20):
                step(*batches[i % 64])
                i += 1
            for _ in range(blocks // 2):
                per_step = {}
                for stopped in (True, False):
                    proc.send_signal(signal.SIGSTOP if stopped else signal.SIGCONT)
                    n, t0 = 0, time.perf_counter()
                    while time.perf_counter() - t0 < block_s:
                        step(*batches[i % 64])
                        i, n = i + 1, n + 1
                    per_step[stopped] = (time.perf_counter() - t0) / n
                ratios.append(per_step[True] / per_step[False])
            proc.send_signal(signal.SIGCONT)
    finally:
        torch.set_num_threads(threads)
    return {"blocks": blocks, "median_ratio": statistics.median(ratios)}


def live_vs_session(pairs: int, steps: int) -> dict[str, object]:
    """Session alone vs Session + the rich live view redrawing at 4 Hz into a terminal-like sink."""
    from rich.console import Console

    from profiler.live.feeds import SessionFeed
    from profiler.live.render import Dashboard, frame, run_source

    def plain(d: Path) -> tuple[float, float]:
        with Session(d, sample_hz=10.0) as s:
            return train(steps, s)

    def live(d: Path) -> tuple[float, float]:
        with Session(d, sample_hz=10.0) as s, open(os.devnull, "w") as sink:
            console = Console(file=sink, force_terminal=True, width=120)
            feed = SessionFeed(s)
            with Dashboard(run_source(feed), lambda snap: frame(snap, feed.meta(), None), console=console):
                return train(steps, s)

    return paired("session", plain, "session+live", live, pairs)


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


def loader_poll_cost(polls: int = 500, repeats: int = 5) -> dict[str, float]:
    """The loader source's poll of the main thread and 2 idle DataLoader workers (each blocked, so each poll
    reads state, syscall and the polled fds), and one read() of its schedstat figures: median microseconds."""
    from profiler.core.sources.blocked import BlockedSource

    loader = torch.utils.data.DataLoader(torch.zeros(4096, 4), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)  # the workers are up and waiting for indices: every poll classifies a blocked call
    workers = {f"w{i}": w.pid for i, w in enumerate(it._workers)}
    src = BlockedSource(workers=lambda: workers, poll_hz=1e-3)  # its own poller all but off: polls timed here
    src.open()
    src.read()  # the workers are found at the first read
    per_poll, per_read = [], []
    try:
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(polls):
                src.poll_once()
            per_poll.append((time.perf_counter() - t) / polls * 1e6)
            t = time.perf_counter()
            src.read()
            per_read.append((time.perf_counter() - t) * 1e6)
    finally:
        src.close()
        del it
    return {"poll_us_median": statistics.median(per_poll), "read_us_median": statistics.median(per_read)}


def memory_source_cost(repeats: int = 20) -> dict[str, float]:
    """The memory source's three readings with a training process and 2 DataLoader workers holding batches in
    /dev/shm: smaps of each (USS, PSS), the job's /dev/shm files (maps + fds), the segment (statvfs); median
    milliseconds each, and the share of one core at the schedule the source keeps (its budget, at least 1 s
    apart; the segment at every 10 Hz tick)."""
    from profiler.core.sources.memory import BUDGET, EVERY_S, MemorySource

    loader = torch.utils.data.DataLoader(torch.zeros(4096, 256, 64), batch_size=16, num_workers=2)
    it = iter(loader)
    next(it)  # the workers are up, each with prefetch_factor batches sent or in flight in /dev/shm
    pids = {"main": os.getpid(), **{f"w{i}": w.pid for i, w in enumerate(it._workers)}}
    src = MemorySource(lambda: pids)
    cost: dict[str, list[float]] = {"smaps": [], "shm_files": [], "segment": []}
    try:
        for _ in range(repeats):
            for name, call in (("smaps", src._reading), ("shm_files", src._job_shm), ("segment", src._segment)):
                t = time.perf_counter()
                call()
                cost[name].append((time.perf_counter() - t) * 1e3)
    finally:
        del it
    ms = {k: statistics.median(v) for k, v in cost.items()}
    every = {k: max(EVERY_S, ms[k] / 1e3 / BUDGET) for k in ("smaps", "shm_files")}
    share = sum(ms[k] / 1e3 / every[k] for k in every) + ms["segment"] / 1e3 * 10
    return {**{f"{k}_ms_median": v for k, v in ms.items()}, **{f"{k}_every_s": v for k, v in every.items()},
            "core_share_pct": 100 * share}  # fmt: skip


def fast_lines(got: dict[str, object], workers: int, before: str) -> str:
    """The fast loop's two ratios, now and before, each a median with its quartiles and range."""

    def one(key: str) -> str:
        sp = got[key]
        assert isinstance(sp, dict)
        return f"{sp['median']:.4f} (quartiles {sp['q1']:.4f}-{sp['q3']:.4f}, range {sp['min']:.4f}-{sp['max']:.4f})"

    lines = [f"fast loop, {workers} workers (bare {got['bare_step_ms_median']:.2f} ms/step, {got['pairs']} rounds):"]
    for side, label in (("now", "now"), ("before", f"before ({before})")):
        if f"{side}_spread" not in got:
            continue
        wall, cpu = got[f"{side}_spread"], got[f"{side}_cpu_spread"]
        assert isinstance(wall, dict) and isinstance(cpu, dict)
        missed = [name for name, sp in (("throughput", wall), ("CPU", cpu)) if sp["median"] < 0.99]
        verdict = f"MISSES the >= 0.99 target in {' and '.join(missed)}" if missed else "meets the >= 0.99 target"
        lines.append(f"  {label}: throughput {one(f'{side}_spread')}; training-thread CPU a step "
                     f"{one(f'{side}_cpu_spread')}, {got[f'median_{side}_cpu_us_a_step']:.1f} us a step more"
                     + (f"; {verdict}" if side == "now" else ""))  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--fast-pairs", type=int, default=15, help="rounds of the fast loop (each: before and now)")
    ap.add_argument(
        "--before", default=BEFORE,
        help="the git revision the fast loop compares with (default: %(default)s; none: this checkout's alone)",
    )  # fmt: skip
    ap.add_argument("--fast-workers", default="0,2", help="the fast loop's loader workers, comma-separated")
    ap.add_argument("--fast-batch", type=int, default=32, help="the fast loop's batch (32: ~3.6 ms a step here)")
    ap.add_argument("--fast-child", nargs=4, type=int, help=argparse.SUPPRESS)  # STEPS WORKERS SESSION_FIRST BATCH
    ap.add_argument("--fast-steps", type=int, default=400)
    ap.add_argument("--only-fast", action="store_true", help="the fast loop alone")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # "nvml unavailable" once per session is noise here
    if args.fast_child:
        steps, workers, session_first, batch = args.fast_child
        print(json.dumps(fast_child(steps, workers, bool(session_first), batch)))
        return 0
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    fast: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        before = source_tree(args.before, Path(tmp)) if args.before != "none" else None
        for workers in (int(w) for w in args.fast_workers.split(",")):
            print(f"fast loop, batch {args.fast_batch}, {workers} workers, 1 intra-op thread: {args.fast_pairs} rounds "
                  f"of {args.fast_steps} steps, the code of {args.before} (before) and this checkout's (now)",
                  flush=True)  # fmt: skip
            got = fast[f"workers_{workers}"] = fast_loop(
                args.fast_pairs, args.fast_steps, workers, before, args.fast_batch
            )
            print(fast_lines(got, workers, args.before), flush=True)
    hot = hot_path_interleaved()
    bg = background_interleaved()
    together = hot["median_ratio"] * bg["median_ratio"]
    print(
        f"fast loop, interleaved: the hot path {hot['median_cost_us']:.1f} us a step, ratio {hot['median_ratio']:.4f} "
        f"({hot['blocks']} blocks of 20 steps; of the training thread's CPU time: {hot['median_cpu_cost_us']:.1f} us, "
        f"ratio {hot['median_cpu_ratio']:.4f}); the sampler process beside it, ratio {bg['median_ratio']:.4f} "
        f"({bg['blocks']} blocks of 0.3 s, stopped in every other); together {together:.4f}",
        flush=True,
    )
    fast["interleaved"] = {"hot_path": hot, "background": bg}
    if args.only_fast:
        if args.json:
            print(json.dumps({"fast_loop": fast}, indent=2))
        return 0
    cost = phase_cost()
    print(
        f"per-phase cost: {cost['phase_us_median']:.2f} us (median of 5 x 200k; worst batch "
        f"{cost['phase_us_max']:.2f} us; budget 20 us)   wrap per step: {cost['wrap_step_us_median']:.2f} us"
    )
    lp = loader_poll_cost()
    print(
        f"loader source: one poll of the main thread and 2 waiting workers {lp['poll_us_median']:.0f} us "
        f"(at 25 Hz: {lp['poll_us_median'] * 25 / 1e4:.2f}% of a core); one read {lp['read_us_median']:.0f} us"
    )
    mc = memory_source_cost()
    print(
        f"memory source, main + 2 workers: smaps {mc['smaps_ms_median']:.1f} ms (every {mc['smaps_every_s']:.1f} s), "
        f"the job's /dev/shm files {mc['shm_files_ms_median']:.2f} ms (every {mc['shm_files_every_s']:.1f} s), "
        f"the segment {mc['segment_ms_median'] * 1e3:.0f} us (10 Hz): {mc['core_share_pct']:.2f}% of a core"
    )
    print(f"Session (10 Hz, default sources) vs bare loop, {args.pairs} pairs of {args.steps} steps:", flush=True)
    sess = session_vs_bare(args.pairs, args.steps)
    verdict = "meets" if sess["median_throughput_ratio"] >= 0.99 else "MISSES"  # type: ignore[operator]
    print(
        f"median throughput ratio {sess['median_throughput_ratio']:.4f} ({verdict} the >= 0.99 target); "
        f"median CPU-per-step ratio {sess['median_cpu_per_step_ratio']:.4f}"
    )
    print(f"live view (rich, 4 Hz) vs Session alone, {args.pairs} pairs:", flush=True)
    live = live_vs_session(args.pairs, args.steps)
    print(
        f"median throughput ratio {live['median_throughput_ratio']:.4f}; "
        f"median CPU-per-step ratio {live['median_cpu_per_step_ratio']:.4f}"
    )
    if args.json:
        out = {
            "fast_loop": fast,
            "phase_cost": cost,
            "loader_poll": lp,
            "memory_source": mc,
            "session": sess,
            "live_view": live,
        }
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
