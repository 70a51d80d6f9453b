"""Sampler against a fake clock: absolute deadlines, lateness, skipped deadlines, failing and lost sources."""

from __future__ import annotations

import itertools
import logging
import math
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import wait_until

from profiler.core.sampling.sampler import Sampler
from profiler.core.sources.base import SourceEnded, SourceLost


class FakeClock:
    """Time moves only when the sampler waits (by the timeout) or a source reads (by its cost)."""

    def __init__(self, stop_after: int) -> None:
        self.t = 100.0
        self.waits = 0
        self.stop_after = stop_after
        self.done = threading.Event()

    def __call__(self) -> float:
        return self.t

    def wait(self, timeout: float) -> bool:
        self.t += timeout
        self.waits += 1
        if self.waits >= self.stop_after:
            self.done.set()
            return True
        return False


class Scripted:
    def __init__(
        self,
        name: str,
        clock: FakeClock,
        costs: list[float],
        fail: dict[int, Exception] | None = None,
        open_reason: str | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.costs = costs
        self.fail = fail or {}
        self.reads = 0
        self.open_reason = open_reason
        self.closed = 0

    def open(self) -> str | None:
        return self.open_reason

    def read(self) -> dict[str, float]:
        i = self.reads
        self.reads += 1
        self.clock.t += self.costs[i % len(self.costs)]
        if i in self.fail:
            raise self.fail[i]
        return {f"{self.name}.value": float(i), f"{self.name}.missing": math.nan}

    def close(self) -> None:
        self.closed += 1


def _run(sources, clock: FakeClock, hz: float = 10.0):
    rows: list = []
    events: list = []
    s = Sampler(
        sources, hz, sink=rows.extend, on_event=lambda *e: events.append(e), clock=clock, t0=clock.t, wait=clock.wait
    )
    s.start()
    assert clock.done.wait(10)
    s.stop()
    return s, rows, events


def test_absolute_deadlines_give_exact_rate_and_recorded_lateness() -> None:
    clock = FakeClock(stop_after=50)
    src = Scripted("a", clock, costs=[0.004])  # every read costs 4 ms of a 100 ms period
    s, rows, _ = _run([src], clock)
    assert s.stats.samples == 50
    assert s.stats.hz_achieved == pytest.approx(10.0, rel=1e-9)  # no drift from the 4 ms reads
    assert s.stats.missed_deadlines == 0
    times = sorted({r[0] for r in rows})
    assert times == pytest.approx([k * 0.1 for k in range(50)])  # on the deadlines, not 0.104 apart
    reads = [r[3] for r in rows if r[2] == "sampler.read_ms"]
    assert reads == pytest.approx([4.0] * 50)
    nan_rows = [r for r in rows if r[2] == "a.missing"]
    assert nan_rows and all(r[3] is None for r in nan_rows)  # NaN is stored as NULL


def test_slow_source_skips_deadlines_instead_of_bursting() -> None:
    clock = FakeClock(stop_after=10)
    src = Scripted("slow", clock, costs=[0.25])  # 250 ms per read at 10 Hz
    s, rows, _ = _run([src], clock)
    times = sorted({r[0] for r in rows})
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g == pytest.approx(0.3) for g in gaps)  # next free deadline after each 250 ms read
    assert s.stats.missed_deadlines == 2 * s.stats.samples  # two deadlines pass during each read
    assert s.stats.hz_achieved == pytest.approx(1 / 0.3)


def test_late_wakeup_is_recorded_as_lateness() -> None:
    clock = FakeClock(stop_after=5)
    late = 0.007

    def late_wait(timeout: float) -> bool:
        return clock.wait(timeout + late)  # the OS wakes us 7 ms late every time

    rows: list = []
    s = Sampler([], 10, sink=rows.extend, clock=clock, t0=clock.t, wait=late_wait)
    s.start()
    assert clock.done.wait(10)
    s.stop()
    lateness = [r[3] for r in rows if r[2] == "sampler.lateness_ms"]
    assert lateness[0] == pytest.approx(0.0)
    assert lateness[1:] == pytest.approx([7.0] * 4)
    assert s.stats.lateness_max_s == pytest.approx(late)


def test_source_exceptions_are_counted_and_never_escape() -> None:
    clock = FakeClock(stop_after=20)
    flaky = Scripted(
        "flaky", clock, costs=[0.0], fail={3: OSError("read failed"), 4: OSError("read failed"), 9: KeyError("x")}
    )
    good = Scripted("good", clock, costs=[0.0])
    s, _rows, events = _run([flaky, good], clock)
    h = s.stats.sources["flaky"]
    assert h.errors == 3 and h.status == "available"
    assert h.last_error == "KeyError: 'x'"
    # the repeated reason is reported once, a new one again
    errs = [e for e in events if e[1] == "source_error"]
    assert [e[2] for e in errs] == ["OSError: read failed", "KeyError: 'x'"]
    assert good.reads == 20 and flaky.reads == 20


