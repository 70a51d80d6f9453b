"""Loader time, piece by piece: a blocked thread's wait classified from a fake /proc (the call, the fds it waits
on, a call restarted after py-spy paused the process), one period's exact CPU / run-queue / off-CPU split, the
window's split by its polls, the bottleneck named from the workers' mean, and the table.
The figures against a data set's own timing are in tests/test_loader_time_truth.py."""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from profiler.analysis.loader_time import loader_time
from profiler.analysis.parts import HostFigures
from profiler.core.sources.blocked import BlockedSource, ThreadProbe, calls, fd_kind, of_kinds, split
from profiler.render.loader import loader_time_table

X86 = calls("x86_64")
PID = 4242


def fake_proc(tmp: Path, *, state: str, syscall: str, fds: dict[int, str] = {}, wchan: str = "0") -> Path:  # noqa: B006
    task = tmp / str(PID) / "task" / str(PID)
    task.mkdir(parents=True)
    (task / "stat").write_text(f"{PID} (pt_data_worker) {state} 1 2 3")
    (task / "syscall").write_text(syscall + "\n")
    (task / "wchan").write_text(wchan)
    (tmp / str(PID) / "fd").mkdir()
    (tmp / str(PID) / "fdinfo").mkdir()
    for fd, target in fds.items():
        os.symlink(target, tmp / str(PID) / "fd" / str(fd))
    return tmp


def probe(tmp: Path) -> ThreadProbe:
    return ThreadProbe(PID, PID, str(tmp), X86)


@pytest.mark.parametrize(
    ("syscall", "fds", "state", "expected"),
    [
        ("0 0x5 0x7f00 0x1000", {5: "/data/img_001.jpg"}, "S", "storage"),  # read() of a file
        ("17 0x5 0x7f00 0x1000 0x0", {5: "/data/img_001.jpg"}, "D", "storage"),  # pread64, disk wait
        ("0 0x6 0x7f00 0x1000", {6: "socket:[991]"}, "S", "network"),  # read() of a socket
        ("45 0x6 0x7f00 0x1000", {6: "socket:[991]"}, "S", "network"),  # recvfrom
        ("0 0x3 0x7f00 0x4", {3: "pipe:[77]"}, "S", "queue"),  # read() of a pipe
        ("230 0x1 0x0 0x7ffc", {}, "S", "sleep"),  # clock_nanosleep
        ("202 0x7f00 0x80 0x0", {}, "S", "lock"),  # futex
        ("61 0xffffffff 0x0", {}, "S", "other"),  # wait4
        ("running", {}, "D", "storage"),  # no call to read, uninterruptible: disk I/O or a page fault
    ],
)
def test_a_blocked_call_is_classified_by_the_call_and_its_fd(
    tmp_path: Path, syscall: str, fds: dict[int, str], state: str, expected: str
) -> None:
    p = probe(fake_proc(tmp_path, state=state, syscall=syscall, fds=fds))
    assert p.state() == state
    assert p.blocked_on(state) == expected


def _poll_memory(tmp: Path, address: int, fds: list[int]) -> None:
    with open(tmp / str(PID) / "mem", "wb") as f:
        f.seek(address)
        f.write(b"".join(struct.pack("ihh", fd, 1, 0) for fd in fds))


def test_a_poll_is_classified_by_the_fds_it_waits_on(tmp_path: Path) -> None:
    tmp = fake_proc(tmp_path, state="S", syscall="7 0x1000 0x2 0x1388", fds={3: "pipe:[1]", 4: "pipe:[2]"})
    _poll_memory(tmp, 0x1000, [3, 4])
    assert probe(tmp).blocked_on("S") == "queue"  # a worker waiting for its next indices
    _poll_memory(tmp, 0x1000, [3, 9])
    os.symlink("socket:[5]", tmp / str(PID) / "fd" / "9")
    assert probe(tmp).blocked_on("S") == "network"


def test_a_call_restarted_after_a_pause_is_classified_by_wchan(tmp_path: Path) -> None:
    # py-spy pausing the process interrupts the poll; it resumes as restart_syscall (219), same registers
    tmp = fake_proc(
        tmp_path, state="S", syscall="219 0x1000 0x1 0x1388", fds={3: "pipe:[1]"}, wchan="poll_schedule_timeout"
    )
    _poll_memory(tmp, 0x1000, [3])
    assert probe(tmp).blocked_on("S") == "queue"
    (tmp / str(PID) / "task" / str(PID) / "wchan").write_text("hrtimer_nanosleep")
    assert probe(tmp).blocked_on("S") == "sleep"
    (tmp / str(PID) / "task" / str(PID) / "wchan").write_text("0")
    assert probe(tmp).blocked_on("S") == "other"


