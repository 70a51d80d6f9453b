"""The sampler process beside the training process (profiler/core/sampler_process/): the ring that joins them, each of
the two killed mid-run with nothing recorded lost, and the training process left with no stallscope thread that wakes
more than about once a second."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, sleep_loader, wait_until

from profiler import Session
from profiler.cli import main
from profiler.core.sampler_process import client as client_module
from profiler.core.sampler_process.client import WATCH_S, ProcessRecorder
from profiler.core.sampler_process.ring import Announced, Ring, RingReader, RingWriter, send_segment
from profiler.core.sampler_process.wire import RunEvent
from profiler.core.steps.clock import HANDOFF_STEPS
from profiler.core.steps.events import BATCH, ENTER, EXIT, FETCH
from profiler.core.store import integrity_ok, load_run, pid_alive, read_head

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _step_events(writer: RingWriter, i: int, phases: int = 2) -> list[tuple[int, int, float, float, float]]:
    """Step ``i``'s events as a Session puts them: the fetch, the batch, and ``phases`` phases entered and exited
    (their names announced to the ring the first time)."""
    t = i * 0.01
    evs = [(FETCH, 0, t, 1e-6 * i, float(i)), (BATCH, 0, t + 0.001, 2e-6 * i, 8.0)]
    for k in range(phases):
        ident = writer.name_id(["h2d", "compute", "compute/fwd", f"user{i % 3}"][k % 4])
        a = t + 0.002 + k * 1e-4
        evs += [(ENTER, ident, a, 1e-6, float(k)), (EXIT, ident, a + 5e-5, 2e-6, -1.0)]
    for ev in evs:
        writer.put(ev)
    return evs


def _drain(ring: Ring, writer: RingWriter, reader: RingReader) -> list[object]:
    """Everything left, as the sampler process's drain takes it, the producer's spill flushed as room frees."""
    got: list[object] = []
    writer.flush_events()
    while True:
        records = [v[0] if k == "event" else v for k, v in reader.records()]
        ring.set_read(reader.pos)
        got += records
        if not writer.pending() and not records:
            return got
        writer.flush()


def test_the_ring_carries_step_events_and_items_in_order_across_its_end() -> None:
    ring = Ring.create(8192)  # small: the records cross its end many times
    writer, reader = RingWriter(ring), RingReader(ring)
    sent: list[object] = []
    got: list[object] = []
    for i in range(400):
        sent += _step_events(writer, i, phases=i % 5)
        if i % 7 == 0:  # an item after the events put before it (the Session's tick flushes them first)
            writer.flush_events()
            item = RunEvent(i * 0.01, "warning", "session", f"note {i} " + "x" * (i % 50))
            writer.put_item(item)
            sent.append(item)
        if i % 100 == 0:  # the consumer drains now and then; the producer spills meanwhile, never blocks
            writer.flush_events()
            got += [v[0] if k == "event" else v for k, v in reader.records()]
            ring.set_read(reader.pos)
    got += _drain(ring, writer, reader)
    assert writer.spilled > 0  # the ring was full at times: those records waited, in order
    assert got == sent
    ring.close()


def test_a_reader_that_starts_late_knows_the_names_the_producer_gives_it() -> None:
    ring = Ring.create(8192)
    writer = RingWriter(ring)
    _step_events(writer, 0)
    writer.flush_events()
    first = RingReader(ring)
    list(first.records())
    ring.set_read(first.pos)
    assert first.names == {0: "h2d", 1: "compute"}
    sent = _step_events(writer, 1)  # the same names: announced once, before the first step's events
    writer.flush_events()
    late = RingReader(ring, start=first.pos, names=writer.names())  # a take-over: the one before read the names
    assert [v[0] for _k, v in late.records()] == sent and late.names == first.names
    unaware = RingReader(ring, start=first.pos)
    list(unaware.records())
    assert unaware.names == {}  # without them, the phase ids of these events name nothing
    ring.close()


def test_the_store_failure_reaches_the_training_process_through_the_header() -> None:
    ring = Ring.create(8192)
    assert ring.failure() is None
    ring.set_failure("could not write the run store x: the disk is full", 41)
    assert ring.failure() == ("could not write the run store x: the disk is full", 41)
    ring.close()


def _loop(s: Session, steps: int, wait_s: float = 0.002) -> int:
    n = 0
    for _ in s.wrap(sleep_loader(steps, wait_s)):
        with s.phase("h2d"):
            pass
        with s.phase("compute"):
            time.sleep(0.003)
        n += 1
    return n


def test_a_session_records_through_its_sampler_process(tmp_path: Path) -> None:
    with Session(tmp_path / "run", sample_hz=20, warmup=1) as s:
        rec = s.recording
        assert isinstance(rec, ProcessRecorder) and rec.proc is not None
        child = rec.proc.pid
        n = _loop(s, 40)
    summary = s.summary()
    assert summary is not None and summary.steps == n - 1 and summary.status == "complete"
    stored = load_run(tmp_path / "run")
    assert [r.step for r in stored.steps] == list(range(n))
    assert {p.name for p in stored.phases} == {"h2d", "compute"}
    assert stored.meta["pid"] == os.getpid() and stored.meta["sampler_pid"] == child
    assert stored.meta["sampling"] == "process" and not pid_alive(child)
    # the sampler process sampled the training process's tree and did not count itself as a loader worker
    assert summary.sampler.sources["host"] == "available" and summary.sampler.samples >= 5
    assert not any(m.startswith("proc.w") for _t, _s, m, _v in stored.samples)


KILLED = textwrap.dedent("""
    import sys, time
    from profiler import Session
    with Session(sys.argv[1], sample_hz=20) as s:
        for n, _ in enumerate(s.wrap(iter(lambda: [0] * 4, None))):
            with s.phase("compute"):
                time.sleep(0.002)
            if n == 200:
                print("at 200", flush=True)
