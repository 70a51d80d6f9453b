"""CPU contention: schedstat parsing, the sched source, per-phase run-queue wait, and its ground truth.

Ground truth: a phase that only burns CPU takes wall = its thread's CPU time + the time it waited for a CPU,
so ``wall - thread_time`` measured by the test itself, independently of stallscope, is the wait stallscope
must report. The test pins the loop to one core and runs it alone and beside busy processes pinned to that
core; other jobs on this machine load it too, so the uncontended case is compared with its own truth and
with the contended case, never with zero.
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing as mp
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from profiler import Session
from profiler.analysis import summarize
from profiler.analysis.contention import (
    THRESHOLD,
    Contention,
    contention_advice,
)
from profiler.core.sources import sched
from profiler.core.sources.base import Source, SourceLost
from profiler.core.sources.sched import (
    RUNQ_BUDGET,
    RUNQ_COST_S,
    RUNQ_MAX_EVERY,
    SchedSource,
    ThreadSched,
    delay_between,
    parse,
    probe,
    run_delay_s,
    runq_every,
)
from profiler.core.store import PhaseRow, RunRecord, RunStore, StepRow, load_run
from profiler.render.report import render_report

RUNS = Path(__file__).parent / "data" / "runs"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux-only")
needs_schedstat = pytest.mark.skipif(probe() is not None, reason=f"schedstat unavailable: {probe()}")


# -- parsing ---------------------------------------------------------------------------------------------------


def test_parse_and_run_delay() -> None:
    raw = b"464776034 41960040 129\n"
    assert parse(raw) == (464776034, 41960040, 129)
    assert run_delay_s(raw) == pytest.approx(0.04196004)
    assert delay_between(b"1 1000000000 1\n", b"9 1250000000 3\n") == pytest.approx(0.25)
    assert delay_between(None, raw) is None and delay_between(raw, None) is None
    with pytest.raises(ValueError, match="2 fields"):
        parse(b"1 2\n")


def _fake_thread(root: Path, pid: int, tid: int, delay_ns: int) -> Path:
    p = root / str(pid) / "task" / str(tid) / "schedstat"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{delay_ns * 3 + 5} {delay_ns} 7\n")
    return p


def _fake_stat(root: Path, pid: int, start: int) -> None:
    # field 22 (start time) after a command name holding a space and a parenthesis
    fields = ["S", *["0"] * 18, str(start), "0"]
    (root / str(pid) / "stat").write_text(f"{pid} (py (w) 1) " + " ".join(fields) + "\n")


def test_probe_reasons_on_fake_proc(tmp_path: Path) -> None:
    assert "CONFIG_SCHED_INFO" in (probe(7, 7, str(tmp_path)) or "")
    _fake_thread(tmp_path, 7, 7, 0).write_text("0 0 0\n")
    assert "scheduler statistics are off" in (probe(7, 7, str(tmp_path)) or "")
    _fake_thread(tmp_path, 7, 7, 0).write_text("garbage\n")
    assert "unreadable" in (probe(7, 7, str(tmp_path)) or "")
    _fake_thread(tmp_path, 7, 7, 12)
    assert probe(7, 7, str(tmp_path)) is None


@linux_only
def test_probe_and_thread_reader_on_this_machine() -> None:
    reason = probe()
    if reason is not None:
        pytest.skip(f"schedstat unavailable here: {reason}")
    rq = ThreadSched()
    try:
        assert rq.ident == threading.get_ident() and rq.tid == threading.get_native_id()
        first = parse(rq.raw())
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        second = parse(rq.raw())
        assert second[0] - first[0] >= 15_000_000  # the 20 ms burn shows as on-CPU time: fresh readings
        assert second[1] >= first[1] and second[2] >= first[2]
    finally:
        rq.close()
        rq.close()


# -- the sampled source ----------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_source_rates_on_fake_proc(tmp_path: Path) -> None:
    root, clock = tmp_path, Clock()
    _fake_thread(root, 100, 100, 0)
    _fake_thread(root, 100, 101, 0)
    labels = {"main": 100}
    src = SchedSource(100, workers=lambda: labels, rescan_s=0.0, root=str(root), clock=clock)
    assert isinstance(src, Source) and src.name == "sched"
    assert src.open() is None
    clock.t += 1.0
    _fake_thread(root, 100, 100, 50_000_000)  # 50 ms waited in 1 s
    _fake_thread(root, 100, 101, 250_000_000)
    got = src.read()
    assert got == pytest.approx({"sched.main.runq_pct": 5.0, "sched.proc.runq_pct": 30.0})

    # a worker appears: its first reading has no previous one (NaN), then a rate summed over its threads
    _fake_thread(root, 200, 200, 1_000_000_000)
    _fake_thread(root, 200, 201, 0)
    _fake_stat(root, 200, 4242)
    labels["w0"] = 200
    clock.t += 0.5
    got = src.read()
    assert math.isnan(got["sched.w0.runq_pct"]) and math.isnan(got["sched.workers.runq_pct"])
    assert got["sched.main.runq_pct"] == 0.0
    clock.t += 0.5
    _fake_thread(root, 200, 200, 1_100_000_000)
    _fake_thread(root, 200, 201, 50_000_000)
    got = src.read()
    assert got["sched.w0.runq_pct"] == pytest.approx(30.0) and got["sched.workers.runq_pct"] == pytest.approx(30.0)

    # its pid recycled by another process (new start time): the label reports nothing, and is never reused
    _fake_stat(root, 200, 9999)
    clock.t += 0.5
    got = src.read()
    assert "sched.w0.runq_pct" not in got and "sched.workers.runq_pct" not in got

    # a thread that exits stops contributing; the main process gone retires the source
    shutil.rmtree(root / "100" / "task" / "101")
    clock.t += 1.0
    _fake_thread(root, 100, 100, 60_000_000)
    assert src.read() == pytest.approx({"sched.main.runq_pct": 1.0, "sched.proc.runq_pct": 1.0})
    shutil.rmtree(root / "100")
    clock.t += 1.0
    with pytest.raises(SourceLost):
        src.read()
    src.close()
    src.close()


def test_source_rescans_at_most_every_rescan_s(tmp_path: Path) -> None:
    root, clock = tmp_path, Clock()
    _fake_thread(root, 100, 100, 0)
    src = SchedSource(100, rescan_s=1.0, root=str(root), clock=clock)
    assert src.open() is None
    _fake_thread(root, 100, 101, 0)
    clock.t += 0.5
    src.read()
    _fake_thread(root, 100, 101, 500_000_000)
    clock.t += 0.4  # 0.9 s since the scan at open: thread 101 is not listed yet
    assert src.read()["sched.proc.runq_pct"] == 0.0
    clock.t += 0.2  # rescanned: 101 is primed now, counted from the next reading
    src.read()
    _fake_thread(root, 100, 101, 600_000_000)
    clock.t += 1.0
    assert src.read()["sched.proc.runq_pct"] == pytest.approx(10.0)


def _burn(seconds: float, ready: mp.synchronize.Event | None = None, cpu: int | None = None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    if ready is not None:
        ready.set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@needs_schedstat
def test_source_on_this_process_and_a_real_worker() -> None:
    ctx = mp.get_context("fork")
    worker = ctx.Process(target=_burn, args=(10.0,), daemon=True)
    worker.start()
    try:
        src = SchedSource(workers=lambda: {"main": os.getpid(), "w0": worker.pid or -1}, rescan_s=0.0)
        assert src.open() is None
        readings = []
        for _ in range(3):
            time.sleep(0.1)
            readings.append(src.read())
        # the worker was listed when the source opened, so open() primed it (a later one starts at NaN)
        for r in readings:
            assert r["sched.w0.runq_pct"] >= 0.0 and r["sched.workers.runq_pct"] == r["sched.w0.runq_pct"]
            assert 0.0 <= r["sched.main.runq_pct"] <= r["sched.proc.runq_pct"] + 1e-9
        src.close()
    finally:
        worker.terminate()
        worker.join(10)


# -- the session's per-phase figures ---------------------------------------------------------------------------


def _burn_cpu(seconds: float) -> tuple[float, float]:
    """Burn ``seconds`` of this thread's CPU time; (wall, thread CPU) it took, timed here."""
    w0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass
    return time.perf_counter() - w0, time.thread_time() - c0


