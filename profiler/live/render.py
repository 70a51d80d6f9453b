"""Live view while a run trains: a rich dashboard on a terminal, one plain status line every few seconds
elsewhere (a pipe, CI, nohup: rich ``Live`` off a TTY prints only its last frame, so it is no use there).

Both read a :class:`profiler.live.feeds.LiveFeed` on their own thread and fold it through
``analysis.live.LiveAggregator``; the training thread never waits on them. Both write to stderr so that
stdout keeps the report (or, with ``--json``, the summary alone). ``frame()`` and ``status_line()`` are
pure functions of a snapshot, so tests compare their text exactly. On a simulated accelerator (device kind
``sim``) the head line says SIMULATED and every GPU figure says "simulated".
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TextIO, TypeVar

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from profiler.analysis.gpu import window_source
from profiler.analysis.meta import as_json
from profiler.analysis.parts import SIMULATED, device_where
from profiler.live.analysis import LiveAggregator, LiveSnapshot
from profiler.live.feeds import LiveFeed
from profiler.render.loader import COLUMNS

Tb = TracebackType | None
_S = TypeVar("_S")  # what a view's source hands it: a run's or a job's snapshot
BARS = "▁▂▃▄▅▆▇█"  # zero is the lowest bar; a blank means no data
HISTORY_S = 60


def sparkline(values: Sequence[float], width: int = HISTORY_S, top: float = 100.0) -> str:
    """The newest ``width`` values as block characters, 0..top; missing history is blank on the left."""
    vals = list(values)[-width:]
    out = []
    for v in vals:
        if math.isnan(v):
            out.append(" ")
            continue
        level = min(max(v / top, 0.0), 1.0)
        out.append(BARS[round(level * (len(BARS) - 1))])
    return " " * (width - len(out)) + "".join(out)


def _f(x: float, spec: str, unit: str = "") -> str:
    return "n/a" if x is None or math.isnan(x) else format(x, spec) + unit


def _or_q(x: object) -> str:
    return "?" if x is None else str(x)


def _progress(snap: LiveSnapshot, total: int | None) -> str:
    st = snap.stats
    if st is None:
        return "waiting for the first step"
    of = f"/{total}" if total else ""
    return f"step {st.steps_total}{of}" + (" (warm-up)" if st.warmup else "")


def _simulated(meta: Mapping[str, object] | None) -> bool:
    dev = (meta or {}).get("device")
    return isinstance(dev, dict) and dev.get("kind") == SIMULATED


def status_line(
    snap: LiveSnapshot, total_steps: int | None = None, meta: Mapping[str, object] | None = None
) -> str | None:
    st = snap.stats
    if st is None:
        return None
    line = (
        f"{_progress(snap, total_steps)}  {_f(st.throughput_samples_per_s, '.1f')} samples/s  "
        f"stall {_f(st.stall_fraction * 100, '.0f')}%  wait {st.data_wait_ms:.1f} ms  "
        f"h2d {st.h2d_ms:.1f} ms  compute {st.compute_ms:.1f} ms  (last {st.window_steps} steps)"
    )
    m = snap.latest
    line += f"  cpu {_f(m.get('proc.total.cpu_pct', math.nan), '.0f')}%"
    util = m.get("gpu0.util_pct", math.nan)
    sim = " (simulated)" if _simulated(meta) else ""
    return line + ("" if math.isnan(util) else f"  gpu0 {util:.0f}%{sim}")


def frame(snap: LiveSnapshot, meta: Mapping[str, object], total_steps: int | None = None) -> Group:
    """One frame of the dashboard."""
    dev = as_json(meta.get("device"))
    sim = _simulated(meta)
    where = device_where(dev) if sim else dev.get("torch_device", "?")
    head = Text.assemble(
        ("stallscope ", "bold"),
        f"{meta.get('scenario') or 'run'}  pipeline={meta.get('pipeline') or '?'}"
        f"  batch={meta.get('batch_size') or '?'}  workers={_or_q(meta.get('workers'))}"
        f"  device={where}  ",
        ("SIMULATED device  " if sim else "", "bold magenta"),
        (_progress(snap, total_steps), "bold"),
        f"  t={snap.latest_t:.0f}s",
    )
    simulated = "  simulated" if sim else ""
    # Fixed-width Text lines, not a Table: a grid costs ~4 ms to lay out per frame on this CPU, lines ~0.6 ms,
    # and the frame is redrawn 4 times a second beside the training it must not slow.
    rows: list[Text] = []

    def row(label: str, value: str, detail: str | Text = "") -> None:
        rows.append(Text.assemble((f"{label:<12}", "bold"), f"{value:<22}  ", detail))

    st = snap.stats
    if st is not None:
        row("throughput", f"{_f(st.throughput_samples_per_s, '.1f')} samples/s", f"last {st.window_steps} steps")
        other = max(0.0, st.step_ms - st.data_wait_ms - st.h2d_ms - st.compute_ms)
        row(
            "step",
            f"{st.step_ms:.1f} ms",
            f"wait {st.data_wait_ms:.1f}  h2d {st.h2d_ms:.1f}  compute {st.compute_ms:.1f}  other {other:.1f} ms",
        )
    stall_now = snap.stall_history[-1] if snap.stall_history else math.nan
    row("stall %", _f(stall_now, ".0f", "%"), Text(sparkline(snap.stall_history), style="red"))
    m = snap.latest
    if snap.util_history:
        for gpu, hist in snap.util_history.items():
            row(f"{gpu} util", _f(hist[-1], ".0f", "%"), Text.assemble((sparkline(hist), "green"), simulated))
            used, tot = m.get(f"{gpu}.mem_used_mb", math.nan), m.get(f"{gpu}.mem_total_mb", math.nan)
            rx, tx = m.get(f"{gpu}.pcie_rx_mbps", math.nan), m.get(f"{gpu}.pcie_tx_mbps", math.nan)
            row(
                f"{gpu} mem",
                f"{_f(used, '.0f')}/{_f(tot, '.0f')} MiB",
                f"PCIe rx {_f(rx, '.0f')} tx {_f(tx, '.0f')} MB/s{simulated}",
            )
    else:
        row("gpu util", "n/a", "NVML not sampled (no driver or no GPU): see the report")
    procs = [k.split(".")[1] for k in m if k.startswith("proc.") and k.endswith(".cpu_pct")]
    workers = [p for p in procs if p not in ("main", "children", "total")]
    cpu = f"main {_f(m.get('proc.main.cpu_pct', math.nan), '.0f')}%" + "".join(
        f"  {w} {_f(m.get(f'proc.{w}.cpu_pct', math.nan), '.0f')}%" for w in workers
    )
    row("cpu", cpu, f"(100% = one core)  system {_f(m.get('sys.cpu_pct', math.nan), '.0f')}% of all cores")
    row("rss", _f(m.get("proc.total.rss_mb", math.nan), ".0f", " MiB"), "main + workers")
    rows_of = (("memory", _memory_row), ("workers", _workers_row), ("stages", _stages_row), ("GPU", _gpu_row))
    for label, make in rows_of:
        if (cells := make(snap)) is not None:
            row(label, *cells)
    return Group(head, *rows)


def _memory_row(snap: LiveSnapshot) -> tuple[str, str] | None:
    """The job's memory and shared memory, newest reading of each (None before the first reading)."""
    mem = snap.memory
    if not mem:
        return None
    used, size = _f(mem.get("mem.shm.used_mb", math.nan), ".0f"), _f(mem.get("mem.shm.size_mb", math.nan), ".0f")
    shm = f"/dev/shm: the job's {_f(mem.get('mem.shm.job_mb', math.nan), '.0f')} MiB, segment {used}/{size} MiB"
    return f"PSS {_f(mem.get('mem.total.pss_mb', math.nan), '.0f', ' MiB')}", shm + "  (newest reading)"