""")


def test_the_training_process_killed_leaves_a_closed_interrupted_store(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(out)], stdout=subprocess.PIPE, env=ENV, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline() == b"at 200\n"
    meta, _ = read_head(out)
    sampler = meta.get("sampler_pid")
    assert isinstance(sampler, int) and pid_alive(sampler)
    proc.kill()  # SIGKILL: no handler runs in the training process
    proc.wait()
    assert wait_until(lambda: not pid_alive(sampler), timeout=20)  # it saw its parent go, drained and closed
    assert integrity_ok(out)
    rec = load_run(out)
    assert rec.meta["status"] == "interrupted" and "ended without closing the run" in rec.meta["error"]
    steps = [r.step for r in rec.steps]
    # every step resolved before the kill: steps are resolved in batches, so at most HANDOFF_STEPS had not been
    assert steps == list(range(len(steps))) and len(steps) >= 200 - HANDOFF_STEPS
    assert main(["report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "interrupted"


def test_the_sampler_process_killed_loses_no_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="stallscope")
    with Session(tmp_path / "run", sample_hz=20, prometheus="127.0.0.1:0") as s:
        rec = s.recording
        assert isinstance(rec, ProcessRecorder) and rec.proc is not None and s.exporter is not None
        n = _loop(s, 60)
        assert wait_until(lambda: len(load_run(tmp_path / "run").steps) > 0, timeout=10)
        assert _served_steps(s.exporter.url) > 0  # the sampler process answers the endpoint
        rec.proc.send_signal(signal.SIGKILL)
        killed_at = rec.now()
        n += _loop(s, 400)  # > WATCH_S: the training process sees it and takes the store over
        assert rec.lost is not None and not rec.serving_views
        assert _served_steps(s.exporter.url) == n  # and then the training process, from its own buffer of steps
    summary = s.summary()
    assert summary is not None and summary.status == "complete" and summary.steps == n
    stored = load_run(tmp_path / "run")
    assert [r.step for r in stored.steps] == list(range(n))  # those in the ring at the kill too
    lost = stored.meta["sampler_lost"]
    assert "signal SIGKILL" in lost["how"] and killed_at <= lost["at_s"] <= killed_at + WATCH_S + 1.0
    said = [r.getMessage() for r in caplog.records if "sampler process" in r.getMessage()]
    assert len(said) == 1 and "every step is kept" in said[0]
    assert any(k == "warning" and "sampler process" in m for _t, k, _s, m in stored.events)
    # samples stop at the kill; nothing after it is claimed
    last = max(t for t, src, _m, _v in stored.samples if src == "host")
    assert last <= lost["at_s"] + 0.1


def _served_steps(url: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        lines = [ln for ln in r.read().decode().splitlines() if ln.startswith("stallscope_steps_total")]
    return float(lines[0].split()[-1]) if lines else 0.0


def _wakeups(tid: int) -> int:
    """Voluntary context switches of one thread of this process so far: each time it blocked (a sleep, a wait, the
    GIL); preemptions, which a busy host adds, are not counted."""
    with open(f"/proc/self/task/{tid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
    return int(fields["voluntary_ctxt_switches"])


def test_no_stallscope_thread_in_the_training_process_wakes_more_than_once_a_second(tmp_path: Path) -> None:
    # an earlier test's threads (a start-up module's window thread), by the objects: an ident is the thread's stack
    # address, and a thread started after one ended may get its ident (the pin source's did in a fresh-clone CI)
    earlier = set(threading.enumerate())
    with Session(tmp_path / "run", sample_hz=100) as s:  # the fastest sampling allowed: none of it is here
        ours = {t.name: t.native_id for t in threading.enumerate() if t.name.startswith("stallscope")
                and t not in earlier}  # fmt: skip
        rec = s.recording
        assert isinstance(rec, ProcessRecorder) and s.sampler is None
        before = {name: _wakeups(tid) for name, tid in ours.items() if tid is not None}
        rounds0, t0 = rec.watch_rounds, time.monotonic()
        _loop(s, 500)
        seconds = time.monotonic() - t0
        after = {name: _wakeups(tid) for name, tid in ours.items() if tid is not None}
        rounds = rec.watch_rounds - rounds0
    # the watch alone: the pin-memory source is read on the training thread at its hand-overs
    # (core.sampling.on_training_thread), with no sampler thread of its own (issue #65)
    assert set(ours) == {"stallscope-watch"}, ours
    assert seconds > 2.5
    assert rounds <= math.floor(seconds / WATCH_S) + 1, (rounds, seconds)
    # and nothing else wakes it: a round costs the thread one to three voluntary context switches (its wake-up, a
    # wait for the GIL that the training thread holds). A thread woken at 10 Hz adds 10 or more
    switches = sum(after[name] - before[name] for name in ours) / seconds
    assert switches <= 6, {name: (after[name] - before[name]) / seconds for name in ours}


EXPECTED = {"stallscope-watch", "stallscope-shm-watch"}  # the pin source is read at the hand-overs (issue #65)


# light (tests/scheduling.py): a sleeping training loop, its live view and endpoint in the sampler process; 12 s
@pytest.mark.light(seconds=12)
def test_a_run_with_its_live_view_and_endpoint_keeps_them_out_of_the_training_process(tmp_path: Path) -> None:
    """``stallscope run`` with the live view (plain lines: no terminal here) and ``--prometheus``, through the
    runner as the CLI calls it, with 2 loader workers: the views are the sampler process's, scraped from outside
    while it trains; the training process's stallscope threads are the watch and the shared-memory watch, each
    waking about once a second (the pin source is read on the training thread at its hand-overs)."""
    from profiler.cli.common import RunViews
    from profiler.core.steps.device_timers import resolve_device
    from profiler.drivers.runner import RunConfig, run_scenario
    from profiler.export.endpoint import parse_endpoint
    from profiler.export.prometheus import PrometheusExporter
    from scenarios import get

    exporter = PrometheusExporter(parse_endpoint("127.0.0.1:0")).bind()
    seen: dict[str, object] = {}

    earlier = set(threading.enumerate())  # an earlier test's threads that may still be ending (the objects: see above)

    def observe() -> None:  # the test's own thread, while the run trains
        def ours() -> dict[str, int | None]:
            return {t.name: t.native_id for t in threading.enumerate() if t.name.startswith("stallscope")
                    and t not in earlier}  # fmt: skip

        # from when the run's threads are up (its set-up took 3-6 s here beside the suite), then a second more
        deadline = time.monotonic() + 30.0
        while len(ours()) < len(EXPECTED) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        threads = ours()
        before, t0 = {n: _wakeups(tid) for n, tid in threads.items() if tid is not None}, time.monotonic()
        time.sleep(2.5)
        seconds = time.monotonic() - t0
        seen["rates"] = {n: (_wakeups(tid) - before[n]) / seconds for n, tid in threads.items() if tid is not None}
        with urllib.request.urlopen(exporter.url, timeout=5) as r:
            seen["scrape"] = r.read().decode()

    scenario = get(str(ROOT / "tests" / "data" / "scenarios" / "io_wait.py"))
    cfg = RunConfig(out=tmp_path / "run", device=resolve_device("cpu"), workers=2, steps=120, attribution=False)
    watcher = threading.Thread(target=observe, name="test-observer")
    try:
        watcher.start()
        session = run_scenario(scenario, cfg, RunViews(True, 120, exporter, None))  # ~10 s: longer than observed
        watcher.join(30)
    finally:
        exporter.close()
    rates = seen["rates"]
    assert isinstance(rates, dict)
    assert set(rates) == EXPECTED
    # one round a second each: the watches 1.0 switch a second (a GIL wait may add one or two). A thread woken at
    # 10 Hz makes 10 or more
    assert all(rate <= 6 for rate in rates.values()) and sum(rates.values()) <= 12, rates
    assert isinstance(session.recording, ProcessRecorder) and session.recording.serving_views
    assert session.sampler is None  # no in-process sampler thread: the pin source is read at the hand-overs
    steps = [ln for ln in str(seen["scrape"]).splitlines() if ln.startswith("stallscope_steps_total")]
    assert steps and float(steps[0].split()[-1]) > 0, steps


def test_without_a_sampler_process_the_run_is_still_recorded(tmp_path: Path, monkeypatch, caplog) -> None:
    """The sampler process cannot start (its interpreter fails): the training process writes the store itself,
    unsampled, and says so once."""
    caplog.set_level(logging.WARNING, logger="stallscope")
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with Session(tmp_path / "run", sample_hz=20) as s:
        n = _loop(s, 20)
    summary = s.summary()
    assert summary is not None and summary.steps == n and summary.status == "complete"
    assert "failed to start" in load_run(tmp_path / "run").meta["sampler_lost"]["how"]
    assert len([r for r in caplog.records if "sampler process" in r.getMessage()]) == 1
    assert math.isnan(summary.sampler.hz_achieved)


def test_a_flush_of_more_events_than_a_record_holds_arrives_whole_and_in_order() -> None:
    ring = Ring.create(1 << 20)
    writer, reader = RingWriter(ring), RingReader(ring)
    ident = writer.name_id("compute")
    sent = [(ENTER if k % 2 == 0 else EXIT, ident, k * 1e-6, 0.0, float(k)) for k in range(70_000)]  # 9 records
    for ev in sent:
        writer.put(ev)
    assert _drain(ring, writer, reader) == sent
    ring.close()


def test_a_short_run_with_workers_still_has_memory_and_loader_figures(tmp_path: Path) -> None:
    """The issue's new user: 150 steps with 2 workers over a list of dicts, 0.6 s of training (4 ms a step). Every
    source reads once the workers are up and once more at close, so the summary has the workers' memory (before,
    the memory source's schedule put its next reading seconds after the first, taken before the workers started)."""
    import torch

    items = [{"x": torch.full((16,), float(i)), "y": i % 10} for i in range(150 * 8)]
    loader = torch.utils.data.DataLoader(items, batch_size=8, num_workers=2)
    with Session(tmp_path / "run", sample_hz=10, device="cpu") as s:
        t0 = time.monotonic()
        for batch in s.wrap(loader):
            with s.phase("compute"):
                (batch["x"] * 2).sum()
                time.sleep(0.004)
        measured = time.monotonic() - t0
    summary = s.summary()
    assert summary is not None and summary.steps == 150
    rec = load_run(tmp_path / "run")
    workers_mem = {m for _t, _s, m, v in rec.samples if m.startswith("mem.w") and m.endswith("uss_mb") and v}
    assert workers_mem == {"mem.w0.uss_mb", "mem.w1.uss_mb"}, (workers_mem, measured)
    assert summary.memory is not None
    # the close's reading comes after the last step
    last_step = rec.steps[-1].t_end
    assert max(t for t, _s, m, _v in rec.samples if m == "mem.main.uss_mb") >= last_step