@needs_schedstat
def test_session_records_runq_per_phase_and_step(tmp_path: Path) -> None:
    with Session(tmp_path, warmup=1, sources=[], meta={"workers": 0}) as s:
        for _ in s.wrap([[0] * 4] * 6):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                _burn_cpu(0.051)  # steps of 50 ms or more: every one's schedstat is read (RUNQ_BUDGET)
                with s.phase("forward"):
                    pass
    rec = load_run(tmp_path)
    assert rec.meta["schema_version"] == 4 and rec.meta["schedstat"] == "available"
    assert rec.meta["schedstat_path"] == f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
    assert all(p.runq_s is not None and p.runq_s >= 0 for p in rec.phases)
    for step in rec.steps:
        assert step.runq_s is not None and step.data_wait_runq_s is not None
        inside = sum(p.runq_s or 0.0 for p in rec.phases if p.step == step.step and p.depth == 0)
        assert step.data_wait_runq_s >= 0 and inside + step.data_wait_runq_s <= step.runq_s + 1e-9
    summary = json.loads((tmp_path / "summary.json").read_text())
    c = summary["contention"]
    assert c["available"] is True and c["reason"] is None
    assert set(c["runq_ms_per_step"]) == {"data_wait", "h2d", "compute", "other"}
    assert c["sources"]["compute_runq_fraction"].startswith(f"/proc/{os.getpid()}/task/")
    assert 0.0 <= c["compute_runq_fraction"] <= 1.0