def test_lost_source_is_retired_and_others_go_on() -> None:
    clock = FakeClock(stop_after=12)
    gpu = Scripted("gpu", clock, costs=[0.0], fail={5: SourceLost("GPU is lost")})
    host = Scripted("host", clock, costs=[0.0])
    s, rows, events = _run([gpu, host], clock)
    assert gpu.reads == 6 and host.reads == 12
    assert s.stats.sources["gpu"].status == "lost: GPU is lost"
    # a retired source's close is queued on its own thread, never waited for (sampler.py): poll for it
    assert wait_until(lambda: gpu.closed >= 1, timeout=10)
    assert ("source" in [e[1] for e in events]) and any("lost" in e[2] for e in events)
    assert max(r[0] for r in rows if r[1] == "gpu") < min(r[0] for r in rows if r[1] == "host" and r[3] == 6.0)


def test_a_source_whose_process_ended_is_retired_as_ended_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # issue #57: a script that finished printed "source host lost at 37.8 s: process 1845 exited; sampling goes on
    # without it" for each source that followed it
    clock = FakeClock(stop_after=12)
    host = Scripted("host", clock, costs=[0.0], fail={5: SourceEnded("process 1845 exited")})
    gpu = Scripted("gpu", clock, costs=[0.0], fail={7: SourceLost("GPU is lost")})
    with caplog.at_level(logging.DEBUG, logger="stallscope"):
        s, _rows, events = _run([host, gpu], clock)
    assert s.stats.sources["host"].status == "ended: process 1845 exited"
    assert s.stats.sources["gpu"].status == "lost: GPU is lost"
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == ["stallscope: source gpu lost at 0.7 s: GPU is lost; sampling goes on without it"], warned
    assert any(e[2] == "ended: process 1845 exited" for e in events if e[1] == "source")


def test_unavailable_source_is_reported_once_and_never_read() -> None:
    clock = FakeClock(stop_after=5)
    nvml = Scripted("nvml", clock, costs=[0.0], open_reason="NVMLError_LibraryNotFound")
    s, _, events = _run([nvml], clock)
    assert nvml.reads == 0
    assert s.stats.sources["nvml"].status == "unavailable: NVMLError_LibraryNotFound"
    assert [e[1:] for e in events] == [("source", "unavailable: NVMLError_LibraryNotFound", "nvml")]


def test_rate_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="allowed 0 < hz <= 100"):
        Sampler([], 101)
    with pytest.raises(ValueError):
        Sampler([], 0)


def test_start_stop_idempotent_and_stop_is_prompt_with_real_clock() -> None:
    s = Sampler([], 1.0)  # a 1 s period: stop must not wait for the deadline
    s.start()
    s.start()
    first = s._thread
    assert wait_until(lambda: s.stats.samples >= 1, timeout=5)

    t = time.perf_counter()
    s.stop()
    s.stop()
    assert time.perf_counter() - t < 0.5
    assert first is not None and not first.is_alive()
    s.start()  # a fresh thread per start
    assert s._thread is not first
    s.stop()


def test_bounded_buffer_keeps_the_newest() -> None:
    clock = FakeClock(stop_after=40)
    s = Sampler([Scripted("a", clock, costs=[0.0])], 10, clock=clock, t0=clock.t, wait=clock.wait, buffer_s=1.0)
    s.start()
    assert clock.done.wait(10)
    s.stop()
    assert len(s.buffer) == 10
    latest = s.latest()
    assert latest is not None and latest[1]["a.value"] == 39.0


class Hanging:
    """A source whose read (or probe) blocks from its ``after``-th call until ``release`` is set."""

    def __init__(self, name: str, after: int, *, hang_open: bool = False) -> None:
        self.name = name
        self.after = after
        self.hang_open = hang_open
        self.reads = 0
        self.release = threading.Event()

    def open(self) -> str | None:
        if self.hang_open:
            self.release.wait(30)
        return None

    def read(self) -> dict[str, float]:
        self.reads += 1
        if self.reads > self.after:
            self.release.wait(30)
        return {f"{self.name}.value": float(self.reads)}

    def close(self) -> None:
        pass


class Quick:
    name = "quick"

    def open(self) -> str | None:
        return None

    def read(self) -> dict[str, float]:
        return {"quick.value": 1.0}

    def close(self) -> None:
        pass