def _grow_and_drain(writer: RingWriter, reader: RingReader, ring: Ring, steps: int) -> list[object]:
    """``steps`` steps put while the consumer reads only now and then (and commits what it read): the ring grows."""
    sent: list[object] = []
    got: list[object] = []
    for i in range(steps):
        sent += _step_events(writer, i)
        if i % 50 == 0:
            writer.flush_events()
        if i % 400 == 399:  # far behind: about 400 steps of about 300 bytes, in a ring of 8 KiB
            got += [v[0] for _k, v in reader.records()]
            ring.set_read(reader.pos)
            writer.flush()  # the watch's round: unmaps the segments the store committed past
    writer.flush_events()
    got += [v[0] for _k, v in reader.records()]
    ring.set_read(reader.pos)
    assert got == sent
    return got


def test_a_full_ring_grows_in_segments_the_consumer_is_sent_and_nothing_spills() -> None:
    """The producer's new segments go over a socket (as to the sampler process); the reader follows each NEXT."""
    ring = Ring.create(8192)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    writer = RingWriter(ring, announce=lambda seg: send_segment(ours, seg))
    reader = RingReader(ring, segments=Announced(ring, theirs))
    _grow_and_drain(writer, reader, ring, 2000)
    assert writer.spilled == 0 and writer.grew >= 3  # 8, 16, 32, 64 KiB ...
    assert reader.seg.index == writer.grew and reader.seg.base <= reader.pos
    writer.flush()
    assert writer.segments_held() <= 2  # the first (its header) and the one written now: the others were unmapped
    writer.close()
    ring.close()
    ours.close()
    theirs.close()