def test_the_schedstat_budget_reads_every_step_of_22_ms_or_more_and_one_in_k_of_shorter_ones() -> None:
    assert pytest.approx(0.05) == RUNQ_COST_S / RUNQ_BUDGET
    assert runq_every(0.051) == 1 and runq_every(0.05) == 1 and runq_every(0.0499) == 2
    assert runq_every(0.005) == 10 and runq_every(0.0036) == 14 and runq_every(1e-5) == 32 and runq_every(0.0) == 1


@needs_schedstat
def test_short_steps_read_schedstat_on_one_step_in_k_and_the_figures_are_those_steps(tmp_path: Path) -> None:
    """Steps of ~1 ms: reading the training thread's schedstat on each would cost ~10% of it (RUNQ_COST_S). It is
    read on one step in k (k from each batch of steps' mean time), every phase of a step read or none, and the
    contention figures are the read steps' and say how many they were."""
    with Session(tmp_path, sources=[], meta={"workers": 0}) as s:
        for _ in s.wrap([[0] * 4] * 400):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                _burn_cpu(0.001)
    rec = load_run(tmp_path)
    read = {st.step for st in rec.steps if st.runq_s is not None}
    assert 0 in read  # before any step's time is known, every step is read
    later = [st for st in rec.steps if st.step >= 100]
    # ~1 ms steps (1.2-3 ms on a busy host): k of 2 or more, never past RUNQ_MAX_EVERY (k = 32 reads 9 of 300 here)
    assert len(later) // RUNQ_MAX_EVERY <= sum(st.step in read for st in later) <= len(later) / 2
    for st in rec.steps:
        phases = [p for p in rec.phases if p.step == st.step]
        assert all((p.runq_s is not None) == (st.step in read) for p in phases), st
        if st.step in read:
            inside = sum(p.runq_s or 0.0 for p in phases if p.depth == 0)
            assert st.data_wait_runq_s is not None and inside + st.data_wait_runq_s <= st.runq_s + 1e-9
    c = summarize(rec).contention
    assert c is not None and c.available
    measured_read = sum(not st.warmup and st.step in read for st in rec.steps)
    assert (c.steps_timed, c.steps_measured) == (measured_read, len(rec.steps))
    assert (
        f"on {measured_read} of the {len(rec.steps)} measured steps (read on every step of 50 ms"
        in (c.sources["compute_runq_fraction"])
    )