def test_select_and_epoll_read_their_fds(tmp_path: Path) -> None:
    tmp = fake_proc(tmp_path, state="S", syscall="23 0x8 0x2000 0x0 0x0 0x0", fds={6: "socket:[3]"})
    with open(tmp / str(PID) / "mem", "wb") as f:
        f.seek(0x2000)
        f.write(bytes([1 << 6]))  # fd 6 in the read set
    assert probe(tmp).blocked_on("S") == "network"
    (tmp / str(PID) / "task" / str(PID) / "syscall").write_text("232 0x7 0x7f00 0x10 0xffffffff\n")
    (tmp / str(PID) / "fdinfo" / "7").write_text("pos:\t0\nflags:\t02\ntfd:        3 events:       19\n")
    os.symlink("pipe:[8]", tmp / str(PID) / "fd" / "3")
    assert probe(tmp).blocked_on("S") == "queue"


def test_memory_that_cannot_be_read_is_other_and_says_why(tmp_path: Path) -> None:
    tmp = fake_proc(tmp_path, state="S", syscall="7 0x1000 0x2 0x1388", fds={3: "pipe:[1]"})
    (tmp / str(PID) / "mem").write_bytes(b"")
    (tmp / str(PID) / "mem").chmod(0)
    p = probe(tmp)
    assert p.blocked_on("S") == "other"
    if os.geteuid() != 0:  # root reads a file whatever its mode
        assert p.refused is not None and "permission denied" in p.refused


def test_fd_kinds() -> None:
    assert [fd_kind(t) for t in ("socket:[1]", "pipe:[2]", "/x/y.jpg", "anon_inode:[eventfd]")] == [
        "socket",
        "pipe",
        "file",
        "other",
    ]
    assert of_kinds({"pipe", "socket"}) == "network" and of_kinds({"pipe"}) == "queue"
    assert of_kinds({"file"}) == "storage" and of_kinds(set()) == "other" and of_kinds({"pipe", "other"}) == "other"


def test_one_period_is_exact_cpu_and_run_queue_and_counts_its_polls() -> None:
    first = split("w0", None, (0, 0), None, Counter())
    assert all(math.isnan(v) for v in first.values())
    got = split("w0", (1_000_000_000, 50_000_000), (1_030_000_000, 60_000_000), 0.1, Counter(sleep=2, queue=1))
    assert got["loader.w0.cpu_pct"] == pytest.approx(30.0) and got["loader.w0.runq_pct"] == pytest.approx(10.0)
    assert got["loader.w0.off_pct"] == pytest.approx(60.0)
    assert got["loader.w0.polls_sleep"] == 2.0 and got["loader.w0.polls_queue"] == 1.0
    assert got["loader.w0.polls_network"] == 0.0


def test_a_wait_for_a_cpu_credited_late_is_carried_and_no_period_holds_more_than_its_length(tmp_path: Path) -> None:
    """The kernel adds a wait for a CPU to schedstat only when the thread gets one: here a 150 ms wait that spans
    two 100 ms periods lands whole in the second. Each period holds at most its own length (before, the second
    read 160% on a CPU and waiting, the first's 100% off the CPU counted that wait too), and the total is kept."""
    root = fake_proc(tmp_path, state="R", syscall="running")
    stat = tmp_path / str(PID) / "task" / str(PID) / "schedstat"
    (tmp_path / str(PID) / "stat").write_text(f"{PID} (w) R " + "0 " * 30)
    now = [0.0]
    src = BlockedSource(PID, root=str(root), clock=lambda: now[0], poll_hz=1e-3, rescan_s=1e9)
    stat.write_text("0 0 1\n")
    assert src.open() is None
    periods = []
    # (cpu ms, runq ms) so far at each reading, 100 ms apart: the 150 ms wait is credited in the second period
    for cpu_ms, runq_ms in ((0, 0), (10, 150), (20, 150), (30, 150)):
        now[0] += 0.1
        stat.write_text(f"{cpu_ms * 1_000_000} {runq_ms * 1_000_000} 1\n")
        got = src.read()
        periods.append((got["loader.main.cpu_pct"], got["loader.main.runq_pct"], got["loader.main.off_pct"]))
    src.close()
    assert all(cpu + runq <= 100.0 + 1e-9 and off >= 0.0 for cpu, runq, off in periods), periods
    assert all(sum(p) == pytest.approx(100.0) for p in periods), periods
    assert periods[1] == pytest.approx((10.0, 90.0, 0.0)) and periods[2] == pytest.approx((10.0, 60.0, 30.0))
    # every ns kept: 30 ms on a CPU and 150 ms waiting over the four periods' 400 ms
    assert sum(p[0] for p in periods) == pytest.approx(30.0) and sum(p[1] for p in periods) == pytest.approx(150.0)


