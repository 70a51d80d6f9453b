"""Live view of a multi-rank job while it trains (``stallscope run SCENARIO --nproc N``, ``stallscope watch
JOB_DIR``): one row per rank, the job's throughput and the straggler candidate, redrawn 4 times a second on a
terminal; off a terminal one plain line every few seconds, as the single-run view does (render/live.py).

It reads a :class:`profiler.feeds.JobFeed` (the rank stores as they are written) on its own thread and folds it
through ``analysis.joblive.JobLiveAggregator``: the launcher, blocked in torch's elastic launcher, never waits on
it. It writes to stderr, so stdout keeps the job report (or, with ``--json``, the job summary alone).
``job_frame()`` and ``job_status_line()`` are pure functions of a snapshot; they format figures, compute none.
On a simulated device (kind ``sim``) the head line says SIMULATED and the sync column says simulated.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from profiler.analysis.joblive import JobLive, JobLiveAggregator, RankLive
from profiler.analysis.parts import SIMULATED, device_where
from profiler.feeds import JobFeed

Tb = TracebackType | None


def _f(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None or math.isnan(x) else format(x, spec) + unit


def _simulated(meta: dict[str, Any]) -> bool:
    dev = meta.get("device")
    return isinstance(dev, dict) and dev.get("kind") == SIMULATED


def _where(meta: dict[str, Any]) -> str:
    dev = meta.get("device")
    if isinstance(dev, dict):
        where = device_where(dev) if _simulated(meta) else dev.get("torch_device") or dev.get("kind")
        return str(where or "?")
    return str(dev or "?")


def _steps(done: int, total: int | None) -> str:
    return f"{done}/{total}" if total else str(done)


COLUMNS = (
    ("rank", 4),
    ("node", 4),
    ("steps", 9),
    ("samples/s", 9),
    ("step ms", 8),
    ("data wait ms", 12),
    ("sync ms", 8),
    ("stall", 5),
    ("CPU", 5),
)


def _cells(r: RankLive, total: int | None) -> list[str]:
    steps = _steps(r.steps_done, total) + ("w" if r.warmup else "")
    return [
        str(r.rank),
        "?" if r.node_rank is None else str(r.node_rank),
        steps,
        _f(r.throughput_samples_per_s, ".1f"),
        _f(r.step_ms, ".1f"),
        _f(r.data_wait_ms, ".1f"),
        _f(r.sync_ms, ".1f"),
        _f(r.stall_fraction * 100, ".0f", "%"),
        _f(r.cpu_pct, ".0f", "%"),
    ]


def _line(cells: list[str], status: str) -> str:
    return "  ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS, strict=True)) + f"  {status}"


def straggler_text(snap: JobLive) -> str:
    if snap.straggler is not None:
        return snap.straggler.evidence
    if sum(r.measured for r in snap.ranks) < 2:
        return "none yet (fewer than 2 ranks with measured steps)"
    return "none"


def job_frame(snap: JobLive, meta: dict[str, Any], total_steps: int | None = None) -> Group:
    """One frame of the job's dashboard."""
    sim = _simulated(meta)
    head = Text.assemble(
        ("stallscope ", "bold"),
        f"{meta.get('scenario') or 'job'}  pipeline={meta.get('pipeline') or '?'}"
        f"  batch/rank={meta.get('batch_size') or '?'}  workers/rank={_or_q(meta.get('workers'))}"
        f"  device={_where(meta)}  world={meta.get('world_size') or len(snap.ranks)}  ",
        ("SIMULATED device  " if sim else "", "bold magenta"),
        (f"step {_steps(snap.steps_done, total_steps)}", "bold"),
        f"  t={snap.t_s:.0f}s",
    )
    # Fixed-width Text lines, not a Table: a grid costs several ms to lay out per frame, and the frame is
    # redrawn 4 times a second in the launcher process beside the ranks it must not slow.
    names = [n for n, _ in COLUMNS]
    if sim:
        names[names.index("sync ms")] = "sync sim"
    lines: list[Text] = [Text(_line(names, "status"), style="bold")]
    if not snap.ranks:
        lines.append(Text("waiting for the ranks' stores (the ranks are starting)", style="dim"))
    for r in snap.ranks:
        style = "bold red" if snap.straggler is not None and snap.straggler.rank == r.rank else ""
        lines.append(Text(_line(_cells(r, total_steps), r.status), style=style))
    lines.append(
        Text.assemble(
            ("job         ", "bold"),
            f"{_f(snap.throughput_recent, '.1f')} samples/s (sum over ranks, last {snap.horizon_s:g} s);  "
            f"{_f(snap.throughput_so_far, '.1f')} samples/s so far (measured steps)",
        )
    )
    style = "bold red" if snap.straggler is not None else ""
    lines.append(Text.assemble(("straggler   ", "bold"), (straggler_text(snap), style)))
    note = "per step over each rank's last measured steps ('w': still warming up); CPU: rank + its loader workers"
    note += ", % of one core" + ("; sync on the SIMULATED device is simulated" if sim else "")
    lines.append(Text(note, style="dim"))
    return Group(head, *lines)