@needs_schedstat
def test_phases_on_another_thread_store_null(tmp_path: Path) -> None:
    def other() -> None:
        with s.phase("compute"):
            pass

    with Session(tmp_path, sources=[]) as s:
        for _ in s.wrap([[0]] * 3):
            t = threading.Thread(target=other)
            t.start()
            t.join()
            time.sleep(0.051)  # steps of 50 ms or more: every one's schedstat is read (RUNQ_BUDGET)
    rec = load_run(tmp_path)
    assert len(rec.phases) == 3 and all(p.runq_s is None for p in rec.phases)
    assert all(st.runq_s is not None for st in rec.steps)


def test_unavailable_schedstat_is_recorded_once_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sched, "probe", lambda *a, **k: "no schedstat in this test")
    with Session(tmp_path, sources=[SchedSource()]) as s:
        for _ in s.wrap([[0]] * 4):
            with s.phase("compute"):
                pass
        assert s._st.edges.reader is None  # the hot path reads nothing
    rec = load_run(tmp_path)
    assert rec.meta["schedstat"] == "unavailable: no schedstat in this test"
    assert all(p.runq_s is None for p in rec.phases) and all(st.runq_s is None for st in rec.steps)
    assert ("source", "sched", "unavailable: no schedstat in this test") in [e[1:] for e in rec.events]
    summary = summarize(rec)
    assert summary.contention is not None and not summary.contention.available
    assert summary.contention.reason == "no schedstat in this test"
    assert "CPU_CONTENTION" not in [r.code for r in summary.recommendations]
    assert "CPU contention  not measured (no schedstat in this test)" in _render(summary)


# -- stored runs -----------------------------------------------------------------------------------------------


def test_v1_store_loads_without_the_new_columns(tmp_path: Path) -> None:
    shutil.copytree(RUNS / "cpu-workers", tmp_path / "run")
    rec = load_run(tmp_path / "run")
    assert rec.meta["schema_version"] == 1 and rec.steps and rec.phases
    assert all(s.runq_s is None and s.data_wait_runq_s is None for s in rec.steps)
    assert all(p.runq_s is None for p in rec.phases)
    summary = summarize(rec)
    assert summary.contention is not None and not summary.contention.available
    assert summary.contention.reason == "not recorded: run store schema v1 predates run-queue wait"
    assert summary.to_dict()["contention"]["compute_runq_fraction"] is None  # NaN -> null, never 0

    # a writer opening that store adds the columns; old rows read NULL, new rows keep their figures
    store = RunStore(tmp_path / "run")
    phase = PhaseRow(999, "compute", 0, 90.0, 90.1, runq_s=0.005)
    store.put_step(StepRow(999, 90.0, 90.1, 0.0, 8, False, 0.001, 0.01), [phase])
    store.close()
    rec = load_run(tmp_path / "run")
    assert rec.steps[-1].runq_s == 0.01 and rec.phases[-1].runq_s == 0.005
    assert rec.steps[0].runq_s is None