def _host(rows: dict[str, tuple[float, float, dict[str, float]]]) -> HostFigures:
    by: dict[str, float] = {}
    for label, (cpu, runq, polls) in rows.items():
        by[f"loader.{label}.cpu_pct"], by[f"loader.{label}.runq_pct"] = cpu, runq
        by[f"loader.{label}.off_pct"] = 100.0 - cpu - runq
        for c in ("storage", "network", "queue", "sleep", "lock", "other"):
            by[f"loader.{label}.polls_{c}"] = polls.get(c, 0.0)
    return HostFigures(dict(sorted(by.items())))


def test_the_window_splits_off_cpu_time_by_its_polls_and_names_the_bottleneck() -> None:
    lt = loader_time(
        _host({"main": (90, 5, {}), "w0": (10, 0, {"network": 3.0, "sleep": 1.0}), "w1": (10, 0, {"network": 1.0})})
    )
    assert lt is not None and [p.label for p in lt.processes] == ["main", "w0", "w1"]
    w0 = lt.processes[1]
    assert w0.network == pytest.approx(67.5) and w0.sleep == pytest.approx(22.5) and w0.other == 0.0
    assert lt.processes[0].other == pytest.approx(5.0)  # off the CPU with no blocked poll: other
    assert lt.workers is not None and lt.workers.network == pytest.approx(78.75)
    assert lt.bottleneck == "network" and "blocked on the network 79%" in (lt.headline or "")


@pytest.mark.parametrize(
    ("cpu", "runq", "polls", "bottleneck", "words"),
    [
        (5, 1, {"queue": 9.0}, "ahead", "more workers will not help"),
        (5, 1, {"storage": 9.0}, "storage", "fetch-bound"),
        (70, 25, {}, "cores", "short of cores"),
        (85, 5, {}, "cpu", "CPU-bound"),
        (30, 5, {"sleep": 1.0, "queue": 1.0}, None, None),  # nothing took 40% or more
    ],
)
def test_the_bottleneck_of_the_workers(
    cpu: float, runq: float, polls: dict[str, float], bottleneck: str | None, words: str | None
) -> None:
    lt = loader_time(_host({"w0": (cpu, runq, polls)}))
    assert lt is not None and lt.bottleneck == bottleneck
    assert (words is None and lt.headline is None) or (words and words in (lt.headline or ""))


def test_no_loader_figures_no_loader_time_and_the_table_shows_each_process() -> None:
    assert loader_time(HostFigures({"proc.main.cpu_pct": 50.0})) is None
    lt = loader_time(_host({"main": (90, 5, {}), "w0": (5, 1, {"queue": 5.0}), "w1": (5, 1, {"queue": 5.0})}))
    assert lt is not None
    console = Console(record=True, width=100)
    console.print(loader_time_table(lt))
    text = console.export_text()
    for cell in ("main", "w0", "w1", "mean", "waited for work 94%", "source: schedstat"):
        assert cell in text, text


def test_the_live_view_shows_the_workers_recent_time() -> None:
    from profiler.live.analysis import LiveAggregator
    from profiler.live.render import frame

    agg = LiveAggregator(window_s=5.0)
    old = _host({"w0": (90, 5, {}), "w1": (90, 5, {})}).by_metric  # 10 s ago: computing
    new = _host({"w0": (4, 1, {"queue": 3.0}), "w1": (4, 1, {"queue": 2.0})}).by_metric  # now: ahead
    agg.add_samples([(1.0, old), *((10.0 + i / 10, new) for i in range(20))])
    snap = agg.snapshot()
    assert snap.loader is not None and snap.loader.bottleneck == "ahead"  # the old samples left the window
    assert snap.loader.workers is not None and snap.loader.workers.queue == pytest.approx(95.0)
    console = Console(record=True, width=120)
    console.print(frame(snap, {"workers": 2}))
    text = console.export_text()
    assert "workers     ahead" in text and "work 95% (mean of 2, recent samples)" in text, text