def _workers_row(snap: LiveSnapshot) -> tuple[str, str] | None:
    """The workers' recent time: what it says, and its parts of 1% or more (None without workers)."""
    lt = snap.loader
    if lt is None or lt.workers is None:
        return None
    w = lt.workers
    parts = ", ".join(f"{name} {getattr(w, key):.0f}%" for key, name in COLUMNS if getattr(w, key) >= 1)
    n = sum(p.label != "main" for p in lt.processes)
    return lt.bottleneck or "mixed", f"{parts} (mean of {n}, recent samples)"


def _stages_row(snap: LiveSnapshot) -> tuple[str, str] | None:
    """The loader stages' recent time per item, slowest first named (None where no stage is timed)."""
    if not snap.stages:
        return None
    slowest = max(snap.stages, key=lambda name: snap.stages[name])
    times = ", ".join(f"{name} {1e3 * s:.1f}" for name, s in snap.stages.items())
    return f"slowest: {slowest}", f"{times} ms an item (recent samples)"


def _gpu_row(snap: LiveSnapshot) -> tuple[str, str] | None:
    """The newest kernel window's split of its steps (None before the first window's steps are in)."""
    g = snap.gpu
    if g is None:
        return None
    parts = "  ".join(f"{k} {100 * g.fraction(k):.0f}%" for k in ("input", "host", "sync", "short"))
    how = "SIMULATED kernels" if g.simulated else "CUPTI"
    return f"busy {100 * g.busy_fraction:.0f}%", f"{parts}  (the newest kernel window, {len(g.steps)} steps, {how})"