def test_a_segment_the_consumer_cannot_be_sent_spills_as_before() -> None:
    ring = Ring.create(8192)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()  # the sampler process is gone: a segment cannot reach it
    writer = RingWriter(ring, announce=lambda seg: send_segment(ours, seg))
    reader = RingReader(ring)
    sent = [ev for i in range(400) for ev in _step_events(writer, i)]
    writer.flush_events()
    assert writer.grew == 0 and writer.spilled > 0
    assert [v[0] if k == "event" else v for k, v in reader.records()] + _drain(ring, writer, reader) == sent
    ring.close()
    ours.close()


def test_a_take_over_reads_from_the_committed_mark_through_the_writers_segments() -> None:
    """The sampler process died with its last commit in an old segment: the training process reads on from there
    through its own mappings (the writer's), and grows the ring for itself from then on."""
    ring = Ring.create(8192)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    writer = RingWriter(ring, announce=lambda seg: send_segment(ours, seg))
    first = RingReader(ring, segments=Announced(ring, theirs))
    sent = [ev for i in range(20) for ev in _step_events(writer, i)]
    writer.flush_events()
    got = [v[0] for _k, v in first.records()]
    ring.set_read(first.pos)
    assert got == sent and first.seg.index == 0
    theirs.close()  # the consumer is killed; then the producer goes on alone
    writer.grow_here()
    later = [ev for i in range(20, 500) for ev in _step_events(writer, i)]
    writer.flush_events()
    assert writer.grew >= 2 and writer.spilled == 0
    taker = RingReader(ring, start=ring.read_pos(), names=writer.names(), segments=writer)
    assert [v[0] for _k, v in taker.records()] == later
    writer.close()
    ring.close()
    ours.close()