def _or_q(x: Any) -> str:
    return "?" if x is None else str(x)


def job_status_line(snap: JobLive, total_steps: int | None = None, meta: dict[str, Any] | None = None) -> str | None:
    """The plain line: job figures, then per rank data wait / sync / stall / CPU, then the straggler."""
    if not any(r.window_steps for r in snap.ranks):
        return None
    sim = " (simulated)" if _simulated(meta or {}) else ""
    ranks = " | ".join(
        f"rank {r.rank}: wait {_f(r.data_wait_ms, '.1f')} sync {_f(r.sync_ms, '.1f')} ms{sim} "
        f"stall {_f(r.stall_fraction * 100, '.0f')}% cpu {_f(r.cpu_pct, '.0f')}%"
        for r in snap.ranks
    )
    return (
        f"step {_steps(snap.steps_done, total_steps)}  {_f(snap.throughput_recent, '.1f')} samples/s  {ranks}  "
        f"straggler: {straggler_text(snap)}"
    )


class _JobMonitor:
    """Polls a job feed on a thread every ``interval_s`` and hands each snapshot to ``_show``."""

    def __init__(self, feed: JobFeed, interval_s: float, total_steps: int | None) -> None:
        self._feed = feed
        self._interval = interval_s
        self._total = total_steps
        self._agg = JobLiveAggregator()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stallscope-job-live", daemon=True)
        self.frames = 0
        self.error: BaseException | None = None  # what stopped the view (the job itself goes on)

    def _tick(self) -> None:
        steps, samples = self._feed.poll()
        for rank, rows in steps.items():
            self._agg.add_rank(rank, rows, self._feed.rank_meta().get(rank), self._feed.rank_status(rank))
        self._agg.add_node_samples(samples)
        self._show(self._agg.snapshot())
        self.frames += 1

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - a view that fails stops showing (said at exit), never the job
                self.error = exc
                return

    def _show(self, snap: JobLive) -> None:
        raise NotImplementedError

    def __enter__(self) -> _JobMonitor:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Tb) -> None:
        self._done.set()
        self._thread.join(timeout=max(2.0, 2 * self._interval))
        if self.error is not None:
            sys.stderr.write(f"stallscope: the live view stopped: {type(self.error).__name__}: {self.error}\n")


class JobPlainLive(_JobMonitor):
    """One plain status line every ``interval_s`` seconds."""

    def __init__(
        self, feed: JobFeed, *, interval_s: float = 5.0, stream: TextIO | None = None, total_steps: int | None = None
    ) -> None:
        super().__init__(feed, interval_s, total_steps)
        self._stream = stream or sys.stderr

    def _show(self, snap: JobLive) -> None:
        line = job_status_line(snap, self._total, self._feed.meta())
        if line:
            print(line, file=self._stream, flush=True)


class JobLiveView(_JobMonitor):
    """The rich dashboard, redrawn about ``refresh_hz`` times a second (transient: the job report follows it)."""

    def __init__(
        self, feed: JobFeed, *, refresh_hz: float = 4.0, console: Console | None = None, total_steps: int | None = None
    ) -> None:
        super().__init__(feed, 1.0 / refresh_hz, total_steps)
        self._console = console or Console(stderr=True)
        self._live = Live(console=self._console, auto_refresh=False, transient=True)

    def _show(self, snap: JobLive) -> None:
        self._live.update(job_frame(snap, self._feed.meta(), self._total), refresh=True)

    def __enter__(self) -> JobLiveView:
        self._live.start()
        super().__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Tb) -> None:
        super().__exit__(exc_type, exc, tb)
        self._live.stop()


def job_monitor_for(
    feed: JobFeed, *, tty: bool | None = None, total_steps: int | None = None, plain_interval_s: float = 5.0
) -> _JobMonitor:
    """The dashboard on a terminal, plain lines otherwise (decided by stderr, where both write)."""
    if tty is None:
        tty = sys.stderr.isatty()
    if tty:
        return JobLiveView(feed, total_steps=total_steps)
    return JobPlainLive(feed, interval_s=plain_interval_s, total_steps=total_steps)


def watch_job(feed: JobFeed, *, tty: bool | None = None, poll_s: float = 0.25) -> str:
    """Follow a job another process runs until its status leaves "running"; returns the final status."""
    with job_monitor_for(feed, tty=tty):
        while True:
            status = feed.status()
            if status != "running":
                return status
            time.sleep(poll_s)
