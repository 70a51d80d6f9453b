"""Live view of a multi-rank job while it trains (``stallscope run SCENARIO --nproc N``, ``stallscope watch
JOB_DIR``): one row per rank, the job's throughput and the straggler candidate, redrawn 4 times a second on a
terminal; off a terminal one plain line every few seconds, as the single-run view does (render/live.py).

It reads a :class:`profiler.live.feeds.JobFeed` (the rank stores as they are written) on its own thread and folds it
through ``analysis.joblive.JobLiveAggregator``: the launcher, blocked in torch's elastic launcher, never waits on
it. It writes to stderr, so stdout keeps the job report (or, with ``--json``, the job summary alone).
``job_frame()`` and ``job_status_line()`` are pure functions of a snapshot; they format figures, compute none.
On a simulated device (kind ``sim``) the head line says SIMULATED and the sync column says simulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TextIO

from rich.console import Group
from rich.text import Text

from profiler.analysis.parts import SIMULATED, device_where
from profiler.jobs.analysis_live import JobLive, JobLiveAggregator, RankLive
from profiler.live.feeds import JobFeed
from profiler.live.render import Monitor, PlainLines, choose, follow

Tb = TracebackType | None


def _f(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None or math.isnan(x) else format(x, spec) + unit


def _simulated(meta: Mapping[str, object]) -> bool:
    dev = meta.get("device")
    return isinstance(dev, dict) and dev.get("kind") == SIMULATED


def _where(meta: Mapping[str, object]) -> str:
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


def job_frame(snap: JobLive, meta: Mapping[str, object], total_steps: int | None = None) -> Group:
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


def _or_q(x: object) -> str:
    return "?" if x is None else str(x)


def job_status_line(
    snap: JobLive, total_steps: int | None = None, meta: Mapping[str, object] | None = None
) -> str | None:
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


def job_source(feed: JobFeed) -> Callable[[], JobLive]:
    """A job's snapshots: each rank's new steps and the node samplers' samples, folded."""
    agg = JobLiveAggregator()

    def poll() -> JobLive:
        steps, samples = feed.poll()
        for rank, rows in steps.items():
            agg.add_rank(rank, rows, feed.rank_meta().get(rank), feed.rank_status(rank))
        agg.add_node_samples(samples)
        return agg.snapshot()

    return poll


class JobPlainLive(PlainLines):
    """A job's plain status line every ``interval_s`` seconds."""

    def __init__(
        self, feed: JobFeed, *, interval_s: float = 5.0, stream: TextIO | None = None, total_steps: int | None = None
    ) -> None:
        super().__init__(
            job_source(feed), lambda snap: job_status_line(snap, total_steps, feed.meta()), interval_s=interval_s,
            stream=stream,
        )  # fmt: skip


def job_monitor_for(
    feed: JobFeed, *, tty: bool | None = None, total_steps: int | None = None, plain_interval_s: float = 5.0
) -> Monitor:
    """A job's live view: the dashboard on a terminal, plain lines otherwise."""
    return choose(
        job_source(feed),
        lambda snap: job_status_line(snap, total_steps, feed.meta()),
        lambda snap: job_frame(snap, feed.meta(), total_steps),
        tty=tty,
        plain_interval_s=plain_interval_s,
    )


def watch_job(feed: JobFeed, *, tty: bool | None = None, poll_s: float = 0.25) -> str:
    """Follow a job another process runs until its status leaves "running"; returns the final status."""
    return follow(job_monitor_for(feed, tty=tty), feed.status, poll_s)