def _record(
    runq_fraction: float,
    *,
    workers: int = 2,
    threads: int = 2,
    cores: int = 2,
    meta: dict | None = None,
    cpu: tuple[float, float, float] | None = None,
) -> RunRecord:
    """10 measured steps of 100 ms (and 1 warm-up): 2 ms data wait, 1 ms h2d, 88 ms compute, of which
    ``runq_fraction`` waiting for a CPU. ``cpu``: psutil's (main, workers, system) CPU %, when sampled."""
    steps, phases, samples = [], [], []
    for i in range(11):
        t = i * 0.1
        cw = 0.088 * runq_fraction
        steps.append(StepRow(i, t, t + 0.1, 0.002, 8, i == 0, 0.0005, cw + 0.0015))
        phases.append(PhaseRow(i, "h2d", 0, t + 0.002, t + 0.003, runq_s=0.0))
        phases.append(PhaseRow(i, "compute", 0, t + 0.01, t + 0.098, runq_s=cw))
        samples += [
            (t, "sched", "sched.main.runq_pct", 100 * runq_fraction),
            (t, "sched", "sched.proc.runq_pct", 150.0),
            (t, "sched", "sched.w0.runq_pct", 20.0),
            (t, "sched", "sched.w1.runq_pct", 25.0),
            (t, "sched", "sched.workers.runq_pct", 45.0),
        ]
        if cpu is not None:
            samples += [
                (t, "host", "proc.main.cpu_pct", cpu[0]),
                (t, "host", "proc.children.cpu_pct", cpu[1]),
                (t, "host", "sys.cpu_pct", cpu[2]),
            ]
    base = {
        "schema_version": 2,
        "schedstat": "available",
        "schedstat_path": "/proc/42/task/42/schedstat",
        "workers": workers,
        "torch_threads": threads,
        "cpu_count": cores,
        "sample_hz": 10.0,
        "batch_size": 8,
        "status": "complete",
        "device": {"kind": "cpu", "name": "test"},
    }
    return RunRecord({**base, **(meta or {})}, steps, phases, samples, [(0.0, "source", "sched", "available")])


def _contention(rec: RunRecord) -> Contention:
    """The contention part of the record's summary (built from the summary's own host figures)."""
    c = summarize(rec).contention
    assert c is not None
    return c


def test_contention_figures_from_a_record() -> None:
    c = _contention(_record(0.4))
    assert c.available and c.reason is None
    assert c.compute_runq_fraction == pytest.approx(0.4)
    assert c.runq_ms_per_step == pytest.approx({"data_wait": 0.5, "h2d": 0.0, "compute": 35.2, "other": 1.0})
    assert c.step_runq_fraction == pytest.approx((35.2 + 1.5) / 100)
    assert (c.main_runq_pct, c.process_runq_pct, c.workers_runq_pct) == pytest.approx((40.0, 150.0, 45.0))
    assert c.per_worker_runq_pct == {"w0": 20.0, "w1": 25.0}
    assert "field 2 (run delay)" in c.sources["compute_runq_fraction"]
    assert c.to_dict()["compute_runq_fraction"] == pytest.approx(0.4)


def test_recommendation_fires_with_the_measured_figure() -> None:
    s = summarize(_record(0.38))
    codes = [r.code for r in s.recommendations]
    assert codes[0] == "CPU_CONTENTION" and "NOT_INPUT_BOUND" in codes
    text = s.recommendations[0].text
    assert text.startswith("The training thread waited for a CPU 38% of its compute time (33 ms per step; schedstat")
    assert "2 loader worker(s) and 2 intra-op thread(s) share 2 core(s) (the workers waited 45% of a core)" in text
    assert "fewer loader workers (now 2), fewer intra-op threads (torch.set_num_threads(1); now 2)" in text
    assert "os.sched_setaffinity" in text
    # the "loader keeps up, speed-ups from compute" advice names the contention instead of ignoring it
    nib = next(r.text for r in s.recommendations if r.code == "NOT_INPUT_BOUND")
    assert "lost 38% of its compute time waiting for a CPU (CPU_CONTENTION)" in nib
    line = _render(s)
    assert "CPU contention  training thread waited for a CPU 38.0% of compute time (33.4 ms/step; schedstat" in line
    assert "waiting: process 150%, workers 45% over 2 (sampled; 100% = one core)" in line