def test_a_hung_read_retires_its_source_while_the_others_keep_their_rate() -> None:

    rows: list = []
    hung = Hanging("gpu", after=3)
    s = Sampler([hung, Quick()], 50.0, sink=rows.extend, call_timeout_s=0.4)
    try:
        s.start()
        assert wait_until(lambda: s.stats.sources["gpu"].status.startswith("lost"), timeout=10)
        assert wait_until(lambda: s.stats.samples >= 40, timeout=10)
        t = time.perf_counter()
        s.stop()
        assert time.perf_counter() - t < 0.5
    finally:
        hung.release.set()
    assert s.stats.sources["gpu"].status == "lost: a read did not return within 0.4 s (the call hangs)"
    quick = [t for t, src, _m, _v in rows if src == "quick"]
    gpu = [t for t, src, _m, _v in rows if src == "gpu"]
    assert len(gpu) == 3
    # while the read hung (0.4 s), the quick source went on at about the sampler's rate (50 Hz)
    assert len([t for t in quick if gpu[-1] < t < gpu[-1] + 0.4]) >= 10


def test_a_hung_probe_is_unavailable_and_start_returns() -> None:

    hung = Hanging("gpu", after=0, hang_open=True)
    s = Sampler([hung, Quick()], 20.0, open_timeout_s=0.3)
    try:
        t = time.perf_counter()
        s.start()
        assert time.perf_counter() - t < 1.0
        assert s.stats.sources["gpu"].status == "unavailable: its probe did not return within 0.3 s (the call hangs)"
        assert wait_until(lambda: s.stats.samples >= 3, timeout=10)
        s.stop()
    finally:
        hung.release.set()
    assert hung.reads == 0


class Starved:
    """A source whose read computes ``cpu_s`` of its thread's CPU time at the lowest priority (nice 19): beside
    processes that take every core it is runnable but given a CPU a few % of the time."""

    name = "stages"

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s
        self.wall_s: list[float] = []

    def open(self) -> str | None:
        return None

    def read(self) -> dict[str, float]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        t0, c0 = time.monotonic(), time.thread_time()
        while time.thread_time() - c0 < self.cpu_s:
            pass
        self.wall_s.append(time.monotonic() - t0)
        return {"stages.value": 1.0}

    def close(self) -> None:
        pass


# alone (tests/scheduling.py): its premise is a thread starved of a CPU by its own spinning processes, whose wait is
# run-queue wait; beside the suite's other tests a quiet fresh-clone CI's read took 6.2 s for its 30 ms of CPU and was
# retired. The rest of its wait was likely for the GIL (not measured), held by this process's other threads while
# they waited for a core, which is not its run-queue wait: an in-process sampler's limit (the sampler process runs
# no other Python work)
@pytest.mark.alone
def test_a_read_that_only_waits_for_a_cpu_is_not_a_hung_call() -> None:
    # the read is out past the timeout, but waiting for a CPU (schedstat run delay) rather than hung: the out time
    # counted is less that wait, so the source is kept (a CI run retired a loader's stage counters this way)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 2))]
    src = Starved(0.03)
    s = Sampler([src, Quick()], 20.0, call_timeout_s=0.4)
    try:
        s.start()
        lost = lambda: s.stats.sources["stages"].status != "available"  # noqa: E731
        assert wait_until(lambda: len(src.wall_s) >= 2 or lost(), timeout=60)
    finally:
        for p in spin:
            p.kill()
            p.wait()
        s.stop()
    assert max(src.wall_s) > 0.4, src.wall_s  # the premise: a read was out longer than the timeout
    assert s.stats.sources["stages"].status == "available", (s.stats.sources["stages"], src.wall_s)


def test_a_read_still_out_at_the_stop_is_kept_and_the_last_round_reads_afresh() -> None:
    class Slow:
        """Its second read takes 0.3 s: it is still out when the sampler stops."""

        name = "slow"

        def __init__(self) -> None:
            self.calls = 0

        def open(self) -> str | None:
            return None

        def read(self) -> dict[str, float]:
            self.calls += 1
            n = self.calls
            if n == 2:
                time.sleep(0.3)
            return {"slow.n": float(n)}

        def close(self) -> None:
            pass

    src, rows = Slow(), []
    s = Sampler([src], 20.0, sink=rows.extend)
    s.start()
    assert wait_until(lambda: src.calls >= 2, timeout=10)
    s.stop(final=True)
    got = [r[3] for r in rows if r[2] == "slow.n"]
    # the slow read is kept, and the last round read afresh after it (before: the slow one was not waited for, and
    # no read was made at the stop)
    assert 2.0 in got and got[-1] == src.calls >= 3, (got, src.calls)