class Monitor:
    """Calls ``show()`` (poll a feed, fold it, show the snapshot) on a thread every ``interval_s``. A view that
    fails stops showing and says so once at exit (``error``); the training it watches never sees the failure."""

    def __init__(self, show: Callable[[], None], interval_s: float) -> None:
        self._show = show
        self._interval = interval_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stallscope-live", daemon=True)
        self.frames = 0
        self.error: BaseException | None = None

    def _tick(self) -> None:
        self._show()
        self.frames += 1

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - a view that fails stops showing (said at exit), never the run
                self.error = exc
                return

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Tb) -> None:
        self._done.set()
        self._thread.join(timeout=max(2.0, 2 * self._interval))
        if self.error is not None:
            sys.stderr.write(f"stallscope: the live view stopped: {type(self.error).__name__}: {self.error}\n")


class PlainLines(Monitor):
    """One plain status line (``line(snapshot)``; None: nothing to say yet) every ``interval_s`` seconds."""

    def __init__(
        self,
        source: Callable[[], _S],
        line: Callable[[_S], str | None],
        *,
        interval_s: float = 5.0,
        stream: TextIO | None = None,
    ) -> None:
        def show() -> None:
            text = line(source())
            if text:
                print(text, file=self._stream, flush=True)

        super().__init__(show, interval_s)
        self._stream = stream or sys.stderr


class Dashboard(Monitor):
    """The rich dashboard (``draw(snapshot)``), redrawn about ``refresh_hz`` times a second; transient: the report
    follows it."""

    def __init__(
        self,
        source: Callable[[], _S],
        draw: Callable[[_S], RenderableType],
        *,
        refresh_hz: float = 4.0,
        console: Console | None = None,
    ) -> None:
        super().__init__(lambda: self._live.update(draw(source()), refresh=True), 1.0 / refresh_hz)
        self._live = Live(console=console or Console(stderr=True), auto_refresh=False, transient=True)

    def __enter__(self) -> Dashboard:
        self._live.start()
        super().__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Tb) -> None:
        super().__exit__(exc_type, exc, tb)
        self._live.stop()


def choose(
    source: Callable[[], _S],
    line: Callable[[_S], str | None],
    draw: Callable[[_S], RenderableType],
    *,
    tty: bool | None = None,
    plain_interval_s: float = 5.0,
) -> Monitor:
    """The dashboard on a terminal, plain lines otherwise (decided by stderr, where both write)."""
    if tty is None:
        tty = sys.stderr.isatty()
    return Dashboard(source, draw) if tty else PlainLines(source, line, interval_s=plain_interval_s)


def follow(monitor: Monitor, status: Callable[[], str], poll_s: float = 0.25) -> str:
    """Show ``monitor`` until ``status()`` leaves "running"; returns the final status."""
    with monitor:
        while True:
            now = status()
            if now != "running":
                return now
            time.sleep(poll_s)


def run_source(feed: LiveFeed) -> Callable[[], LiveSnapshot]:
    """A single run's snapshots: the feed's new steps and samples folded into the last minute."""
    agg = LiveAggregator(horizon_s=HISTORY_S)

    def poll() -> LiveSnapshot:
        steps, samples = feed.poll()
        agg.add_steps(steps)
        agg.add_samples(samples)
        windows = getattr(feed, "windows", None)  # a feed of kernel windows (the sampler process's, a store's)
        if callable(windows):
            agg.add_windows(windows(), window_source(feed.meta()))
        return agg.snapshot()

    return poll


class PlainLive(PlainLines):
    """A single run's plain status line every ``interval_s`` seconds."""

    def __init__(
        self, feed: LiveFeed, *, interval_s: float = 5.0, stream: TextIO | None = None, total_steps: int | None = None
    ) -> None:
        super().__init__(
            run_source(feed), lambda snap: status_line(snap, total_steps, feed.meta()), interval_s=interval_s,
            stream=stream,
        )  # fmt: skip


def monitor_for(
    feed: LiveFeed, *, tty: bool | None = None, total_steps: int | None = None, plain_interval_s: float = 5.0
) -> Monitor:
    """A single run's live view: the dashboard on a terminal, plain lines otherwise."""
    return choose(
        run_source(feed),
        lambda snap: status_line(snap, total_steps, feed.meta()),
        lambda snap: frame(snap, feed.meta(), total_steps),
        tty=tty,
        plain_interval_s=plain_interval_s,
    )


def watch(feed: LiveFeed, *, tty: bool | None = None, poll_s: float = 0.25) -> str:
    """Follow a run another process writes until its status leaves "running"; returns the final status."""
    return follow(monitor_for(feed, tty=tty), feed.status, poll_s)