@pytest.mark.parametrize(
    ("workers", "threads", "cpu", "expected"),
    [
        # the job fits its cores and other processes took 89% of a core (2 x 97% - 100% - 5%)
        (2, 2, (100.0, 5.0, 97.0), "Other processes took 89% of a core: run where cores are free"),
        # the workers took 130% of a core: fewer workers, fewer intra-op threads, or pinning
        (2, 2, (60.0, 130.0, 100.0), "Use fewer loader workers (now 2), fewer intra-op threads"),
        # nothing else was busy and the pool holds more threads than cores
        (0, 4, (195.0, 0.0, 98.0), "Use at most one intra-op thread per core (torch.set_num_threads(2); now 4)"),
        # nothing else was busy and the threads fit: say so rather than guess
        (0, 2, (195.0, 0.0, 98.0), "No other process or loader worker used much CPU (psutil)"),
    ],
)
def test_recommendation_advice_follows_what_was_measured(
    workers: int, threads: int, cpu: tuple[float, float, float], expected: str
) -> None:
    c = _contention(_record(0.3, workers=workers, threads=threads, cpu=cpu))
    text = contention_advice(c) or ""
    assert text.startswith("The training thread waited for a CPU 30% of its compute time") and expected in text
    assert ("fewer loader workers" in text) == expected.startswith("Use fewer loader workers")
    assert "(psutil, 100% = one core)" in text


def test_recommendation_stays_quiet_under_the_threshold() -> None:
    s = summarize(_record(THRESHOLD / 2))
    assert "CPU_CONTENTION" not in [r.code for r in s.recommendations]
    nib = next(r.text for r in s.recommendations if r.code == "NOT_INPUT_BOUND")
    assert "the loader keeps up" in nib


def _render(summary: object) -> str:
    buf = io.StringIO()
    render_report(summary, Console(file=buf, width=200, color_system=None))  # type: ignore[arg-type]
    return buf.getvalue()


# -- ground truth: a CPU-bound phase pinned to one core, alone and beside busy processes ---------------------


@contextmanager
def _burners(k: int, cpu: int) -> Iterator[None]:
    """``k`` busy processes pinned to ``cpu``, up and running on entry, stopped on exit (20 s at most)."""
    ctx = mp.get_context("fork")
    ready = [ctx.Event() for _ in range(k)]
    procs = [ctx.Process(target=_burn, args=(20.0, r, cpu), daemon=True) for r in ready]
    for p in procs:
        p.start()
    try:
        assert all(r.wait(10) for r in ready)
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)


def _steal_s(cpu: int) -> float:
    """Time the hypervisor took ``cpu`` away from this machine (``/proc/stat``'s steal), in s; 0 where none."""
    with open("/proc/stat") as f:
        for line in f:
            fields = line.split()
            if fields[0] == f"cpu{cpu}":
                return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
    return 0.0