def test_the_steps_taken_are_kept_in_the_header_and_outlive_the_ring_close() -> None:
    ring = Ring.create(8192)
    counter = RingWriter(ring).taken
    assert ring.taken() == 0
    counter[0] = 99_999  # the index of the last step opened
    assert ring.taken() == 100_000
    ring.close()
    counter[0] = 100_000  # the Session's clock may still hold it: its own mapping, still valid
    assert counter[0] == 100_000


def test_the_watch_makes_the_next_segment_ahead_and_the_ring_grows_into_it() -> None:
    ring = Ring.create(8192)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    writer = RingWriter(ring, announce=lambda seg: send_segment(ours, seg))
    reader = RingReader(ring, segments=Announced(ring, theirs))
    sent = [ev for i in range(5) for ev in _step_events(writer, i)]
    writer.flush_events()
    writer.prepare()
    assert writer.prepared == 0  # under 3/4 full: nothing made ahead
    sent += [ev for i in range(5, 30) for ev in _step_events(writer, i)]
    writer.flush_events()
    assert writer.grew == 0
    writer.prepare()
    writer.prepare()
    assert writer.prepared == 1  # one ahead, not more
    sent += [ev for i in range(30, 60) for ev in _step_events(writer, i)]
    writer.flush_events()
    assert writer.grew == 1 and writer.prepared == 1 and writer.spilled == 0
    assert [v[0] for _k, v in reader.records()] == sent and reader.seg.index == 1
    writer.close()
    ring.close()
    ours.close()
    theirs.close()


def test_an_error_in_the_watch_is_counted_named_once_and_the_watch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the watch thread lives in the user's process: what a round raises must not end it nor reach the user as a
    # traceback (docs/reliability.md)
    monkeypatch.setattr(client_module, "WATCH_S", 0.05)
    with Session(tmp_path / "run", sample_hz=10) as s:
        rec = s.recording
        assert isinstance(rec, ProcessRecorder)
        real_check = rec.check

        def failing() -> None:
            raise RuntimeError("planted")

        monkeypatch.setattr(rec, "check", failing)
        deadline = time.monotonic() + 10
        while rec.watch_errors < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        monkeypatch.setattr(rec, "check", real_check)
        assert rec.watch_errors >= 3
        rounds = rec.watch_rounds
        assert wait_until(lambda: rec.watch_rounds >= rounds + 2, timeout=10)  # the watch goes on
        _loop(s, 20)
    assert rec.watch_error == "RuntimeError: planted"
    assert [r.getMessage() for r in caplog.records].count(
        "stallscope: the Session's watch thread met RuntimeError: planted; it goes on"
    ) == 1
    assert s.summary().steps == 20
