"""Loader memory, piece by piece: the source's readings from fake process figures (once a second, a process
that cannot be read left out), the growth rule on readings made by hand, and the report's table. The figures
against the workers' own smaps are in tests/test_memory_truth.py."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from profiler.analysis.memory import GROWTH_MIN_MB, loader_memory, shm_exhausted, shm_headline, shm_need, slope
from profiler.core.sources.memory import MemorySource, shm_files
from profiler.core.sources.pin import PinSource
from profiler.render.loader import memory_table


@dataclass
class Info:
    uss: int
    pss: int
    rss: int


def test_the_source_reads_every_second_and_leaves_out_what_it_cannot_read(tmp_path) -> None:
    now = [0.0]
    mib = 2**20

    def read(pid: int) -> Info:
        if pid == 3:
            raise ProcessLookupError(pid)
        return Info(uss=10 * mib * pid, pss=20 * mib * pid, rss=50 * mib * pid)

    def maps(pid: int) -> dict[tuple[int, int], int]:
        # main maps batch files 1 and 2; worker 0 holds 2 (sent, not yet let go) and 3 (not yet taken)
        return {1: {(7, 1): 3 * mib, (7, 2): 2 * mib}, 2: {(7, 2): 2 * mib, (7, 3): mib}}.get(pid, {})

    src = MemorySource(
        lambda: {"main": 1, "w0": 2, "w1": 3},
        clock=lambda: now[0],
        cpu_clock=lambda: 0.0,  # readings that cost nothing: the schedule is EVERY_S
        read=read,
        shm=str(tmp_path),
        maps=maps,
    )
    assert src.open() is None
    got = src.read()
    assert got["mem.main.uss_mb"] == 10 and got["mem.w0.pss_mb"] == 40 and got["mem.w0.shared_mb"] == 80
    assert "mem.w1.uss_mb" not in got and got["mem.total.pss_mb"] == 60  # main 20 + w0 40
    assert got["mem.shm.job_mb"] == 6  # 1, 2, 3 once each: a file two processes hold is one batch
    assert got["mem.shm.size_mb"] > 0 and got["mem.host.available_mb"] > 0
    now[0] = 0.5
    # not a second yet: only the segment's use (one statvfs), which every call reads
    assert set(src.read()) == {"mem.shm.used_mb", "mem.shm.size_mb"}
    now[0] = 1.0
    assert "mem.main.uss_mb" in src.read()
    # asked for the workers' memory off the schedule (profiler.core.sampling.worker_memory_asks): theirs alone, not the
    # training process's (a walk of its page tables holds its memory-map lock) nor the job's total, which needs every
    # one
    now[0] = 1.5
    src.read_workers_next()
    got = src.read()
    assert got["mem.w0.uss_mb"] == 20 and "mem.main.uss_mb" not in got and "mem.total.pss_mb" not in got
    assert "mem.w0.uss_mb" not in src.read()  # once: the next read keeps the schedule


def test_the_shared_memory_files_a_process_maps_or_holds_are_read_from_proc() -> None:
    import mmap
    import os

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    path = shm / f"stallscope-test-{os.getpid()}"
    before = shm_files(os.getpid())  # what this process held already (multiprocessing's heap lives there too)
    with path.open("w+b") as f:
        f.truncate(3 * mmap.PAGESIZE)
        region = mmap.mmap(f.fileno(), 3 * mmap.PAGESIZE)
        path.unlink()  # as torch does: mapped and open, no longer named ("(deleted)" in maps)
        try:
            mapped_and_open = _new(before, shm_files(os.getpid()))
        finally:
            region.close()
        held_open = _new(before, shm_files(os.getpid()))  # unmapped, the descriptor open: a batch sent, not taken
    assert sorted(mapped_and_open.values()) == [3 * mmap.PAGESIZE], mapped_and_open
    assert sorted(held_open.values()) == [3 * mmap.PAGESIZE], held_open
    assert _new(before, shm_files(os.getpid())) == {}  # closed: gone


def _new(before: dict[tuple[int, int], int], now: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    return {k: v for k, v in now.items() if k not in before}


def test_the_source_keeps_its_reading_cost_to_its_budget() -> None:
    now = [0.0]

    def slow(pid: int) -> Info:
        now[0] += 0.01  # each process takes 10 ms to read
        return Info(uss=1, pss=1, rss=1)

    src = MemorySource(
        lambda: {"main": 1, "w0": 2},
        clock=lambda: now[0],
        cpu_clock=lambda: now[0],  # the fake reading's time is all CPU
        read=slow,
        budget=0.005,
        maps=lambda _pid: {},
    )
    assert src.read() and now[0] == pytest.approx(0.02)
    now[0] = 3.9
    assert "mem.main.uss_mb" not in src.read()  # 20 ms spent is 0.5% of 4 s: the next reading is due at 4 s
    now[0] = 4.0
    assert "mem.main.uss_mb" in src.read()


def test_slope_and_its_fit() -> None:
    b, r2 = slope([(0, 1.0), (1, 3.0), (2, 5.0)])
    assert b == pytest.approx(2.0) and r2 == pytest.approx(1.0)
    assert all(math.isnan(v) for v in slope([(0, 1.0)]))


def _samples(w0: list[float], w1: list[float]) -> list[tuple[float, str, str, float | None]]:
    out: list[tuple[float, str, str, float | None]] = []
    for i, (a, b) in enumerate(zip(w0, w1, strict=True)):
        t = float(i)
        out += [(t, "memory", "mem.main.uss_mb", 200.0), (t, "memory", "mem.w0.uss_mb", a)]
        out += [(t, "memory", "mem.w1.uss_mb", b), (t, "memory", "mem.total.pss_mb", 400.0 + a + b)]
        out += [(t, "memory", "mem.host.available_mb", 1000.0)]
    return out


def test_a_steady_growth_is_named_with_its_rate_and_when_memory_runs_out() -> None:
    # w0 grows 4 MiB a second for 6 s, w1 stays; 100 samples/s over 2 workers: 50 items a second each
    mem = loader_memory(_samples([20 + 4 * i for i in range(7)], [20.0] * 7), None, 100.0, 2)
    assert mem is not None and mem.growing == ("w0",)
    w0 = mem.processes[1]
    assert w0.growth_mb_per_s == pytest.approx(4.0) and w0.growth_mb_per_1k_items == pytest.approx(80.0)
    assert mem.out_of_memory_in_s == pytest.approx(250.0)  # 1,000 MiB available / 4 MiB/s
    assert mem.headline is not None and "w0" in mem.headline and "80.0 MiB per 1,000 items" in mem.headline
    assert mem.total_pss_peak_mb == pytest.approx(400 + 44 + 20)


@pytest.mark.parametrize(
    "w0",
    [
        [20.0 + (GROWTH_MIN_MB / 2) * i / 6 for i in range(7)],  # steady but less than GROWTH_MIN_MB in all
        [20.0, 60.0, 20.0, 60.0, 20.0, 60.0, 21.0],  # large swings, no steady growth
        [20.0, 60.0, 60.0],  # too few readings
    ],
)
def test_what_is_not_growth(w0: list[float]) -> None:
    mem = loader_memory(_samples(w0, [20.0] * len(w0)), None, 100.0, 2)
    assert mem is not None and mem.growing == () and mem.headline is None and math.isnan(mem.out_of_memory_in_s)


def test_no_memory_readings_no_figures_and_the_table() -> None:
    assert loader_memory([(0.0, "host", "proc.main.rss_mb", 10.0)], None, 10.0, 2) is None
    mem = loader_memory(_samples([20 + 4 * i for i in range(7)], [20.0] * 7), (0.0, 6.0), 100.0, 2)
    assert mem is not None
    console = Console(record=True, width=120)
    console.print(memory_table(mem))
    text = console.export_text()
    assert "80.0 grows" in text and "copy-on-read" in text and "sum of PSS" in text, text


MIB = 2**20


def test_the_shm_files_are_paced_on_cpu_time_and_smaps_on_wall_time() -> None:
    wall, cpu = [0.0], [0.0]

    def stalled(pid: int) -> dict[tuple[int, int], int]:
        wall[0] += 0.090  # 90 ms of wall time (the training process held the GIL), 1 ms of CPU
        cpu[0] += 0.001
        return {}

    def smaps(pid: int) -> Info:
        wall[0] += 0.020  # a page-table walk: 20 ms, paced on wall time (it holds the process's map lock)
        cpu[0] += 0.001
        return Info(uss=1, pss=1, rss=1)

    src = MemorySource(lambda: {"main": 1}, clock=lambda: wall[0], cpu_clock=lambda: cpu[0], read=smaps, maps=stalled)
    first = src.read()
    assert "mem.shm.job_mb" in first and "mem.main.uss_mb" in first
    wall[0] = 1.2  # 1 ms of CPU is 0.1% of a second: the shm files again after EVERY_S, not 18 s
    second = src.read()
    assert "mem.shm.job_mb" in second and "mem.main.uss_mb" not in second  # smaps: 20 ms of wall is due at 4 s


def test_the_shared_memory_need_counts_the_batches_in_flight() -> None:
    loader = {"pipeline": "naive", "workers": 4, "prefetch_factor": 2, "pin_memory": False}
    need = shm_need({"loader": loader, "batch_bytes": 6 * MIB, "device": {"kind": "cpu"}})
    assert need is not None and need.batches == 4 * 2 + 2 and need.need_mb == pytest.approx(60.0)
    assert need.rule == "4 workers x prefetch_factor 2 + 2 held by the loop"
    # torch's default prefetch_factor (2) where the loader did not say; prefetch's queue on a CPU device holds the
    # batches as received (in shared memory), pinned or on CUDA it holds copies
    prefetch = {"pipeline": "prefetch", "workers": 1, "prefetch_factor": None, "pin_memory": False, "depth": 3}
    queued = shm_need({"loader": prefetch, "batch_bytes": MIB, "device": {"kind": "cpu"}})
    assert queued is not None and queued.batches == 1 * 2 + 2 + 3 and "3 queued by the prefetch thread" in queued.rule
    pinned = shm_need({"loader": {**prefetch, "pin_memory": True}, "batch_bytes": MIB, "device": {"kind": "cuda"}})
    assert pinned is not None and pinned.batches == 4
    # nothing in shared memory: no worker processes (0 workers, DALI's threads), resident batches, no batch size
    assert shm_need({"loader": {**loader, "workers": 0}, "batch_bytes": MIB}) is None
    dali = {"pipeline": "dali", "workers": 2, "worker_processes": 0}
    assert shm_need({"loader": dali, "batch_bytes": MIB}) is None
    assert shm_need({"loader": loader, "batch_bytes": MIB, "synthetic_input": True}) is None
    assert shm_need({"loader": loader}) is None


def test_shared_memory_is_said_when_the_need_or_the_use_comes_near_the_segment() -> None:
    need = shm_need({"loader": {"workers": 2, "prefetch_factor": 2}, "batch_bytes": 16 * MIB})
    assert need is not None and need.need_mb == 96
    said = shm_headline(need, free_mb=64.0, size_mb=64.0, used_peak_mb=10.0)
    assert said is not None and "needs about 96 MiB" in said and "64 MiB free of 64" in said and "--shm-size" in said
    assert shm_headline(need, free_mb=120.0, size_mb=128.0, used_peak_mb=30.0) is None  # 96 < 0.9 x 120
    full = shm_headline(None, free_mb=math.nan, size_mb=64.0, used_peak_mb=60.0)
    assert full is not None and "reached 60 of 64 MiB" in full
    samples = [
        (0.0, "memory", "mem.shm.used_mb", 4.0), (0.0, "memory", "mem.shm.size_mb", 64.0),
        (1.0, "memory", "mem.shm.used_mb", 50.0), (1.0, "memory", "mem.shm.size_mb", 64.0),
        (1.0, "memory", "mem.shm.job_mb", 46.0),
    ]  # fmt: skip
    mem = loader_memory(samples, None, 10.0, 2, need)  # no smaps reading: the shm figures alone
    assert mem is not None and mem.processes == () and mem.shm_free_start_mb == 60 and mem.shm_job_peak_mb == 46
    assert mem.shm_headline is not None and "60 MiB free of 64" in mem.shm_headline


@pytest.mark.parametrize(
    ("error", "out_of_shm"),
    [
        ("DataLoader worker 1 of 2 (pid 9) raised RuntimeError: unable to allocate shared memory(shm) for file", True),
        ("DataLoader worker 0 of 2 (pid 9) was killed by SIGBUS", True),
        ("DataLoader worker (pid 9) is killed by signal: Bus error. It is possible that dataloader's workers", True),
        ("DataLoader worker 0 of 2 (pid 9) was killed by SIGKILL (the kernel's out-of-memory killer", False),
        ("DataLoader worker 0 of 2 (pid 9) raised OSError: [Errno 28] No space left on device: 'out.bin'", False),
        (None, False),
    ],
)
def test_a_worker_out_of_shared_memory_is_told_from_other_deaths(error: str | None, out_of_shm: bool) -> None:
    assert shm_exhausted(error) is out_of_shm


def test_the_pin_source_reads_the_pin_threads_cpu_and_the_pinned_bytes() -> None:
    now, cpu = [10.0], {7: 0}
    src = PinSource(
        threads=lambda: list(cpu), cpu_ns=lambda tid: cpu[tid], pinned=lambda: 96 * MIB, clock=lambda: now[0]
    )
    first = src.read()
    assert math.isnan(first["pin.cpu_pct"]) and first["pin.threads"] == 1 and first["pin.pinned_mb"] == 96
    now[0], cpu[7] = 12.0, 500_000_000  # 0.5 s of CPU in 2 s
    assert src.read()["pin.cpu_pct"] == pytest.approx(25.0)
    cpu.clear()  # the iterator ended: no thread, no CPU figure; nothing pinned where CUDA is not in use
    assert PinSource(threads=list, pinned=lambda: math.nan).read() == {}


def test_the_pin_threads_figures_reach_the_report_table() -> None:
    samples = [
        *_samples([20.0] * 3, [20.0] * 3),
        (0.0, "pin", "pin.cpu_pct", math.nan), (1.0, "pin", "pin.cpu_pct", 30.0), (2.0, "pin", "pin.cpu_pct", 50.0),
        (1.0, "pin", "pin.pinned_mb", 64.0), (2.0, "pin", "pin.pinned_mb", 96.0),
    ]  # fmt: skip
    mem = loader_memory(samples, None, 100.0, 2)
    assert mem is not None and mem.pin_cpu_pct == pytest.approx(40.0) and mem.pinned_peak_mb == 96
    console = Console(record=True, width=160)
    console.print(memory_table(mem))
    assert "pin memory: the pin-memory thread 40% of a core; pinned 96 MiB at the peak" in console.export_text()
    assert math.isnan(loader_memory(_samples([20.0] * 3, [20.0] * 3), None, 100.0, 2).pin_cpu_pct)  # type: ignore[union-attr]


class _Loader:
    num_workers = 2

    def __init__(self, n: int = 300) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def _asks(reads: object, steps: range, step_s: Callable[[int], float]) -> list[int]:
    """The steps at which ``reads`` asks, checked at a hand-over every 10 steps, each step ``step_s(i)`` long."""
    t, out = 0.0, []
    for i in range(steps.stop):
        if i in steps and i % 10 == 0 and reads.due(i, t):  # type: ignore[attr-defined]
            out.append(i)
        t = round(t + step_s(i), 9)  # the floats of a sum of 10 ms steps land on their marks
    return out


def test_the_first_epoch_with_workers_asks_for_readings_spaced_in_time_up_to_before_its_end() -> None:
    from profiler.core.sampling.worker_memory_asks import ASKS, EARLY_GAP_S, READ_AHEAD_S, WorkerReads

    reads = WorkerReads(warmup=5)
    reads.begin(_Loader(300), 0, 0.0)
    # 10 ms steps: the window's first step (10, the first hand-over past step 5), the next EARLY_GAP_S later (60),
    # then evenly spaced in time to READ_AHEAD_S before the end (3.0 s - 0.5 s = step 250)
    asked = _asks(reads, range(300), lambda i: 0.010)
    assert asked == [10, 60, 130, 190, 250] and len(asked) == ASKS and (READ_AHEAD_S, EARLY_GAP_S) == (0.5, 0.5), asked
    # a later epoch, a loader without workers or without a length: the schedule alone
    reads.begin(_Loader(300), 300, 3.0)
    assert not any(reads.due(i, i * 0.01) for i in range(300, 600, 10))
    for loader in (type("NoWorkers", (_Loader,), {"num_workers": 0})(), _Loader(4)):
        fresh = WorkerReads(warmup=0)
        fresh.begin(loader, 0, 0.0)
        assert not any(fresh.due(i, i * 0.01) for i in range(0, 300, 10)), loader


def test_the_runs_known_length_places_the_asks_where_the_epoch_is_longer_than_the_run() -> None:
    # issue #65: 150 steps of a 6,250-step epoch (400,000 items, batch 64) asked at the window's first step only: its
    # marks were a quarter, half and three quarters of the epoch. The run's length (Session(steps=), run --steps)
    # ends the loop first; the asks span it
    from profiler.core.sampling.worker_memory_asks import READ_AHEAD_S, WorkerReads

    reads = WorkerReads(warmup=10)
    reads.run_length(150)
    reads.begin(_Loader(6250), 0, 0.0)
    asked = _asks(reads, range(160), lambda i: 0.015)
    assert asked[0] == 10 and len(asked) == 5, asked
    # the last one READ_AHEAD_S before the loop's end at step 160 (2.4 s): at 1.9 s, step 126.7, the hand-over at 130
    assert asked[-1] == 130 and (160 - asked[-1]) * 0.015 <= READ_AHEAD_S, asked
    # the steps slow to 4x halfway: the end is projected from the mean step since the first ask, at each hand-over,
    # so the last ask still comes before the end, with the others spread before it
    slow = WorkerReads(warmup=10)
    slow.run_length(150)
    slow.begin(_Loader(6250), 0, 0.0)
    asked = _asks(slow, range(160), lambda i: 0.010 if i < 80 else 0.040)
    t_of = [0.0]
    for i in range(160):
        t_of.append(t_of[-1] + (0.010 if i < 80 else 0.040))
    assert len(asked) == 5 and t_of[160] - t_of[asked[-1]] >= READ_AHEAD_S / 2, (asked, t_of[160])
    assert all(b - a >= 10 for a, b in itertools.pairwise(asked)), asked


def test_a_loop_of_unknown_length_asks_early_then_reads_its_workers_where_it_breaks_out() -> None:
    # a Session without steps= over an iterable without a length: asks early on, and the reading at the loop's end
    # (profiler.core.steps.clock: a break, an exception, close()) while the iterator still holds its workers, once
    import os
    import subprocess
    import sys

    from profiler.core.sampling.worker_memory_asks import WorkerReads

    class Proc:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    class Iterator:  # a DataLoader iterator's worker list (torch's _workers)
        def __init__(self, pids: list[int]) -> None:
            self._workers = [Proc(p) for p in pids]

    reads = WorkerReads(warmup=2)
    assert reads.at_end(Iterator([os.getpid()])) is None  # nothing planned yet: no reading
    reads.begin(type("NoLen", (), {"num_workers": 2})(), 0, 0.0)
    # the first ask, then gaps that double from EARLY_GAP_S: 0.5, 1, 2 and 4 s (the schedule reads a longer loop)
    assert _asks(reads, range(2000), lambda i: 0.01) == [10, 60, 160, 360, 760]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        taken = reads.at_end(Iterator([child.pid, 999_999_999]))  # one that does not exist is left out
        assert taken is not None and set(taken) == {child.pid}, taken
        uss, pss, shared = taken[child.pid]
        assert 0 < uss <= pss + shared and pss > 0, taken  # MiB of a live Python process
        assert reads.at_end(Iterator([child.pid])) is None  # once
        # a loader that keeps its iterator (persistent workers): they outlive the break, so no reading is taken on
        # the training thread; an empty one, which the clock sends as an ask to the sampler process
        kept = WorkerReads(warmup=2)
        kept.begin(type("NoLen", (), {"num_workers": 2})(), 0, 0.0)
        assert kept.at_end(Iterator([child.pid]), kept=True) == {}
        assert kept.at_end(Iterator([child.pid]), kept=True) is None  # once
    finally:
        child.kill()
        child.wait()
    # no worker list: this process's children that run its own command line (a fork), in a fresh process (a pytest
    # worker has children of earlier tests: two of them were found here in a fresh-clone CI)
    code = (
        "import os, signal, time\n"
        "from profiler.core.sampling.worker_memory_asks import worker_pids\n"
        "before = worker_pids(object())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print(before, worker_pids(object()) == [pid])\n"
        "os.kill(pid, signal.SIGKILL)\n"
        "os.waitpid(pid, 0)\n"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert got.stdout.split() == ["[]", "True"], (got.stdout, got.stderr)


def test_readings_taken_at_the_loops_end_are_labelled_by_the_source_and_cross_the_ring() -> None:
    from profiler.core.sampler_process.wire import ReadMemory, decode, encode

    src = MemorySource(lambda: {"main": 1, "w0": 2, "w1": 3})
    got = src.labelled({2: (10.0, 20.0, 30.0), 7: (1.0, 1.0, 1.0)})  # pid 7 is no process it knows
    assert got == {"mem.w0.uss_mb": 10.0, "mem.w0.pss_mb": 20.0, "mem.w0.shared_mb": 30.0}
    item = ReadMemory(4.5, {2: (10.0, 20.0, 30.0)})
    assert list(decode(encode(item))) == [item]
    assert list(decode(encode(ReadMemory()))) == [ReadMemory()]  # a plain ask, as before


def test_a_workers_reading_just_after_the_window_counts_as_its_end() -> None:
    # the loop's end reading comes after its last step ended: within END_GRACE_S of the window it counts; a reading
    # later than that (the workers idle since) does not
    from profiler.analysis.memory import END_GRACE_S

    samples = [(t, "memory", "mem.w0.uss_mb", 10.0 + 10 * t) for t in (0.0, 0.5, 1.0, 1.5)]
    samples.append((2.0 + END_GRACE_S / 2, "memory", "mem.w0.uss_mb", 30.0))
    samples.append((2.0 + 2 * END_GRACE_S, "memory", "mem.w0.uss_mb", 30.0))
    mem = loader_memory(samples, (0.0, 2.0), 100.0, 1)
    assert mem is not None
    (w0,) = mem.processes
    assert w0.readings == 5 and w0.uss_end_mb == 30.0, w0


def test_a_process_read_as_it_exits_gives_no_figure() -> None:
    # a worker read while its loader stopped it: smaps read 0 MiB of USS (issue #65's dicts run), no figure of it
    from profiler.core.sources.memory import take

    src = MemorySource(lambda: {"main": 1, "w0": 2}, read=lambda pid: Info(uss=0, pss=0, rss=0) if pid == 2 else
                       Info(uss=2**20, pss=2**20, rss=2**21))  # fmt: skip
    src.read_workers_next()
    got = src.read()
    assert "mem.w0.uss_mb" not in got and got["mem.main.uss_mb"] == 1.0, got
    assert take([2], read=lambda pid: Info(uss=0, pss=0, rss=0)) == {}


def test_a_workers_reading_just_after_the_loops_end_reading_is_left_out() -> None:
    # the loop's end reading is taken just before the loader stops its workers; the sampler process's reading of a
    # worker after it comes while the worker's Python frees its memory on its way out: not a figure of what it held
    from profiler.analysis.memory import LOOP_END
    from profiler.core.sources.memory import LOOP_END as STORED_AS

    assert LOOP_END == STORED_AS  # the analysis cannot import the core's sources: the name is spelled twice
    samples = [(t, "memory", "mem.w0.uss_mb", 10.0 + 10 * t) for t in (0.0, 0.5, 1.0, 1.5)]
    samples += [(2.0, LOOP_END, "mem.w0.uss_mb", 30.0), (2.1, "memory", "mem.w0.uss_mb", 14.0)]
    mem = loader_memory(samples, (0.0, 2.0), 100.0, 1)
    assert mem is not None
    (w0,) = mem.processes
    assert w0.readings == 5 and w0.uss_end_mb == 30.0, w0
    # without the loop's end reading, the same late reading is the worker's last
    plain = [(t, "memory" if src == LOOP_END else src, m, v) for t, src, m, v in samples]
    (w0,) = loader_memory(plain, (0.0, 2.0), 100.0, 1).processes  # type: ignore[union-attr]
    assert w0.uss_end_mb == 14.0, w0


def test_asks_before_the_workers_are_found_are_made_once_they_are() -> None:
    # the host source finds a loader's workers a round or more after they start (0.4-1 s here beside other work, the
    # window of a fast 150-step run half over): asks made before are made then, one a read
    procs: dict[str, int] = {"main": 1}
    src = MemorySource(lambda: dict(procs), clock=lambda: 5.0, cpu_clock=lambda: 0.0,
                       read=lambda pid: Info(uss=2**20 * pid, pss=2**20, rss=2**22))  # fmt: skip
    src.read()  # the schedule's reading of the training process
    for _ in range(2):
        src.read_workers_next()
        assert "mem.w0.uss_mb" not in src.read()  # no worker yet
    procs["w0"] = 2
    got = [("mem.w0.uss_mb" in src.read()) for _ in range(5)]
    # found: their first reading, then the two asks made before, then the schedule alone (at 5 s: not yet due)
    assert got == [True, True, True, False, False], got