def _pinned_loop(tmp: Path, cpu: int, steps: int = 12, burn_s: float = 0.051) -> tuple[Contention, dict[str, float]]:
    """Run a loop whose compute burns ``burn_s`` of CPU, pinned to ``cpu``; the figures, and the truth in s. Steps
    of 50 ms or more: every one's schedstat is read (RUNQ_BUDGET), as the truth is every step's.

    The truth is ``wall - thread CPU`` timed just inside the phase (``inner``) and outside it (``outer``):
    stallscope reads its counter between the two, so its figure must lie between them. ``outer`` starts where the
    last step's ended, not at the phase's ``with``: a phase entered right after the step's boundary takes the
    boundary's reading, made inside ``next()`` (core/steps/boundaries.py, ADJACENT_S), so a wait for the core
    between the batch's delivery and the ``with`` is the phase's too (a CI run beside two busy processes once
    measured 1.4 ms more than a bound that began at the ``with``). Two
    things are in ``wall - CPU`` without being run-queue wait, and are kept out: time the hypervisor stole
    from the core (``steal``, from /proc/stat) and waits for the GIL. For the second, the session's own
    threads start before the pinning, so they run on other cores, and the switch interval is long, so the
    loop does not hand the GIL over in the middle of its compute.
    """
    before, interval = os.sched_getaffinity(0), sys.getswitchinterval()
    truth = dict.fromkeys(("inner", "outer", "wall", "steal"), 0.0)
    with Session(tmp, warmup=2, sources=[]) as s:
        os.sched_setaffinity(0, {cpu})  # this thread only: Linux affinity is per thread
        sys.setswitchinterval(1.0)
        steal0 = _steal_s(cpu)
        try:
            w0, c0 = time.perf_counter(), time.thread_time()
            for i, _ in enumerate(s.wrap([[0] * 4] * (steps + 2))):
                with s.phase("compute"):
                    w, c = _burn_cpu(burn_s)
                w1, c1 = time.perf_counter(), time.thread_time()
                if i >= 2:
                    truth["inner"] += w - c
                    truth["outer"] += (w1 - w0) - (c1 - c0)
                    truth["wall"] += w
                w0, c0 = w1, c1
        finally:
            truth["steal"] = _steal_s(cpu) - steal0
            sys.setswitchinterval(interval)
            os.sched_setaffinity(0, before)
    return _contention(load_run(tmp)), truth


@needs_schedstat
@pytest.mark.slow
def test_runq_matches_wall_minus_cpu_alone_and_contended(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    alone, alone_truth = _pinned_loop(tmp_path / "alone", cpu)
    with _burners(2, cpu):
        busy, busy_truth = _pinned_loop(tmp_path / "busy", cpu)
    for c, truth in ((alone, alone_truth), (busy, busy_truth)):
        measured = c.runq_ms_per_step["compute"] * 12 / 1e3
        # inside <= stallscope <= outside, less what the hypervisor stole (in wall - CPU, not in the run queue),
        # the GIL hand-offs left at the phase edges and the microseconds between two clocks' reads
        inner = max(truth["inner"] - truth["steal"], 0.0)
        assert inner - 0.02 * truth["wall"] - 0.001 <= measured <= truth["outer"] + 0.001, (measured, truth)
        # the fraction is as good as its truth: an interval, since the core's steal time is known for the core and
        # not for this thread (the run-queue wait lies between the inner clock's less the steal and the outer's)
        lo, hi = inner / truth["wall"] - 0.05, truth["outer"] / truth["wall"] + 0.05
        assert lo <= c.compute_runq_fraction <= hi, (c, truth)
    # two busy processes on the core leave the loop at most about a third of it (less if the host adds its own
    # load): a wait of at least 0.3 of compute time
    assert busy.compute_runq_fraction >= 0.3, busy
    # the burners' added wait is what the two runs' own truths say it is, whatever else shares the core ("alone"
    # is alone only on a quiet host: beside a neighbour its wait grows, and so does the truth it is checked with)
    least = (
        max(busy_truth["inner"] - busy_truth["steal"], 0.0) / busy_truth["wall"]
        - alone_truth["outer"] / alone_truth["wall"]
    )
    assert busy.compute_runq_fraction - alone.compute_runq_fraction >= least - 0.1, (alone, busy, least)


def test_a_simulated_device_gets_no_contention_advice() -> None:
    """On ``--device sim:NAME`` the host's compute phase only launches kernels the simulator times: its wait for a
    CPU is no loss of the model's compute, so the recommendation is not made (the figure is still shown)."""
    sim = {"kind": "sim", "torch_device": "cpu", "name": "NVIDIA H100-SXM5-80GB (simulated)", "index": None}
    s = summarize(_record(0.3, meta={"device": sim}))
    assert s.contention.compute_runq_fraction == pytest.approx(0.3)
    assert "CPU_CONTENTION" not in [r.code for r in s.recommendations]
    assert "CPU_CONTENTION" in [r.code for r in summarize(_record(0.3)).recommendations]
